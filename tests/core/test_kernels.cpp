// Reduction kernels against a scalar reference: every datatype and operator,
// unaligned pointers, lengths that are not a multiple of any vector width,
// NaN and Inf, and float16 / bfloat16 rounding.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/copy.hpp"
#include "kernels/reduce.hpp"

using namespace shmring;
using namespace shmring::detail;

namespace {

#if defined(__x86_64__)
__attribute__((target("f16c"))) std::uint16_t hardware_float_to_half(float f) {
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#endif

using Kernel = void (*)(void*, const void*, const void*, std::size_t, DataType, ReduceOp, int);

// The kernels that must agree on n elements: reduce, and reduce_short for
// the few elements it serves (the small collectives' path).
std::vector<Kernel> kernels_for(std::size_t n) {
  if (n <= kShortReduceElems) return {reduce, reduce_short};
  return {reduce};
}

// Scalar reference of one element, on the decoded values. Floating min and
// max: IEEE 754-2019 minimum / maximum (-0 < +0, any NaN gives the default
// quiet NaN), whatever the operands' order.
template <class T>
T ref_op(ReduceOp op, T a, T b, int div) {
  if constexpr (std::is_floating_point_v<T>) {
    if (op == ReduceOp::min || op == ReduceOp::max) {
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
      if (a == b) return (std::signbit(a) == (op == ReduceOp::min)) ? a : b;
    }
  }
  switch (op) {
    case ReduceOp::sum:
      if constexpr (std::is_integral_v<T>)
        return static_cast<T>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
      else
        return a + b;
    case ReduceOp::prod:
      if constexpr (std::is_integral_v<T>)
        return static_cast<T>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
      else
        return a * b;
    case ReduceOp::min:
      return b < a ? b : a;
    case ReduceOp::max:
      return a < b ? b : a;
    case ReduceOp::avg:
      return static_cast<T>((a + b) / static_cast<T>(div));
  }
  return a;
}

template <class T>
T random_value(std::mt19937_64& g, int special) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (special % 23) {
      case 0:
        return std::numeric_limits<T>::quiet_NaN();
      case 1:
        return std::numeric_limits<T>::infinity();
      case 2:
        return -std::numeric_limits<T>::infinity();
      case 3:
        return T(0) * T(-1);
      case 4:
        return T(0);
      default:
        return static_cast<T>(std::uniform_real_distribution<double>(-100, 100)(g));
    }
  } else {
    return static_cast<T>(g());
  }
}

bool same_bits_or_both_nan(double x, double y) {
  if (std::isnan(x) && std::isnan(y)) return true;
  return std::memcmp(&x, &y, sizeof x) == 0;
}

template <class T>
void check_type(DataType dt) {
  std::mt19937_64 g(42);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
    if (op == ReduceOp::avg && !std::is_floating_point_v<T>) continue;
    for (std::size_t misalign : {0u, 2u, 4u}) {
      for (std::size_t n : {1u, 3u, 7u, 15u, 16u, 17u, 31u, 33u, 63u, 65u, 127u, 1000u, 4099u})
        for (Kernel kernel : kernels_for(n)) {
          std::vector<unsigned char> ba(n * sizeof(T) + 8), bb(ba.size()), bd(ba.size());
          std::vector<T> a(n), b(n);
          for (std::size_t i = 0; i < n; ++i) {
            a[i] = random_value<T>(g, static_cast<int>(g() % 64));
            b[i] = random_value<T>(g, static_cast<int>(g() % 64));
          }
          std::memcpy(ba.data() + misalign, a.data(), n * sizeof(T));
          std::memcpy(bb.data() + misalign, b.data(), n * sizeof(T));
          const int div = 3;
          kernel(bd.data() + misalign, ba.data() + misalign, bb.data() + misalign, n, dt, op, div);
          // In place (dst == a) must give the same result.
          kernel(ba.data() + misalign, ba.data() + misalign, bb.data() + misalign, n, dt, op, div);
          for (std::size_t i = 0; i < n; ++i) {
            T got, got_inplace;
            std::memcpy(&got, bd.data() + misalign + i * sizeof(T), sizeof(T));
            std::memcpy(&got_inplace, ba.data() + misalign + i * sizeof(T), sizeof(T));
            T want = ref_op<T>(op, a[i], b[i], div);
            INFO("type ", to_string(dt), " op ", to_string(op), " n ", n, " misalign ", misalign,
                 " i ", i, " a ", double(a[i]), " b ", double(b[i]), " kernel ",
                 kernel == reduce ? "reduce" : "reduce_short");
            REQUIRE(same_bits_or_both_nan(double(got), double(want)));
            REQUIRE(same_bits_or_both_nan(double(got_inplace), double(want)));
            if constexpr (std::is_floating_point_v<T>) {
              if ((op == ReduceOp::min || op == ReduceOp::max) && std::isnan(want))
                REQUIRE(std::memcmp(&got, &want, sizeof(T)) == 0);  // the default quiet NaN
            }
          }
        }
    }
  }
}

