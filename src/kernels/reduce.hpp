#pragma once

// Elementwise reduction kernels: dst[i] = op(a[i], b[i]).
//
// One function per (datatype, operator), compiled three times with GCC's
// target_clones (x86-64-v4 = AVX-512, x86-64-v3 = AVX2+FMA+F16C, and the
// SSE2 baseline); the dynamic loader picks the best clone once, at load time.
// float16 and bfloat16 are widened to float32 in blocks, reduced there and
// rounded back to nearest-even, so they accumulate in float32 within a step.
// (The collectives reduce 16-bit sum, prod and avg through kernels/wide.hpp
// instead, so that they round once; min and max use these.)

#include <cstddef>
#include <cstdint>

#include "shmring/types.hpp"

namespace shmring::detail {

/// dst[i] = op(a[i], b[i]) for i < n. dst may alias a or b exactly (not
/// partially). Pointers need no alignment. With op == avg, computes
/// (a[i] + b[i]) / divisor (the last step of an average); divisor >= 1.
/// Integer sum and prod wrap; avg on an integer type is the caller's error
/// (not checked here). Floating-point min and max are IEEE 754-2019 minimum
/// and maximum (-0 < +0; any NaN input gives the default quiet NaN), so
/// their result bits do not depend on the operands' order.
void reduce(void* dst, const void* a, const void* b, std::size_t n, DataType dtype, ReduceOp op,
            int divisor = 1);

/// As reduce(), for a few elements (kShortReduceElems or fewer): the same
/// element-wise operations, hence the same bits for every result that is
/// not NaN, in a plain loop on the calling CPU's baseline instructions,
/// without the per-kernel dispatch and the vector loop's set-up, which cost
/// a 2-element reduction about 15 ns (a tenth of an 8-byte allreduce).
/// When both inputs of a sum, prod or avg are NaN, the NaN returned (its
/// payload and sign; IEEE 754 leaves them open) may differ from reduce()'s,
/// as the two loops may order the operands differently; it is still the
/// same on every rank, which runs the same loop for the same count.
/// 16-bit types go to reduce().
inline constexpr std::size_t kShortReduceElems = 16;
void reduce_short(void* dst, const void* a, const void* b, std::size_t n, DataType dtype,
                  ReduceOp op, int divisor = 1);

/// Name of the instruction set the float32 sum kernel runs with here
/// ("avx512", "avx2" or "sse2" on x86-64; "sve" or "neon" on AArch64).
const char* kernel_isa();

/// float16 <-> float32 conversions, round to nearest even (exposed for tests).
float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);
float bfloat16_to_float(std::uint16_t h);
std::uint16_t float_to_bfloat16(float f);

}  // namespace shmring::detail
