// Ring reduce-scatter, allgather and allreduce over the segment's slots.
//
// Terms (reflected in the names below):
//   chunk  - the part of the buffer rank c owns: 1/N of an allreduce buffer,
//            `recv_count` elements for reduce-scatter, `send_count` for
//            allgather.
//   slice  - the part of a chunk one step moves through a slot
//            (Config::slice_bytes: slot_bytes, 64 KiB when oversubscribed).
//   round  - one pass of all ring steps over slice q of every chunk.
//   step   - one slot write by this rank (and, fused with it, one slot read).
//
// Round q at rank r (left = r-1, right = r+1), every step one slot:
//   reduce-scatter (N-1 writes, N-1 reads)
//     first write : copy  in[chunk r-1]                        -> my slot
//     step t      : read  left slot (chunk r-t-2, partial), add in[same chunk]
//                                                              -> my slot
//     last read   : chunk r is complete: add in[chunk r]       -> out[chunk r]
//                   (allreduce: -> my slot too, starting the allgather)
//   allgather (N-1 writes, N-1 reads)
//     first write : my chunk r -> my slot (allreduce: fused above)
//     step t      : read left slot (chunk r-t-1), copy -> out and -> my slot
//     last read   : chunk r+1 -> out only
// Every write but a round's first is fused with the read before it, so write
// k depends only on the left's write k-1 and on the right having read write
// k-K: with K >= 2 slots the ring cannot deadlock. Rounds and collectives
// follow each other without a barrier (docs/design/protocols.md, "Ring").
//
// Bytes per rank: allreduce moves 2(N-1)/N of the buffer through slots each
// way (the busbw factor), reduce-scatter and allgather (N-1)/N.
//
// float16 / bfloat16 sum, prod and avg (reduce_steps.hpp): the first write
// is the raw 16-bit input, every later reduce-scatter write a float64
// partial, and the last read rounds once; slices shrink to slice_bytes / 8
// elements for the whole collective (so the allgather slices match), and the
// reduce-scatter moves up to 4x the bytes of the 16-bit buffer.

#include <algorithm>
#include <cstring>
#include <functional>

#include "algorithms/algorithms.hpp"
#include "core/chunking.hpp"
#include "core/reduce_steps.hpp"
#include "core/state.hpp"

namespace shmring::algo {

namespace {

using detail::Range;
using detail::ring_mod;

struct RingPass {
  CommState& c;
  int n, r;
  std::size_t esize;
  std::size_t slice_elems;
  // Chunk c of the pass as [begin, count) in elements of the output buffer.
  std::function<Range(int)> chunk;

  Range slice(int owner, std::size_t q) const {
    return detail::slice_range(chunk(ring_mod(owner, n)), q, slice_elems);
  }

  // Reduce-scatter part of round q: `in` holds the rank's full input laid
  // out like the output. The complete chunk r goes to `out_mine` (an
  // element offset applies: out_mine + (slice.begin - chunk r begin)); with
  // `forward`, it is also written to my slot as the allgather's first write.
  void reduce_scatter_round(std::size_t q, const std::byte* in, std::byte* out_mine, DataType dtype,
                            ReduceOp op, bool forward) {
    c.step = 0;
    {
      Range s = slice(r - 1, q);
      std::byte* dst = c.acquire_send_slot();
      c.copy_to_slot(dst, in + s.begin * esize, s.count * esize);
      c.publish_send();
    }
    for (int t = 0; t < n - 2; ++t) {
      c.step = t + 1;
      Range s = slice(r - t - 2, q);
      const std::byte* src = c.wait_recv_slot();
      std::byte* dst = c.acquire_send_slot();
      partial_step(c, dst, src, /*src_partial=*/t > 0, in + s.begin * esize, s.count, dtype, op);
      c.publish_send();
      c.release_recv();
    }
    c.step = n - 1;
    Range s = slice(r, q);
    const std::size_t mine = s.begin - chunk(r).begin;
    std::byte* out = out_mine + mine * esize;
    const std::byte* src = c.wait_recv_slot();
    // Reduce into the output (in place, `in` is that very range, which the
    // kernels allow), then forward from there: the slot gets one copy, which
    // copy_to_slot may stream.
    final_step(c, out, src, /*src_partial=*/n > 2, in + s.begin * esize, s.count, dtype, op, n);
    if (forward) {
      std::byte* dst = c.acquire_send_slot();
      c.copy_to_slot(dst, out, s.count * esize);
      c.publish_send();
    }
    c.release_recv();
  }

