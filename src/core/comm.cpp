// The protocol every algorithm shares (core/comm.hpp): descriptors and
// their checks, begin/announce/end of a collective, the waits with their
// failure checks, and the job-wide abort. docs/design/protocols.md gives the
// steps; docs/design/segment.md the words in shared memory.

#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <utility>

#include "base/log.hpp"
#include "base/placement.hpp"
#include "core/request.hpp"
#include "core/state.hpp"

namespace shmring {

using detail::Clock;

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::ring:
      return "ring";
    case Algorithm::direct:
      return "direct";
    case Algorithm::two_shot:
      return "two-shot";
    case Algorithm::low_latency:
      return "low-latency";
    case Algorithm::staged:
      return "staged";
  }
  return "unknown";
}

const char* to_string(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::allreduce:
      return "allreduce";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::allgather:
      return "allgather";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::reduce:
      return "reduce";
    case CollectiveKind::barrier:
      return "barrier";
    case CollectiveKind::alltoall:
      return "alltoall";
    case CollectiveKind::alltoallv:
      return "alltoallv";
    case CollectiveKind::gather:
      return "gather";
    case CollectiveKind::scatter:
      return "scatter";
    case CollectiveKind::allgatherv:
      return "allgatherv";
    case CollectiveKind::reduce_scatter_v:
      return "reduce_scatter_v";
    case CollectiveKind::invalid:
      return "an invalid call";
  }
  return "unknown";
}

namespace {

// The fields of a descriptor entry (relaxed loads: the caller orders them).
CollectiveDesc load_descriptor(const detail::Descriptor& desc) {
  const std::uint32_t kind_word = desc.kind.load(std::memory_order_relaxed);
  CollectiveDesc d{static_cast<CollectiveKind>(kind_word & 0xffff),
                   desc.count.load(std::memory_order_relaxed),
                   static_cast<DataType>(desc.dtype.load(std::memory_order_relaxed)),
                   static_cast<ReduceOp>(desc.op.load(std::memory_order_relaxed)),
                   desc.root.load(std::memory_order_relaxed),
                   static_cast<Algorithm>(desc.algorithm.load(std::memory_order_relaxed))};
  d.purpose = static_cast<CallPurpose>(kind_word >> 16);
  return d;
}

}  // namespace

std::string CommState::describe(const CollectiveDesc& d) const {
  switch (d.purpose) {
    case CallPurpose::user:
      break;
    case CallPurpose::split: {
      CollectiveDesc inner = d;
      inner.purpose = CallPurpose::user;
      return describe(inner) +
             " [in split(), whose first step is that allgather of every "
             "rank's (color, key)]";
    }
    case CallPurpose::finalize:
      return "finalize() [the rank is leaving: it destroys its communicator or process group]";
  }
  if (d.kind == CollectiveKind::invalid) return "an invalid call (rejected its arguments)";
  if (d.kind == CollectiveKind::barrier) return "barrier()";
  if (d.kind == CollectiveKind::alltoallv || d.kind == CollectiveKind::allgatherv)
    return fmt::format("{}({})", to_string(d.kind), to_string(d.dtype));
  if (d.kind == CollectiveKind::reduce_scatter_v)
    return fmt::format("{}({}, {})", to_string(d.kind), to_string(d.dtype), to_string(d.op));
  std::string s = fmt::format("{}(count={}, {}", to_string(d.kind), d.count, to_string(d.dtype));
  if (d.kind == CollectiveKind::allreduce || d.kind == CollectiveKind::reduce ||
      d.kind == CollectiveKind::reduce_scatter)
    s += fmt::format(", {}", to_string(d.op));
  if (d.kind == CollectiveKind::broadcast || d.kind == CollectiveKind::reduce ||
      d.kind == CollectiveKind::gather || d.kind == CollectiveKind::scatter)
    s += fmt::format(", root={}", d.root);
  return s + ")";
}

namespace {
thread_local WaitCheck t_wait_check = nullptr;
}  // namespace

WaitCheck set_wait_check(WaitCheck check) noexcept {
  return std::exchange(t_wait_check, check);
}

