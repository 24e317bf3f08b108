#include "kernels/reduce.hpp"

#include "kernels/target.hpp"

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define SHMRING_INLINE inline __attribute__((always_inline))
#define SHMRING_CLONES SHMRING_TARGET_CLONES  // kernels/target.hpp

namespace shmring::detail {

#if defined(SHMRING_DISPATCH_SVE)
namespace sve {  // this file again, built with +sve (kernels/target.hpp)
void reduce(void* dst, const void* a, const void* b, std::size_t n, DataType dtype, ReduceOp op,
            int divisor);
}  // namespace sve
#endif

SHMRING_KERNELS_BEGIN

namespace {

// Integer arithmetic goes through the unsigned type: wraps, no UB.
template <class T>
SHMRING_INLINE T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <class T>
SHMRING_INLINE T mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(
        static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
  } else {
    return a * b;
  }
}
// min/max, floating point: IEEE 754-2019 minimum / maximum, with -0 < +0,
// and any NaN input gives the default quiet NaN. Both are then commutative
// to the bit, so a collective's result does not depend on the order in which
// the ranks are combined (the ring and the direct path combine in different
// orders). Where the signs differ, min is the negative input and max the
// positive one, so setting (min) or clearing (max) the sign bit when the
// inputs' signs differ changes nothing but the pair -0 / +0, which the
// comparison alone leaves to the operand order. Blend form, so it vectorises.
template <class T>
SHMRING_INLINE auto bits_of(T x) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  U u;
  std::memcpy(&u, &x, sizeof x);
  return u;
}
template <class T, class U>
SHMRING_INLINE T from_bits(U u) {
  T x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
template <class T>
SHMRING_INLINE auto sign_differs(T a, T b) {
  using U = decltype(bits_of(a));
  return (bits_of(a) ^ bits_of(b)) & (U{1} << (8 * sizeof(U) - 1));
}
template <class T>
SHMRING_INLINE T vmin(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    const T r = from_bits<T>(bits_of(b < a ? b : a) | sign_differs(a, b));
    return (a != a || b != b) ? std::numeric_limits<T>::quiet_NaN() : r;
  } else {
    return b < a ? b : a;
  }
}
template <class T>
SHMRING_INLINE T vmax(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    const T r = from_bits<T>(bits_of(a < b ? b : a) & ~sign_differs(a, b));
    return (a != a || b != b) ? std::numeric_limits<T>::quiet_NaN() : r;
  } else {
    return a < b ? b : a;
  }
}

template <class T, class F>
SHMRING_INLINE void loop(void* dst, const void* a, const void* b, std::size_t n, F f) {
  // memcpy per element, not Unaligned<T>::type: GCC drops the aligned(1)
  // attribute of a typedef used as a template argument, which made these
  // loads of misaligned user buffers undefined (UBSan: "load of misaligned
  // address"). A one-element memcpy is a plain unaligned load, and vectorises.
  auto* d = static_cast<unsigned char*>(dst);
  auto* x = static_cast<const unsigned char*>(a);
  auto* y = static_cast<const unsigned char*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    T xv, yv;
    std::memcpy(&xv, x + i * sizeof(T), sizeof(T));
    std::memcpy(&yv, y + i * sizeof(T), sizeof(T));
    const T r = f(xv, yv);
    std::memcpy(d + i * sizeof(T), &r, sizeof(T));
  }
}

using Kernel = void (*)(void*, const void*, const void*, std::size_t, int);

#define SHMRING_KERNELS(T, name)                                                               \
  SHMRING_CLONES void sum_##name(void* d, const void* a, const void* b, std::size_t n, int) {  \
    loop<T>(                                                                                   \
        d, a, b, n, [](T x, T y) __attribute__((always_inline)) { return add(x, y); });        \
  }                                                                                            \
  SHMRING_CLONES void prod_##name(void* d, const void* a, const void* b, std::size_t n, int) { \
    loop<T>(                                                                                   \
        d, a, b, n, [](T x, T y) __attribute__((always_inline)) { return mul(x, y); });        \
  }                                                                                            \
  SHMRING_CLONES void min_##name(void* d, const void* a, const void* b, std::size_t n, int) {  \
    loop<T>(                                                                                   \
        d, a, b, n, [](T x, T y) __attribute__((always_inline)) { return vmin(x, y); });       \
  }                                                                                            \
  SHMRING_CLONES void max_##name(void* d, const void* a, const void* b, std::size_t n, int) {  \
    loop<T>(                                                                                   \
        d, a, b, n, [](T x, T y) __attribute__((always_inline)) { return vmax(x, y); });       \
  }

