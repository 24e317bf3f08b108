#include "kernels/wide.hpp"

#include "kernels/target.hpp"
#include "kernels/wide_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

// The portable loops (no intrinsics: the conversions are written
// branch-free, with selects, so the compiler can vectorise them), compiled
// like kernels/reduce.cpp. They are the reference that the vector kernels
// (kernels/wide_x86.cpp, kernels/wide_neon.cpp) match bit for bit, the
// tails of those kernels, and the kernels themselves elsewhere.
// reduce_to_wide, reduce_to_narrow and reduce_many_to_narrow pick the best
// table once.
#define SHMRING_INLINE inline __attribute__((always_inline))
// The clone set of kernels/target.hpp (the baseline on AArch64, and a
// second copy built for SVE).
#define SHMRING_CLONES SHMRING_TARGET_CLONES

namespace shmring::detail {

#if defined(SHMRING_DISPATCH_SVE)
namespace sve {  // this file again, built with +sve (kernels/target.hpp)
const WideKernels& wide_kernels_portable();
}  // namespace sve
#endif

SHMRING_KERNELS_BEGIN

namespace {

SHMRING_INLINE std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
SHMRING_INLINE float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Elements of user buffers may sit at any byte offset: memcpy loads.
SHMRING_INLINE std::uint16_t load_u16(const unsigned char* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
SHMRING_INLINE double load_wide(const unsigned char* p) {
  Wide v;
  std::memcpy(&v, p, sizeof(Wide));
  return v;
}
// Selects written as masks: GCC keeps a ?: over floating-point values as a
// branch (it may not speculate an operation that could trap), which stops
// the vectoriser; integer masks become blends.
SHMRING_INLINE std::uint32_t select(bool c, std::uint32_t a, std::uint32_t b) {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return (a & m) | (b & ~m);
}
SHMRING_INLINE std::uint64_t select64(bool c, std::uint64_t a, std::uint64_t b) {
  const std::uint64_t m = 0u - static_cast<std::uint64_t>(c);
  return (a & m) | (b & ~m);
}

// float64 -> float32 rounding to odd: truncate towards zero, and set the
// last bit when anything was cut. Magnitudes past float32's largest finite
// value become inf first (out-of-range conversion is undefined in C++); they
// round to inf in 16 bits either way.
SHMRING_INLINE float round_to_odd_float(double d) {
  constexpr double kMax = std::numeric_limits<float>::max();
  std::uint64_t u;
  std::memcpy(&u, &d, 8);
  u = select64(std::fabs(d) > kMax, (u & 0x8000000000000000ull) | 0x7ff0000000000000ull, u);
  double dc;
  std::memcpy(&dc, &u, 8);
  const float f = static_cast<float>(dc);
  const double back = static_cast<double>(f);
  const std::uint32_t inexact = back != dc ? 1u : 0u;  // NaN too: stays NaN
  const std::uint32_t away = std::fabs(back) > std::fabs(dc) ? 1u : 0u;
  return float_of((bits_of(f) - (inexact & away)) | inexact);
}

struct Bf16 {
  static SHMRING_INLINE double load(std::uint16_t h) {
    return static_cast<double>(float_of(static_cast<std::uint32_t>(h) << 16));
  }
  // Round to nearest even; any NaN becomes the default quiet NaN.
  static SHMRING_INLINE std::uint16_t store(float f) {
    const std::uint32_t u = bits_of(f);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return static_cast<std::uint16_t>(select((u & 0x7fffffffu) > 0x7f800000u, 0x7fc0u, rounded));
  }
};

struct F16 {
  // Exact, and never through float32 subnormals (so flush-to-zero modes set
  // by other code cannot change it): subnormal halves convert from their
  // integer mantissa.
  static SHMRING_INLINE double load(std::uint16_t h) {
    const std::uint32_t em = h & 0x7fffu;
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t normal = (em << 13) + 0x38000000u;  // rebias 15 -> 127
    const std::uint32_t sub =
        bits_of(static_cast<float>(static_cast<std::int32_t>(em & 0x3ffu)) * 0x1p-24f);
    const std::uint32_t special = (em << 13) | 0x7f800000u;  // inf, NaN
    const std::uint32_t f = select(em < 0x400u, sub, select(em >= 0x7c00u, special, normal));
    return static_cast<double>(float_of(f | sign));
  }
  // Round to nearest even; any NaN becomes the default quiet NaN. Below
  // 2^-14 (float16 subnormals) adding 0.5 makes the hardware round at
  // float16's subnormal spacing 2^-24, which is float32's spacing at 0.5;
  // the sum's low bits are then the result.
  static SHMRING_INLINE std::uint16_t store(float f) {
    const std::uint32_t x = bits_of(f);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t mag = x & 0x7fffffffu;
    const std::uint32_t normal = (mag - 0x38000000u + 0xfffu + ((mag >> 13) & 1u)) >> 13;
    const std::uint32_t sub = bits_of(float_of(mag) + 0.5f) - 0x3f000000u;
    std::uint32_t r = select(mag < 0x38800000u, sub, normal);
    r = select(mag >= 0x47800000u, 0x7c00u, r);  // >= 2^16 (just below rounds to inf above)
    return static_cast<std::uint16_t>(select(mag > 0x7f800000u, 0x7e00u, r | sign));
  }
};

template <class T>
SHMRING_INLINE std::uint16_t narrow(double x) {
  return T::store(round_to_odd_float(x));
}

struct Add {
  static SHMRING_INLINE double apply(double a, double b) { return a + b; }
};
struct Mul {
  static SHMRING_INLINE double apply(double a, double b) { return a * b; }
};

template <class T, class Op, bool AWide>
SHMRING_INLINE void to_wide(void* dst, const void* a, const void* b, std::size_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  auto* x = static_cast<const unsigned char*>(a);
  auto* y = static_cast<const unsigned char*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    const double xv = AWide ? load_wide(x + kWideBytes * i) : T::load(load_u16(x + 2 * i));
    const Wide r = static_cast<Wide>(Op::apply(xv, T::load(load_u16(y + 2 * i))));
    std::memcpy(d + kWideBytes * i, &r, kWideBytes);
  }
}

template <class T, class Op, bool AWide, bool Divide>
SHMRING_INLINE void to_narrow(void* dst, const void* a, const void* b, std::size_t n, double q) {
  auto* d = static_cast<unsigned char*>(dst);
  auto* x = static_cast<const unsigned char*>(a);
  auto* y = static_cast<const unsigned char*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    const double xv = AWide ? load_wide(x + kWideBytes * i) : T::load(load_u16(x + 2 * i));
    double r = Op::apply(xv, T::load(load_u16(y + 2 * i)));
    if constexpr (Divide) r = r / q;
    const std::uint16_t h = narrow<T>(r);
    std::memcpy(d + 2 * i, &h, 2);
  }
}

// One clone set per (type, operator, operand form); target_clones needs
// plain functions, so a macro spells them out.
#define SHMRING_WIDE_KERNELS(T, name)                                                           \
  SHMRING_CLONES void add_16_16_##name(void* d, const void* a, const void* b, std::size_t n) {  \
    to_wide<T, Add, false>(d, a, b, n);                                                         \
  }                                                                                             \
  SHMRING_CLONES void add_w_16_##name(void* d, const void* a, const void* b, std::size_t n) {   \
    to_wide<T, Add, true>(d, a, b, n);                                                          \
  }                                                                                             \
  SHMRING_CLONES void mul_16_16_##name(void* d, const void* a, const void* b, std::size_t n) {  \
    to_wide<T, Mul, false>(d, a, b, n);                                                         \
  }                                                                                             \
  SHMRING_CLONES void mul_w_16_##name(void* d, const void* a, const void* b, std::size_t n) {   \
    to_wide<T, Mul, true>(d, a, b, n);                                                          \
  }                                                                                             \
  SHMRING_CLONES void add_16_16_to_##name(void* d, const void* a, const void* b, std::size_t n, \
                                          double) {                                             \
    to_narrow<T, Add, false, false>(d, a, b, n, 1.0);                                           \
  }                                                                                             \
  SHMRING_CLONES void add_w_16_to_##name(void* d, const void* a, const void* b, std::size_t n,  \
                                         double) {                                              \
    to_narrow<T, Add, true, false>(d, a, b, n, 1.0);                                            \
  }                                                                                             \
  SHMRING_CLONES void avg_16_16_to_##name(void* d, const void* a, const void* b, std::size_t n, \
                                          double q) {                                           \
    to_narrow<T, Add, false, true>(d, a, b, n, q);                                              \
  }                                                                                             \
  SHMRING_CLONES void avg_w_16_to_##name(void* d, const void* a, const void* b, std::size_t n,  \
                                         double q) {                                            \
    to_narrow<T, Add, true, true>(d, a, b, n, q);                                               \
  }                                                                                             \
  SHMRING_CLONES void mul_16_16_to_##name(void* d, const void* a, const void* b, std::size_t n, \
                                          double) {                                             \
    to_narrow<T, Mul, false, false>(d, a, b, n, 1.0);                                           \
  }                                                                                             \
  SHMRING_CLONES void mul_w_16_to_##name(void* d, const void* a, const void* b, std::size_t n,  \
                                         double) {                                              \
    to_narrow<T, Mul, true, false>(d, a, b, n, 1.0);                                            \
  }

