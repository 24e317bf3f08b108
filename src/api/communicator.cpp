#include <fmt/format.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "api/front_checks.hpp"
#include "base/config.hpp"
#include "base/log.hpp"
#include "base/placement.hpp"
#include "core/comm.hpp"
#include "engine/engine.hpp"
#include "kernels/copy.hpp"
#include "kernels/reduce.hpp"
#include "kernels/wide.hpp"
#include "shmring/version.hpp"
#include "transport/cma.hpp"

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

std::string Communicator::Impl::describe(const CollectiveDesc& d) const {
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

void Communicator::Impl::check_progress(int peer, const char* what, Clock::time_point deadline,
                                        const detail::Counter& counter, std::uint64_t target) {
  if (auto a = detail::read_abort(seg->header())) rethrow_abort(*a);
  std::string where = current
                          ? fmt::format("{} (collective #{}{})", describe(*current), collectives,
                                        step < 0 ? ", at its start, step 0: before any data moved"
                                                 : fmt::format(", step {}", step))
                          : "";
  if (!seg->rank_alive(peer)) {
    if (counter.value.load(std::memory_order_acquire) >= target) return;
    bool clean = area(peer).info.state.load(std::memory_order_acquire) == detail::kRankFinalized;
    fail(PeerFailureError(
        fmt::format("rank {}: rank {} (pid {}) {} while rank {} waited for {} in {}", rank, peer,
                    area(peer).info.pid.load(), clean ? "destroyed its communicator" : "died", rank,
                    what, where)));
  }
  if (Clock::now() >= deadline) {
    // Whoever times out first speaks for the job: name the ranks that never
    // started this collective, the usual culprits, not just our neighbour.
    std::string late;
    for (int r = 0; r < size; ++r)
      if (area(r).announced.value.load(std::memory_order_acquire) < collectives + 1)
        late += fmt::format("{}{}", late.empty() ? "" : ", ", r);
    fail(TimeoutError(fmt::format(
        "rank {}: timed out after {} s waiting for {} of rank {} in {}{} (SHMRING_TIMEOUT sets "
        "the limit)",
        rank, config.timeout_s, what, peer, where,
        late.empty()
            ? ""
            : fmt::format("; rank(s) {} never started collective #{}", late, collectives))));
  }
}

bool Communicator::Impl::keep_off_cpu_of(int peer) {
  int cpu = detail::current_cpu();
  if (cpu != published_cpu) {
    my_area().info.cpu.store(cpu, std::memory_order_relaxed);
    published_cpu = cpu;
  }
  if (cpu < 0 || area(peer).info.cpu.load(std::memory_order_relaxed) != cpu) return true;
  // One mover at a time; whoever loses the claim stays (and skips its spin).
  auto& mover = seg->header().mover;
  std::uint32_t none = 0;
  if (!mover.compare_exchange_strong(none, static_cast<std::uint32_t>(rank) + 1,
                                     std::memory_order_acq_rel))
    return false;
  int moved = -1;
  bool stacked = area(peer).info.cpu.load(std::memory_order_acquire) == cpu;
  if (stacked) {
    moved = unstacker.move_off(
        cpu,
        [&](int c) {
          for (int r = 0; r < size; ++r)
            if (r != rank && area(r).info.cpu.load(std::memory_order_relaxed) == c) return true;
          return false;
        },
        [&](int target) { my_area().info.cpu.store(target, std::memory_order_relaxed); });
    if (moved >= 0) stacked = false;
  }
  published_cpu = moved >= 0 ? moved : cpu;
  my_area().info.cpu.store(published_cpu, std::memory_order_relaxed);
  mover.store(0, std::memory_order_release);
  return !stacked;
}

detail::WaitPolicy Communicator::Impl::policy_for(int peer) {
  detail::WaitPolicy policy = wait_policy;
  if (config.oversubscribed) return policy;  // spin 0 (apply_placement): yield, then sleep
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
  // 15-19 vs 15-153 vs 17-397 (bench/README.md). Without foreign load a
  // spin and a yield loop cost the same.
  policy.spin_ns += policy.yield_ns;
  policy.yield_ns = 0;
  return policy;
}

void Communicator::Impl::wait_counter(detail::Counter& counter, std::uint64_t target, int peer,
                                      const char* what) {
  if (counter.value.load(std::memory_order_acquire) >= target) return;
  detail::WaitPolicy policy = policy_for(peer);
  // The deadline bounds each wait, not the whole collective: a huge buffer
  // may take longer than SHMRING_TIMEOUT while every step makes progress.
  // It starts at the first slow check, after the spin and yield phases.
  std::optional<Clock::time_point> wait_deadline;
  detail::wait_at_least(counter, target, policy, [&] {
    if (!wait_deadline) wait_deadline = deadline();
    check_progress(peer, what, *wait_deadline, counter, target);
  });
}

std::byte* Communicator::Impl::acquire_send_slot() {
  const std::uint64_t k = seg->slots();
  // Slot (sent mod K) is free once the right neighbour consumed slice sent-K.
  if (sent >= k) {
    const std::uint64_t need = sent - k + 1;
    if (!right_checked && area(right).consumed.value.load(std::memory_order_acquire) < need) {
      // Before waiting on the right, check that it runs this collective as
      // we do: a right that disagrees on the root of a chain believes
      // itself first and never reads our slots, so it never checks our
      // descriptor either (its wait_recv_slot does that for its left).
      wait_announced(right);
      right_checked = true;
    }
    wait_counter(area(right).consumed, need, right, "a free slot");
  }
  return seg->slot(rank, sent % k);
}

void Communicator::Impl::publish_send() {
  publish(my_area().produced, ++sent);
}

const std::byte* Communicator::Impl::wait_recv_slot() {
  if (!left_checked) {
    // Check left's descriptor before using its data (and even if it never
    // writes to us: a rank that disagrees may wait for us in turn).
    wait_announced(left);
    left_checked = true;
  }
  wait_counter(area(left).produced, recvd + 1, left, "data");
  return seg->slot(left, recvd % seg->slots());
}

void Communicator::Impl::release_recv() {
  publish(my_area().consumed, ++recvd);
}

Algorithm Communicator::Impl::choose(CollectiveKind kind, std::uint64_t payload, bool wide) const {
  // Barriers and allreduces whose data fits one line travel in one line per
  // rank unless an algorithm is forced (SHMRING_ALGO=direct keeps testing
  // the direct path at every size).
  if (kind == CollectiveKind::barrier) return Algorithm::low_latency;
  if ((kind == CollectiveKind::allreduce || kind == CollectiveKind::allgather ||
       kind == CollectiveKind::alltoall) &&
      payload <= detail::kLowLatencyBytes && !forced_algorithm && size > 1)
    return Algorithm::low_latency;
  // allgather at N=2 on CPUs of their own, blocks of 4 KiB to 2 MiB: the
  // staged rounds (allgatherv's, staged.cpp), whose single-copy round reads
  // each block straight from its writer. allgather_perf at N=2 on the Intel
  // VM of bench/README.md (tenth session), total size, direct or ring /
  // staged / staged with SHMRING_CMA=0, us: 8 KiB 1.35-1.38 / 1.27-1.28 /
  // 1.29-1.31; 32 KiB 4.34-4.35 / 2.00-2.02 / 3.51-3.57; 128 KiB
  // 11.4-11.7 / 4.51-4.53 / 8.56-8.71; 512 KiB 31.4-32.2 / 14.5-15.1 /
  // 32.5-33.3; 2 MiB 174-176 / 128-132 / 187-192 (Open MPI at 32 KiB 2.59,
  // 256 KiB 8.50, 1 MiB 40.4, 2 MiB 165). At 1 MiB blocks two copies
  // (where a rank cannot read another's memory) lose 7% to the ring, one
  // copy gains 25%; from 2 MiB blocks the ring stays: one copy gained 4-6%
  // there (4 MiB in all: 339-348 against 355-372; Open MPI 340-355), two
  // copies lost up to 25% (uneven allgatherv, 16 MiB). Up to 2 KiB blocks,
  // and at N=3, 4 on the 2 CPUs, the paths were level.
  //   Oversubscribed, every wait can cost a context switch, and there is no
  // single copy for allgather (staged.cpp single_copy_min): the staged
  // rounds win only where they wait less often than the ring, whose slots
  // (256 KiB by default) carry a block piecewise, while a big round carries
  // half the slot area (512 KiB). N=2 under `taskset -c 0` (eleventh
  // session, total size, ring / staged, us): 256 KiB 12.8 / 14.7; 362 KiB
  // 20.3-21.4 / 19.0; 512 KiB 40.6-42.6 / 27.6-28.3; 1 MiB 125.7-127.0 /
  // 96.4-98.1; 1.4 MiB 180.6-182.3 / 179.0-180.9; 2 MiB 256-260 / 296-298.
  // The node communicators of shmring's MPI layer on fake nodes meet this
  // (2 x 2 ranks on 2 CPUs: 512 KiB blocks in a 1 MiB allreduce). Every
  // input here is the same on every rank.
  if (kind == CollectiveKind::allgather && size == 2 && !forced_algorithm) {
    const bool staged = config.oversubscribed ? payload >= 160 * 1024 && payload < 640 * 1024
                                              : payload >= 4 * 1024 && payload < 2 * 1024 * 1024;
    if (staged) return Algorithm::staged;
  }
  if (forced_algorithm == Algorithm::two_shot && kind == CollectiveKind::allreduce)
    return Algorithm::two_shot;  // any size: the rounds carry what the buffer cannot
  if (forced_algorithm == Algorithm::ring) return Algorithm::ring;
  if (payload > seg->direct_bytes()) {
    // Past the direct buffer at N > 2, the two-shot rounds (two_shot.cpp)
    // where measured faster than the ring (docs/design/algorithms.md):
    //   - a 16-bit sum, prod or avg: the ring's reduce-scatter would carry
    //     float64 partials, 4x the data's bytes; the rounds reduce every
    //     rank's 16-bit copy in registers. N=4 on the 2-CPU VM, bfloat16:
    //     1 MiB 356 us against 1457 with the ring, 64 MiB 26.5 ms against 84.
    //   - ranks that share CPUs: two synchronisations a round instead of
    //     2(N-1) ring steps a slice, each a likely context switch. float32,
    //     2-CPU VM, ring / rounds, us: N=3 128 KiB 46 / 43, 1 MiB 334 / 226,
    //     16 MiB 5755 / 4035; N=4 256 KiB 108 / 87, 1 MiB 405 / 297, 64 MiB
    //     34313 / 19979; N=8 1 MiB 1078 / 780, 16 MiB 18779 / 10190.
    //   At N=2 the ring's two steps stay ahead (float32 1 MiB 69 / 83 us);
    //   ranks on CPUs of their own keep the ring for other datatypes until
    //   measured.
    if (kind == CollectiveKind::allreduce && size > 2 && !forced_algorithm &&
        (wide || config.oversubscribed))
      return Algorithm::two_shot;
    return Algorithm::ring;
  }
  if (forced_algorithm == Algorithm::direct) return Algorithm::direct;
  if (kind == CollectiveKind::allreduce) {
    // Measured crossovers (allreduce_perf, SHMRING_ALGO=direct|ring, float32;
    // bench/README.md). The choice depends only on N and on oversubscription,
    // which every rank computes alike from the same masks.
    //   N=2 (2-core VM): the ring's two steps beat reading both buffers from
    //     1 KiB on (4 KiB: 0.60 vs 0.88 us, 64 KiB: 9.5-10.2 vs 10.9-11.1 us).
    //   Ranks on CPUs of their own (16-core device, N=4, 8, 16): direct wins
    //     up to 4 KiB (N=16: 14.8 vs 19.2 us), the ring from 8 KiB (N=16:
    //     20.7 vs 27.0 us; 64 KiB: 47.8 vs 197 us).
    //   Oversubscribed (N=3, 4 on 2 cores): every ring step can wait for a
    //     context switch, so the one-shot path wins longer: at N=3 up to
    //     16 KiB (32 KiB: ring 11.9 vs 13.1 us), at N=4 still at 128 KiB
    //     (50-61 vs 58-75 us), past the default direct buffer.
    //   Oversubscribed, N >= 4 (2-core VM, 2026-11-30): the two-shot path
    //     beats the one-shot from 32 KiB at N=4 (18.1 vs 19.4 us; 64 KiB:
    //     28.1 vs 42.3) and from 16 KiB at N=8 (30.8 vs 35.7 us; 64 KiB:
    //     48.0 vs 94.5), where reading N whole buffers costs more than a
    //     second synchronisation; below, the one-shot wins (N=8, 8 KiB: 19.8
    //     vs 22.6 us). Ranks on cores of their own: not measured yet.
    std::uint64_t limit = 4 * 1024;
    if (size == 2)
      limit = 512;
    else if (config.oversubscribed)
      limit = size == 3 ? 16 * 1024 : payload;
    if (config.oversubscribed && size >= 4 && payload > (size >= 8 ? 8 * 1024 : 16 * 1024))
      return Algorithm::two_shot;
    if (payload > limit) return Algorithm::ring;
  }
  return Algorithm::direct;
}

std::string Communicator::Impl::unusable_message() const {
  return fmt::format("rank {}: communicator is unusable after an earlier error: {}", rank,
                     broken.value_or("unknown"));
}

void Communicator::Impl::rethrow_abort(const detail::AbortInfo& a) {
  // A rank's first error carries the job's first error (its class and its
  // words); every later one reads "unusable after an earlier error" on every
  // rank alike, whichever error this rank saw first.
  // This rank's own InvalidArgumentError was its first error when the job's
  // is the mismatch its peers found in that rejected call.
  const bool blames_my_call =
      a.code == static_cast<std::uint32_t>(ErrorCode::mismatch) &&
      a.reason.find(fmt::format("rank {} made an invalid call", rank)) != std::string::npos;
  const bool follow_up =
      broken.has_value() || blames_my_call || p2p_failed.load(std::memory_order_relaxed);
  broken = a.reason;
  if (follow_up) throw AbortedError(unusable_message());
  throw_error(static_cast<ErrorCode>(a.code), a.reason);
}

void Communicator::Impl::check_owner() const {
  if (!seg->forked_away()) return;
  throw InvalidArgumentError(fmt::format(
      "rank {} (forked child pid {}): this communicator belongs to process {} (rank {}); a forked "
      "child must create its own",
      rank, getpid(), seg->owner_pid(), rank));
}

void Communicator::Impl::begin(const CollectiveDesc& d) {
  check_owner();
  if (broken) throw AbortedError(unusable_message());
  if (auto a = detail::read_abort(seg->header())) rethrow_abort(*a);
  current = d;
  step = -1;
  left_checked = right_checked = false;
  if (size == 1) return;
  auto& desc = my_area().desc[collectives % detail::kDescRing];
  desc.count.store(d.count, std::memory_order_relaxed);
  desc.kind.store(static_cast<std::uint32_t>(d.kind), std::memory_order_relaxed);
  desc.dtype.store(static_cast<std::uint32_t>(d.dtype), std::memory_order_relaxed);
  desc.op.store(static_cast<std::uint32_t>(d.op), std::memory_order_relaxed);
  desc.root.store(d.root, std::memory_order_relaxed);
  desc.algorithm.store(static_cast<std::uint32_t>(d.algorithm), std::memory_order_relaxed);
  desc.vhash.store(d.vhash, std::memory_order_relaxed);
  desc.aux.store(d.aux, std::memory_order_relaxed);
  desc.seq.store(collectives + 1, std::memory_order_release);
  if (eager_scatter_unchecked != 0) check_eager_scatter();
  if (d.algorithm == Algorithm::ring) announce();
}

void Communicator::Impl::announce() {
  publish(my_area().announced, collectives + 1);
}

void Communicator::Impl::wait_announced(int peer) {
  wait_counter(area(peer).announced, collectives + 1, peer, "the start of the collective");
  check_descriptor(peer);
}

std::byte* Communicator::Impl::acquire_direct_buffer() {
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

void Communicator::Impl::fail_recv_counts(int peer) {
  fail(MismatchError(fmt::format(
      "rank {}: collective mismatch in collective #{} {}: rank {} passed different recv_counts; "
      "every rank must pass the same recv_counts",
      rank, collectives, describe(*current), peer)));
}

void Communicator::Impl::check_descriptor(int peer) {
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
  CollectiveDesc theirs{static_cast<CollectiveKind>(desc.kind.load(std::memory_order_relaxed)),
                        desc.count.load(std::memory_order_relaxed),
                        static_cast<DataType>(desc.dtype.load(std::memory_order_relaxed)),
                        static_cast<ReduceOp>(desc.op.load(std::memory_order_relaxed)),
                        desc.root.load(std::memory_order_relaxed),
                        static_cast<Algorithm>(desc.algorithm.load(std::memory_order_relaxed))};
  std::atomic_thread_fence(std::memory_order_acquire);
  bool torn = desc.seq.load(std::memory_order_relaxed) != seq;
  const CollectiveDesc& mine = *current;
  const bool has_op =
      mine.kind == CollectiveKind::allreduce || mine.kind == CollectiveKind::reduce ||
      mine.kind == CollectiveKind::reduce_scatter || mine.kind == CollectiveKind::reduce_scatter_v;
  const bool has_dtype = mine.kind != CollectiveKind::barrier;
  bool same = !torn && seq == collectives + 1 && theirs.kind == mine.kind &&
              theirs.count == mine.count && (!has_dtype || theirs.dtype == mine.dtype) &&
              theirs.root == mine.root && (!has_op || theirs.op == mine.op);
  // The staged paths compare recv_counts themselves (and name the entry);
  // the ring (allgatherv_ring) has only this check.
  if (same && theirs.algorithm == mine.algorithm &&
      (mine.algorithm != Algorithm::ring ||
       desc.vhash.load(std::memory_order_relaxed) == mine.vhash))
    return;
  if (!torn && seq == collectives + 1 && theirs.kind == CollectiveKind::invalid) {
    fail(MismatchError(fmt::format(
        "rank {}: collective mismatch: collective #{} {} cannot run: rank {} made an invalid call "
        "(it refused its arguments; its own error says why)",
        rank, collectives, describe(mine), peer)));
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

void Communicator::Impl::end() {
  if (eager_unchecked != 0 && eager_unchecked <= collectives) check_eager_gather();
  if (eager_pending_count > 0)  // staged.cpp "Eager rings": a collective's confirmations
    confirm_eager_ring(
        collectives >= detail::kEagerEntries ? collectives - detail::kEagerEntries + 1 : 0,
        eager_ring_call ? 0 : collectives);
  eager_ring_call = false;
  if (size > 1) publish(my_area().done, collectives + 1);
  ++collectives;
  completed.store(collectives, std::memory_order_relaxed);
  current.reset();
  step = -1;
}

void Communicator::Impl::fail(const Error& e) {
  bool won = detail::raise_abort(*seg, size, static_cast<std::uint32_t>(e.code()), rank, e.what());
  auto a = detail::read_abort(seg->header());
  if (!won && a) {
    SHMRING_LOG(debug, "also saw: {}", e.what());
    rethrow_abort(*a);
  }
  broken = a ? a->reason : std::string(e.what());
  throw_error(e.code(), e.what(), e.sys_errno());
}

namespace {
// Below this many bytes a kernel runs on the calling thread: splitting costs
// more than it gains (about 100k cycles of work per task, as oneTBB advises).
constexpr std::size_t kParallelMinBytes = 256 * 1024;
constexpr std::size_t kGrainBytes = 64 * 1024;
}  // namespace

void Communicator::Impl::reduce(void* dst, const void* a, const void* b, std::size_t n, DataType dt,
                                ReduceOp op, int divisor) {
  const std::size_t es = datatype_size(dt);
  if (!arena || n * es < kParallelMinBytes) {
    detail::reduce(dst, a, b, n, dt, op, divisor);
    return;
  }
  arena->execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, n, std::max<std::size_t>(1, kGrainBytes / es)),
        [&](const tbb::blocked_range<std::size_t>& r) {
          const std::size_t off = r.begin() * es;
          detail::reduce(static_cast<std::byte*>(dst) + off, static_cast<const std::byte*>(a) + off,
                         static_cast<const std::byte*>(b) + off, r.size(), dt, op, divisor);
        },
        tbb::static_partitioner());
  });
}

