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
//     rounds. A slot then carries slot_bytes / 8 elements (slice_elems).
//   - direct: reduce_in_rank_order accumulates in a local float64 block.
// At N = 2 no partial is ever sent, so slices keep their 16-bit size.

#include <cstddef>
#include <functional>

#include "comm_impl.hpp"

namespace shmring::algo {

/// Whether a rank's partials for (dtype, op) at world size n travel as
/// float64: a 16-bit sum, prod or avg with N > 2.
bool partials_wide(DataType dtype, ReduceOp op, int n);

/// Elements per slot (one slice) for a reduction of (dtype, op) at world
/// size n: slot_bytes / 8 when partials travel wide, else slot_bytes / size.
std::size_t reduction_slice_elems(std::size_t slot_bytes, DataType dtype, ReduceOp op, int n);

/// An intermediate step: dst = partial(src) op in, where src is the raw
/// 16-bit / native input of the first rank of the chain (src_partial false)
/// or a partial written by partial_step (src_partial true). dst receives a
/// partial (float64 for wide pairs). m elements; dst may alias src.
void partial_step(Communicator::Impl& c, std::byte* dst, const std::byte* src, bool src_partial,
                  const std::byte* in, std::size_t m, DataType dtype, ReduceOp op);

/// The step that completes the reduction of n ranks: out = src op in, with
/// avg divided by n, rounded once to dtype. src as in partial_step; out may
/// alias in exactly.
void final_step(Communicator::Impl& c, std::byte* out, const std::byte* src, bool src_partial,
                const std::byte* in, std::size_t m, DataType dtype, ReduceOp op, int n);

/// out[i] = op over q = 0..nsrc-1 of src(q)[i] for i < m, combined strictly
/// in order q = 0, 1, ..., nsrc-1 (so every caller gets the same bits);
/// avg divides by nsrc. nsrc >= 2; out must not overlap any src(q). Uses
/// the rank's thread arena for large m. The direct path reduces the byte
/// range of every rank's buffer with it (src(q) = rank q's buffer + offset).
void reduce_in_rank_order(Communicator::Impl& c, std::byte* out,
                          const std::function<const std::byte*(int)>& src, int nsrc, std::size_t m,
                          DataType dtype, ReduceOp op);

}  // namespace shmring::algo