SHMRING_WIDE_KERNELS(Bf16, bf16)
SHMRING_WIDE_KERNELS(F16, f16)
#undef SHMRING_WIDE_KERNELS

constexpr WideKernel kToWide[2][2][2] = {
    {{add_16_16_f16, add_w_16_f16}, {mul_16_16_f16, mul_w_16_f16}},
    {{add_16_16_bf16, add_w_16_bf16}, {mul_16_16_bf16, mul_w_16_bf16}},
};
constexpr NarrowKernel kToNarrow[2][3][2] = {
    {{add_16_16_to_f16, add_w_16_to_f16},
     {mul_16_16_to_f16, mul_w_16_to_f16},
     {avg_16_16_to_f16, avg_w_16_to_f16}},
    {{add_16_16_to_bf16, add_w_16_to_bf16},
     {mul_16_16_to_bf16, mul_w_16_to_bf16},
     {avg_16_16_to_bf16, avg_w_16_to_bf16}},
};

// Many sources, portably: block by block, the sources two at a time
// through a float64 accumulator that stays in L1 (the vectorised loops
// above; the same operations in the same order as one pass in registers).
constexpr std::size_t kManyBlock = 512;

void many_blocks(void* dst, const void* const* srcs, int nsrc, std::size_t first, std::size_t n,
                 bool bf16, int form, double q) {
  alignas(64) Wide acc[kManyBlock];
  const int op = form == 1 ? 1 : 0;  // kToWide's prod index
  for (std::size_t i = 0; i < n; i += kManyBlock) {
    const std::size_t k = std::min(kManyBlock, n - i);
    auto at = [&](int s) { return static_cast<const unsigned char*>(srcs[s]) + 2 * (first + i); };
    auto* d = static_cast<unsigned char*>(dst) + 2 * i;
    if (nsrc == 2) {
      kToNarrow[bf16][form][0](d, at(0), at(1), k, q);
      continue;
    }
    kToWide[bf16][op][0](acc, at(0), at(1), k);
    for (int s = 2; s < nsrc - 1; ++s) kToWide[bf16][op][1](acc, acc, at(s), k);
    kToNarrow[bf16][form][1](d, acc, at(nsrc - 1), k, q);
  }
}