namespace {

// Runs copy_fn(dst + off, src + off, n) over [0, bytes): on the calling thread
// when there is no arena or the copy is small, else in 64 KiB grains across
// the rank's arena (each grain's stores complete before the arena joins).
template <class CopyFn>
void copy_in_grains(tbb::task_arena* arena, void* dst, const void* src, std::size_t bytes,
                    CopyFn copy_fn) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  if (!arena || bytes < kParallelMinBytes) {
    copy_fn(d, s, bytes);
    return;
  }
  arena->execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, bytes, kGrainBytes),
        [&](const tbb::blocked_range<std::size_t>& r) {
          copy_fn(d + r.begin(), s + r.begin(), r.size());
        },
        tbb::static_partitioner());
  });
}

}  // namespace

void Communicator::Impl::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  copy_in_grains(arena.get(), dst, src, bytes,
                 [](std::byte* d, const std::byte* s, std::size_t n) { std::memcpy(d, s, n); });
}

void Communicator::Impl::copy_to_slot(std::byte* slot, const void* src, std::size_t bytes) {
  // On the 2-core Zen 4 VM (N=2, 256 KiB slots), streaming slices of 32-128
  // KiB cut the time by 20-30%; below 16 KiB the reader's trip to memory
  // costs more than a cross-core snoop, and from 256 KiB the slots overflow
  // the writer's L2 into the shared L3, which beats memory. On an Intel Xeon
  // streaming was 1.5x slower from 64 KiB and equal below (bench/README.md):
  // hence the vendor test in streaming_pays_off().
  constexpr std::size_t kNtMinBytes = 16 * 1024, kNtMaxBytes = 128 * 1024;
  const bool nt = config.nt_stores == NtStores::always ||
                  (config.nt_stores == NtStores::automatic && detail::streaming_pays_off() &&
                   bytes >= kNtMinBytes && bytes <= kNtMaxBytes);
  if (!nt) {
    copy(slot, src, bytes);
    return;
  }
  if (bytes == 0) return;
  // copy_streaming fences its own stores, so each grain's are visible before
  // the arena joins and publish_send()'s release store follows.
  copy_in_grains(
      arena.get(), slot, src, bytes,
      [](std::byte* d, const std::byte* s, std::size_t n) { detail::copy_streaming(d, s, n); });
}