SHMRING_KERNELS(float, f32)
SHMRING_KERNELS(double, f64)
SHMRING_KERNELS(std::int8_t, i8)
SHMRING_KERNELS(std::uint8_t, u8)
SHMRING_KERNELS(std::int32_t, i32)
SHMRING_KERNELS(std::int64_t, i64)
#undef SHMRING_KERNELS

// The last step of an average: (a + b) / divisor, one rounding each, in the
// element type (so every rank computes the same bits).
SHMRING_CLONES void avg_f32(void* d, const void* a, const void* b, std::size_t n, int div) {
  const float q = static_cast<float>(div);
  loop<float>(
      d, a, b, n, [q](float x, float y) __attribute__((always_inline)) { return (x + y) / q; });
}
SHMRING_CLONES void avg_f64(void* d, const void* a, const void* b, std::size_t n, int div) {
  const double q = static_cast<double>(div);
  loop<double>(
      d, a, b, n, [q](double x, double y) __attribute__((always_inline)) { return (x + y) / q; });
}

constexpr Kernel kF32[] = {sum_f32, prod_f32, min_f32, max_f32, avg_f32};
constexpr Kernel kF64[] = {sum_f64, prod_f64, min_f64, max_f64, avg_f64};
constexpr Kernel kI8[] = {sum_i8, prod_i8, min_i8, max_i8, nullptr};
constexpr Kernel kU8[] = {sum_u8, prod_u8, min_u8, max_u8, nullptr};
constexpr Kernel kI32[] = {sum_i32, prod_i32, min_i32, max_i32, nullptr};
constexpr Kernel kI64[] = {sum_i64, prod_i64, min_i64, max_i64, nullptr};