namespace detail {
WaitCheck thread_wait_check() noexcept {
  return t_wait_check;
}
}  // namespace detail

void CommState::abort_job(const std::string& reason) {
  detail::raise_abort(*seg, size, static_cast<std::uint32_t>(ErrorCode::aborted), rank,
                      fmt::format("rank {}: aborted the job: {}", rank, reason));
}

void CommState::check_progress(int peer, const char* what, Clock::time_point deadline,
                               const detail::Counter& counter, std::uint64_t target) {
  // The caller's check (set_wait_check): a reason aborts the job, which the
  // read below then raises on this rank as on the others.
  if (t_wait_check != nullptr && !detail::t_helper_thread) {
    const std::string why = t_wait_check();
    if (!why.empty()) abort_job(why);
  }
  if (auto a = detail::read_abort(seg->header())) rethrow_abort(*a);
  // Settling a refusal (settle_refusal), no call is in flight: the
  // awaited collective is the refused one.
  const std::uint64_t awaited = current || refused == 0 ? collectives : refused - 1;
  std::string where =
      current        ? fmt::format("{} (collective #{}{})", describe(*current), collectives,
                            step < 0 ? ", at its start: before any data moved"
                                            : fmt::format(", step {}", step))
             : refused != 0 ? fmt::format("collective #{}, which this rank refused", awaited)
                     : "";
  if (!seg->rank_alive(peer)) {
    if (counter.value.load(std::memory_order_acquire) >= target) return;
    bool clean = area(peer).info.state.load(std::memory_order_acquire) == detail::kRankFinalized;
    std::string msg =
        fmt::format("rank {}: rank {} (pid {}) {} while rank {} waited for {}{}", rank, peer,
                    area(peer).info.pid.load(), clean ? "destroyed its communicator" : "died", rank,
                    what, where.empty() ? "" : " in " + where);
    fail(PeerFailureError(with_diagnosis(std::move(msg))));
  }
  if (Clock::now() >= deadline) {
    // Whoever times out first speaks for the job: name the ranks that never
    // started this collective, the usual culprits, not just our neighbour.
    std::string late;
    for (int r = 0; r < size; ++r)
      if (area(r).announced.value.load(std::memory_order_acquire) < awaited + 1)
        late += fmt::format("{}{}", late.empty() ? "" : ", ", r);
    fail(TimeoutError(with_diagnosis(fmt::format(
        "rank {}: timed out after {} s waiting for {} of rank {}{}{} (SHMRING_TIMEOUT sets "
        "the limit)",
        rank, config.timeout_s, what, peer, where.empty() ? "" : " in " + where,
        late.empty() ? ""
                     : fmt::format("; rank(s) {} never started collective #{}", late, awaited)))));
  }
}

int CommState::publish_cpu() {
  const int cpu = detail::current_cpu();
  if (cpu != published_cpu) {
    my_area().info.cpu.store(cpu, std::memory_order_relaxed);
    published_cpu = cpu;
  }
  return cpu;
}

int CommState::ranks_on(int cpu) {
  int k = 0;
  for (int r = 0; r < size; ++r)
    k += r != rank && area(r).info.cpu.load(std::memory_order_relaxed) == cpu;
  return k;
}

int CommState::claimed_move_off(int cpu, const std::function<bool()>& still_wanted) {
  // One mover at a time: two ranks that both saw a reason would otherwise
  // both move, to the same CPU.
  auto& mover = seg->header().mover;
  std::uint32_t none = 0;
  if (!mover.compare_exchange_strong(none, static_cast<std::uint32_t>(rank) + 1,
                                     std::memory_order_acq_rel))
    return kClaimLost;
  int moved = -1;
  if (still_wanted())
    moved = unstacker.move_off(
        cpu, [&](int c) { return ranks_on(c); },
        [&](int target) { my_area().info.cpu.store(target, std::memory_order_relaxed); });
  published_cpu = moved >= 0 ? moved : cpu;
  my_area().info.cpu.store(published_cpu, std::memory_order_relaxed);
  mover.store(0, std::memory_order_release);
  return moved;
}

