#pragma once

// The implementations behind kernels/wide.hpp, for the kernel files and the
// tests: the portable loops (every CPU; the reference the vector kernels
// must match bit for bit, and their tails), the x86 and AArch64 vector
// tables.

#include <cstddef>

#include "kernels/wide.hpp"

namespace shmring::detail {

using WideKernel = void (*)(void* dst, const void* a, const void* b, std::size_t n);
using NarrowKernel = void (*)(void* dst, const void* a, const void* b, std::size_t n, double q);
using ManyKernel = void (*)(void* dst, const void* const* srcs, int nsrc, std::size_t n, double q);

/// One instruction set's 16-bit kernels. Indices: [bfloat16?][prod?][a_wide?]
/// for to_wide; [bfloat16?][0 add, 1 prod, 2 add then divide][a_wide?] for
/// to_narrow; [bfloat16?][0 add, 1 prod, 2 add then divide] for many.
struct WideKernels {
  WideKernel to_wide[2][2][2];
  NarrowKernel to_narrow[2][3][2];
  ManyKernel many[2][3];
  /// Whether many[bf16][0 or 2] sums the first `lanes` elements of these
  /// sources in float32 (the span rule of docs/design/accuracy.md, "Many
  /// 16-bit inputs in float32"); nullptr where every vector sums in
  /// float64. For the tests.
  bool (*many_in_float32)(const void* const* srcs, int nsrc, bool bf16);
  std::size_t lanes;
  const char* isa;
};

/// The x86 tables (kernels/wide_x86.cpp); nullptr where the CPU lacks the
/// instructions, and on other architectures.
const WideKernels* wide_kernels_avx512();
/// The AVX-512 table with AVX-512 BF16's rounding in the bfloat16 pair
/// sums (where the CPU also has AVX-512 BF16).
const WideKernels* wide_kernels_avx512bf16();
const WideKernels* wide_kernels_avx2();
/// The AArch64 NEON table (kernels/wide_neon.cpp; every AArch64 CPU has
/// NEON); nullptr on other architectures.
const WideKernels* wide_kernels_neon();
/// The portable loops as a table (kernels/wide.cpp).
const WideKernels& wide_kernels_portable();
/// The same loops compiled for SVE (AArch64 CPUs that have it; nullptr
/// elsewhere): kernels/target.hpp's second copy of the kernel files.
const WideKernels* wide_kernels_sve();

namespace portable {

/// kernels/wide.hpp's functions in plain loops.
void reduce_to_wide(void* dst, const void* a, bool a_wide, const void* b, std::size_t n,
                    DataType dtype, ReduceOp op);
void reduce_to_narrow(void* dst, const void* a, bool a_wide, const void* b, std::size_t n,
                      DataType dtype, ReduceOp op, int divisor);
/// reduce_many_to_narrow over elements [first, first + n) of every source,
/// written to dst[0, n).
void reduce_many_to_narrow(void* dst, const void* const* srcs, int nsrc, std::size_t first,
                           std::size_t n, DataType dtype, ReduceOp op, int divisor);

}  // namespace portable

}  // namespace shmring::detail
