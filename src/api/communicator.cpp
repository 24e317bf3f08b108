// The public face of Communicator: construction (settings, attach, CPU
// placement), accessors, abort, split, and the front of the collectives:
// each checks its arguments on the caller's thread, fills the descriptor
// (kind, count, datatype, operator, root, algorithm from the table of
// engine/tuning.cpp) and hands the Op to the engine (engine/engine.cpp),
// which runs blocking and non-blocking calls alike. docs/design/layers.md
// shows the layers.

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <string_view>
#include <vector>

#include "api/front_checks.hpp"
#include "base/config.hpp"
#include "base/log.hpp"
#include "base/placement.hpp"
#include "core/comm.hpp"
#include "engine/engine.hpp"
#include "engine/tuning.hpp"
#include "kernels/copy.hpp"
#include "kernels/reduce.hpp"
#include "kernels/wide.hpp"
#include "shmring/version.hpp"
#include "transport/cma.hpp"

namespace shmring {

using detail::Clock;

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
  single_copy.mode = cfg.cma;
  single_copy.min_bytes = cfg.cma_min_bytes;
  single_copy.large = cfg.cma_large;
  // Asked for explicitly: let the peers read us even under Yama's
  // ptrace_scope=1 (any process of this user may then attach to us).
  if (single_copy.mode == 1 && detail::settings::text("SHMRING_CMA")) detail::allow_cma_readers();
  // Flight recorder entries per rank (docs/design/recorder.md); rank 0's
  // value sizes the job's recorders.
  if (auto v = detail::settings::integer("SHMRING_RECORDER_ENTRIES"))
    rec_wanted = static_cast<std::uint32_t>(*v);
  rank = cfg.rank;
  size = cfg.world_size;
  left = (rank + size - 1) % size;
  right = (rank + 1) % size;
  // A bad SHMRING_MEMBARRIER fails here; the result is published as the
  // rank attaches.
  asymmetric_fence_ok = detail::register_asymmetric_fence();
  // A misspelt SHMRING_* name is ignored by every reader: say so once per
  // process, on rank 0 (the ranks of a job share their environment).
  static std::once_flag unknown_told;
  if (rank == 0)
    std::call_once(unknown_told, [] {
      for (const auto& u : detail::settings::unknown_variables())
        SHMRING_LOG(
            warn, "{} is not a shmring setting{}; it is ignored (shmrun --info lists them)", u.name,
            u.nearest.empty() ? std::string() : fmt::format(" (did you mean {}?)", u.nearest));
    });
}

