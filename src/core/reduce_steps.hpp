#pragma once

// Reduction steps shared by the ring, chain and direct algorithms.
//
// Most (datatype, operator) pairs reduce pairwise in their own type: a step
// is detail::reduce. float16 and bfloat16 sum, prod and avg instead carry
// float64 partials (kernels/wide.hpp) and round once, in the step that
// produces the result, so every path gives the same bits:
//   - ring and chain: a rank's first write is its raw 16-bit input; each
//     later step reads the left's partial (16-bit if it was that first
//     write, float64 otherwise) and writes a float64 partial; the final step
//     rounds. A slot then carries slice_bytes / 8 elements (slice_elems).
//   - direct and two-shot: reduce_in_rank_order reads every rank's 16-bit
//     block and combines them in registers (detail::reduce_many_to_narrow).
// At N = 2 no partial is ever sent, so slices keep their 16-bit size.

#include <cstddef>
#include <cstring>
#include <functional>

#include "core/state.hpp"
#include "kernels/reduce.hpp"
#include "kernels/wide.hpp"

namespace shmring::algo {

/// Whether a rank's partials for (dtype, op) at world size n travel as
/// float64: a 16-bit sum, prod or avg with N > 2.
bool partials_wide(DataType dtype, ReduceOp op, int n);

/// Elements per slot (one slice) for a reduction of (dtype, op) at world
/// size n: slice_bytes / 8 when partials travel wide, else slice_bytes /
/// size (slice_bytes: Config::slice_bytes).
std::size_t reduction_slice_elems(std::size_t slice_bytes, DataType dtype, ReduceOp op, int n);

/// An intermediate step: dst = partial(src) op in, where src is the raw
/// 16-bit / native input of the first rank of the chain (src_partial false)
/// or a partial written by partial_step (src_partial true). dst receives a
/// partial (float64 for wide pairs). m elements; dst may alias src.
void partial_step(CommState& c, std::byte* dst, const std::byte* src, bool src_partial,
                  const std::byte* in, std::size_t m, DataType dtype, ReduceOp op);

/// The step that completes the reduction of n ranks: out = src op in, with
/// avg divided by n, rounded once to dtype. src as in partial_step; out may
/// alias in exactly.
void final_step(CommState& c, std::byte* out, const std::byte* src, bool src_partial,
                const std::byte* in, std::size_t m, DataType dtype, ReduceOp op, int n);

/// Up to this many sources a 16-bit block reduces in one pass
/// (detail::reduce_many_to_narrow); more go through the Wide accumulator in
/// memory, two sources at a time (the same bits).
inline constexpr int kManyInRegisters = 64;

/// One block of reduce_in_rank_order: o[i] = op over q of src(q)[i] for
/// i < k, in rank order; `acc` holds k Wide partials for the 16-bit sum,
/// prod and avg (kernels/wide.hpp), unused otherwise.
template <class Src>
void reduce_block_in_rank_order(std::byte* o, Src&& src, int nsrc, std::size_t k, DataType dtype,
                                ReduceOp op, detail::Wide* acc) {
  const ReduceOp step_op = op == ReduceOp::avg ? ReduceOp::sum : op;
  const int divisor = op == ReduceOp::avg ? nsrc : 1;
  if (!detail::reduces_wide(dtype, op)) {
    auto step = k <= detail::kShortReduceElems ? detail::reduce_short : detail::reduce;
    for (int q = 1; q < nsrc; ++q) {
      const std::byte* a = q == 1 ? src(0) : o;
      if (q == nsrc - 1)
        step(o, a, src(q), k, dtype, op, divisor);
      else
        step(o, a, src(q), k, dtype, step_op, 1);
    }
  } else if (nsrc == 2) {
    detail::reduce_to_narrow(o, src(0), false, src(1), k, dtype, op, divisor);
  } else if (nsrc <= kManyInRegisters) {
    // Every source's block in one pass, the partial kept in registers.
    const void* ptrs[kManyInRegisters];
    for (int q = 0; q < nsrc; ++q) ptrs[q] = src(q);
    detail::reduce_many_to_narrow(o, ptrs, nsrc, k, dtype, op, divisor);
  } else {
    detail::reduce_to_wide(acc, src(0), false, src(1), k, dtype, op);
    for (int q = 2; q < nsrc - 1; ++q) detail::reduce_to_wide(acc, acc, true, src(q), k, dtype, op);
    detail::reduce_to_narrow(o, acc, true, src(nsrc - 1), k, dtype, op, divisor);
  }
}

/// The general case of reduce_in_rank_order (any m, in blocks, on the
/// rank's thread arena when m is large).
void reduce_in_rank_order_blocks(CommState& c, std::byte* out,
                                 const std::function<const std::byte*(int)>& src, int nsrc,
                                 std::size_t m, DataType dtype, ReduceOp op, std::byte* copy);

/// Up to this many elements reduce_in_rank_order runs inline on the calling
/// thread, with the accumulator on the stack (2 KiB). An 8-byte allreduce
/// spent about 40 ns (a quarter of its time) in the general path's
/// type-erased callable, arena check and 16 KiB accumulator frame.
inline constexpr std::size_t kInlineReduceElems = 256;

/// out[i] = op over q = 0..nsrc-1 of src(q)[i] for i < m, combined strictly
/// in order q = 0, 1, ..., nsrc-1 (so every caller gets the same bits);
/// avg divides by nsrc. nsrc >= 2; out must not overlap any src(q). Uses
/// the rank's thread arena for large m. The direct path reduces the byte
/// range of every rank's buffer with it (src(q) = rank q's buffer + offset).
/// `src`: a callable int -> const std::byte*.
///
/// `copy`, when not null, receives a copy of the result (m elements), each
/// block written right after it is reduced, while it is still in cache. It
/// must not overlap `out`; it may be one of the sources exactly (copy ==
/// src(q) for one q), since a block of a source is read before the same
/// block of `copy` is written (the two-shot path publishes its reduced part
/// over its own input that way).
template <class Src>
void reduce_in_rank_order(CommState& c, std::byte* out, Src&& src, int nsrc, std::size_t m,
                          DataType dtype, ReduceOp op, std::byte* copy = nullptr) {
  if (m <= kInlineReduceElems) {
    alignas(64) detail::Wide acc[kInlineReduceElems];
    reduce_block_in_rank_order(out, src, nsrc, m, dtype, op, acc);
    if (copy != nullptr) std::memcpy(copy, out, m * datatype_size(dtype));
    return;
  }
  reduce_in_rank_order_blocks(c, out, src, nsrc, m, dtype, op, copy);
}

}  // namespace shmring::algo