bool CommState::keep_off_cpu_of(int peer) {
  const int cpu = publish_cpu();
  if (cpu < 0 || area(peer).info.cpu.load(std::memory_order_relaxed) != cpu) return true;
  // Whoever loses the claim stays (and skips its spin).
  bool stacked = true;
  const int moved = claimed_move_off(
      cpu, [&] { return stacked = area(peer).info.cpu.load(std::memory_order_acquire) == cpu; });
  return moved != kClaimLost && (!stacked || moved >= 0);
}

void CommState::spread_crowded() {
  // The rank's own threads only: the progress thread of non-blocking calls
  // would overwrite the CPU they publish.
  if (detail::t_helper_thread) return;
  const int cpu = publish_cpu();
  if (cpu < 0 || size < 2 || !unstacker.may_look()) return;
  // Cheap first, from what the ranks published (sorted, equal CPUs form
  // runs): does our CPU hold others while a CPU holds fewer of them, or
  // while a CPU may hold none (fewer CPUs in use than online)? Only then
  // the mask, a system call, and the claim.
  auto& cpus = crowd_cpus;
  cpus.clear();
  for (int r = 0; r < size; ++r)
    if (r != rank) cpus.push_back(area(r).info.cpu.load(std::memory_order_relaxed));
  std::sort(cpus.begin(), cpus.end());
  int mine = 0, least = size, in_use = 1;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j < cpus.size() && cpus[j] == cpus[i]) ++j;
    const int k = static_cast<int>(j - i);
    if (cpus[i] == cpu) {
      mine = k;
    } else if (cpus[i] >= 0) {
      least = std::min(least, k);
      ++in_use;
    }
    i = j;
  }
  static const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (mine == 0 || (least >= mine && in_use >= online)) return;
  // Not beside another program's busy task (placement.hpp): the
  // scheduler's placement is then as good as ours, and a move can be far
  // worse.
  if (detail::others_runnable(size)) {
    unstacker.quiet_for(std::chrono::milliseconds(10));
    return;
  }
  claimed_move_off(cpu, [] { return true; });
}

detail::WaitPolicy CommState::policy_for(int peer) {
  detail::WaitPolicy policy = base_policy();
  // Spin 0 (apply_placement, base_policy): yield, then sleep. The ranks
  // outnumber the CPUs: keep them spread evenly over them (placement.hpp).
  if (config.oversubscribed || crowded_by_job()) {
    spread_crowded();
    return policy;
  }
  if (peer >= 0 && !keep_off_cpu_of(peer)) {
    // Spinning only pays while the peer runs on a CPU of its own; on ours it
    // would only delay the peer (placement.hpp).
    policy.spin_ns = 0;
    return policy;
  }
  // The progress thread spins and yields as configured, for at most 200 us:
  // the CPU it would hold may be the one its own rank's compute thread
  // needs (as its idle polling, engine.cpp, and p2p's waits).
  if (detail::t_helper_thread) {
    policy.yield_ns = std::min(policy.yield_ns, detail::kHelperMaxYieldNs);
    return policy;
  }
  // The peer runs elsewhere: yielding gains it nothing, and with a task of
  // another program runnable here (foreign load) sched_yield hands that task
  // our CPU until its slice ends, while the peer's answer waits. Measured
  // under one busy loop per CPU on the 2-core VM (this policy against the
  // old one and Open MPI, which never yields; 4 interleaved runs each):
  // send/recv 64 KiB 14-83 us vs 823-3366 vs 14-173; allreduce 64 KiB
  // 15-19 vs 15-153 vs 17-397 (docs/performance/notes). Without foreign load a
  // spin and a yield loop cost the same.
  policy.spin_ns += policy.yield_ns;
  policy.yield_ns = 0;
  return policy;
}

std::string CommState::with_diagnosis(std::string msg) {
  // The first rank to see the stall speaks for the job (a later one finds
  // the abort word set and rethrows the first error instead).
  if (rec_n == 0) return msg;
  msg += "; " + job_summary();
  std::string path = dump_recorders(msg);
  if (!path.empty()) msg += fmt::format("; every rank's flight recorder: {}", path);
  return msg;
}