Communicator::Communicator(const Options& options) : impl_(std::make_unique<Impl>()) {
  Impl& c = *impl_;
  // A bad local rank or size is told to the peers below, as a bad setting.
  std::string identity_error;
  c.config = detail::resolve_identity(options, &identity_error);
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
    if (!identity_error.empty()) throw InvalidArgumentError(identity_error);
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
  req.recorder_entries = c.rec_wanted;
  req.deadline = c.deadline();
  req.asymmetric_fence = c.asymmetric_fence_ok;
  req.oversubscribed = cfg.oversubscribed_request;
  // Automatic: the job's crowding, where this process knows of it, counts
  // for this communicator too (config.hpp job_crowding_hint); published, so
  // every rank of the communicator agrees.
  const std::string crowding = req.oversubscribed < 0 ? detail::job_crowding_hint() : "";
  if (!crowding.empty()) req.oversubscribed = 1;
  c.seg = detail::Segment::create_or_attach(req);
  c.init_recorder();
  (void)c.call_clock.now();  // the cycle counter's rate: measured now, not in a call
  c.trace = detail::TraceLog::open(cfg.job_id, cfg.rank, cfg.world_size);
  cfg.slots = c.seg->slots();
  cfg.slot_bytes = c.seg->slot_bytes();
  cfg.direct_bytes = c.seg->direct_bytes();
  cfg.segment_bytes = c.seg->total_bytes();
  c.seg->wait_all_attached(req.deadline);
  c.spin_explicit = cfg.spin_us >= 0;  // apply_placement fills an automatic one
  detail::apply_placement(cfg, detail::affinity_cpus(), c.seg->job_cpus(),
                          c.seg->oversubscribed_request());
  if (cfg.oversubscribed) c.crowded.emplace();
  // Every input of the algorithm table is now fixed (and agreed): compile it.
  c.choices = engine::compile_choices(engine::tuning_inputs(c));
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
  if (c.single_copy.mode == 1 && c.single_copy.large < 0) {
    cma_ratio = detail::cma_copy_ratio();
    c.single_copy.large = cma_ratio <= detail::kCmaLargeMaxRatio ? 1 : 0;
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
              detail::copy_streaming_isa(), cfg.migrate ? 1 : 0, cfg.job_cpus, c.single_copy.mode,
              c.single_copy.large,
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

std::vector<CollectiveStats> Communicator::stats() const {
  std::vector<CollectiveStats> out;
  for (std::size_t k = 1; k < impl_->kind_stats.size(); ++k) {
    const auto& s = impl_->kind_stats[k];
    CollectiveStats c;
    c.calls = s.calls.load(std::memory_order_relaxed);
    if (c.calls == 0) continue;
    c.collective = to_string(static_cast<CollectiveKind>(k));
    c.bytes = s.bytes.load(std::memory_order_relaxed);
    c.time_ns = s.time_ns.load(std::memory_order_relaxed);
    c.wait_ns = s.wait_ns.load(std::memory_order_relaxed);
    out.push_back(std::move(c));
  }
  return out;
}

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
bool Communicator::waits_may_spin() const noexcept {
  return impl_->base_policy().spin_ns > 0;
}
std::uint64_t Communicator::collective_count() const noexcept {
  return impl_->completed.load(std::memory_order_relaxed);
}

void Communicator::abort(const std::string& reason) {
  Impl& c = *impl_;
  c.check_owner();
  c.abort_job(reason);
  // This thread's (or another's) next wait or call sees the abort word;
  // `broken` is only written by the thread running collectives.
}

using namespace front;

void Communicator::Impl::reject_call(const InvalidArgumentError& e) {
  check_owner();
  if (broken) throw AbortedError(unusable_message());
  publish_rejected(e.what());
  throw e;
}

// ---- Front: argument checks and descriptors. Each make_* validates on the
// caller's thread (a refused call is published in order by reject()) and
// returns the Op that the engine runs, blocking or not (engine.cpp). ----

namespace {

Op make_allreduce(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                  DataType dtype, ReduceOp op) {
  const char* what = "allreduce";
  std::size_t bytes = 0;
  validated(c, [&] {
    check_dtype(c, what, dtype);
    check_op(c, what, dtype, op);
    bytes = checked_bytes(c, what, count, dtype, 1);
    check_pointer(c, what, "send", send, bytes);
    check_pointer(c, what, "recv", recv, bytes);
    check_disjoint(c, what, send, bytes, recv, bytes, send, "recv == send");
  });
  Algorithm a =
      engine::choose(c, CollectiveKind::allreduce, bytes, detail::reduces_wide(dtype, op));
  return {{CollectiveKind::allreduce, count, dtype, op, -1, a}, send, recv, bytes};
}

Op make_reduce_scatter(Communicator::Impl& c, const void* send, void* recv, std::size_t recv_count,
                       DataType dtype, ReduceOp op) {
  const char* what = "reduce_scatter";
  std::size_t bytes = 0, send_bytes = 0;
  validated(c, [&] {
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
  Algorithm a = engine::choose(c, CollectiveKind::reduce_scatter, send_bytes,
                               detail::reduces_wide(dtype, op));
  return {{CollectiveKind::reduce_scatter, recv_count, dtype, op, -1, a}, send, recv, bytes};
}

Op make_allgather(Communicator::Impl& c, const void* send, void* recv, std::size_t send_count,
                  DataType dtype) {
  const char* what = "allgather";
  std::size_t bytes = 0, recv_bytes = 0;
  validated(c, [&] {
    check_dtype(c, what, dtype);
    bytes = checked_bytes(c, what, send_count, dtype, 1);
    recv_bytes = checked_bytes(c, what, send_count, dtype, static_cast<std::size_t>(c.size));
    check_pointer(c, what, "send", send, bytes);
    check_pointer(c, what, "recv", recv, recv_bytes);
    check_disjoint(c, what, recv, recv_bytes, send, bytes,
                   static_cast<const std::byte*>(recv) + static_cast<std::size_t>(c.rank) * bytes,
                   "send == recv + rank * send_count");
  });
  Algorithm a = engine::choose(c, CollectiveKind::allgather, bytes);
  return {
      {CollectiveKind::allgather, send_count, dtype, ReduceOp::sum, -1, a}, send, recv, recv_bytes};
}

Op make_broadcast(Communicator::Impl& c, void* buffer, std::size_t count, DataType dtype,
                  int root) {
  const char* what = "broadcast";
  std::size_t bytes = 0;
  validated(c, [&] {
    check_dtype(c, what, dtype);
    check_root(c, what, root);
    bytes = checked_bytes(c, what, count, dtype, 1);
    check_pointer(c, what, "buffer", buffer, bytes);
  });
  Algorithm a = engine::choose(c, CollectiveKind::broadcast, bytes);
  return {{CollectiveKind::broadcast, count, dtype, ReduceOp::sum, root, a}, buffer, buffer, bytes};
}

Op make_reduce(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
               DataType dtype, ReduceOp op, int root) {
  const char* what = "reduce";
  std::size_t bytes = 0;
  validated(c, [&] {
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
  Algorithm a = engine::choose(c, CollectiveKind::reduce, bytes, detail::reduces_wide(dtype, op));
  return {{CollectiveKind::reduce, count, dtype, op, root, a}, send, recv, bytes};
}

Op make_barrier() {
  return {{CollectiveKind::barrier, 0, DataType::uint8, ReduceOp::sum, -1, Algorithm::low_latency}};
}

Op make_finalize() {
  Op o = make_barrier();
  o.desc.purpose = CallPurpose::finalize;
  return o;
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
void Communicator::finalize() {
  impl_->execute(make_finalize());
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
Request Communicator::ifinalize() {
  return impl_->submit(make_finalize());
}

Communicator Communicator::split(int color, int key) {
  Impl& c = *impl_;
  validated(c, [&] {
    if (color < 0)
      throw InvalidArgumentError(
          fmt::format("rank {}: split: color {} must be >= 0", c.rank, color));
  });
  // MPI_Comm_split: gather every rank's (color, key), then each group orders
  // its members by (key, parent rank).
  std::vector<std::int64_t> mine = {color, key}, all(2 * static_cast<std::size_t>(c.size));
  // Published as split's (CallPurpose::split): a peer in another call names
  // split, not an allgather its user never made.
  Op gather_keys = make_allgather(c, mine.data(), all.data(), 2, DataType::int64);
  gather_keys.desc.purpose = CallPurpose::split;
  try {
    c.execute(gather_keys);
  } catch (const Error& e) {
    // A mismatch names split already (describe(), on every rank in the same
    // words: docs/guide/errors.md); other errors (a timeout, a dead peer)
    // get the context here.
    if (std::string_view(e.what()).find("in split()") != std::string_view::npos) throw;
    throw_error(e.code(),
                fmt::format("{} [in split(color={}, key={}), whose first step is an allgather "
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