// ---------------------------------------------------------------------------

Communicator::Communicator() : Communicator(Options{}) {}

Communicator::Communicator(int rank, int world_size, std::string job_id)
    : Communicator([&] {
        Options o;
        o.rank = rank;
        o.world_size = world_size;
        o.job_id = std::move(job_id);
        return o;
      }()) {}

// Every setting of this rank (options, then the environment), checked
// before attaching. Throws InvalidArgumentError; the constructor tells the
// peers.
void Communicator::Impl::settings(const Options& options) {
  Config& cfg = config;
  detail::resolve_settings(options, cfg);
  if (cfg.algorithm == "ring")
    forced_algorithm = Algorithm::ring;
  else if (cfg.algorithm == "direct")
    forced_algorithm = Algorithm::direct;
  else if (cfg.algorithm == "two_shot")
    forced_algorithm = Algorithm::two_shot;
  detail::set_log_rank(cfg.rank);
  cfg.progress_cpu = progress_cpu = detail::progress_cpu_from_env(cfg.rank);
  // Resolved with the other settings (base/config.cpp); Impl keeps copies.
  cma_mode = cfg.cma;
  cma_min_bytes = cfg.cma_min_bytes;
  cma_large = cfg.cma_large;
  // Asked for explicitly: let the peers read us even under Yama's
  // ptrace_scope=1 (any process of this user may then attach to us).
  if (cma_mode == 1 && detail::settings::text("SHMRING_CMA")) detail::allow_cma_readers();
  rank = cfg.rank;
  size = cfg.world_size;
  left = (rank + size - 1) % size;
  right = (rank + 1) % size;
  // A bad SHMRING_MEMBARRIER fails here; the result is published as the
  // rank attaches.
  asymmetric_fence_ok = detail::register_asymmetric_fence();
}