template <bool Bf16, int Form>
void many_from_0(void* d, const void* const* s, int ns, std::size_t n, double q) {
  many_blocks(d, s, ns, 0, n, Bf16, Form, q);
}

const WideKernels kPortable = {
    {{{add_16_16_f16, add_w_16_f16}, {mul_16_16_f16, mul_w_16_f16}},
     {{add_16_16_bf16, add_w_16_bf16}, {mul_16_16_bf16, mul_w_16_bf16}}},
    {{{add_16_16_to_f16, add_w_16_to_f16},
      {mul_16_16_to_f16, mul_w_16_to_f16},
      {avg_16_16_to_f16, avg_w_16_to_f16}},
     {{add_16_16_to_bf16, add_w_16_to_bf16},
      {mul_16_16_to_bf16, mul_w_16_to_bf16},
      {avg_16_16_to_bf16, avg_w_16_to_bf16}}},
    {{many_from_0<false, 0>, many_from_0<false, 1>, many_from_0<false, 2>},
     {many_from_0<true, 0>, many_from_0<true, 1>, many_from_0<true, 2>}},
    nullptr,
    1,
#if defined(SHMRING_KERNEL_COPY_SVE)
    "sve"};
#else
    "portable"};
#endif

int form_of(ReduceOp op, int divisor) {
  return op == ReduceOp::prod ? 1 : (divisor != 1 ? 2 : 0);
}

