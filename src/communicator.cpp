#include <fmt/format.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <unistd.h>

#include <cstring>

#include "comm_impl.hpp"
#include "config.hpp"
#include "kernels/reduce.hpp"
#include "log.hpp"
#include "shmring/version.hpp"

namespace shmring {

using detail::Clock;

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
  }
  return "unknown";
}

std::string Communicator::Impl::describe(const CollectiveDesc& d) const {
  std::string s = fmt::format("{}(count={}, {}", to_string(d.kind), d.count, to_string(d.dtype));
  if (d.kind == CollectiveKind::allreduce || d.kind == CollectiveKind::reduce ||
      d.kind == CollectiveKind::reduce_scatter)
    s += fmt::format(", {}", to_string(d.op));
  if (d.kind == CollectiveKind::broadcast || d.kind == CollectiveKind::reduce)
    s += fmt::format(", root={}", d.root);
  return s + ")";
}

void Communicator::Impl::check_progress(int peer, const char* what, Clock::time_point deadline,
                                        const detail::Counter& counter, std::uint64_t target) {
  if (auto a = detail::read_abort(seg->header())) {
    broken = a->reason;
    throw_error(static_cast<ErrorCode>(a->code), a->reason);
  }
  std::string where =
      current ? fmt::format("{} #{} step {}", describe(*current), collectives, step) : "";
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
      if (area(r).desc.seq.load(std::memory_order_acquire) < collectives + 1)
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

std::byte* Communicator::Impl::acquire_send_slot() {
  const std::uint64_t k = seg->slots();
  // Slot (sent mod K) is free once the right neighbour consumed slice sent-K.
  if (sent >= k) {
    const std::uint64_t need = sent - k + 1;
    auto& counter = area(right).consumed;
    detail::wait_at_least(counter, need, wait_policy, [&] {
      check_progress(right, "a free slot (its consumed counter)", op_deadline, counter, need);
    });
  }
  return seg->slot(rank, sent % k);
}

void Communicator::Impl::publish_send() {
  detail::publish(my_area().produced, ++sent);
}

const std::byte* Communicator::Impl::wait_recv_slot() {
  auto& counter = area(left).produced;
  detail::wait_at_least(counter, recvd + 1, wait_policy, [&] {
    check_progress(left, "data (its produced counter)", op_deadline, counter, recvd + 1);
  });
  return seg->slot(left, recvd % seg->slots());
}

void Communicator::Impl::release_recv() {
  detail::publish(my_area().consumed, ++recvd);
}

void Communicator::Impl::begin(const CollectiveDesc& d) {
  if (broken)
    throw AbortedError(
        fmt::format("rank {}: communicator is unusable after an earlier error: {}", rank, *broken));
  if (auto a = detail::read_abort(seg->header())) {
    broken = a->reason;
    throw_error(static_cast<ErrorCode>(a->code), a->reason);
  }
  current = d;
  step = -1;
  op_deadline = deadline();
  auto& desc = my_area().desc;
  desc.count.store(d.count, std::memory_order_relaxed);
  desc.kind.store(static_cast<std::uint32_t>(d.kind), std::memory_order_relaxed);
  desc.dtype.store(static_cast<std::uint32_t>(d.dtype), std::memory_order_relaxed);
  desc.op.store(static_cast<std::uint32_t>(d.op), std::memory_order_relaxed);
  desc.root.store(d.root, std::memory_order_relaxed);
  desc.seq.store(collectives + 1, std::memory_order_release);
}

void Communicator::Impl::check_left_descriptor() {
  // Left published its descriptor before the slot write we just saw, and it
  // cannot start its next collective before we have read this one's data,
  // unless it disagrees with us: a changed seq is a mismatch too.
  auto& desc = area(left).desc;
  std::uint64_t seq = desc.seq.load(std::memory_order_acquire);
  CollectiveDesc theirs{static_cast<CollectiveKind>(desc.kind.load(std::memory_order_relaxed)),
                        desc.count.load(std::memory_order_relaxed),
                        static_cast<DataType>(desc.dtype.load(std::memory_order_relaxed)),
                        static_cast<ReduceOp>(desc.op.load(std::memory_order_relaxed)),
                        desc.root.load(std::memory_order_relaxed)};
  std::atomic_thread_fence(std::memory_order_acquire);
  bool torn = desc.seq.load(std::memory_order_relaxed) != seq;
  const CollectiveDesc& mine = *current;
  bool same = !torn && seq == collectives + 1 && theirs.kind == mine.kind &&
              theirs.count == mine.count && theirs.dtype == mine.dtype &&
              theirs.root == mine.root &&
              (theirs.op == mine.op ||
               (mine.kind != CollectiveKind::allreduce && mine.kind != CollectiveKind::reduce &&
                mine.kind != CollectiveKind::reduce_scatter));
  if (same) return;
  std::string their_call =
      torn ? std::string("a later collective")
           : fmt::format("collective #{} {}", seq == 0 ? 0 : seq - 1, describe(theirs));
  fail(MismatchError(fmt::format(
      "collective mismatch: rank {} called collective #{} {} but rank {} called {}; every rank "
      "must call the same collectives in the same order with the same count, datatype, "
      "operator and root",
      rank, collectives, describe(mine), left, their_call)));
}

void Communicator::Impl::end() {
  ++collectives;
  current.reset();
  step = -1;
}

void Communicator::Impl::fail(const Error& e) {
  bool won = detail::raise_abort(*seg, size, static_cast<std::uint32_t>(e.code()), rank, e.what());
  auto a = detail::read_abort(seg->header());
  broken = a ? a->reason : std::string(e.what());
  if (!won && a) {
    SHMRING_LOG(debug, "also saw: {}", e.what());
    throw_error(static_cast<ErrorCode>(a->code), a->reason);
  }
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

void Communicator::Impl::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (!arena || bytes < kParallelMinBytes) {
    std::memcpy(dst, src, bytes);
    return;
  }
  arena->execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, bytes, kGrainBytes),
        [&](const tbb::blocked_range<std::size_t>& r) {
          std::memcpy(static_cast<std::byte*>(dst) + r.begin(),
                      static_cast<const std::byte*>(src) + r.begin(), r.size());
        },
        tbb::static_partitioner());
  });
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