Communicator::Communicator(const Options& options) : impl_(std::make_unique<Impl>()) {
  Impl& c = *impl_;
  c.config = detail::resolve_identity(options);
  Config& cfg = c.config;
  const std::uint64_t host = detail::host_hash();
  cfg.segment_name = detail::segment_name(cfg.job_id, host);
  detail::SegmentRequest req;
  req.name = cfg.segment_name;
  req.rank = cfg.rank;
  req.world_size = cfg.world_size;
  req.host_hash = host;
  req.job_id = cfg.job_id;
  try {
    c.settings(options);
  } catch (const InvalidArgumentError& e) {
    // A setting only this rank has wrong: its peers would wait for it until
    // SHMRING_TIMEOUT. Tell them through the segment (rank 0 makes one that
    // says so), so that every rank fails now with this message.
    const std::string m = e.what();
    const std::string why = m.rfind("rank ", 0) == 0 ? m : fmt::format("rank {}: {}", cfg.rank, m);
    req.refusal = why;
    double timeout_s = cfg.timeout_s > 0 ? cfg.timeout_s : detail::kDefaultTimeoutS;
    if (cfg.timeout_s <= 0 && options.timeout_s <= 0) {
      try {
        timeout_s = detail::settings::number("SHMRING_TIMEOUT").value_or(timeout_s);
      } catch (const InvalidArgumentError&) {
      }
    }
    req.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(timeout_s));
    try {
      (void)detail::Segment::create_or_attach(req);
    } catch (...) {
      // Told as far as it could be; this rank's own error is the one to raise.
    }
    throw InvalidArgumentError(why);
  }
  req.slots = cfg.slots;
  req.slot_bytes = cfg.slot_bytes;
  req.direct_bytes = cfg.direct_bytes;
  req.deadline = c.deadline();
  req.asymmetric_fence = c.asymmetric_fence_ok;
  req.oversubscribed = cfg.oversubscribed_request;
  // Automatic: the job's crowding, where this process knows of it, counts
  // for this communicator too (config.hpp job_crowding_hint); published, so
  // every rank of the communicator agrees.
  const std::string crowding = req.oversubscribed < 0 ? detail::job_crowding_hint() : "";
  if (!crowding.empty()) req.oversubscribed = 1;
  c.seg = detail::Segment::create_or_attach(req);
  cfg.slots = c.seg->slots();
  cfg.slot_bytes = c.seg->slot_bytes();
  cfg.direct_bytes = c.seg->direct_bytes();
  cfg.segment_bytes = c.seg->total_bytes();
  c.seg->wait_all_attached(req.deadline);
  detail::apply_placement(cfg, detail::affinity_cpus(), c.seg->job_cpus(),
                          c.seg->oversubscribed_request());
  if (cfg.oversubscribed) c.crowded.emplace();
  if (!crowding.empty()) SHMRING_LOG(info, "rank {}: waits never spin: {}", cfg.rank, crowding);
  cfg.asymmetric_fence = c.seg->all_asymmetric_fence();
  c.light_publish = cfg.asymmetric_fence;
  c.wait_policy.spin_ns = static_cast<std::int64_t>(cfg.spin_us * 1000);
  c.wait_policy.yield_ns = static_cast<std::int64_t>(cfg.yield_us * 1000);
  if (cfg.threads > 1) c.arena = std::make_unique<tbb::task_arena>(cfg.threads);
  c.unstacker = detail::Unstacker(cfg.migrate);
  // Measured here, once per process, after placement and outside any
  // collective's time.
  double cma_ratio = 0;
  if (c.cma_mode == 1 && c.cma_large < 0) {
    cma_ratio = detail::cma_copy_ratio();
    c.cma_large = cma_ratio <= detail::kCmaLargeMaxRatio ? 1 : 0;
  }

  SHMRING_LOG(info,
              "shmring {} rank {}/{} (local {}/{}) job '{}': segment '{}' {} bytes, slots={} "
              "slot_bytes={} slice_bytes={} direct_bytes={} algorithm={} threads={} kernels={} "
              "timeout={}s spin={}us yield={}us nt_stores={} ({}) migrate={} job_cpus={} cma={} "
              "cma_large={} (copy ratio {}) membarrier={}{}",
              SHMRING_VERSION_STRING, cfg.rank, cfg.world_size, cfg.local_rank,
              cfg.local_world_size, cfg.job_id, cfg.segment_name, cfg.segment_bytes, cfg.slots,
              cfg.slot_bytes, cfg.slice_bytes, cfg.direct_bytes, cfg.algorithm, cfg.threads,
              detail::kernel_isa(), cfg.timeout_s, cfg.spin_us, cfg.yield_us,
              cfg.nt_stores == NtStores::automatic ? "auto"
              : cfg.nt_stores == NtStores::always  ? "always"
                                                   : "never",
              detail::copy_streaming_isa(), cfg.migrate ? 1 : 0, cfg.job_cpus, c.cma_mode,
              c.cma_large,
              cma_ratio > 0 ? fmt::format("{:.2f}", cma_ratio) : std::string("not measured"),
              c.light_publish ? 1 : 0, cfg.oversubscribed ? " (oversubscribed)" : "");
}