// The best table this CPU runs, chosen once.
const WideKernels& active() {
  static const WideKernels& k = []() -> const WideKernels& {
    if (const WideKernels* t = wide_kernels_avx512bf16()) return *t;
    if (const WideKernels* t = wide_kernels_avx512()) return *t;
    if (const WideKernels* t = wide_kernels_avx2()) return *t;
    if (const WideKernels* t = wide_kernels_neon()) return *t;
#if defined(SHMRING_DISPATCH_SVE)
    if (sve_available()) return sve::wide_kernels_portable();
#endif
    return kPortable;
  }();
  return k;
}

}  // namespace

#if !defined(__x86_64__)
const WideKernels* wide_kernels_avx512() {
  return nullptr;
}
const WideKernels* wide_kernels_avx512bf16() {
  return nullptr;
}
const WideKernels* wide_kernels_avx2() {
  return nullptr;
}
#endif

const WideKernels& wide_kernels_portable() {
  return kPortable;
}

#if !defined(SHMRING_KERNEL_COPY_SVE)
const WideKernels* wide_kernels_sve() {
#if defined(SHMRING_DISPATCH_SVE)
  return sve_available() ? &sve::wide_kernels_portable() : nullptr;
#else
  return nullptr;
#endif
}
#endif

namespace portable {

void reduce_to_wide(void* dst, const void* a, bool a_wide, const void* b, std::size_t n,
                    DataType dtype, ReduceOp op) {
  if (n == 0) return;
  kToWide[dtype == DataType::bfloat16][op == ReduceOp::prod][a_wide](dst, a, b, n);
}

void reduce_to_narrow(void* dst, const void* a, bool a_wide, const void* b, std::size_t n,
                      DataType dtype, ReduceOp op, int divisor) {
  if (n == 0) return;
  kToNarrow[dtype == DataType::bfloat16][form_of(op, divisor)][a_wide](
      dst, a, b, n, static_cast<double>(divisor));
}

void reduce_many_to_narrow(void* dst, const void* const* srcs, int nsrc, std::size_t first,
                           std::size_t n, DataType dtype, ReduceOp op, int divisor) {
  if (n == 0) return;
  many_blocks(dst, srcs, nsrc, first, n, dtype == DataType::bfloat16, form_of(op, divisor),
              static_cast<double>(divisor));
}

}  // namespace portable

void reduce_to_wide(void* dst, const void* a, bool a_wide, const void* b, std::size_t n,
                    DataType dtype, ReduceOp op) {
  if (n == 0) return;
  active().to_wide[dtype == DataType::bfloat16][op == ReduceOp::prod][a_wide](dst, a, b, n);
}

void reduce_to_narrow(void* dst, const void* a, bool a_wide, const void* b, std::size_t n,
                      DataType dtype, ReduceOp op, int divisor) {
  if (n == 0) return;
  active().to_narrow[dtype == DataType::bfloat16][form_of(op, divisor)][a_wide](
      dst, a, b, n, static_cast<double>(divisor));
}

void reduce_many_to_narrow(void* dst, const void* const* srcs, int nsrc, std::size_t n,
                           DataType dtype, ReduceOp op, int divisor) {
  if (n == 0) return;
  if (nsrc == 1) {
    // One source: the identity, rounded (a copy for 16-bit values; avg of
    // one rank divides by 1).
    std::memcpy(dst, srcs[0], 2 * n);
    return;
  }
  active().many[dtype == DataType::bfloat16][form_of(op, divisor)](dst, srcs, nsrc, n,
                                                                   static_cast<double>(divisor));
}

const char* wide_kernel_isa() {
  return active().isa;
}

std::uint16_t wide_to_half(double x) {
  return narrow<F16>(x);
}
std::uint16_t wide_to_bfloat16(double x) {
  return narrow<Bf16>(x);
}

SHMRING_KERNELS_END
}  // namespace shmring::detail