Communicator::Communicator(const Options& options) : impl_(std::make_unique<Impl>()) {
  Impl& c = *impl_;
  c.config = detail::resolve_config(options);
  Config& cfg = c.config;
  detail::set_log_rank(cfg.rank);
  c.rank = cfg.rank;
  c.size = cfg.world_size;
  c.left = (c.rank + c.size - 1) % c.size;
  c.right = (c.rank + 1) % c.size;
  c.wait_policy.spin_ns = static_cast<std::int64_t>(cfg.spin_us * 1000);
  c.wait_policy.yield_ns = static_cast<std::int64_t>(cfg.yield_us * 1000);
  if (cfg.threads > 1) c.arena = std::make_unique<tbb::task_arena>(cfg.threads);

  const std::uint64_t host = detail::host_hash();
  cfg.segment_name = detail::segment_name(cfg.job_id, host);
  detail::SegmentRequest req;
  req.name = cfg.segment_name;
  req.rank = cfg.rank;
  req.world_size = cfg.world_size;
  req.slots = cfg.slots;
  req.slot_bytes = cfg.slot_bytes;
  req.host_hash = host;
  req.deadline = c.deadline();
  c.seg = detail::Segment::create_or_attach(req);
  cfg.slots = c.seg->slots();
  cfg.slot_bytes = c.seg->slot_bytes();
  cfg.segment_bytes = c.seg->total_bytes();
  c.seg->wait_all_attached(req.deadline);

  SHMRING_LOG(info,
              "shmring {} rank {}/{} (local {}/{}) job '{}': segment '{}' {} bytes, slots={} "
              "slot_bytes={} threads={} kernels={} timeout={}s spin={}us yield={}us algorithm=ring",
              SHMRING_VERSION_STRING, cfg.rank, cfg.world_size, cfg.local_rank,
              cfg.local_world_size, cfg.job_id, cfg.segment_name, cfg.segment_bytes, cfg.slots,
              cfg.slot_bytes, cfg.threads, detail::kernel_isa(), cfg.timeout_s, cfg.spin_us,
              cfg.yield_us);
}

Communicator::~Communicator() = default;
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
  return impl_->collectives;
}

void Communicator::abort(const std::string& reason) {
  Impl& c = *impl_;
  detail::raise_abort(*c.seg, c.size, static_cast<std::uint32_t>(ErrorCode::aborted), c.rank,
                      fmt::format("rank {} aborted the job: {}", c.rank, reason));
  if (!c.broken) c.broken = reason;
}

namespace {

void validate_buffers(const Communicator::Impl& c, const char* what, const void* send,
                      const void* recv, std::size_t count, DataType dtype, ReduceOp op) {
  if (static_cast<unsigned>(dtype) >= static_cast<unsigned>(kNumDataTypes))
    throw InvalidArgumentError(fmt::format("rank {}: {}: datatype {} is not a DataType (0..{})",
                                           c.rank, what, static_cast<int>(dtype),
                                           kNumDataTypes - 1));
  if (static_cast<unsigned>(op) >= static_cast<unsigned>(kNumReduceOps))
    throw InvalidArgumentError(fmt::format("rank {}: {}: operator {} is not a ReduceOp (0..{})",
                                           c.rank, what, static_cast<int>(op), kNumReduceOps - 1));
  if (op == ReduceOp::avg && !is_floating(dtype))
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: avg needs a floating datatype, got {}; use sum and divide",
                    c.rank, what, to_string(dtype)));
  const std::size_t es = datatype_size(dtype);
  if (count > SIZE_MAX / es / 2)
    throw InvalidArgumentError(fmt::format("rank {}: {}: count {} of {} overflows", c.rank, what,
                                           count, to_string(dtype)));
  if (count > 0 && (send == nullptr || recv == nullptr))
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: null buffer with count {}", c.rank, what, count));
  if (count > 0 && send != recv) {
    auto s = reinterpret_cast<std::uintptr_t>(send);
    auto r = reinterpret_cast<std::uintptr_t>(recv);
    const std::size_t bytes = count * es;
    if (s < r + bytes && r < s + bytes)
      throw InvalidArgumentError(fmt::format(
          "rank {}: {}: send and recv overlap without being equal (in place needs send == recv)",
          c.rank, what));
  }
}

}  // namespace

void Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType dtype,
                             ReduceOp op) {
  Impl& c = *impl_;
  validate_buffers(c, "allreduce", send, recv, count, dtype, op);
  c.begin({CollectiveKind::allreduce, count, dtype, op, -1});
  if (c.size == 1) {
    if (count > 0 && send != recv) c.copy(recv, send, count * datatype_size(dtype));
  } else {
    algo::allreduce_ring(c, send, recv, count, dtype, op);
  }
  c.end();
}

}  // namespace shmring