Communicator::~Communicator() {
  // In a child forked from this rank, the reduction threads are the parent's
  // (they do not exist here): leave the arena alone rather than join them.
  // Impl::~Impl does the same for the progress thread (engine.cpp).
  if (impl_ && impl_->seg && impl_->seg->forked_away()) (void)impl_->arena.release();
}
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

int Communicator::rank() const noexcept {
  return impl_->rank;
}
int Communicator::size() const noexcept {
  return impl_->size;
}
int Communicator::local_rank() const noexcept {
  return impl_->config.local_rank;
}
int Communicator::local_size() const noexcept {
  return impl_->config.local_world_size;
}
const Config& Communicator::config() const noexcept {
  return impl_->config;
}
std::uint64_t Communicator::collective_count() const noexcept {
  return impl_->completed.load(std::memory_order_relaxed);
}

void Communicator::abort(const std::string& reason) {
  Impl& c = *impl_;
  c.check_owner();
  detail::raise_abort(*c.seg, c.size, static_cast<std::uint32_t>(ErrorCode::aborted), c.rank,
                      fmt::format("rank {}: aborted the job: {}", c.rank, reason));
  // This thread's (or another's) next wait or call sees the abort word;
  // `broken` is only written by the thread running collectives.
}

namespace front {

// Argument checks. Each throws InvalidArgumentError naming the rank, the
// collective, the value and what was expected. Shared with collective_set.cpp
// (front_checks.hpp).
void check_dtype(const Communicator::Impl& c, const char* what, DataType dtype) {
  if (static_cast<unsigned>(dtype) >= static_cast<unsigned>(kNumDataTypes))
    throw InvalidArgumentError(fmt::format("rank {}: {}: datatype {} is not a DataType (0..{})",
                                           c.rank, what, static_cast<int>(dtype),
                                           kNumDataTypes - 1));
}

void check_op(const Communicator::Impl& c, const char* what, DataType dtype, ReduceOp op) {
  if (static_cast<unsigned>(op) >= static_cast<unsigned>(kNumReduceOps))
    throw InvalidArgumentError(fmt::format("rank {}: {}: operator {} is not a ReduceOp (0..{})",
                                           c.rank, what, static_cast<int>(op), kNumReduceOps - 1));
  if (op == ReduceOp::avg && !is_floating(dtype))
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: avg needs a floating datatype, got {}; use sum and divide",
                    c.rank, what, to_string(dtype)));
}