// 16-bit types: the reference widens with the scalar conversion, computes in
// float32 and rounds once.
void check_16bit(DataType dt) {
  auto to_f = dt == DataType::float16 ? half_to_float : bfloat16_to_float;
  auto from_f = dt == DataType::float16 ? float_to_half : float_to_bfloat16;
  std::mt19937_64 g(7);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
    for (std::size_t misalign : {0u, 1u, 2u}) {
      for (std::size_t n : {1u, 7u, 9u, 1023u, 1025u, 3000u})
        for (Kernel kernel : kernels_for(n)) {
          std::vector<std::uint16_t> a(n), b(n);
          for (std::size_t i = 0; i < n; ++i) {
            a[i] = static_cast<std::uint16_t>(g());
            b[i] = static_cast<std::uint16_t>(g());
          }
          std::vector<unsigned char> ba(2 * n + 4), bb(2 * n + 4), bd(2 * n + 4);
          std::memcpy(ba.data() + misalign, a.data(), 2 * n);
          std::memcpy(bb.data() + misalign, b.data(), 2 * n);
          kernel(bd.data() + misalign, ba.data() + misalign, bb.data() + misalign, n, dt, op, 5);
          for (std::size_t i = 0; i < n; ++i) {
            std::uint16_t got;
            std::memcpy(&got, bd.data() + misalign + 2 * i, 2);
            float want_f = ref_op<float>(op, to_f(a[i]), to_f(b[i]), 5);
            std::uint16_t want = from_f(want_f);
            INFO("type ", to_string(dt), " op ", to_string(op), " i ", i, " a ", a[i], " b ", b[i]);
            if (std::isnan(want_f))
              REQUIRE(std::isnan(to_f(got)));
            else
              REQUIRE(got == want);
          }
        }
    }
  }
}

}  // namespace

TEST_CASE("float32 kernels match the scalar reference") {
  check_type<float>(DataType::float32);
}
TEST_CASE("float64 kernels match the scalar reference") {
  check_type<double>(DataType::float64);
}
TEST_CASE("int8 kernels wrap like the scalar reference") {
  check_type<std::int8_t>(DataType::int8);
}
TEST_CASE("uint8 kernels wrap like the scalar reference") {
  check_type<std::uint8_t>(DataType::uint8);
}
TEST_CASE("int32 kernels wrap like the scalar reference") {
  check_type<std::int32_t>(DataType::int32);
}
TEST_CASE("int64 kernels wrap like the scalar reference") {
  check_type<std::int64_t>(DataType::int64);
}
TEST_CASE("float16 kernels accumulate in float32 and round to nearest even") {
  check_16bit(DataType::float16);
}
TEST_CASE("bfloat16 kernels accumulate in float32 and round to nearest even") {
  check_16bit(DataType::bfloat16);
}

TEST_CASE("bfloat16 rounding: ties to even, NaN stays NaN, overflow to Inf") {
  CHECK(float_to_bfloat16(1.0f) == 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1+2^-7: ties to even (1.0).
  CHECK(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6: rounds up to even.
  CHECK(float_to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
  CHECK(float_to_bfloat16(std::numeric_limits<float>::max()) == 0x7f80);
  std::uint32_t nan_low = 0x7f800001;  // NaN whose payload is only in the cut bits
  float f;
  std::memcpy(&f, &nan_low, 4);
  CHECK(std::isnan(bfloat16_to_float(float_to_bfloat16(f))));
  CHECK(bfloat16_to_float(0xc040) == -3.0f);
}

TEST_CASE("float16 conversion is exact both ways and rounds to nearest even") {
  // Every half round-trips through float32.
  for (std::uint32_t h = 0; h < 65536; ++h) {
    float f = half_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      CHECK(std::isnan(half_to_float(float_to_half(f))));
      continue;
    }
    REQUIRE(float_to_half(f) == h);
  }
  CHECK(half_to_float(0x3c00) == 1.0f);
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(65520.0f) == 0x7c00);               // halfway to 2^16: rounds to Inf
  CHECK(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);  // tie: to even (zero)
  CHECK(float_to_half(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie: to even
  CHECK(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie: to even (up)
#if defined(__x86_64__)
  if (__builtin_cpu_supports("f16c")) {
    // The software path agrees with the hardware (F16C) on random floats.
    std::mt19937 g(1);
    for (int i = 0; i < 200000; ++i) {
      std::uint32_t u = g();
      float f;
      std::memcpy(&f, &u, 4);
      if (std::isnan(f)) continue;
      REQUIRE(float_to_half(f) == hardware_float_to_half(f));
    }
  }
#endif
}

TEST_CASE("the dispatcher names an instruction set") {
  std::string isa = kernel_isa();
  CHECK((isa == "avx512" || isa == "avx2" || isa == "sse2" || isa == "sve" || isa == "neon"));
  MESSAGE("kernels run with ", isa);
}

TEST_CASE("the streaming copy equals memcpy at every alignment and length, and stays in bounds") {
  std::mt19937 rng(7);
  std::vector<unsigned char> src(70000), dst(70000 + 256);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 300; ++n) lengths.push_back(n);
  for (std::size_t n : {4095u, 4096u, 4097u, 65536u + 13u}) lengths.push_back(n);
  for (std::size_t dst_off : {0u, 1u, 8u, 31u, 32u, 63u, 64u})
    for (std::size_t src_off : {0u, 3u, 64u})
      for (std::size_t n : lengths) {
        std::fill(dst.begin(), dst.end(), 0x5A);
        copy_streaming(dst.data() + 64 + dst_off, src.data() + src_off, n);
        REQUIRE_MESSAGE(std::memcmp(dst.data() + 64 + dst_off, src.data() + src_off, n) == 0,
                        "dst_off ", dst_off, " src_off ", src_off, " n ", n);
        const auto untouched = [](unsigned char b) { return b == 0x5A; };
        REQUIRE(std::all_of(dst.begin(), dst.begin() + 64 + dst_off, untouched));
        REQUIRE(std::all_of(dst.begin() + 64 + dst_off + n, dst.end(), untouched));
      }
  std::string isa = copy_streaming_isa();
  CHECK((isa == "avx512" || isa == "avx2" || isa == "sse2" || isa == "memcpy"));
  MESSAGE("streaming copy runs with ", isa);
}