void CommState::wait_counter(detail::Counter& counter, std::uint64_t target, int peer,
                             const char* what) {
  if (counter.value.load(std::memory_order_acquire) >= target) return;
  wait_counter(counter, target, peer, what, policy_for(peer));
}

void CommState::wait_counter(detail::Counter& counter, std::uint64_t target, int peer,
                             const char* what, const detail::WaitPolicy& policy) {
  // A wait that outlasts the spin and yield phases is timed from its start
  // (stats() wait_ns), and the recorder head tells `shmrun --status` whom
  // this rank waits for, since when, at which step, from its first slow
  // check on (as the sleep phase begins). Shorter waits read no clock here:
  // two reads per wait cost 0.1-0.2 us of a 0.6 us allreduce at N=2
  // (docs/design/recorder.md).
  std::uint64_t t0 = 0;
  struct Done {
    CommState& c;
    const std::uint64_t& t0;
    ~Done() {
      if (t0 == 0) return;
      c.call_wait_ns += detail::mono_ns() - t0;
      if (c.rec_head) c.rec_head->wait_since_ns.store(0, std::memory_order_relaxed);
    }
  } done{*this, t0};
  // The deadline bounds each wait, not the whole collective: a huge buffer
  // may take longer than SHMRING_TIMEOUT while every step makes progress.
  // It starts at the first slow check, after the spin and yield phases.
  std::optional<Clock::time_point> wait_deadline;
  detail::wait_at_least(counter, target, policy, [&](Clock::time_point start) {
    if (!wait_deadline) {
      wait_deadline = deadline();
      // The wait's start on the mono_ns() timeline.
      const auto waited =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
      t0 = detail::mono_ns() - static_cast<std::uint64_t>(std::max<std::int64_t>(waited, 0));
      if (rec_head) {
        rec_head->step.store(step, std::memory_order_relaxed);
        rec_head->waiting_for.store(peer, std::memory_order_relaxed);
        rec_head->wait_since_ns.store(t0, std::memory_order_relaxed);
      }
    }
    check_progress(peer, what, *wait_deadline, counter, target);
  });
}

std::string CommState::unusable_message() const {
  return fmt::format("rank {}: communicator is unusable after an earlier error: {}", rank,
                     broken.value_or("unknown"));
}

void CommState::rethrow_abort(const detail::AbortInfo& a) {
  // A rank's first error carries the job's first error (its class and its
  // words); every later one reads "unusable after an earlier error" on every
  // rank alike, whichever error this rank saw first.
  // This rank's own InvalidArgumentError was its first error when the job's
  // is the mismatch its peers found in that rejected call.
  const bool blames_my_call =
      a.code == static_cast<std::uint32_t>(ErrorCode::mismatch) &&
      a.reason.find(fmt::format("rank {} made an invalid call", rank)) != std::string::npos;
  // So was a refusal not yet settled: whichever rank's view of it won the
  // abort word, this rank refused that call (settle_refusal).
  const bool follow_up = broken.has_value() || blames_my_call || refused != 0 ||
                         p2p_failed.load(std::memory_order_relaxed);
  broken = a.reason;
  record_failure();
  if (follow_up) throw AbortedError(unusable_message());
  throw_error(static_cast<ErrorCode>(a.code), a.reason);
}

void CommState::refuse_forked() const {
  throw InvalidArgumentError(fmt::format(
      "rank {} (forked child pid {}): this communicator belongs to process {} (rank {}); a forked "
      "child must create its own",
      rank, getpid(), seg->owner_pid(), rank));
}

