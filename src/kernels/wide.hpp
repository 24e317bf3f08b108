#pragma once

// Wide partials for float16 and bfloat16 reductions.
//
// A 16-bit sum, prod or avg is computed in float64 and rounded to the 16-bit
// type once, at the end, so the result does not depend on how many steps
// the reduction took, in which order the ranks were combined (ring, chain,
// direct path), or where the element sits in the buffer:
//   - float16: every float16 value is an integer multiple of 2^-24 below
//     2^16, so a float64 sum of up to 8192 of them is exact. The result is
//     the exact sum (or exact sum / N) rounded once to nearest even.
//   - bfloat16: the float64 sum is exact while an element's inputs span less
//     than 2^(45 - log2 N) (2^42 at N = 8: 53 bits less bfloat16's 8 and
//     the carries); beyond that the float64 partial rounds, as any
//     fixed-width accumulator would.
//   - prod: float64 products of up to 6 bfloat16 (4 float16) values are
//     exact; larger N round in float64 (53 bits) before the one rounding.
// Partials travel between ranks as float64 (ring and chain slots) or stay in
// a local accumulator (direct path); min and max are exact in 16 bits and do
// not use them.
//
// Narrowing float64 -> 16 bits: round to odd to float32, then to nearest even
// to 16 bits. Rounding to odd first keeps the sticky information, so the two
// steps give exactly the one correctly rounded result (float32's grid refines
// both 16-bit grids by >= 2 bits everywhere, subnormals included).

#include <cstddef>
#include <cstdint>

#include "shmring/types.hpp"

namespace shmring::detail {

/// Element type of wide partials. float64 makes float16 sums exact; float
/// would halve the partials' bytes but round them (results would then
/// depend on the path and position again). The kernels compile with either.
using Wide = double;
inline constexpr std::size_t kWideBytes = sizeof(Wide);

/// Whether (dtype, op) reduces through wide partials: float16 and bfloat16
/// with sum, prod or avg.
constexpr bool reduces_wide(DataType dtype, ReduceOp op) {
  return (dtype == DataType::float16 || dtype == DataType::bfloat16) &&
         (op == ReduceOp::sum || op == ReduceOp::prod || op == ReduceOp::avg);
}

/// dst[i] = a[i] op b[i] as a Wide partial. `a` holds Wide partials when
/// a_wide, else 16-bit values of `dtype`; `b` holds 16-bit values. op: sum
/// or avg (both add) or prod. dst may alias a exactly (a_wide). No alignment
/// needed. Requires reduces_wide(dtype, op).
void reduce_to_wide(void* dst, const void* a, bool a_wide, const void* b, std::size_t n,
                    DataType dtype, ReduceOp op);

/// dst[i] = round((a[i] op b[i]) / divisor) to `dtype`, the one rounding of
/// the reduction; `a` as in reduce_to_wide. op: sum, prod or avg; divisor 1,
/// or N >= 1 with sum or avg (the float64 division before the rounding).
/// dst may alias b exactly.
void reduce_to_narrow(void* dst, const void* a, bool a_wide, const void* b, std::size_t n,
                      DataType dtype, ReduceOp op, int divisor);

/// dst[i] = round((s_0[i] op s_1[i] op ... op s_{nsrc-1}[i]) / divisor) to
/// `dtype`, for i < n: every source holds n 16-bit values of `dtype`
/// (srcs[q] points at them; any alignment); they combine as Wide values in
/// the order q = 0, 1, ..., nsrc-1 (so the bits do not depend on who calls),
/// kept in registers, and round once: the same bits as reduce_to_wide over
/// sources 0..nsrc-2 followed by reduce_to_narrow with the last. op: sum,
/// prod or avg; divisor as in reduce_to_narrow. nsrc >= 1; dst must not
/// overlap a source unless it is that source exactly. This is how a rank
/// that reads every rank's block reduces it (the direct and two-shot
/// paths): no partial leaves the registers, only 16-bit bytes move.
void reduce_many_to_narrow(void* dst, const void* const* srcs, int nsrc, std::size_t n,
                           DataType dtype, ReduceOp op, int divisor);

/// Which instruction set the 16-bit kernels run with here: "avx512bf16"
/// (AVX-512 with AVX-512 BF16's rounding in the bfloat16 pair sums),
/// "avx512", "avx2" (with F16C), "neon" (AArch64; kernels/wide_neon.cpp), "sve" (the
/// plain loops of kernels/wide.cpp compiled for SVE; not picked while the
/// NEON table is there) or "portable" (those loops for the baseline).
const char* wide_kernel_isa();

/// The one rounding, exposed for tests: float64 -> float16 / bfloat16 bits,
/// round to nearest even (NaN stays NaN, overflow gives inf).
std::uint16_t wide_to_half(double x);
std::uint16_t wide_to_bfloat16(double x);

}  // namespace shmring::detail