// ---- bfloat16: the top 16 bits of a float32. ----
SHMRING_INLINE float bf16_load(std::uint16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
SHMRING_INLINE std::uint16_t bf16_store(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  // Round to nearest even; a NaN stays a (quiet) NaN even if its payload is
  // only in the low bits that are cut.
  std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  std::uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
// 16-bit elements of user buffers may sit at any byte offset: memcpy loads.
SHMRING_INLINE std::uint16_t load_u16(const unsigned char* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
SHMRING_INLINE void store_u16(unsigned char* p, std::uint16_t v) {
  std::memcpy(p, &v, 2);
}
// Fused bfloat16 kernels: widen, operate in float32 and round back in one
// loop, which the vectoriser turns into shifts and blends (measured 1.3-1.5x
// faster than widening into blocks first; bench/kernel_bench).
template <class F>
SHMRING_INLINE void loop_bf16(void* dst, const void* a, const void* b, std::size_t n, F f) {
  auto* d = static_cast<unsigned char*>(dst);
  auto* x = static_cast<const unsigned char*>(a);
  auto* y = static_cast<const unsigned char*>(b);
  for (std::size_t i = 0; i < n; ++i)
    store_u16(d + 2 * i,
              bf16_store(f(bf16_load(load_u16(x + 2 * i)), bf16_load(load_u16(y + 2 * i)))));
}
SHMRING_CLONES void sum_bf16(void* d, const void* a, const void* b, std::size_t n, int) {
  loop_bf16(
      d, a, b, n, [](float x, float y) __attribute__((always_inline)) { return x + y; });
}
SHMRING_CLONES void prod_bf16(void* d, const void* a, const void* b, std::size_t n, int) {
  loop_bf16(
      d, a, b, n, [](float x, float y) __attribute__((always_inline)) { return x * y; });
}
SHMRING_CLONES void min_bf16(void* d, const void* a, const void* b, std::size_t n, int) {
  loop_bf16(
      d, a, b, n, [](float x, float y) __attribute__((always_inline)) { return vmin(x, y); });
}
SHMRING_CLONES void max_bf16(void* d, const void* a, const void* b, std::size_t n, int) {
  loop_bf16(
      d, a, b, n, [](float x, float y) __attribute__((always_inline)) { return vmax(x, y); });
}
SHMRING_CLONES void avg_bf16(void* d, const void* a, const void* b, std::size_t n, int div) {
  const float q = static_cast<float>(div);
  loop_bf16(
      d, a, b, n, [q](float x, float y) __attribute__((always_inline)) { return (x + y) / q; });
}
constexpr Kernel kBF16[] = {sum_bf16, prod_bf16, min_bf16, max_bf16, avg_bf16};

// ---- float16: F16C where the CPU has it, exact software conversion elsewhere. ----
std::uint16_t soft_float_to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((mag >> 13) & 0x3ffu));
  if (mag >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (mag < 0x38800000u) {                                           // subnormal half (or zero)
    if (mag < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < half of min subnormal
    std::uint32_t e = mag >> 23;
    std::uint32_t m = (mag & 0x7fffffu) | 0x800000u;
    std::uint32_t shift = 126 - e;  // so that result = m >> (shift) in units of 2^-24
    std::uint32_t r = m >> shift;
    std::uint32_t rem = m & ((1u << shift) - 1);
    std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = mag - 0x38000000u;  // rebias exponent 127 -> 15
  r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  return static_cast<std::uint16_t>(sign | r);
}
float soft_half_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  std::uint32_t x;
  if (e == 0x1f) {
    x = sign | 0x7f800000u | (m << 13);
  } else if (e == 0) {
    if (m == 0) {
      x = sign;
    } else {  // subnormal: normalise
      int s = 0;
      while (!(m & 0x400u)) {
        m <<= 1;
        ++s;
      }
      x = sign | ((113u - s) << 23) | ((m & 0x3ffu) << 13);
    }
  } else {
    x = sign | ((e + 112u) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) void widen_f16_f16c(float* out, const void* in,
                                                         std::size_t n) {
  auto* p = static_cast<const unsigned char*>(in);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i))));
  for (; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    out[i] = _cvtsh_ss(h);
  }
}
__attribute__((target("avx2,f16c"))) void narrow_f16_f16c(void* out, const float* in,
                                                          std::size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 2 * i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) {
    std::uint16_t h = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT);
    std::memcpy(p + 2 * i, &h, 2);
  }
}
#endif
void widen_f16_soft(float* out, const void* in, std::size_t n) {
  auto* p = static_cast<const unsigned char*>(in);
  for (std::size_t i = 0; i < n; ++i) out[i] = soft_half_to_float(load_u16(p + 2 * i));
}
void narrow_f16_soft(void* out, const float* in, std::size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  for (std::size_t i = 0; i < n; ++i) store_u16(p + 2 * i, soft_float_to_half(in[i]));
}

using Widen = void (*)(float*, const void*, std::size_t);
using Narrow = void (*)(void*, const float*, std::size_t);

[[maybe_unused]] bool has_f16c() {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
  return yes;
#else
  return false;
#endif
}