void CommState::begin(const CollectiveDesc& d) {
  check_owner();
  if (broken) throw AbortedError(unusable_message());
  if (refused != 0) [[unlikely]]
    settle_refusal();
  if (detail::abort_claimed(seg->header())) [[unlikely]]
    if (auto a = detail::read_abort(seg->header())) rethrow_abort(*a);
  current = d;
  step = -1;
  call_wait_ns = 0;
  // A low-latency call whose line is free at once stamps its start after
  // publishing the line (start_deferred); every other call here.
  start_deferred =
      d.algorithm == Algorithm::low_latency && size > 1 && low_latency.read == collectives;
  if (!start_deferred) stamp_start();
  ring.left_checked = ring.right_checked = false;
  if (size == 1) return;
  auto& desc = my_area().desc[collectives % detail::kDescRing];
  desc.count.store(d.count, std::memory_order_relaxed);
  desc.kind.store(static_cast<std::uint32_t>(d.kind) | static_cast<std::uint32_t>(d.purpose) << 16,
                  std::memory_order_relaxed);
  desc.dtype.store(static_cast<std::uint32_t>(d.dtype), std::memory_order_relaxed);
  desc.op.store(static_cast<std::uint32_t>(d.op), std::memory_order_relaxed);
  desc.root.store(d.root, std::memory_order_relaxed);
  desc.algorithm.store(static_cast<std::uint32_t>(d.algorithm), std::memory_order_relaxed);
  desc.vhash.store(d.vhash, std::memory_order_relaxed);
  desc.aux.store(d.aux, std::memory_order_relaxed);
  desc.seq.store(collectives + 1, std::memory_order_release);
  if (pending.at_begin) pending.at_begin(*this);
  if (d.algorithm == Algorithm::ring) announce();
}

void CommState::stamp_start() {
  start_deferred = false;
  call_start_ns = call_clock.now();
  if (rec_n != 0)
    detail::recorder_write_call(rec_current(), collectives, *current, current_bytes,
                                detail::kCallStarted, call_start_ns);
}

void CommState::announce() {
  publish(my_area().announced, collectives + 1);
}

void CommState::wait_announced(int peer) {
  wait_counter(area(peer).announced, collectives + 1, peer, "the start of the collective");
  check_descriptor(peer);
}

void CommState::wait_every_announced() {
  for (int q = 0; q < size; ++q)
    if (q != rank) wait_announced(q);
  ring.left_checked = ring.right_checked = true;  // the slots need not check them again
}

std::byte* CommState::acquire_direct_buffer() {
  // Buffer (c mod 2) was last read in collective c-2: every rank must have
  // finished that one.
  // A staged collective (staged.cpp) used both buffers: wait until every
  // rank has finished it too.
  std::uint64_t need = std::max(staged_done_needed, collectives >= detail::kDirectBuffers
                                                        ? collectives - detail::kDirectBuffers + 1
                                                        : std::uint64_t{0});
  if (need > 0) {
    for (int q = 0; q < size; ++q)
      if (q != rank) wait_counter(area(q).done, need, q, "the end of an earlier collective");
  }
  return seg->direct(rank, collectives % detail::kDirectBuffers);
}

void CommState::fail_recv_counts(int peer) {
  fail(MismatchError(fmt::format(
      "rank {}: collective mismatch in collective #{} {}: rank {} passed different recv_counts; "
      "every rank must pass the same recv_counts",
      rank, collectives, describe(*current), peer)));
}

