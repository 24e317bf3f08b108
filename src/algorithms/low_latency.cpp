// Low-latency path for the smallest collectives: barriers, allreduces,
// allgathers and allgathervs of at most kLowLatencyBytes (104 bytes: 26
// float32) per rank, alltoalls whose whole send buffer is that small, and
// at N=2 alltoallvs whose blocks to and from the peer each are (the two
// ranks decide from the same two counts; a larger N would need every
// pair's). N=2 on the Intel VM of docs/performance/notes/2026-12-01-intel-allgather.md, 8 bytes
// in all: 0.37-0.40 us in the staged rounds, 0.22-0.23 here (Open MPI
// 0.36-0.37).
//
// Terms. Every rank owns two low-latency lines (layout.hpp LowLatencyLine);
// collective c uses line c mod 2. A line holds a sequence number (`seq` =
// c + 1), the descriptor (count, kind, datatype, operator, algorithm,
// purpose, root)
// and the data: 40 bytes of it in the same 64-byte cache line as `seq`, the
// rest in the next one, the other half of its 128-byte block (x86's
// adjacent-line prefetcher may fetch the two together; N=2 on the Intel VM
// of docs/performance/notes/2026-12-01-intel-single-copy.md, 64 bytes took 0.20-0.29 us this way
// against 0.33-0.45 on the direct and staged paths, 8 bytes 0.17).
//
// Steps of collective c, on every rank:
//   1. Make sure line c mod 2 is free: every peer finished collective c-2.
//      When c-1 was a low-latency collective that is already proven (we read
//      every peer's line c-1, which a peer writes only after finishing c-2),
//      so back-to-back small calls never read a peer's `done` counter.
//      Otherwise wait for the `done` counters as the direct path does.
//   2. Write descriptor and data into the line, then `seq` (release). The
//      `announced` counter (publish(): it carries sleepers and slow checks,
//      and without the asymmetric fence of wait.hpp it is a seq_cst store)
//      follows when a wait of ours leaves its spin phase, or at the end: a
//      fence right after the line would stall until every peer's polled copy
//      of it is invalidated. A peer sleeps only after its spin (and yield)
//      phases, as long as ours, by which time we announced.
//   3. For each peer, poll its line until `seq` = c + 1 (acquire): the poll
//      that succeeds brings descriptor and data with it, one cache-line
//      transfer per peer, or two past 40 bytes (the direct path moves three
//      in a row: announced, descriptor entry, data). Compare the descriptor,
//      then reduce the N lines in rank order 0..N-1 (bitwise the same on
//      every rank, float16 and bfloat16 in float64 and rounded once, as the
//      direct path), or copy the blocks out (allgather, allgatherv,
//      alltoall).
// A wait that does not succeed within the spin phase falls back to waiting
// on the peer's `announced` counter (yield, futex sleep, peer death, abort
// and deadline checks of wait_counter). A peer that announced collective c
// without writing its line took another path: a mismatch (check_descriptor
// names it). This is NCCL's "LL" idea (data and flag travel together), here
// with a whole line per rank and one flag per line instead of a flag per
// 8 bytes: the writer publishes the line with one release store.

#include <fmt/format.h>

#include <cstring>

#include "algorithms/algorithms.hpp"
#include "base/element.hpp"
#include "core/reduce_steps.hpp"
#include "core/state.hpp"