void reduce_16bit(void* dst, const void* a, const void* b, std::size_t n, Kernel k, int div,
                  Widen widen, Narrow narrow) {
  constexpr std::size_t kBlock = 1024;  // 3 x 4 KiB of float32 on the stack, stays in L1
  alignas(64) float fa[kBlock], fb[kBlock];
  auto* d = static_cast<unsigned char*>(dst);
  auto* x = static_cast<const unsigned char*>(a);
  auto* y = static_cast<const unsigned char*>(b);
  for (std::size_t i = 0; i < n; i += kBlock) {
    std::size_t m = std::min(kBlock, n - i);
    widen(fa, x + 2 * i, m);
    widen(fb, y + 2 * i, m);
    k(fa, fa, fb, m, div);
    narrow(d + 2 * i, fa, m);
  }
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, std::size_t n, DataType dtype, ReduceOp op,
            int divisor) {
  if (n == 0) return;
#if defined(SHMRING_DISPATCH_SVE)
  if (sve_available()) return sve::reduce(dst, a, b, n, dtype, op, divisor);
#endif
  auto o = static_cast<std::size_t>(op);
  switch (dtype) {
    case DataType::float32:
      return kF32[o](dst, a, b, n, divisor);
    case DataType::float64:
      return kF64[o](dst, a, b, n, divisor);
    case DataType::int8:
      return kI8[o](dst, a, b, n, divisor);
    case DataType::uint8:
      return kU8[o](dst, a, b, n, divisor);
    case DataType::int32:
      return kI32[o](dst, a, b, n, divisor);
    case DataType::int64:
      return kI64[o](dst, a, b, n, divisor);
    case DataType::bfloat16:
      return kBF16[o](dst, a, b, n, divisor);
    case DataType::float16:
#if defined(__x86_64__)
      if (has_f16c())
        return reduce_16bit(dst, a, b, n, kF32[o], divisor, widen_f16_f16c, narrow_f16_f16c);
#endif
      return reduce_16bit(dst, a, b, n, kF32[o], divisor, widen_f16_soft, narrow_f16_soft);
  }
}

#if !defined(SHMRING_KERNEL_COPY_SVE)
namespace {
template <class T>
SHMRING_INLINE bool short_loop(void* d, const void* a, const void* b, std::size_t n, ReduceOp op,
                               int div) {
  switch (op) {
    case ReduceOp::sum:
      loop<T>(
          d, a, b, n, [](T x, T y) __attribute__((always_inline)) { return add(x, y); });
      return true;
    case ReduceOp::prod:
      loop<T>(
          d, a, b, n, [](T x, T y) __attribute__((always_inline)) { return mul(x, y); });
      return true;
    case ReduceOp::min:
      loop<T>(
          d, a, b, n, [](T x, T y) __attribute__((always_inline)) { return vmin(x, y); });
      return true;
    case ReduceOp::max:
      loop<T>(
          d, a, b, n, [](T x, T y) __attribute__((always_inline)) { return vmax(x, y); });
      return true;
    case ReduceOp::avg:
      if constexpr (std::is_floating_point_v<T>) {
        const T q = static_cast<T>(div);
        loop<T>(
            d, a, b, n, [q](T x, T y) __attribute__((always_inline)) { return (x + y) / q; });
        return true;
      }
      return false;
  }
  return false;
}
}  // namespace

void reduce_short(void* dst, const void* a, const void* b, std::size_t n, DataType dtype,
                  ReduceOp op, int divisor) {
  bool done = false;
  switch (dtype) {
    case DataType::float32:
      done = short_loop<float>(dst, a, b, n, op, divisor);
      break;
    case DataType::float64:
      done = short_loop<double>(dst, a, b, n, op, divisor);
      break;
    case DataType::int8:
      done = short_loop<std::int8_t>(dst, a, b, n, op, divisor);
      break;
    case DataType::uint8:
      done = short_loop<std::uint8_t>(dst, a, b, n, op, divisor);
      break;
    case DataType::int32:
      done = short_loop<std::int32_t>(dst, a, b, n, op, divisor);
      break;
    case DataType::int64:
      done = short_loop<std::int64_t>(dst, a, b, n, op, divisor);
      break;
    case DataType::float16:
    case DataType::bfloat16:
      break;
  }
  if (!done) reduce(dst, a, b, n, dtype, op, divisor);
}
#endif

const char* kernel_isa() {
#if defined(SHMRING_KERNEL_COPY_SVE)
  return "sve";
#elif defined(SHMRING_DISPATCH_SVE)
  return sve_available() ? "sve" : "neon";
#elif defined(__aarch64__)
  return "neon";
#endif
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "avx512";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
#endif
  return "sse2";
}

float half_to_float(std::uint16_t h) {
  return soft_half_to_float(h);
}
std::uint16_t float_to_half(float f) {
  return soft_float_to_half(f);
}
float bfloat16_to_float(std::uint16_t h) {
  return bf16_load(h);
}
std::uint16_t float_to_bfloat16(float f) {
  return bf16_store(f);
}

SHMRING_KERNELS_END
}  // namespace shmring::detail