void CommState::check_descriptor(int peer) {
  // A peer runs at most K slots, 2 direct buffers or 32 eager-ring calls ahead, fewer than
  // kDescRing collectives: entry c is still ours to read. A torn read or a
  // different seq means the peer is in another collective: a mismatch too.
  // Ordering: begin() stores the fields (relaxed), then seq (release), then
  // announced (publish, seq_cst); we get here after an acquire of announced,
  // so the fields of this entry are visible. The re-read of seq after an
  // acquire fence is a safety net only: the writer does not mark the entry
  // busy before rewriting it, which is sound because it cannot reach this
  // entry again while we may still read it (the pace bound above).
  auto& desc = area(peer).desc[collectives % detail::kDescRing];
  std::uint64_t seq = desc.seq.load(std::memory_order_acquire);
  CollectiveDesc theirs = load_descriptor(desc);
  std::atomic_thread_fence(std::memory_order_acquire);
  bool torn = desc.seq.load(std::memory_order_relaxed) != seq;
  const CollectiveDesc& mine = *current;
  const bool has_op =
      mine.kind == CollectiveKind::allreduce || mine.kind == CollectiveKind::reduce ||
      mine.kind == CollectiveKind::reduce_scatter || mine.kind == CollectiveKind::reduce_scatter_v;
  const bool has_dtype = mine.kind != CollectiveKind::barrier;
  bool same = !torn && seq == collectives + 1 && theirs.kind == mine.kind &&
              theirs.count == mine.count && (!has_dtype || theirs.dtype == mine.dtype) &&
              theirs.root == mine.root && (!has_op || theirs.op == mine.op) &&
              theirs.purpose == mine.purpose;
  // The staged paths compare recv_counts themselves (and name the entry);
  // the ring (allgatherv_ring) has only this check.
  if (same && theirs.algorithm == mine.algorithm &&
      (mine.algorithm != Algorithm::ring ||
       desc.vhash.load(std::memory_order_relaxed) == mine.vhash))
    return;
  if (!torn && seq == collectives + 1 && theirs.kind == CollectiveKind::invalid) {
    fail(MismatchError(invalid_call_message(peer, collectives, mine)));
  }
  // The vector collectives whose recv_counts every rank must pass alike
  // hash them into the descriptor (staged.cpp compares them itself, and
  // names the entry); a peer on another path is told here.
  if (same &&
      (mine.kind == CollectiveKind::allgatherv || mine.kind == CollectiveKind::reduce_scatter_v) &&
      desc.vhash.load(std::memory_order_relaxed) != mine.vhash)
    fail_recv_counts(peer);
  // alltoallv chooses its path from the counts to and from the peer alone
  // (collective_set.cpp), so two paths mean the counts disagree.
  if (same && mine.kind == CollectiveKind::alltoallv)
    fail(MismatchError(fmt::format(
        "rank {}: collective mismatch in collective #{} {}: rank {} took another path for it: "
        "its send_counts or recv_counts disagree with this rank's (recv_counts[i] on rank j must "
        "equal send_counts[j] on rank i), or SHMRING_ALGO differs between the two",
        rank, collectives, describe(mine), peer)));
  if (same) {
    fail(MismatchError(fmt::format(
        "rank {}: collective #{} {} runs the {} algorithm here but the {} algorithm on rank {}: "
        "set SHMRING_ALGO and SHMRING_DIRECT_BYTES alike on every rank",
        rank, collectives, describe(mine), to_string(mine.algorithm), to_string(theirs.algorithm),
        peer)));
  }
  std::string their_call = torn || seq == 0 || seq > collectives + 1
                               ? std::string("a different collective")
                               : fmt::format("collective #{} {}", seq - 1, describe(theirs));
  fail(MismatchError(fmt::format(
      "rank {}: collective mismatch: rank {} called collective #{} {} but rank {} called {}; "
      "every rank must call the same collectives in the same order with the same count, "
      "datatype, operator and root",
      rank, rank, collectives, describe(mine), peer, their_call)));
}

std::uint64_t CommState::end() {
  if (start_deferred) [[unlikely]]
    stamp_start();
  if (pending.at_end) pending.at_end(*this);
  if (size > 1) publish(my_area().done, collectives + 1);
  std::uint64_t now = 0;
  if (current) {
    // After `done`: the peers need not wait for the bookkeeping. stats()
    // is booked by Impl::run (engine.cpp) from the same reading.
    now = call_clock.now();
    if (trace) trace_call(now, false);
    if (rec_n != 0) {
      detail::recorder_end_call(rec_current(), detail::kCallCompleted, now, step);
      rec_head->calls.store(rec_head->calls.load(std::memory_order_relaxed) + 1,
                            std::memory_order_relaxed);
      rec_head->bytes.store(rec_head->bytes.load(std::memory_order_relaxed) + current_bytes,
                            std::memory_order_relaxed);
    }
  }
  ++collectives;
  if (rec_n != 0 && ++rec_index == rec_n) rec_index = 0;
  completed.store(collectives, std::memory_order_relaxed);
  current.reset();
  step = -1;
  return now;
}