void check_root(const Communicator::Impl& c, const char* what, int root) {
  if (root < 0 || root >= c.size)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: root {} is not a rank of this communicator (0..{})", c.rank, what,
                    root, c.size - 1));
}

// Bytes of `count` elements times `factor`, refusing overflow.
std::size_t checked_bytes(const Communicator::Impl& c, const char* what, std::size_t count,
                          DataType dtype, std::size_t factor) {
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(count, datatype_size(dtype) * factor, &bytes) ||
      bytes > (std::numeric_limits<std::size_t>::max() >> 2))
    throw InvalidArgumentError(fmt::format("rank {}: {}: count {} of {} (x{}) overflows", c.rank,
                                           what, count, to_string(dtype), factor));
  return bytes;
}

void check_pointer(const Communicator::Impl& c, const char* what, const char* name, const void* p,
                   std::size_t bytes) {
  if (bytes > 0 && p == nullptr)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: {} is null but holds {} bytes", c.rank, what, name, bytes));
}

// [a, a+a_bytes) and [b, b+b_bytes) must not overlap, except that b may be
// exactly `in_place` (the collective's in-place form).
void check_disjoint(const Communicator::Impl& c, const char* what, const void* a,
                    std::size_t a_bytes, const void* b, std::size_t b_bytes, const void* in_place,
                    const char* in_place_rule) {
  if (a_bytes == 0 || b_bytes == 0 || b == in_place) return;
  auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  if (x < y + b_bytes && y < x + a_bytes)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: send and recv overlap without being the in-place form ({})",
                    c.rank, what, in_place_rule));
}

}  // namespace front
using namespace front;

