// Ring allreduce over the shared segment's slots.
//
// Terms (reflected in the names below):
//   chunk  - 1/N of the buffer; rank c owns chunk c at the end of reduce-scatter.
//   slice  - the part of a chunk that fits one slot (slot_bytes).
//   round  - one pass of all 2(N-1) ring steps over slice q of every chunk.
//   step   - one slot write by this rank (and, fused with it, one slot read).
//
// Round q at rank r (left = r-1, right = r+1), every step one slot:
//   reduce-scatter (N-1 steps)
//     step 0      : copy  send[chunk r-1]                      -> my slot
//     step t<N-1  : read  left slot (chunk r-t-1, partial sum),
//                   add   send[chunk r-t-1]                    -> my slot
//     last read   : chunk r is complete: add send[chunk r]     -> my slot, recv[chunk r]
//   allgather (N-1 steps)
//     step t      : read  left slot (chunk r-t), copy -> recv and -> my slot
//     last read   : chunk r+1 -> recv only
// So every write but a round's first is fused with the read before it, and
// every write k of a round depends only on the left's write k-1 and on the
// right having read write k-K: with K >= 2 slots the ring cannot deadlock.
// Rounds follow each other without a barrier, as do collectives (DESIGN).
//
// Bytes per rank per round: 2(N-1) slot writes and 2(N-1) slot reads of one
// slice each, i.e. 2(N-1)/N of the buffer each way (the busbw factor).

#include <cstring>

#include "chunking.hpp"
#include "comm_impl.hpp"

namespace shmring::algo {

void allreduce_ring(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                    DataType dtype, ReduceOp op) {
  using detail::chunk_range;
  using detail::ring_mod;
  using detail::slice_range;
  const int n = c.size, r = c.rank;
  const std::size_t esize = datatype_size(dtype);
  const std::size_t slice_elems = c.seg->slot_bytes() / esize;
  const std::size_t rounds = detail::ring_rounds(count, n, slice_elems);
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  // Every step but the last reduce-scatter one accumulates with `step_op`.
  const ReduceOp step_op = op == ReduceOp::avg ? ReduceOp::sum : op;

  auto slice_of = [&](int chunk, std::size_t q) {
    return slice_range(chunk_range(count, n, chunk), q, slice_elems);
  };
  bool checked = false;
  auto recv_slot = [&]() {
    const std::byte* s = c.wait_recv_slot();
    if (!checked) {
      c.check_left_descriptor();
      checked = true;
    }
    return s;
  };

  for (std::size_t q = 0; q < rounds; ++q) {
    c.step = 0;
    // Reduce-scatter, step 0: my copy of chunk r-1 starts around the ring.
    {
      auto s = slice_of(ring_mod(r - 1, n), q);
      std::byte* dst = c.acquire_send_slot();
      c.copy(dst, in + s.begin * esize, s.count * esize);
      c.publish_send();
    }
    for (int t = 0; t < n - 2; ++t) {
      c.step = t + 1;
      auto s = slice_of(ring_mod(r - t - 2, n), q);
      const std::byte* src = recv_slot();
      std::byte* dst = c.acquire_send_slot();
      c.reduce(dst, src, in + s.begin * esize, s.count, dtype, step_op);
      c.publish_send();
      c.release_recv();
    }
    // Last reduce-scatter read: chunk r is complete. Fused with allgather's
    // first write.
    {
      c.step = n - 1;
      auto s = slice_of(r, q);
      const std::byte* src = recv_slot();
      std::byte* dst = c.acquire_send_slot();
      if (op == ReduceOp::avg)
        c.reduce(dst, src, in + s.begin * esize, s.count, dtype, ReduceOp::avg, n);
      else
        c.reduce(dst, src, in + s.begin * esize, s.count, dtype, op);
      c.copy(out + s.begin * esize, dst, s.count * esize);
      c.publish_send();
      c.release_recv();
    }
    // Allgather: forward what arrives, keep a copy.
    for (int t = 0; t < n - 2; ++t) {
      c.step = n + t;
      auto s = slice_of(ring_mod(r - t - 1, n), q);
      const std::byte* src = recv_slot();
      std::byte* dst = c.acquire_send_slot();
      c.copy(dst, src, s.count * esize);
      c.copy(out + s.begin * esize, src, s.count * esize);
      c.publish_send();
      c.release_recv();
    }
    {
      c.step = 2 * n - 2;
      auto s = slice_of(ring_mod(r + 1, n), q);
      const std::byte* src = recv_slot();
      c.copy(out + s.begin * esize, src, s.count * esize);
      c.release_recv();
    }
  }
}

}  // namespace shmring::algo