void CommState::trace_call(std::uint64_t end_ns, bool failed) {
  detail::TraceSpan s;
  s.desc = *current;
  s.seq = collectives;
  s.bytes = current_bytes;
  s.queued_ns = call_queued_ns;
  s.start_ns = call_start_ns;
  s.end_ns = end_ns;
  s.wait_ns = call_wait_ns;
  s.failed = failed;
  trace->add(s);
}

void CommState::record_failure() {
  if (start_deferred && current) stamp_start();
  if (trace && current && call_start_ns != 0) {
    trace_call(call_clock.now(), true);
    call_start_ns = 0;  // one span per call, however many failure paths see it
  }
  if (rec_n == 0 || !current) return;
  auto& e = rec_current();
  if (e.seq.load(std::memory_order_relaxed) != collectives + 1 ||
      e.state.load(std::memory_order_relaxed) != detail::kCallStarted)
    return;
  detail::recorder_end_call(e, detail::kCallFailed, call_clock.now(), step);
}

void CommState::init_recorder() {
  rec_head = seg->recorder(rank);
  if (rec_head == nullptr) return;
  rec_entries = reinterpret_cast<detail::RecorderEntry*>(rec_head + 1);
  rec_n = seg->recorder_entries();
  rec_index = rec_n == 0 ? 0 : collectives % rec_n;
  struct timespec rt {};
  clock_gettime(CLOCK_REALTIME, &rt);
  const std::uint64_t mono = detail::mono_ns();
  const std::uint64_t real =
      static_cast<std::uint64_t>(rt.tv_sec) * 1000000000u + static_cast<std::uint64_t>(rt.tv_nsec);
  rec_head->realtime_offset_ns.store(real - mono, std::memory_order_relaxed);
  rec_head->waiting_for.store(-1, std::memory_order_relaxed);
  rec_head->step.store(-1, std::memory_order_relaxed);
  rec_head->start_ns.store(mono, std::memory_order_release);
}

void CommState::fail(const Error& e) {
  record_failure();
  bool won = detail::raise_abort(*seg, size, static_cast<std::uint32_t>(e.code()), rank, e.what());
  auto a = detail::read_abort(seg->header());
  if (!won && a) {
    SHMRING_LOG(debug, "also saw: {}", e.what());
    rethrow_abort(*a);
  }
  broken = a ? a->reason : std::string(e.what());
  throw_error(e.code(), e.what(), e.sys_errno());
}

std::string CommState::invalid_call_message(int peer, std::uint64_t coll,
                                            const CollectiveDesc& mine) {
  // The refusal's seqlock (layout.hpp, Refusal): a text read between two
  // equal loads of seq = coll + 1 is the reason of this very call.
  const detail::Refusal& r = area(peer).refusal;
  std::array<std::uint64_t, detail::kRefusalWords> words{};
  std::string reason;
  if (r.seq.load(std::memory_order_acquire) == coll + 1) {
    for (std::size_t i = 0; i < words.size(); ++i)
      words[i] = r.text[i].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (r.seq.load(std::memory_order_relaxed) == coll + 1) {
      const char* text = reinterpret_cast<const char*>(words.data());
      reason.assign(text, strnlen(text, sizeof(words)));
    }
  }
  // "rank P made an invalid call" are the words rethrow_abort looks for.
  return fmt::format(
      "rank {}: collective mismatch: collective #{} {} cannot run: rank {} made an invalid call "
      "(it refused its arguments{})",
      rank, coll, describe(mine), peer,
      reason.empty() ? std::string("; its own error says why") : ": " + reason);
}