void Communicator::Impl::reject_call(const InvalidArgumentError& e) {
  check_owner();
  if (broken) throw AbortedError(unusable_message());
  publish_rejected();
  throw e;
}

void Communicator::Impl::publish_rejected() {
  if (broken) return;  // the peers hear of the first error instead
  // Peers that called this collective correctly must not wait for us: our
  // descriptor says "invalid call", which they report as a mismatch. When
  // every rank rejects the same call, nobody waits and the communicator
  // stays usable.
  if (size > 1) {
    auto& desc = my_area().desc[collectives % detail::kDescRing];
    desc.kind.store(static_cast<std::uint32_t>(CollectiveKind::invalid), std::memory_order_relaxed);
    desc.seq.store(collectives + 1, std::memory_order_release);
    announce();
  }
  end();
}

template <class F>
void Communicator::Impl::validated(F&& checks) {
  try {
    checks();
  } catch (const InvalidArgumentError& e) {
    reject(e);  // in call order: inline, or queued behind pending requests
  }
}

// ---- Front: argument checks and descriptors. Each make_* validates on the
// caller's thread (a refused call is published in order by reject()) and
// returns the Op that the engine runs, blocking or not (engine.cpp). ----

namespace {

Op make_allreduce(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                  DataType dtype, ReduceOp op) {
  const char* what = "allreduce";
  std::size_t bytes = 0;
  c.validated([&] {
    check_dtype(c, what, dtype);
    check_op(c, what, dtype, op);
    bytes = checked_bytes(c, what, count, dtype, 1);
    check_pointer(c, what, "send", send, bytes);
    check_pointer(c, what, "recv", recv, bytes);
    check_disjoint(c, what, send, bytes, recv, bytes, send, "recv == send");
  });
  Algorithm a = c.choose(CollectiveKind::allreduce, bytes, detail::reduces_wide(dtype, op));
  return {{CollectiveKind::allreduce, count, dtype, op, -1, a}, send, recv, bytes};
}

Op make_reduce_scatter(Communicator::Impl& c, const void* send, void* recv, std::size_t recv_count,
                       DataType dtype, ReduceOp op) {
  const char* what = "reduce_scatter";
  std::size_t bytes = 0, send_bytes = 0;
  c.validated([&] {
    check_dtype(c, what, dtype);
    check_op(c, what, dtype, op);
    bytes = checked_bytes(c, what, recv_count, dtype, 1);
    send_bytes = checked_bytes(c, what, recv_count, dtype, static_cast<std::size_t>(c.size));
    check_pointer(c, what, "send", send, send_bytes);
    check_pointer(c, what, "recv", recv, bytes);
    check_disjoint(c, what, send, send_bytes, recv, bytes,
                   static_cast<const std::byte*>(send) + static_cast<std::size_t>(c.rank) * bytes,
                   "recv == send + rank * recv_count");
  });
  Algorithm a = c.choose(CollectiveKind::reduce_scatter, send_bytes);
  return {{CollectiveKind::reduce_scatter, recv_count, dtype, op, -1, a}, send, recv, bytes};
}

Op make_allgather(Communicator::Impl& c, const void* send, void* recv, std::size_t send_count,
                  DataType dtype) {
  const char* what = "allgather";
  std::size_t bytes = 0, recv_bytes = 0;
  c.validated([&] {
    check_dtype(c, what, dtype);
    bytes = checked_bytes(c, what, send_count, dtype, 1);
    recv_bytes = checked_bytes(c, what, send_count, dtype, static_cast<std::size_t>(c.size));
    check_pointer(c, what, "send", send, bytes);
    check_pointer(c, what, "recv", recv, recv_bytes);
    check_disjoint(c, what, recv, recv_bytes, send, bytes,
                   static_cast<const std::byte*>(recv) + static_cast<std::size_t>(c.rank) * bytes,
                   "send == recv + rank * send_count");
  });
  Algorithm a = c.choose(CollectiveKind::allgather, bytes);
  return {{CollectiveKind::allgather, send_count, dtype, ReduceOp::sum, -1, a}, send, recv, bytes};
}

Op make_broadcast(Communicator::Impl& c, void* buffer, std::size_t count, DataType dtype,
                  int root) {
  const char* what = "broadcast";
  std::size_t bytes = 0;
  c.validated([&] {
    check_dtype(c, what, dtype);
    check_root(c, what, root);
    bytes = checked_bytes(c, what, count, dtype, 1);
    check_pointer(c, what, "buffer", buffer, bytes);
  });
  Algorithm a = c.choose(CollectiveKind::broadcast, bytes);
  return {{CollectiveKind::broadcast, count, dtype, ReduceOp::sum, root, a}, buffer, buffer, bytes};
}

Op make_reduce(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
               DataType dtype, ReduceOp op, int root) {
  const char* what = "reduce";
  std::size_t bytes = 0;
  c.validated([&] {
    check_dtype(c, what, dtype);
    check_op(c, what, dtype, op);
    check_root(c, what, root);
    bytes = checked_bytes(c, what, count, dtype, 1);
    check_pointer(c, what, "send", send, bytes);
    if (c.rank == root) {
      check_pointer(c, what, "recv (at the root)", recv, bytes);
      check_disjoint(c, what, send, bytes, recv, bytes, send, "recv == send");
    }
  });
  Algorithm a = c.choose(CollectiveKind::reduce, bytes);
  return {{CollectiveKind::reduce, count, dtype, op, root, a}, send, recv, bytes};
}

Op make_barrier() {
  return {{CollectiveKind::barrier, 0, DataType::uint8, ReduceOp::sum, -1, Algorithm::low_latency}};
}

}  // namespace

void Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType dtype,
                             ReduceOp op) {
  impl_->execute(make_allreduce(*impl_, send, recv, count, dtype, op));
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                  DataType dtype, ReduceOp op) {
  impl_->execute(make_reduce_scatter(*impl_, send, recv, recv_count, dtype, op));
}
void Communicator::allgather(const void* send, void* recv, std::size_t send_count, DataType dtype) {
  impl_->execute(make_allgather(*impl_, send, recv, send_count, dtype));
}
void Communicator::broadcast(void* buffer, std::size_t count, DataType dtype, int root) {
  impl_->execute(make_broadcast(*impl_, buffer, count, dtype, root));
}
void Communicator::reduce(const void* send, void* recv, std::size_t count, DataType dtype,
                          ReduceOp op, int root) {
  impl_->execute(make_reduce(*impl_, send, recv, count, dtype, op, root));
}
void Communicator::barrier() {
  impl_->execute(make_barrier());
}

Request Communicator::iallreduce(const void* send, void* recv, std::size_t count, DataType dtype,
                                 ReduceOp op) {
  return impl_->submit(make_allreduce(*impl_, send, recv, count, dtype, op));
}
Request Communicator::ireduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                      DataType dtype, ReduceOp op) {
  return impl_->submit(make_reduce_scatter(*impl_, send, recv, recv_count, dtype, op));
}
Request Communicator::iallgather(const void* send, void* recv, std::size_t send_count,
                                 DataType dtype) {
  return impl_->submit(make_allgather(*impl_, send, recv, send_count, dtype));
}
Request Communicator::ibroadcast(void* buffer, std::size_t count, DataType dtype, int root) {
  return impl_->submit(make_broadcast(*impl_, buffer, count, dtype, root));
}
Request Communicator::ireduce(const void* send, void* recv, std::size_t count, DataType dtype,
                              ReduceOp op, int root) {
  return impl_->submit(make_reduce(*impl_, send, recv, count, dtype, op, root));
}
Request Communicator::ibarrier() {
  return impl_->submit(make_barrier());
}

Communicator Communicator::split(int color, int key) {
  Impl& c = *impl_;
  c.validated([&] {
    if (color < 0)
      throw InvalidArgumentError(
          fmt::format("rank {}: split: color {} must be >= 0", c.rank, color));
  });
  // MPI_Comm_split: gather every rank's (color, key), then each group orders
  // its members by (key, parent rank).
  std::vector<std::int64_t> mine = {color, key}, all(2 * static_cast<std::size_t>(c.size));
  try {
    allgather(mine.data(), all.data(), 2, DataType::int64);
  } catch (const Error& e) {
    // The peers' errors name the allgather, a call they never made: say
    // which one of theirs it belongs to.
    throw_error(e.code(),
                fmt::format("{} [in split(color={}, key={}), whose first step is that allgather "
                            "of every rank's (color, key)]",
                            e.what(), color, key),
                e.sys_errno());
  }
  std::vector<std::pair<std::int64_t, int>> members;  // (key, parent rank)
  for (int q = 0; q < c.size; ++q)
    if (all[2 * q] == color) members.push_back({all[2 * q + 1], q});
  std::sort(members.begin(), members.end());
  Options o;
  o.world_size = static_cast<int>(members.size());
  for (std::size_t i = 0; i < members.size(); ++i)
    if (members[i].second == c.rank) o.rank = static_cast<int>(i);
  // A job id of its own, from the parent's, the split's number and the color.
  const std::string& parent = c.config.job_id;
  o.job_id = fmt::format("{:.32}.{:08x}.s{}.c{}", parent,
                         static_cast<std::uint32_t>(detail::fnv1a(parent.data(), parent.size())),
                         c.splits++, color);
  o.local_rank = o.rank;
  o.local_world_size = o.world_size;
  o.slots = c.config.slots;
  o.slot_bytes = c.config.slot_bytes;
  o.threads = c.config.threads;
  o.timeout_s = c.config.timeout_s;
  // The parent's other ranks stay busy beside the child's (in their own
  // children, or the parent): a crowded parent makes a crowded child, which
  // could not tell from its own ranks' CPUs alone.
  o.oversubscribed = c.config.oversubscribed ? 1 : c.config.oversubscribed_request;
  return Communicator(o);
}

}  // namespace shmring
