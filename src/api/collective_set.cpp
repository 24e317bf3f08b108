// Front of the staged collectives (alltoall, alltoallv, gather, scatter,
// allgatherv, reduce_scatter_v): argument checks on the caller's thread and
// the Op the engine runs (engine.cpp -> staged.cpp), as communicator.cpp
// does for the others. Vectors are copied into the Op (VectorArgs), so a
// queued request does not depend on the caller's spans.

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <utility>
#include <vector>

#include "algorithms/algorithms.hpp"
#include "api/front_checks.hpp"
#include "core/comm.hpp"
#include "engine/tuning.hpp"

namespace shmring {

using namespace front;

namespace {

constexpr std::size_t kMaxBytes = std::numeric_limits<std::size_t>::max() >> 2;

// A VectorArgs for the next call: the communicator's spare one when no
// queued request still holds it (only the Impl's reference is left), else
// a new one that becomes the spare.
std::shared_ptr<VectorArgs> vector_args(Communicator::Impl& c) {
  auto& v = c.spare_vector_args;
  if (!v || v.use_count() != 1) {
    v = std::make_shared<VectorArgs>();
    return v;
  }
  // The progress thread dropped its reference after its last read (an
  // acq_rel decrement); this fence orders that read before our writes.
  std::atomic_thread_fence(std::memory_order_acquire);
  for (auto* f : {&v->send_counts, &v->send_displs, &v->recv_counts, &v->recv_displs}) f->clear();
  return v;
}

void checked_vector(const Communicator::Impl& c, const char* what, const char* name,
                    std::span<const std::size_t> v, std::vector<std::size_t>& out) {
  if (v.size() != static_cast<std::size_t>(c.size))
    throw InvalidArgumentError(fmt::format("rank {}: {}: {} has {} entries, expected size() = {}",
                                           c.rank, what, name, v.size(), c.size));
  out.assign(v.begin(), v.end());  // keeps the capacity of a reused VectorArgs
}

using Blocks = std::vector<std::pair<std::size_t, std::size_t>>;

// Byte ranges [begin, end) of the blocks (displs[j], counts[j]) in a buffer,
// into `out` (a scratch list of the Impl); refuses overflow. Empty blocks
// are left out.
Blocks& block_ranges(const Communicator::Impl& c, const char* what, const char* name,
                     const std::vector<std::size_t>& counts, const std::vector<std::size_t>& displs,
                     DataType dtype, Blocks& out) {
  const std::size_t es = datatype_size(dtype);
  out.clear();
  for (std::size_t j = 0; j < counts.size(); ++j) {
    std::size_t end = 0, end_bytes = 0;
    if (__builtin_add_overflow(displs[j], counts[j], &end) ||
        __builtin_mul_overflow(end, es, &end_bytes) || end_bytes > kMaxBytes)
      throw InvalidArgumentError(
          fmt::format("rank {}: {}: block {} of {} (displacement {} + count {} of {}) overflows",
                      c.rank, what, j, name, displs[j], counts[j], to_string(dtype)));
    if (counts[j] > 0) out.push_back({displs[j] * es, end_bytes});
  }
  return out;
}

std::size_t extent(const Blocks& blocks) {
  std::size_t e = 0;
  for (auto& b : blocks) e = std::max(e, b.second);
  return e;
}

// The receive blocks must not overlap each other (they are written). Sorts
// `blocks` in place.
void check_blocks_disjoint(const Communicator::Impl& c, const char* what, Blocks& blocks) {
  std::sort(blocks.begin(), blocks.end());
  for (std::size_t i = 1; i < blocks.size(); ++i)
    if (blocks[i].first < blocks[i - 1].second)
      throw InvalidArgumentError(fmt::format(
          "rank {}: {}: receive blocks overlap (bytes [{}, {}) and [{}, {})); every block needs "
          "its own place",
          c.rank, what, blocks[i - 1].first, blocks[i - 1].second, blocks[i].first,
          blocks[i].second));
}

// No receive block may overlap [send, send + send_bytes).
void check_send_apart(const Communicator::Impl& c, const char* what, const void* send,
                      std::size_t send_bytes, const void* recv, const Blocks& recv_blocks) {
  if (send_bytes == 0 || recv == nullptr) return;
  const auto s = reinterpret_cast<std::uintptr_t>(send);
  const auto r = reinterpret_cast<std::uintptr_t>(recv);
  for (auto& b : recv_blocks)
    if (r + b.first < s + send_bytes && s < r + b.second)
      throw InvalidArgumentError(
          fmt::format("rank {}: {}: send overlaps the receive block at bytes [{}, {}) of recv",
                      c.rank, what, b.first, b.second));
}

void check_lane(const Communicator::Impl& c, const char* what, int lanes,
                std::size_t header_bytes) {
  const std::size_t buf = c.seg->direct_bytes();
  if (c.size > 1 && (algo::staged_lane_bytes(buf, lanes) == 0 || header_bytes > buf))
    throw InvalidArgumentError(fmt::format(
        "rank {}: {}: the direct buffers ({} bytes, SHMRING_DIRECT_BYTES) are too small "
        "for {} ranks; need at least {} bytes",
        c.rank, what, buf, c.size,
        std::max<std::size_t>(16 * static_cast<std::size_t>(lanes), header_bytes)));
}

std::size_t sum_counts(const Communicator::Impl& c, const char* what,
                       const std::vector<std::size_t>& counts, DataType dtype) {
  std::size_t total = 0;
  for (std::size_t x : counts)
    if (__builtin_add_overflow(total, x, &total))
      throw InvalidArgumentError(
          fmt::format("rank {}: {}: the sum of recv_counts overflows", c.rank, what));
  checked_bytes(c, what, total, dtype, 1);
  return total;
}

// The bytes of a v-collective's receive blocks together: stats() and the
// flight recorder count them (the front has checked that they fit).
std::size_t total_bytes(const std::vector<std::size_t>& counts, DataType dtype) {
  std::size_t total = 0;
  for (std::size_t x : counts) total += x;
  return total * datatype_size(dtype);
}

Op make_alltoall(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                 DataType dtype) {
  const char* what = "alltoall";
  validated(c, [&] {
    check_dtype(c, what, dtype);
    const std::size_t bytes =
        checked_bytes(c, what, count, dtype, static_cast<std::size_t>(c.size));
    check_pointer(c, what, "send", send, bytes);
    check_pointer(c, what, "recv", recv, bytes);
    check_disjoint(c, what, send, bytes, recv, bytes, nullptr, "alltoall has no in-place form");
    check_lane(c, what, c.size - 1, 0);
  });
  // The whole send buffer in one line when it fits (low_latency.cpp).
  const std::size_t payload = count * datatype_size(dtype) * static_cast<std::size_t>(c.size);
  const Algorithm a = engine::choose(c, CollectiveKind::alltoall, payload) == Algorithm::low_latency
                          ? Algorithm::low_latency
                          : Algorithm::staged;
  return {{CollectiveKind::alltoall, count, dtype, ReduceOp::sum, -1, a}, send, recv, payload};
}

Op make_alltoallv(Communicator::Impl& c, const void* send, std::span<const std::size_t> sc,
                  std::span<const std::size_t> sd, void* recv, std::span<const std::size_t> rc,
                  std::span<const std::size_t> rd, DataType dtype) {
  const char* what = "alltoallv";
  auto v = vector_args(c);
  std::uint64_t largest_block = 0;  // bytes, to one peer
  validated(c, [&] {
    check_dtype(c, what, dtype);
    checked_vector(c, what, "send_counts", sc, v->send_counts);
    checked_vector(c, what, "send_displs", sd, v->send_displs);
    checked_vector(c, what, "recv_counts", rc, v->recv_counts);
    checked_vector(c, what, "recv_displs", rd, v->recv_displs);
    const auto me = static_cast<std::size_t>(c.rank);
    if (v->send_counts[me] != v->recv_counts[me])
      throw InvalidArgumentError(fmt::format(
          "rank {}: alltoallv: send_counts[{}]={} but recv_counts[{}]={}; a rank's block to "
          "itself must have one size",
          c.rank, me, v->send_counts[me], me, v->recv_counts[me]));
    auto& sblocks =
        block_ranges(c, what, "send", v->send_counts, v->send_displs, dtype, c.scratch_send_blocks);
    auto& rblocks =
        block_ranges(c, what, "recv", v->recv_counts, v->recv_displs, dtype, c.scratch_recv_blocks);
    check_pointer(c, what, "send", send, extent(sblocks));
    check_pointer(c, what, "recv", recv, extent(rblocks));
    check_blocks_disjoint(c, what, rblocks);
    for (auto& b : sblocks)
      check_send_apart(c, what, static_cast<const std::byte*>(send) + b.first, b.second - b.first,
                       recv, rblocks);
    check_lane(c, what, c.size - 1, 2 * static_cast<std::size_t>(c.size) * 8);
    for (int j = 0; j < c.size; ++j)
      if (j != c.rank)
        largest_block =
            std::max<std::uint64_t>(largest_block, v->send_counts[j] * datatype_size(dtype));
  });
  Op o{{CollectiveKind::alltoallv, 0, dtype, ReduceOp::sum, -1, Algorithm::staged}, send, recv};
  o.desc.vhash = algo::staged_pair_hash(c.rank, v->send_counts, v->recv_counts);
  // N=2: when the blocks to and from the peer each fit a line, the call
  // travels as alltoall's does (low_latency.cpp). Both ranks look at the same
  // two counts, so they choose alike unless they disagree (check_descriptor
  // then names the counts). Larger N would need every pair's counts.
  if (c.size == 2 && !c.forced_algorithm) {
    const auto peer = static_cast<std::size_t>(1 - c.rank);
    if (std::max(v->send_counts[peer], v->recv_counts[peer]) * datatype_size(dtype) <=
        detail::kLowLatencyBytes) {
      o.desc.algorithm = Algorithm::low_latency;
      o.desc.vhash = algo::alltoallv_line_word(c.rank, *v);
    }
  }
  o.desc.aux = largest_block;
  o.bytes = total_bytes(v->recv_counts, dtype);
  o.v = std::move(v);
  return o;
}

// The checks gather and scatter share. `one` is the block of `count`
// elements every rank has (gather's send, scatter's recv); `all` the root's
// size() blocks (gather's recv, scatter's send), where the root's own block
// may be `one` itself (`in_place_rule`). `lanes`: of the staged rounds.
void check_rooted(Communicator::Impl& c, const char* what, std::size_t count, DataType dtype,
                  int root, const char* one_name, const void* one, const char* all_name,
                  const void* all, const char* in_place_rule, int lanes) {
  check_dtype(c, what, dtype);
  check_root(c, what, root);
  const std::size_t bytes = checked_bytes(c, what, count, dtype, 1);
  const std::size_t all_bytes =
      checked_bytes(c, what, count, dtype, static_cast<std::size_t>(c.size));
  check_pointer(c, what, one_name, one, bytes);
  if (c.rank == root) {
    check_pointer(c, what, all_name, all, all_bytes);
    check_disjoint(c, what, all, all_bytes, one, bytes,
                   static_cast<const std::byte*>(all) + static_cast<std::size_t>(root) * bytes,
                   in_place_rule);
  }
  check_lane(c, what, lanes, 0);
}

Op make_gather(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
               DataType dtype, int root) {
  validated(c, [&] {
    check_rooted(c, "gather", count, dtype, root, "send", send, "recv (at the root)", recv,
                 "send == recv + root * count", 1);
  });
  // The root's result holds size() blocks; the others receive nothing and
  // count the block they send.
  const std::size_t blocks = c.rank == root ? static_cast<std::size_t>(c.size) : 1;
  return {{CollectiveKind::gather, count, dtype, ReduceOp::sum, root, Algorithm::staged},
          send,
          recv,
          blocks * count * datatype_size(dtype)};
}

Op make_scatter(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                DataType dtype, int root) {
  validated(c, [&] {
    check_rooted(c, "scatter", count, dtype, root, "recv", recv, "send (at the root)", send,
                 "recv == send + root * count", c.size - 1);
  });
  return {{CollectiveKind::scatter, count, dtype, ReduceOp::sum, root, Algorithm::staged},
          send,
          recv,
          count * datatype_size(dtype)};
}

// Every block in one line when each fits (low_latency.cpp); else the staged
// rounds with their single copy (staged.cpp), or the ring's slots
// (ring.cpp allgatherv_ring) for large, uneven blocks at N=2. The choice
// follows only recv_counts, which every rank's must equal (a rank that
// disagrees may choose otherwise: check_descriptor then names the counts),
// N and oversubscription. SHMRING_ALGO=ring takes the ring at every size.
//   Why the ring there: in one copy a rank reads every other block itself,
// so the rank whose block is smallest reads the most; the ring splits each
// block's cost between its writer and its readers. N=2 on the Intel VM of
// docs/performance/notes/2026-12-01-intel-allgather.md, allgatherv of float32, median us, staged
// / ring: blocks 1/3 and 2/3 of 4 MiB 435-455 / 411-418, of 16 MiB
// 1894-1956 / 1652-1661; small / large = 0.6, 16 MiB 1728-1744 /
// 1631-1636, 64 MiB 12229-12267 / 10507-10914; 0.75 mixed (16 MiB
// 1591-1652 / 1595-1603); 0.9 and even blocks favour one copy (16 MiB
// even 1441-1473 / 1483-1494); a largest block of 2 MiB was level.
// Ranks sharing CPUs (N=3, 4 on 2 CPUs) were level or slower in the ring;
// N >= 3 on CPUs of their own is not measured, so it keeps the rounds.
Algorithm allgatherv_algorithm(const Communicator::Impl& c, const std::vector<std::size_t>& counts,
                               std::size_t es) {
  if (counts.empty() || c.size == 1) return Algorithm::staged;  // size 1: the local copy
  const auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
  const std::size_t largest = *hi * es, smallest = *lo * es;
  const Algorithm a = engine::choose(c, CollectiveKind::allgather, largest);
  if (a == Algorithm::low_latency) return a;
  if (c.forced_algorithm == Algorithm::ring) return Algorithm::ring;
  constexpr std::size_t kRingFrom = std::size_t{2} << 20;
  if (c.size == 2 && !c.config.oversubscribed && !c.forced_algorithm && largest > kRingFrom &&
      5 * smallest <= 3 * largest)
    return Algorithm::ring;
  return Algorithm::staged;
}

Op make_allgatherv(Communicator::Impl& c, const void* send, std::size_t send_count, void* recv,
                   std::span<const std::size_t> rc, std::span<const std::size_t> displs,
                   DataType dtype) {
  const char* what = "allgatherv";
  auto v = vector_args(c);
  validated(c, [&] {
    check_dtype(c, what, dtype);
    checked_vector(c, what, "recv_counts", rc, v->recv_counts);
    checked_vector(c, what, "displs", displs, v->recv_displs);
    const auto me = static_cast<std::size_t>(c.rank);
    if (send_count != v->recv_counts[me])
      throw InvalidArgumentError(
          fmt::format("rank {}: allgatherv: send_count {} differs from recv_counts[{}]={}", c.rank,
                      send_count, me, v->recv_counts[me]));
    sum_counts(c, what, v->recv_counts, dtype);
    const std::size_t bytes = checked_bytes(c, what, send_count, dtype, 1);
    auto& rblocks =
        block_ranges(c, what, "recv", v->recv_counts, v->recv_displs, dtype, c.scratch_recv_blocks);
    check_pointer(c, what, "send", send, bytes);
    check_pointer(c, what, "recv", recv, extent(rblocks));
    check_blocks_disjoint(c, what, rblocks);
    const auto* in_place =
        static_cast<const std::byte*>(recv) + v->recv_displs[me] * datatype_size(dtype);
    if (send != in_place) check_send_apart(c, what, send, bytes, recv, rblocks);
    check_lane(c, what, 1, static_cast<std::size_t>(c.size) * 8);
  });
  const Algorithm a = allgatherv_algorithm(c, v->recv_counts, datatype_size(dtype));
  Op o{{CollectiveKind::allgatherv, 0, dtype, ReduceOp::sum, -1, a},
       send,
       recv,
       total_bytes(v->recv_counts, dtype)};
  o.desc.vhash = algo::staged_vector_hash(v->recv_counts);
  o.v = std::move(v);
  return o;
}

Op make_reduce_scatter_v(Communicator::Impl& c, const void* send, void* recv,
                         std::span<const std::size_t> rc, DataType dtype, ReduceOp op) {
  const char* what = "reduce_scatter_v";
  auto v = vector_args(c);
  validated(c, [&] {
    check_dtype(c, what, dtype);
    check_op(c, what, dtype, op);
    checked_vector(c, what, "recv_counts", rc, v->recv_counts);
    const std::size_t total = sum_counts(c, what, v->recv_counts, dtype);
    const std::size_t es = datatype_size(dtype);
    std::size_t before = 0;
    for (int j = 0; j < c.rank; ++j) before += v->recv_counts[j];
    const std::size_t bytes = v->recv_counts[c.rank] * es;
    check_pointer(c, what, "send", send, total * es);
    check_pointer(c, what, "recv", recv, bytes);
    check_disjoint(c, what, send, total * es, recv, bytes,
                   static_cast<const std::byte*>(send) + before * es,
                   "recv == send + offset of block rank()");
    check_lane(c, what, c.size, static_cast<std::size_t>(c.size) * 8);
  });
  Op o{{CollectiveKind::reduce_scatter_v, 0, dtype, op, -1, Algorithm::staged},
       send,
       recv,
       v->recv_counts[static_cast<std::size_t>(c.rank)] * datatype_size(dtype)};
  o.desc.vhash = algo::staged_vector_hash(v->recv_counts);
  o.v = std::move(v);
  return o;
}

}  // namespace

void Communicator::alltoall(const void* send, void* recv, std::size_t count, DataType dtype) {
  impl_->execute(make_alltoall(*impl_, send, recv, count, dtype));
}
void Communicator::alltoallv(const void* send, std::span<const std::size_t> send_counts,
                             std::span<const std::size_t> send_displs, void* recv,
                             std::span<const std::size_t> recv_counts,
                             std::span<const std::size_t> recv_displs, DataType dtype) {
  impl_->execute(make_alltoallv(*impl_, send, send_counts, send_displs, recv, recv_counts,
                                recv_displs, dtype));
}
void Communicator::gather(const void* send, void* recv, std::size_t count, DataType dtype,
                          int root) {
  impl_->execute(make_gather(*impl_, send, recv, count, dtype, root));
}
void Communicator::scatter(const void* send, void* recv, std::size_t count, DataType dtype,
                           int root) {
  impl_->execute(make_scatter(*impl_, send, recv, count, dtype, root));
}
void Communicator::allgatherv(const void* send, std::size_t send_count, void* recv,
                              std::span<const std::size_t> recv_counts,
                              std::span<const std::size_t> displs, DataType dtype) {
  impl_->execute(make_allgatherv(*impl_, send, send_count, recv, recv_counts, displs, dtype));
}
void Communicator::reduce_scatter_v(const void* send, void* recv,
                                    std::span<const std::size_t> recv_counts, DataType dtype,
                                    ReduceOp op) {
  impl_->execute(make_reduce_scatter_v(*impl_, send, recv, recv_counts, dtype, op));
}

Request Communicator::ialltoall(const void* send, void* recv, std::size_t count, DataType dtype) {
  return impl_->submit(make_alltoall(*impl_, send, recv, count, dtype));
}
Request Communicator::ialltoallv(const void* send, std::span<const std::size_t> send_counts,
                                 std::span<const std::size_t> send_displs, void* recv,
                                 std::span<const std::size_t> recv_counts,
                                 std::span<const std::size_t> recv_displs, DataType dtype) {
  return impl_->submit(make_alltoallv(*impl_, send, send_counts, send_displs, recv, recv_counts,
                                      recv_displs, dtype));
}
Request Communicator::igather(const void* send, void* recv, std::size_t count, DataType dtype,
                              int root) {
  return impl_->submit(make_gather(*impl_, send, recv, count, dtype, root));
}
Request Communicator::iscatter(const void* send, void* recv, std::size_t count, DataType dtype,
                               int root) {
  return impl_->submit(make_scatter(*impl_, send, recv, count, dtype, root));
}
Request Communicator::iallgatherv(const void* send, std::size_t send_count, void* recv,
                                  std::span<const std::size_t> recv_counts,
                                  std::span<const std::size_t> displs, DataType dtype) {
  return impl_->submit(make_allgatherv(*impl_, send, send_count, recv, recv_counts, displs, dtype));
}
Request Communicator::ireduce_scatter_v(const void* send, void* recv,
                                        std::span<const std::size_t> recv_counts, DataType dtype,
                                        ReduceOp op) {
  return impl_->submit(make_reduce_scatter_v(*impl_, send, recv, recv_counts, dtype, op));
}

}  // namespace shmring