namespace shmring {

namespace {

// The line's `count` word: the count, or for allgatherv (count 0) the hash
// of its recv_counts, which every rank's must equal.
std::uint64_t line_count(const CollectiveDesc& d) {
  return d.count ^ d.vhash;
}

// Kind, dtype, op and algorithm a byte each; the purpose (CallPurpose, 2
// bits) in the top bits of the algorithm's byte, whose values are small.
std::uint32_t pack(const CollectiveDesc& d) {
  static_assert(static_cast<std::uint32_t>(Algorithm::low_latency) < 64);
  return static_cast<std::uint32_t>(d.kind) | static_cast<std::uint32_t>(d.dtype) << 8 |
         static_cast<std::uint32_t>(d.op) << 16 | static_cast<std::uint32_t>(d.algorithm) << 24 |
         static_cast<std::uint32_t>(d.purpose) << 30;
}

}  // namespace

detail::LowLatencyLine& CommState::acquire_low_latency_line() {
  if (low_latency.read != collectives) acquire_direct_buffer();  // done(q) >= c-1 for all q
  return my_area().low_latency[collectives % 2];
}

const detail::LowLatencyLine& CommState::wait_low_latency(int peer) {
  const detail::LowLatencyLine& line = area(peer).low_latency[collectives % 2];
  const std::uint64_t want = collectives + 1;
  auto ready = [&] { return line.seq.load(std::memory_order_acquire) == want; };
  if (!ready()) {
    // Spin only while the peer runs on a CPU of its own (placement.hpp).
    detail::WaitPolicy policy = policy_for(peer);
    if (!detail::spin_until(policy, ready)) {
      // Leaving the spin: announce now, so that a peer asleep on our
      // `announced` wakes, and a peer on another path can check our
      // descriptor. `announced` is published after the line: once the
      // peer's moves, its line is visible, or it took another path.
      if (!low_latency.announced) {
        announce();
        low_latency.announced = true;
      }
      policy.spin_ns = 0;
      wait_counter(area(peer).announced, want, peer, "the start of the collective", policy);
      if (!ready()) {
        check_descriptor(peer);  // throws: the peer is in another collective or path
        fail(MismatchError(fmt::format(
            "rank {}: collective #{} {}: rank {} announced it without its low-latency line", rank,
            collectives, describe(*current), peer)));
      }
    }
  }
  const CollectiveDesc& mine = *current;
  if (line.kind_dtype_op_algorithm.load(std::memory_order_relaxed) != pack(mine) ||
      line.count.load(std::memory_order_relaxed) != line_count(mine) ||
      line.root.load(std::memory_order_relaxed) != mine.root) {
    check_descriptor(peer);  // names the difference and throws
    if (mine.kind == CollectiveKind::alltoallv) {
      // Both words list the counts 0 -> 1 and 1 -> 0; the sender's
      // send_counts and the receiver's recv_counts disagree on one of them.
      const std::uint64_t w[2] = {
          rank == 0 ? mine.vhash : line.count.load(std::memory_order_relaxed),
          rank == 1 ? mine.vhash : line.count.load(std::memory_order_relaxed)};
      const auto to1 = [](std::uint64_t x) { return x & 0xffffffffu; };
      const auto to0 = [](std::uint64_t x) { return x >> 32; };
      if (to1(w[0]) != to1(w[1])) algo::alltoallv_pair_mismatch(*this, 0, 1, to1(w[0]), to1(w[1]));
      if (to0(w[0]) != to0(w[1])) algo::alltoallv_pair_mismatch(*this, 1, 0, to0(w[1]), to0(w[0]));
    } else if (mine.vhash != 0) {
      fail_recv_counts(peer);  // allgatherv: the hash of recv_counts
    }
    fail(MismatchError(fmt::format("rank {}: collective #{} {}: rank {} disagrees", rank,
                                   collectives, describe(mine), peer)));
  }
  return line;
}

namespace algo {

namespace {

detail::LowLatencyLine& publish_line(CommState& c, const void* data, std::size_t bytes) {
  detail::LowLatencyLine& line = c.acquire_low_latency_line();
  const CollectiveDesc& d = *c.current;
  line.count.store(line_count(d), std::memory_order_relaxed);
  line.kind_dtype_op_algorithm.store(pack(d), std::memory_order_relaxed);
  line.root.store(d.root, std::memory_order_relaxed);
  if (bytes > 0) std::memcpy(line.data, data, bytes);
  // A release store only: no fence waits here for the peers' copies of the
  // line to be invalidated. `announced` (publish(), the sleepers' counter)
  // follows once we leave a spin or finish (wait_all_lines).
  line.seq.store(c.collectives + 1, std::memory_order_release);
  c.low_latency.announced = false;
  c.step = 0;  // the line is out; what follows waits for the peers'

  // The call's clock read and recorder entry, which begin() left to us:
  // here they overlap the line's transfer (state.hpp start_deferred).
  if (c.start_deferred) c.stamp_start();
  return line;
}

void wait_all_lines(CommState& c) {
  for (int q = 0; q < c.size; ++q)
    if (q != c.rank) c.wait_low_latency(q);
  c.low_latency.read = c.collectives + 1;
  if (!c.low_latency.announced) c.announce();
}

}  // namespace

void allreduce_low_latency(CommState& c, const void* send, void* recv, std::size_t count,
                           DataType dtype, ReduceOp op) {
  const std::size_t bytes = count * detail::element_bytes(dtype);
  publish_line(c, send, bytes);
  wait_all_lines(c);
  if (count == 0) return;
  const std::size_t parity = c.collectives % 2;
  // Our own term comes from `send`, not from our line: the line was just
  // written and the peers polling it hold copies, so reading it back waits
  // for our store to own the line again (N=2, 8 bytes on the Intel VM: 0.23
  // -> 0.17-0.18 us a call; docs/performance/notes/2026-12-01-intel-single-copy.md). The bytes are
  // the same. In place, only where the first step reads our term (ranks 0
  // and 1) and may write over it (reduce: either operand; the 16-bit
  // types' reduce_to_narrow: only the second); a later step would read a
  // `recv` the first one overwrote.
  const auto* own = static_cast<const std::byte*>(send);
  const bool own_from_send =
      send != recv || c.rank == 1 || (c.rank == 0 && !detail::reduces_wide(dtype, op));
  // One block (at most kLowLatencyBytes / 2 elements), so the block step
  // itself, with its Wide partials (16-bit types past kManyInRegisters
  // ranks) on the stack.
  detail::Wide acc[detail::kLowLatencyBytes / 2];
  reduce_block_in_rank_order(
      static_cast<std::byte*>(recv),
      [&c, parity, own, own_from_send](int q) -> const std::byte* {
        return q == c.rank && own_from_send ? own : c.area(q).low_latency[parity].data;
      },
      c.size, count, dtype, op, acc);
}

void allgather_low_latency(CommState& c, const void* send, void* recv, std::size_t count,
                           DataType dtype) {
  const std::size_t bytes = count * datatype_size(dtype);
  publish_line(c, send, bytes);
  wait_all_lines(c);
  if (bytes == 0) return;
  // Our own block too only once every line was checked: a rank that fails
  // returns with `recv` as it was. In place (send == recv + rank * bytes)
  // this copies nothing.
  auto* out = static_cast<std::byte*>(recv);
  std::memmove(out + c.rank * bytes, send, bytes);
  const std::size_t parity = c.collectives % 2;
  for (int q = 0; q < c.size; ++q)
    if (q != c.rank) std::memcpy(out + q * bytes, c.area(q).low_latency[parity].data, bytes);
}

void alltoall_low_latency(CommState& c, const void* send, void* recv, std::size_t count,
                          DataType dtype) {
  // The line carries our whole send buffer; each peer takes its block.
  const std::size_t bytes = count * datatype_size(dtype);
  publish_line(c, send, bytes * static_cast<std::size_t>(c.size));
  wait_all_lines(c);
  if (bytes == 0) return;
  auto* out = static_cast<std::byte*>(recv);  // own block last, as allgather's
  std::memcpy(out + c.rank * bytes, static_cast<const std::byte*>(send) + c.rank * bytes, bytes);
  const std::size_t parity = c.collectives % 2;
  for (int q = 0; q < c.size; ++q)
    if (q != c.rank)
      std::memcpy(out + q * bytes, c.area(q).low_latency[parity].data + c.rank * bytes, bytes);
}

std::uint64_t alltoallv_line_word(int rank, const VectorArgs& v) {
  // Rank 0 sends send_counts[1] and receives recv_counts[1]; rank 1 sends
  // send_counts[0] and receives recv_counts[0]. Each fits 32 bits (at most
  // kLowLatencyBytes elements).
  const std::uint64_t zero_to_one = rank == 0 ? v.send_counts[1] : v.recv_counts[0];
  const std::uint64_t one_to_zero = rank == 0 ? v.recv_counts[1] : v.send_counts[0];
  return zero_to_one | one_to_zero << 32;
}

void alltoallv_low_latency(CommState& c, const void* send, void* recv, const VectorArgs& v,
                           DataType dtype) {
  const std::size_t es = datatype_size(dtype);
  const int me = c.rank, peer = 1 - me;
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  const std::size_t to_peer = v.send_counts[peer] * es, own = v.send_counts[me] * es;
  publish_line(c, to_peer > 0 ? in + v.send_displs[peer] * es : nullptr, to_peer);
  wait_all_lines(c);
  // Own block last, as allgather's. The front keeps send and recv apart (no
  // in-place form).
  if (own > 0) std::memcpy(out + v.recv_displs[me] * es, in + v.send_displs[me] * es, own);
  const std::size_t from_peer = v.recv_counts[peer] * es;  // = the peer's to_peer (checked)
  if (from_peer > 0)
    std::memcpy(out + v.recv_displs[peer] * es, c.area(peer).low_latency[c.collectives % 2].data,
                from_peer);
}

void allgatherv_low_latency(CommState& c, const void* send, void* recv, const VectorArgs& v,
                            DataType dtype) {
  const std::size_t es = datatype_size(dtype);
  const std::size_t bytes = v.recv_counts[c.rank] * es;
  publish_line(c, send, bytes);
  wait_all_lines(c);
  // Own block last, as allgather's. In place (send == recv + displs[rank])
  // this copies nothing.
  auto* out = static_cast<std::byte*>(recv);
  if (bytes > 0) std::memmove(out + v.recv_displs[c.rank] * es, send, bytes);
  const std::size_t parity = c.collectives % 2;
  for (int q = 0; q < c.size; ++q)
    if (q != c.rank && v.recv_counts[q] > 0)
      std::memcpy(out + v.recv_displs[q] * es, c.area(q).low_latency[parity].data,
                  v.recv_counts[q] * es);
}

void barrier_low_latency(CommState& c) {
  publish_line(c, nullptr, 0);
  wait_all_lines(c);
}

}  // namespace algo

}  // namespace shmring