void CommState::publish_rejected(const std::string& reason) {
  if (broken) return;  // the peers hear of the first error instead
  // Two refusals in a row: the first is settled before the second is told.
  if (refused != 0) settle_refusal();
  // Peers that called this collective correctly must not wait for us: our
  // descriptor says "invalid call", which they report as a mismatch naming
  // this rank and `reason`. When every rank rejects the same call, nobody
  // waits and the communicator stays usable.
  if (size > 1) {
    detail::Refusal& r = my_area().refusal;
    std::array<std::uint64_t, detail::kRefusalWords> words{};
    std::memcpy(words.data(), reason.data(), std::min(reason.size(), sizeof(words) - 1));
    r.seq.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    for (std::size_t i = 0; i < words.size(); ++i)
      r.text[i].store(words[i], std::memory_order_relaxed);
    r.seq.store(collectives + 1, std::memory_order_release);
    auto& desc = my_area().desc[collectives % detail::kDescRing];
    desc.kind.store(static_cast<std::uint32_t>(CollectiveKind::invalid), std::memory_order_relaxed);
    desc.seq.store(collectives + 1, std::memory_order_release);
    announce();
    refused = collectives + 1;
    refused_reason = reason;
  }
  end();
}

std::optional<CollectiveDesc> CommState::read_descriptor(int peer, std::uint64_t coll) {
  // The descriptor ring's seqlock, as check_descriptor reads it.
  auto& desc = area(peer).desc[coll % detail::kDescRing];
  const std::uint64_t seq = desc.seq.load(std::memory_order_acquire);
  const CollectiveDesc theirs = load_descriptor(desc);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (seq != coll + 1 || desc.seq.load(std::memory_order_relaxed) != seq) return std::nullopt;
  return theirs;
}

std::optional<std::string> CommState::refusal_conflict(int q, std::uint64_t coll) {
  const std::optional<CollectiveDesc> theirs = read_descriptor(q, coll);
  if (theirs && theirs->kind == CollectiveKind::invalid) return std::nullopt;
  // q called it (or, torn or overwritten, something else). "rank R made an
  // invalid call" are the words rethrow_abort looks for.
  return fmt::format(
      "rank {}: collective mismatch: rank {} called {} but rank {} made an invalid call (it "
      "refused its arguments: {})",
      rank, q,
      theirs ? fmt::format("collective #{} {}", coll, describe(*theirs))
             : std::string("a different collective"),
      rank, refused_reason);
}

void CommState::settle_refusal() {
  // A peer that called the refused collective validly either waits for this
  // rank (and fails on reading the refusal: check_descriptor) or, on an
  // eager path, has already returned and would learn of it only at a later
  // check, after this rank's next call had run with it. So the refusing rank
  // settles it itself, before its next call publishes anything: that call
  // then fails on every rank that meets this one (docs/guide/errors.md,
  // "Refused calls that leave the communicator usable").
  const std::uint64_t coll = refused - 1;
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    wait_counter(area(q).announced, coll + 1, q, "the start");
    const std::optional<std::string> msg = refusal_conflict(q, coll);
    if (!msg) continue;
    detail::raise_abort(*seg, size, static_cast<std::uint32_t>(ErrorCode::mismatch), rank, *msg);
    auto a = detail::read_abort(seg->header());
    rethrow_abort(
        a ? *a : detail::AbortInfo{static_cast<std::uint32_t>(ErrorCode::mismatch), rank, *msg});
  }
  refused = 0;  // every rank refused it: nothing ran, nothing is owed
  refused_reason.clear();
}

void CommState::settle_refusal_at_exit() noexcept {
  // As settle_refusal, without waiting: a peer that has not started the
  // refused call yet will find this rank gone instead.
  if (refused == 0 || broken || seg == nullptr || seg->forked_away()) return;
  const std::uint64_t coll = refused - 1;
  try {
    for (int q = 0; q < size; ++q) {
      if (q == rank || area(q).announced.value.load(std::memory_order_acquire) < coll + 1) continue;
      if (const std::optional<std::string> msg = refusal_conflict(q, coll)) {
        detail::raise_abort(*seg, size, static_cast<std::uint32_t>(ErrorCode::mismatch), rank,
                            *msg);
        return;
      }
    }
  } catch (...) {
    // Leaving anyway: the peers then find this rank gone.
  }
}

}  // namespace shmring