  // Allgather part of round q into `out` (laid out by chunk). Unless the
  // first write was fused into the reduce-scatter, my slice comes from
  // `mine` (element offset relative to chunk r's begin).
  void allgather_round(std::size_t q, std::byte* out, const std::byte* mine_in, bool first_done) {
    if (!first_done) {
      c.step = n - 1;
      Range s = slice(r, q);
      const std::byte* src = mine_in + (s.begin - chunk(r).begin) * esize;
      std::byte* dst = c.acquire_send_slot();
      c.copy_to_slot(dst, src, s.count * esize);
      if (out + s.begin * esize != src) c.copy(out + s.begin * esize, src, s.count * esize);
      c.publish_send();
    }
    for (int t = 0; t < n - 2; ++t) {
      c.step = n + t;
      Range s = slice(r - t - 1, q);
      const std::byte* src = c.wait_recv_slot();
      std::byte* dst = c.acquire_send_slot();
      c.copy(out + s.begin * esize, src, s.count * esize);
      c.copy_to_slot(dst, out + s.begin * esize, s.count * esize);
      c.publish_send();
      c.release_recv();
    }
    c.step = 2 * n - 2;
    Range s = slice(r + 1, q);
    const std::byte* src = c.wait_recv_slot();
    c.copy(out + s.begin * esize, src, s.count * esize);
    c.release_recv();
  }
};

std::size_t rounds_for(const RingPass& p, std::size_t largest_chunk) {
  // At least one round, so that a zero-count call still exchanges
  // descriptors (and a mismatch is seen rather than skipped).
  return std::max<std::size_t>(
      1, largest_chunk / p.slice_elems + (largest_chunk % p.slice_elems != 0 ? 1 : 0));
}

}  // namespace

void allreduce_ring(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                    ReduceOp op) {
  const std::size_t es = datatype_size(dtype);
  RingPass p{c,
             c.size,
             c.rank,
             es,
             reduction_slice_elems(c.config.slice_bytes, dtype, op, c.size),
             [count, n = c.size](int k) { return detail::chunk_range(count, n, k); }};
  const std::size_t rounds = detail::ring_rounds(count, c.size, p.slice_elems);
  auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  std::byte* out_mine = out + p.chunk(c.rank).begin * es;
  for (std::size_t q = 0; q < rounds; ++q) {
    p.reduce_scatter_round(q, in, out_mine, dtype, op, /*forward=*/true);
    p.allgather_round(q, out, nullptr, /*first_done=*/true);
  }
}

void reduce_scatter_ring(CommState& c, const void* send, void* recv, std::size_t recv_count,
                         DataType dtype, ReduceOp op) {
  const std::size_t es = datatype_size(dtype);
  RingPass p{c,
             c.size,
             c.rank,
             es,
             reduction_slice_elems(c.config.slice_bytes, dtype, op, c.size),
             [recv_count](int k) {
               return Range{static_cast<std::size_t>(k) * recv_count, recv_count};
             }};
  const std::size_t rounds = rounds_for(p, recv_count);
  for (std::size_t q = 0; q < rounds; ++q)
    p.reduce_scatter_round(q, static_cast<const std::byte*>(send), static_cast<std::byte*>(recv),
                           dtype, op, /*forward=*/false);
}

void allgather_ring(CommState& c, const void* send, void* recv, std::size_t send_count,
                    DataType dtype) {
  const std::size_t es = datatype_size(dtype);
  RingPass p{c, c.size, c.rank, es, c.config.slice_bytes / es, [send_count](int k) {
               return Range{static_cast<std::size_t>(k) * send_count, send_count};
             }};
  const std::size_t rounds = rounds_for(p, send_count);
  // A ring rank checks only its neighbours' calls, and an allgather's first
  // read lands in `out`: so every rank's call is checked first, and a rank
  // that fails (a peer refused the call, say) returns with `out` as it was.
  // A wait for every rank to start, which the first round needs anyway.
  c.wait_every_announced();
  for (std::size_t q = 0; q < rounds; ++q)
    p.allgather_round(q, static_cast<std::byte*>(recv), static_cast<const std::byte*>(send),
                      /*first_done=*/false);
}

void allgatherv_ring(CommState& c, const void* send, void* recv, const VectorArgs& v,
                     DataType dtype) {
  // The slicing of a chunk follows only its count, which every rank passes
  // alike (the descriptor's vhash, check_descriptor); where a block sits in
  // `recv` (its displacement) is each rank's own business.
  const std::size_t es = datatype_size(dtype);
  RingPass p{c, c.size, c.rank, es, c.config.slice_bytes / es, [&v](int k) {
               return Range{v.recv_displs[k], v.recv_counts[k]};
             }};
  const std::size_t rounds =
      rounds_for(p, *std::max_element(v.recv_counts.begin(), v.recv_counts.end()));
  c.wait_every_announced();  // as allgather_ring: every call before `out` changes
  for (std::size_t q = 0; q < rounds; ++q)
    p.allgather_round(q, static_cast<std::byte*>(recv), static_cast<const std::byte*>(send),
                      /*first_done=*/false);
}

}  // namespace shmring::algo
