// float16 and bfloat16 reductions are the exact (float64) reduction of every
// rank's input rounded once: bitwise equal to a float64 reference rounded
// once to nearest even, on every rank, on every path (direct, ring, chain),
// whatever the element's position, for allreduce, reduce_scatter and reduce
// (every root), sum, avg and prod; min and max stay exact. Includes the
// inputs a new user once found wrong (avg of 4 x 30000 in float16
// overflowed to inf; bfloat16 1 + 256 + 1 + 1 gave 256, not 260).

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "harness.hpp"
#include "kernels/wide.hpp"
#include "kernels/wide_kernels.hpp"

using namespace shmring;

namespace {

// ---- Scalar reference, written from the IEEE definitions (no library code). ----

double decode16(DataType t, std::uint16_t h) {
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  if (t == DataType::bfloat16) {
    const int e = (h >> 7) & 0xff;
    const int m = h & 0x7f;
    if (e == 0xff) return m ? NAN : sign * INFINITY;
    if (e == 0) return sign * std::ldexp(m, -133);
    return sign * std::ldexp(128 + m, e - 127 - 7);
  }
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 0x1f) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 15 - 10);
}

// Rounds x to nearest even in the 16-bit format: precision p bits, smallest
// normal 2^emin, largest finite `max`; subnormals have spacing 2^(emin-p+1).
std::uint16_t encode16(DataType t, double x) {
  const bool bf = t == DataType::bfloat16;
  const int p = bf ? 8 : 11, emin = bf ? -126 : -14;
  const double max = bf ? std::ldexp(255, 120) : 65504.0;
  const std::uint16_t sign = std::signbit(x) ? 0x8000u : 0;
  if (std::isnan(x)) return bf ? 0x7fc0 : 0x7e00;
  const double a = std::fabs(x);
  int e;
  std::frexp(a, &e);                      // a = f * 2^e, f in [0.5, 1)
  const int exp = std::max(e - 1, emin);  // exponent of the leading bit (or of the subnormals)
  const double ulp = std::ldexp(1.0, exp - (p - 1));
  const double q = a / ulp;  // exact: a scaled by a power of two
  double r = std::floor(q);
  const double frac = q - r;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) == 1.0)) r += 1;
  const double v = r * ulp;
  if (std::isinf(a) || v > max) return sign | (bf ? 0x7f80u : 0x7c00u);
  if (v == 0) return sign;
  // Encode the representable v.
  std::frexp(v, &e);
  if (e - 1 < emin)  // subnormal
    return sign | static_cast<std::uint16_t>(v / std::ldexp(1.0, emin - (p - 1)));
  const int biased = e - 1 + (bf ? 127 : 15);
  const auto frac_bits =
      static_cast<std::uint16_t>(v / std::ldexp(1.0, e - 1 - (p - 1))) - (1u << (p - 1));
  return sign | static_cast<std::uint16_t>(biased << (p - 1)) | frac_bits;
}

const char* name(DataType t) {
  return t == DataType::float16 ? "float16" : "bfloat16";
}
const char* name(ReduceOp op) {
  return op == ReduceOp::sum ? "sum" : op == ReduceOp::avg ? "avg" : "prod";
}

TEST_CASE("the test's own reference rounds like IEEE (sanity)") {
  CHECK(encode16(DataType::bfloat16, 259.0) == encode16(DataType::bfloat16, 260.0));
  CHECK(decode16(DataType::bfloat16, encode16(DataType::bfloat16, 259.0)) == 260.0);
  CHECK(decode16(DataType::bfloat16, encode16(DataType::bfloat16, 257.0)) == 256.0);  // tie: even
  CHECK(decode16(DataType::bfloat16, encode16(DataType::bfloat16, 258.0)) == 258.0);
  CHECK(decode16(DataType::float16, encode16(DataType::float16, 65519.0)) == 65504.0);
  CHECK(std::isinf(decode16(DataType::float16, encode16(DataType::float16, 65520.0))));
  CHECK(encode16(DataType::float16, std::ldexp(1.0, -25)) == 0);  // tie with 0: even
  CHECK(encode16(DataType::float16, std::ldexp(3.0, -26)) == 1);
  CHECK(encode16(DataType::float16, std::ldexp(1023.0, -24)) == 0x3ff);
  CHECK(encode16(DataType::float16, std::ldexp(2047.5, -25)) == 0x400);  // rounds into normals
  CHECK(encode16(DataType::float16, 1.0) == 0x3c00);
  CHECK(encode16(DataType::float16, -2.0) == 0xc000);
  CHECK(encode16(DataType::bfloat16, 1.0) == 0x3f80);
  for (std::uint32_t h = 0; h < 0x10000; ++h)
    for (DataType t : {DataType::float16, DataType::bfloat16}) {
      const double v = decode16(t, static_cast<std::uint16_t>(h));
      if (!std::isnan(v)) REQUIRE(encode16(t, v) == h);
    }
}

// Every finite positive 16-bit value, the midpoint above it, and values
// just off both (and their negatives): where a float64 -> float32 -> 16-bit
// double rounding would land on the midpoint and tie to even, wrongly.
std::vector<double> around_midpoints(DataType t) {
  const std::uint32_t last = t == DataType::float16 ? 0x7bff : 0x7f7f;
  std::vector<double> xs;
  for (std::uint32_t h = 0; h <= last; ++h) {
    const double lo = decode16(t, static_cast<std::uint16_t>(h));
    const double hi = h == last ? 2 * lo - decode16(t, static_cast<std::uint16_t>(h - 1))
                                : decode16(t, static_cast<std::uint16_t>(h + 1));
    const double mid = (lo + hi) / 2;
    const double tiny = std::ldexp(mid, -45);
    for (double x : {lo, mid, mid + tiny, mid - tiny, std::nextafter(mid, 0.0),
                     std::nextafter(mid, INFINITY), lo + tiny, hi - tiny})
      for (double y : {x, -x}) xs.push_back(y);
  }
  return xs;
}

TEST_CASE("the one rounding float64 -> 16 bits is correct at and around every midpoint") {
  for (DataType t : {DataType::float16, DataType::bfloat16}) {
    for (double y : around_midpoints(t)) {
      const std::uint16_t got =
          t == DataType::float16 ? detail::wide_to_half(y) : detail::wide_to_bfloat16(y);
      REQUIRE_MESSAGE(got == encode16(t, y), name(t), " ", y, ": 0x", std::hex, got, " want 0x",
                      encode16(t, y));
    }
    const std::uint16_t inf = t == DataType::float16 ? 0x7c00 : 0x7f80;
    CHECK((t == DataType::float16 ? detail::wide_to_half(1e300)
                                  : detail::wide_to_bfloat16(1e300)) == inf);
    CHECK((t == DataType::float16 ? detail::wide_to_half(INFINITY)
                                  : detail::wide_to_bfloat16(INFINITY)) == inf);
    const std::uint16_t nan =
        t == DataType::float16 ? detail::wide_to_half(NAN) : detail::wide_to_bfloat16(NAN);
    CHECK(std::isnan(decode16(t, nan)));
    CHECK((t == DataType::float16 ? detail::wide_to_half(1e-300)
                                  : detail::wide_to_bfloat16(1e-300)) == 0);
  }
}

TEST_CASE("wide kernels: every 16-bit input widens exactly, unaligned, odd lengths") {
  for (DataType t : {DataType::float16, DataType::bfloat16}) {
    // All 65536 encodings as b (NaN included) against a = 0 (16-bit) then
    // against a float64 partial of 0.5, at byte offsets 1 and 3.
    const std::size_t n = 65536;
    std::vector<unsigned char> a16(2 * n + 8, 0), b16(2 * n + 8), wide(8 * n + 8), out(2 * n + 8);
    for (std::size_t i = 0; i < n; ++i) {
      const auto h = static_cast<std::uint16_t>(i);
      std::memcpy(b16.data() + 1 + 2 * i, &h, 2);
    }
    detail::reduce_to_wide(wide.data() + 3, a16.data() + 1, false, b16.data() + 1, n, t,
                           ReduceOp::sum);
    for (std::size_t i = 0; i < n; ++i) {
      double w;
      std::memcpy(&w, wide.data() + 3 + 8 * i, 8);
      const double want = decode16(t, static_cast<std::uint16_t>(i));
      REQUIRE_MESSAGE((std::isnan(want) ? std::isnan(w) : w == want), name(t), " 0x", std::hex, i);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const double half = 0.5;
      std::memcpy(wide.data() + 3 + 8 * i, &half, 8);
    }
    for (int div : {1, 3}) {
      detail::reduce_to_narrow(out.data() + 1, wide.data() + 3, true, b16.data() + 1, n, t,
                               div == 1 ? ReduceOp::sum : ReduceOp::avg, div);
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t got;
        std::memcpy(&got, out.data() + 1 + 2 * i, 2);
        const double v = decode16(t, static_cast<std::uint16_t>(i));
        if (std::isnan(v)) {
          REQUIRE(std::isnan(decode16(t, got)));
          continue;
        }
        REQUIRE_MESSAGE(got == encode16(t, (0.5 + v) / div), name(t), " 0x", std::hex, i);
      }
    }
  }
}

// Every table of 16-bit kernels this CPU runs: the portable loops, and the
// x86 vector kernels, the NEON ones or the SVE copy where present
// (kernels/wide_kernels.hpp).
std::vector<const detail::WideKernels*> wide_tables() {
  std::vector<const detail::WideKernels*> v{&detail::wide_kernels_portable()};
  for (const detail::WideKernels* t :
       {detail::wide_kernels_avx2(), detail::wide_kernels_avx512(),
        detail::wide_kernels_avx512bf16(), detail::wide_kernels_neon(), detail::wide_kernels_sve()})
    if (t) v.push_back(t);
  return v;
}

std::uint16_t load16(const std::vector<unsigned char>& v, std::size_t i) {
  std::uint16_t h;
  std::memcpy(&h, v.data() + 2 * i, 2);
  return h;
}

TEST_CASE("the final rounding of every 16-bit kernel is correct at and around every midpoint") {
  // The rounding inside the kernels, not only the exposed helpers: a
  // float64 partial at, just above and just below every midpoint between
  // two 16-bit neighbours (and at the neighbours), plus a 16-bit zero,
  // through reduce_to_narrow's table entry of every instruction set, sum
  // and avg by 1 and prod by 1.0. The many-input kernel reaches the same
  // points from 16-bit inputs: lo + half an ulp (+ or - a small value).
  for (const detail::WideKernels* k : wide_tables()) {
    for (DataType t : {DataType::float16, DataType::bfloat16}) {
      const bool bf = t == DataType::bfloat16;
      const std::vector<double> xs = around_midpoints(t);
      const std::size_t n = xs.size();
      // -0, not +0: x + (-0) is x for every x, -0 included.
      std::vector<unsigned char> zeros(2 * n), ones(2 * n), out(2 * n);
      const std::uint16_t one = bf ? 0x3f80 : 0x3c00, minus_zero = 0x8000;
      for (std::size_t i = 0; i < n; ++i) {
        std::memcpy(ones.data() + 2 * i, &one, 2);
        std::memcpy(zeros.data() + 2 * i, &minus_zero, 2);
      }
      for (int form = 0; form < 3; ++form) {
        // form 0: x + -0; 1: x * 1; 2: (x + -0) / 1 (the avg kernel).
        k->to_narrow[bf][form][1](out.data(), xs.data(), form == 1 ? ones.data() : zeros.data(), n,
                                  1.0);
        for (std::size_t i = 0; i < n; ++i)
          REQUIRE_MESSAGE(load16(out, i) == encode16(t, xs[i]), std::string(k->isa), " ", name(t),
                          " form ", form, " x=", xs[i], ": 0x", std::hex, load16(out, i),
                          " want 0x", encode16(t, xs[i]));
      }
    }
    for (DataType t : {DataType::float16, DataType::bfloat16}) {
      // Three 16-bit sources whose exact sum is a midpoint or next to one.
      const bool bf = t == DataType::bfloat16;
      const int p = bf ? 8 : 11;
      std::vector<std::uint16_t> s0, s1, s2;
      std::vector<double> want;
      // From where a sixteenth of half an ulp is still a 16-bit value.
      for (std::uint32_t h = bf ? 0x0800u : 0x1800u; h < (bf ? 0x7f00u : 0x7800u); ++h) {
        const double lo = decode16(t, static_cast<std::uint16_t>(h));
        int e;
        std::frexp(lo, &e);
        const double half_ulp = std::ldexp(1.0, e - 1 - p);
        const double small = std::ldexp(half_ulp, -4);
        for (double extra : {0.0, small, -small}) {
          for (double sign : {1.0, -1.0}) {
            s0.push_back(encode16(t, sign * lo));
            s1.push_back(encode16(t, sign * half_ulp));
            s2.push_back(encode16(t, sign * extra));
            want.push_back(sign * (lo + half_ulp + extra));
          }
        }
      }
      const std::size_t n = want.size();
      std::vector<unsigned char> out(2 * n);
      const void* srcs[3] = {s0.data(), s1.data(), s2.data()};
      k->many[bf][0](out.data(), srcs, 3, n, 1.0);
      for (std::size_t i = 0; i < n; ++i) {
        // The sources must be exact (else the test, not the kernel, is off).
        REQUIRE(decode16(t, s0[i]) + decode16(t, s1[i]) + decode16(t, s2[i]) == want[i]);
        REQUIRE_MESSAGE(load16(out, i) == encode16(t, want[i]), std::string(k->isa), " ", name(t),
                        " many: sum=", want[i], ": 0x", std::hex, load16(out, i), " want 0x",
                        encode16(t, want[i]));
      }
    }
  }
}

TEST_CASE("two 16-bit inputs: every table's sum and avg are the exact result rounded once") {
  // The vector kernels sum two 16-bit inputs in float32 (kernels/wide_x86.cpp,
  // docs/design/accuracy.md). Every finite encoding a against partners b
  // that put a + b on, just off, or far from a 16-bit midpoint: half an ulp
  // of a (plus or minus a little), values 12 to 20 binades below a, and
  // random encodings; sum and avg (of two), against the float64 reference.
  std::uint64_t state = 0x2545f4914f6cdd1dull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (DataType t : {DataType::float16, DataType::bfloat16}) {
    const bool bf = t == DataType::bfloat16;
    const int p = bf ? 8 : 11;
    const std::uint32_t last = bf ? 0x7f7f : 0x7bff;
    std::vector<std::uint16_t> as, bs;
    for (std::uint32_t h = 0; h <= last; h += bf ? 1 : 3) {
      const double a = decode16(t, static_cast<std::uint16_t>(h));
      int e;
      std::frexp(a == 0 ? 1.0 : a, &e);
      std::vector<double> partners;
      const double half_ulp = std::ldexp(1.0, e - 1 - p);
      for (double k : {1.0, 1.0 + 1.0 / 8, 1.0 - 1.0 / 8, 3.0, 0.5})
        partners.push_back(half_ulp * k);
      for (int below = 12; below <= 20; ++below) partners.push_back(std::ldexp(1.0, e - below));
      for (double b : partners)
        for (double sb : {b, -b}) {
          const std::uint16_t hb = encode16(t, sb);
          for (std::uint16_t sa :
               {static_cast<std::uint16_t>(h), static_cast<std::uint16_t>(h | 0x8000u)}) {
            as.push_back(sa);
            bs.push_back(hb);
          }
        }
      for (int r = 0; r < 2; ++r) {
        as.push_back(static_cast<std::uint16_t>(h));
        bs.push_back(static_cast<std::uint16_t>(next()));
      }
    }
    const std::size_t n = as.size();
    std::vector<unsigned char> out(2 * n);
    for (const detail::WideKernels* k : wide_tables()) {
      for (int form : {0, 2}) {
        k->to_narrow[bf][form][0](out.data(), as.data(), bs.data(), n, form == 2 ? 2.0 : 1.0);
        for (std::size_t i = 0; i < n; ++i) {
          const double x = decode16(t, as[i]), y = decode16(t, bs[i]);
          const double exact = form == 2 ? (x + y) / 2 : x + y;  // exact in float64
          const std::uint16_t got = load16(out, i);
          if (std::isnan(exact)) {
            REQUIRE(std::isnan(decode16(t, got)));
            continue;
          }
          REQUIRE_MESSAGE(got == encode16(t, exact), std::string(k->isa), " ", std::string(name(t)),
                          form == 2 ? " avg " : " sum ", x, " + ", y, ": 0x", std::hex, got,
                          " want 0x", encode16(t, exact));
        }
      }
    }
  }
}

TEST_CASE("every instruction set's 16-bit kernels give the portable loops' bits") {
  // Random 16-bit encodings (NaN, inf, zeros and subnormals among them),
  // every kernel form, lengths around the vector widths (one and two
  // vectors a step: the bfloat16 pair sums take 2 * kLanes, then kLanes,
  // then the portable tail), odd byte offsets.
  const std::vector<const detail::WideKernels*> tables = wide_tables();
  const detail::WideKernels& ref = detail::wide_kernels_portable();
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const std::size_t kMax = 301;
  const int kSources = 9;
  std::vector<std::vector<unsigned char>> src(kSources, std::vector<unsigned char>(2 * kMax + 2));
  std::vector<unsigned char> wide(8 * kMax + 8);
  for (auto& v : src)
    for (auto& b : v) b = static_cast<unsigned char>(next());
  for (std::size_t i = 0; i < kMax; ++i) {  // partials: sums of two random values
    const double w = std::ldexp(static_cast<double>(static_cast<std::int64_t>(next()) >> 11),
                                static_cast<int>(next() % 80) - 90);
    std::memcpy(wide.data() + 1 + 8 * i, &w, 8);
  }
  // 16-bit results bit for bit, NaN included (every table stores the
  // default quiet NaN). Wide partials may carry either operand's NaN (IEEE
  // leaves the choice open): no result depends on which.
  for (const detail::WideKernels* k : tables) {
    for (DataType t : {DataType::float16, DataType::bfloat16}) {
      const bool bf = t == DataType::bfloat16;
      for (std::size_t n :
           {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{15},
            std::size_t{16}, std::size_t{17}, std::size_t{24}, std::size_t{31}, std::size_t{33},
            std::size_t{48}, std::size_t{49}, std::size_t{64}, kMax}) {
        std::vector<unsigned char> got(8 * n + 8), exp(8 * n + 8);
        for (int prod = 0; prod < 2; ++prod)
          for (int aw = 0; aw < 2; ++aw) {
            const void* a = aw ? static_cast<const void*>(wide.data() + 1) : src[0].data() + 1;
            k->to_wide[bf][prod][aw](got.data(), a, src[1].data() + 1, n);
            ref.to_wide[bf][prod][aw](exp.data(), a, src[1].data() + 1, n);
            for (std::size_t i = 0; i < n; ++i) {
              double g, e;
              std::memcpy(&g, got.data() + 8 * i, 8);
              std::memcpy(&e, exp.data() + 8 * i, 8);
              REQUIRE_MESSAGE(
                  (g == e || (std::isnan(g) && std::isnan(e)) || std::memcmp(&g, &e, 8) == 0),
                  std::string(k->isa), " to_wide ", name(t), " n=", n, " i=", i);
            }
          }
        for (int form = 0; form < 3; ++form)
          for (int aw = 0; aw < 2; ++aw) {
            const void* a = aw ? static_cast<const void*>(wide.data() + 1) : src[0].data() + 1;
            const double q = form == 2 ? 3.0 : 1.0;
            k->to_narrow[bf][form][aw](got.data() + 1, a, src[1].data() + 1, n, q);
            ref.to_narrow[bf][form][aw](exp.data() + 1, a, src[1].data() + 1, n, q);
            for (std::size_t i = 0; i < n; ++i) {
              std::uint16_t g, e;
              std::memcpy(&g, got.data() + 1 + 2 * i, 2);
              std::memcpy(&e, exp.data() + 1 + 2 * i, 2);
              REQUIRE_MESSAGE(g == e, std::string(k->isa), " to_narrow ", name(t), " form ", form,
                              " a_wide ", aw, " n=", n, " i=", i, ": 0x", std::hex, g, " want 0x",
                              e);
            }
          }
        for (int nsrc = 2; nsrc <= kSources; ++nsrc)
          for (int form = 0; form < 3; ++form) {
            std::vector<const void*> ptrs;
            for (int q = 0; q < nsrc; ++q) ptrs.push_back(src[q].data() + 1);
            const double q = form == 2 ? static_cast<double>(nsrc) : 1.0;
            k->many[bf][form](got.data() + 1, ptrs.data(), nsrc, n, q);
            ref.many[bf][form](exp.data() + 1, ptrs.data(), nsrc, n, q);
            for (std::size_t i = 0; i < n; ++i) {
              std::uint16_t g, e;
              std::memcpy(&g, got.data() + 1 + 2 * i, 2);
              std::memcpy(&e, exp.data() + 1 + 2 * i, 2);
              REQUIRE_MESSAGE(g == e, std::string(k->isa), " many ", name(t), " nsrc ", nsrc,
                              " form ", form, " n=", n, " i=", i, ": 0x", std::hex, g, " want 0x",
                              e);
            }
          }
      }
    }
  }
  // The public entry points run the best table; it must be one of these.
  const std::string isa = detail::wide_kernel_isa();
  bool listed = false;
  for (const detail::WideKernels* k : tables) listed = listed || isa == k->isa;
  CHECK_MESSAGE(listed, isa);
}

// The float32 path of the many-input sum and avg (docs/design/accuracy.md,
// "Many 16-bit inputs in float32"): a vector sums in float32 only where
// every lane's exponent span is at most 24 - p - ceil(log2 nsrc) binades and
// no partial can overflow. Vectors at that edge must take it (zeros and
// subnormals must not widen the span), vectors one binade beyond, with
// inf or NaN, or nearer overflow must not, and every one gives the portable
// loops' bits. The test computes the rule itself and checks it with scalar
// float32 arithmetic: at the edge the float32 sum is exact; one binade
// beyond it is not, where the carries can fill the top bit.
TEST_CASE("the many-input float32 path: window edge, one binade beyond, zeros, subnormals, inf") {
  const detail::WideKernels& ref = detail::wide_kernels_portable();
  int checked_tables = 0;
  for (const detail::WideKernels* k : wide_tables()) {
    if (!k->many_in_float32) continue;
    ++checked_tables;
    const std::size_t lanes = k->lanes;
    for (DataType t : {DataType::float16, DataType::bfloat16}) {
      const bool bf = t == DataType::bfloat16;
      const int p = bf ? 8 : 11, mbits = p - 1, full = (1 << mbits) - 1;
      const int top_field = bf ? 254 : 30;  // largest finite exponent field
      for (int nsrc = 2; nsrc <= 9; ++nsrc) {
        int c = 0;
        while ((1 << c) < nsrc) ++c;
        const int window = 24 - p - c;
        const int ceiling = bf ? 254 - c : 30;
        // Carries can reach 2^(top + c) only when nsrc - 1 values just under
        // 2^(top + 1) pass it: there one binade beyond is inexact.
        const bool tight = (nsrc - 1) * (2.0 - std::ldexp(1.0, 1 - p)) >= std::ldexp(1.0, c);
        auto enc = [&](int sign, int field, int mant) {
          return static_cast<std::uint16_t>((sign ? 0x8000 : 0) | (field << mbits) | mant);
        };
        // One lane: nsrc - 1 inputs at exponent field `top` with the high
        // mantissa bits set (the most carries), one at field top - span
        // (0: a subnormal) with its lowest bit set, at position `pos`.
        auto carry_lane = [&](std::vector<std::uint16_t>& v, int top, int span, int sign,
                              std::size_t j) {
          const int pos = static_cast<int>(j % static_cast<std::size_t>(nsrc));
          for (int q = 0; q < nsrc; ++q)
            v[q] = q == pos ? enc(sign, top - span, (1 | static_cast<int>(j * 37)) & full)
                            : enc(sign, top, full - static_cast<int>(j % 3));
        };
        struct Case {
          std::string what;
          std::vector<std::vector<std::uint16_t>> lane;  // [lane][source]
          bool float32;                                  // the expected decision
          bool exact_witness, inexact_witness;
        };
        std::vector<Case> cases;
        auto add = [&](std::string what, bool expect, auto&& fill) {
          Case cs{std::move(what),
                  std::vector<std::vector<std::uint16_t>>(lanes, std::vector<std::uint16_t>(nsrc)),
                  expect, expect, false};
          for (std::size_t j = 0; j < lanes; ++j) fill(cs.lane[j], j);
          cases.push_back(std::move(cs));
        };
        const int hi = std::min(ceiling, top_field);
        // Exponent fields for lanes whose smallest input is normal at span s.
        auto top_at = [&](int s, std::size_t j) {
          return 1 + s + static_cast<int>(j * 7 % static_cast<std::size_t>(hi - s));
        };
        add("edge", true, [&](auto& v, std::size_t j) {
          carry_lane(v, top_at(window, j), window, static_cast<int>(j & 1), j);
        });
        add("beyond", false, [&](auto& v, std::size_t j) {
          carry_lane(v, top_at(window + 1, j), window + 1, static_cast<int>(j & 1), j);
        });
        cases.back().inexact_witness = tight;
        add("one lane beyond", false, [&](auto& v, std::size_t j) {
          const int s = j == lanes / 2 ? window + 1 : window;
          carry_lane(v, top_at(s, j), s, 0, j);
        });
        // Zeros contribute nothing: a zero counted as the smallest exponent
        // would widen these lanes (top >= window + 2) past the window.
        add("zeros", true, [&](auto& v, std::size_t j) {
          carry_lane(v, std::max(top_at(window, j), window + 2), window, 0, j);
          v[1 + j % static_cast<std::size_t>(nsrc - 1)] = (j & 2) ? 0x8000 : 0;
          if (j == 0)
            for (auto& x : v) x = 0;
          if (j == 1)
            for (int q = 1; q < nsrc; ++q) v[q] = 0x8000;
        });
        // A subnormal counts as the smallest normal exponent (field 1).
        add("subnormal at the edge", true,
            [&](auto& v, std::size_t j) { carry_lane(v, window + 1, window + 1, 0, j); });
        add("subnormal one binade beyond", false,
            [&](auto& v, std::size_t j) { carry_lane(v, window + 2, window + 2, 1, j); });
        const std::uint16_t inf = enc(0, bf ? 255 : 31, 0), nan = enc(0, bf ? 255 : 31, 1);
        // Lanes whose other inputs sit at the largest finite exponent, so
        // that only the exponent field of inf or NaN can refuse them.
        add("inf", false, [&](auto& v, std::size_t j) {
          carry_lane(v, top_at(window, j), window, 0, j);
          if (j == 3)
            for (int q = 0; q < nsrc; ++q) v[q] = q == 0 ? inf : enc(1, hi, full);
        });
        add("nan", false, [&](auto& v, std::size_t j) {
          carry_lane(v, top_at(window, j), window, 0, j);
          if (j == 5)
            for (int q = 0; q < nsrc; ++q) v[q] = q == nsrc - 1 ? nan : enc(0, hi, 3);
        });
        add("largest exponent", true, [&](auto& v, std::size_t j) {
          carry_lane(v, ceiling, static_cast<int>(j % static_cast<std::size_t>(window + 1)),
                     static_cast<int>(j & 1), j);
        });
        if (bf) {
          // One binade higher the carries reach 2^128: float32 overflows.
          add("one binade nearer overflow", false, [&](auto& v, std::size_t j) {
            carry_lane(v, ceiling + 1, static_cast<int>(j % 4), 0, j);
          });
          // Mixed signs: the partials overflow float32, the sum does not.
          add("overflowing partials", false, [&](auto& v, std::size_t j) {
            for (int q = 0; q < nsrc; ++q)
              v[q] = enc(q >= (nsrc + 1) / 2 ? 1 : 0, 254 - static_cast<int>(j % 2), full);
          });
        }
        for (const Case& cs : cases) {
          std::vector<std::vector<std::uint16_t>> src(nsrc, std::vector<std::uint16_t>(lanes));
          std::vector<const void*> ptrs;
          for (int q = 0; q < nsrc; ++q) {
            for (std::size_t j = 0; j < lanes; ++j) src[q][j] = cs.lane[j][q];
            ptrs.push_back(src[q].data());
          }
          const std::string where =
              std::string(k->isa) + " " + name(t) + " nsrc " + std::to_string(nsrc) + " " + cs.what;
          CHECK_MESSAGE(k->many_in_float32(ptrs.data(), nsrc, bf) == cs.float32, where,
                        ": float32 path expected ", cs.float32);
          bool inexact = false;
          for (std::size_t j = 0; j < lanes; ++j) {
            float f = 0;
            double exact = 0;  // exact: at most 9 inputs within 2^45 of each other
            for (int q = 0; q < nsrc; ++q) {
              f += static_cast<float>(decode16(t, cs.lane[j][q]));
              exact += decode16(t, cs.lane[j][q]);
            }
            inexact = inexact || static_cast<double>(f) != exact;
            if (cs.exact_witness)
              REQUIRE_MESSAGE(static_cast<double>(f) == exact, where, " lane ", j, ": float32 sum ",
                              f, " exact ", exact);
          }
          if (cs.inexact_witness)
            CHECK_MESSAGE(inexact, where, ": some lane's float32 sum should round");
          // The sums: one vector, and two (the bfloat16 kernels take two
          // vectors at a time as pairs, with one check for both).
          for (std::size_t len : {lanes, 2 * lanes}) {
            std::vector<std::vector<std::uint16_t>> wide(nsrc, std::vector<std::uint16_t>(len));
            std::vector<const void*> wptrs;
            for (int q = 0; q < nsrc; ++q) {
              for (std::size_t e = 0; e < len; ++e) wide[q][e] = src[q][e % lanes];
              wptrs.push_back(wide[q].data());
            }
            std::vector<std::uint16_t> got(len), want(len);
            for (int form : {0, 2}) {
              const double q = form == 2 ? static_cast<double>(nsrc) : 1.0;
              k->many[bf][form](got.data(), wptrs.data(), nsrc, len, q);
              ref.many[bf][form](want.data(), wptrs.data(), nsrc, len, q);
              for (std::size_t j = 0; j < len; ++j)
                REQUIRE_MESSAGE(got[j] == want[j], where, form == 2 ? " avg" : " sum", " of ", len,
                                " element ", j, ": 0x", std::hex, got[j], " want 0x", want[j]);
            }
          }
        }
      }
    }
  }
#if defined(__x86_64__)
  CHECK(checked_tables > 0);
#endif
}

// The float32 path over runs of vectors, as the direct and two-shot paths
// call it: vectors at the window's edge and vectors far beyond it
// interleaved (each failed check sends the next vectors to float64 for a
// while, then the check resumes), a tail shorter than a vector, sources and
// destination at odd byte offsets. Every element must carry the portable
// loops' bits. Each "beyond" lane is a double-rounding witness: x, half an
// ulp of x and a value below float32's reach, so summed in float32 it lands
// on the 16-bit midpoint and rounds to even, while the exact sum rounds up.
// A vector summed in float32 without its check, or a tail taken for a
// vector, therefore changes bits (2 inputs cannot make such a witness, so
// the runs start at 3).
TEST_CASE("the many-input float32 path over runs: mixed vectors, tails, odd offsets") {
  const detail::WideKernels& ref = detail::wide_kernels_portable();
  int checked_tables = 0;
  for (const detail::WideKernels* k : wide_tables()) {
    if (!k->many_in_float32) continue;
    ++checked_tables;
    const std::size_t lanes = k->lanes;
    for (DataType t : {DataType::float16, DataType::bfloat16}) {
      const bool bf = t == DataType::bfloat16;
      const int p = bf ? 8 : 11, mbits = p - 1, full = (1 << mbits) - 1;
      for (int nsrc = 3; nsrc <= 9; ++nsrc) {
        int c = 0;
        while ((1 << c) < nsrc) ++c;
        const int window = 24 - p - c;
        const int hi = bf ? 254 - c : 30;
        auto enc = [&](int sign, int field, int mant) {
          return static_cast<std::uint16_t>((sign ? 0x8000 : 0) | (field << mbits) | mant);
        };
        // Vector kinds in order: 0 at the window's edge, 1 far beyond it,
        // 2 and 3 beyond only in the odd or the even elements (the
        // bfloat16 kernels load elements in pairs, even and odd apart).
        // Single failures, a pair (the second inside the retry stretch of
        // the first), failures just after a retry stretch ends, and long
        // edge runs between.
        const std::vector<int> kinds = {0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0,
                                        0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0,
                                        0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3};
        for (std::size_t tail : {std::size_t{0}, std::size_t{1}, lanes - 1}) {
          const std::size_t n = kinds.size() * lanes + tail;
          // [source][element], one byte in: every pointer at an odd address.
          std::vector<std::vector<unsigned char>> src(nsrc, std::vector<unsigned char>(2 * n + 1));
          for (std::size_t e = 0; e < n; ++e) {
            // The tail's elements are witnesses too.
            const int kind = e / lanes < kinds.size() ? kinds[e / lanes] : 1;
            const bool beyond = kind == 1 || (kind == 2 && e % 2 == 1) || (kind == 3 && e % 2 == 0);
            const int sign = static_cast<int>((e >> 1) & 1);
            const int rot = static_cast<int>(e % static_cast<std::size_t>(nsrc));
            std::vector<std::uint16_t> v(nsrc, 0);  // zeros: no part of the span
            if (beyond) {
              // x (even last bit) at field f, half its ulp, and z below
              // float32's half ulp of x (2^-25 of it) but within float64's
              // reach of it (so `exact` below is): 2^-30 of x for bfloat16,
              // the smallest subnormal for float16 (f >= 26: 2^-35 or more).
              const int f = hi - static_cast<int>(e % 5);
              v[0] = enc(sign, f, (static_cast<int>(e * 37) & full) & ~1);
              v[1] = enc(sign, f - p, 0);
              v[2] = bf ? enc(sign, f - 30, 1) : enc(sign, 0, 1);
            } else {
              // As "edge" in the case above: nsrc - 1 inputs at field top
              // with the high mantissa bits set, one at top - window.
              const int top =
                  1 + window + static_cast<int>(e * 7 % static_cast<std::size_t>(hi - window));
              for (int q = 0; q < nsrc; ++q)
                v[q] = q == 0 ? enc(sign, top - window, (1 | static_cast<int>(e * 37)) & full)
                              : enc(sign, top, full - static_cast<int>(e % 3));
            }
            float f32 = 0;
            double exact = 0;  // exact: each lane spans less than 53 bits
            for (int q = 0; q < nsrc; ++q) {
              const std::uint16_t x = v[(q + rot) % nsrc];
              std::memcpy(src[q].data() + 1 + 2 * e, &x, 2);
              f32 += static_cast<float>(decode16(t, x));
              exact += decode16(t, x);
            }
            if (beyond)
              REQUIRE_MESSAGE(encode16(t, f32) != encode16(t, exact), std::string(name(t)),
                              " nsrc ", nsrc, " element ", e, ": not a double-rounding witness");
            else
              REQUIRE_MESSAGE(static_cast<double>(f32) == exact, std::string(name(t)), " nsrc ",
                              nsrc, " element ", e,
                              ": the float32 sum at the edge should be exact");
          }
          std::vector<const void*> ptrs;
          for (int q = 0; q < nsrc; ++q) ptrs.push_back(src[q].data() + 1);
          const std::string where = std::string(k->isa) + " " + name(t) + " nsrc " +
                                    std::to_string(nsrc) + " tail " + std::to_string(tail);
          // The first vector takes the float32 path, the second does not.
          CHECK_MESSAGE(k->many_in_float32(ptrs.data(), nsrc, bf), where);
          std::vector<const void*> second;
          for (const void* q : ptrs)
            second.push_back(static_cast<const unsigned char*>(q) + 2 * lanes);
          CHECK_MESSAGE(!k->many_in_float32(second.data(), nsrc, bf), where);
          std::vector<unsigned char> got(2 * n + 1), want(2 * n + 1);
          for (int form : {0, 2}) {
            const double q = form == 2 ? static_cast<double>(nsrc) : 1.0;
            k->many[bf][form](got.data() + 1, ptrs.data(), nsrc, n, q);
            ref.many[bf][form](want.data() + 1, ptrs.data(), nsrc, n, q);
            for (std::size_t e = 0; e < n; ++e) {
              std::uint16_t g, w;
              std::memcpy(&g, got.data() + 1 + 2 * e, 2);
              std::memcpy(&w, want.data() + 1 + 2 * e, 2);
              REQUIRE_MESSAGE(g == w, where, form == 2 ? " avg" : " sum", " element ", e,
                              " (vector ", e / lanes, "): encoding ", g, ", want ", w);
            }
          }
        }
      }
    }
  }
#if defined(__x86_64__)
  CHECK(checked_tables > 0);
#endif
}

// avg in the many-input kernels: an exact float32 sum times 2^-k is exact,
// so avg by 2, 4, 8, ... rounds once from float32; by any other divisor
// the float32 product (or quotient) would be a second rounding. Each
// witness's exact mean is a 16-bit midpoint or lies just off one, so a
// second rounding moves it to the other neighbour: 2807/32768 / 7 =
// 401/32768 rounds (ties to even) to 25/2048 in bfloat16, while the
// float32 product with 1/7 rounds up to 201/16384. Every table, in every
// lane and the tail, against the value worked out by hand.
TEST_CASE("many-input avg: rounded once, by divisors that are powers of two and not") {
  struct Witness {
    DataType t;
    int q;                       // the divisor, and the number of sources
    std::vector<double> inputs;  // the rest of the q sources are zeros
    double mean;                 // the exact mean rounded to nearest even
  };
  const std::vector<Witness> witnesses = {
      // 2807/32768 / 7 = 401/32768, a tie between 400 and 402 (x 2^-15).
      {DataType::bfloat16, 7, {171.0 / 2048, 247.0 / 32768, -11.0 / 2048}, 25.0 / 2048},
      // 19215/65536 / 7 = 2745/65536, a tie between 1372 and 1373 (x 2^-15).
      {DataType::float16, 7, {-709.0 / 4096, 469.0 / 1024, 543.0 / 65536}, 343.0 / 8192},
      // (4 + 2^-6) / 4 = 1 + 2^-8: a tie, to 1 (even).
      {DataType::bfloat16, 4, {2, 2, 1.0 / 64}, 1.0},
      // (4 + 3 * 2^-6) / 4 = 1 + 3 * 2^-8: a tie, up to 1 + 2^-6 (even).
      {DataType::bfloat16, 4, {2, 2, 3.0 / 64}, 1.0 + 1.0 / 64},
      // (8 + 2^-8) / 8 = 1 + 2^-11: a float16 tie, to 1.
      {DataType::float16, 8, {4, 4, 1.0 / 256}, 1.0},
      // A bfloat16 mean in the subnormals: (3 * 2^-126) / 8 = 3 * 2^-129,
      // 48 x 2^-133 exactly.
      {DataType::bfloat16,
       8,
       {std::ldexp(1.0, -126), std::ldexp(1.0, -125)},
       std::ldexp(3.0, -129)},
  };
  for (const Witness& w : witnesses) {
    const bool bf = w.t == DataType::bfloat16;
    double sum = 0;
    for (double x : w.inputs) {
      REQUIRE(decode16(w.t, encode16(w.t, x)) == x);  // each input is a 16-bit value
      sum += x;                                       // exact here: few bits
    }
    REQUIRE(decode16(w.t, encode16(w.t, sum / w.q)) == w.mean);
    for (const detail::WideKernels* k : wide_tables()) {
      const std::size_t n = 2 * k->lanes + 3;
      std::vector<std::vector<std::uint16_t>> src(w.q, std::vector<std::uint16_t>(n, 0));
      for (std::size_t e = 0; e < n; ++e)  // the inputs rotate through the sources
        for (std::size_t i = 0; i < w.inputs.size(); ++i)
          src[(i + e) % static_cast<std::size_t>(w.q)][e] = encode16(w.t, w.inputs[i]);
      std::vector<const void*> ptrs;
      for (const auto& s : src) ptrs.push_back(s.data());
      std::vector<std::uint16_t> got(n);
      k->many[bf][2](got.data(), ptrs.data(), w.q, n, static_cast<double>(w.q));
      for (std::size_t e = 0; e < n; ++e)
        REQUIRE_MESSAGE(decode16(w.t, got[e]) == w.mean, k->isa, " ", name(w.t), " avg by ", w.q,
                        " element ", e, ": ", decode16(w.t, got[e]), ", want ", w.mean);
    }
  }
}

// ---- Inputs: a pure function of (seed, rank, index), so any rank knows all. ----

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Magnitudes from 2^-14 (float16) or 2^-20 (bfloat16) to 2^12 / 2^20, mixed
// signs (cancellation), some float16 subnormals. bfloat16 spans stay below
// 2^45, so the float64 reference sum is exact; prod inputs keep 2 mantissa
// bits so that products of 8 stay exact too.
std::uint16_t input(DataType t, ReduceOp op, std::uint64_t seed, int rank, std::size_t i) {
  const std::uint64_t h = mix(seed * 1000003 + static_cast<std::uint64_t>(rank) * 7919 + i * 31);
  const std::uint16_t sign = (h & 1) ? 0x8000u : 0;
  if (op == ReduceOp::prod) {
    // +-(1, 1.25, 1.5, 1.75) * 2^(-3..3)
    const int e = static_cast<int>((h >> 8) % 7) - 3;
    const int m = static_cast<int>((h >> 16) % 4);
    return t == DataType::bfloat16 ? static_cast<std::uint16_t>(sign | ((e + 127) << 7) | (m << 5))
                                   : static_cast<std::uint16_t>(sign | ((e + 15) << 10) | (m << 8));
  }
  if (t == DataType::float16) {
    if ((h >> 4) % 8 == 0) return static_cast<std::uint16_t>(sign | ((h >> 12) % 1024));
    const int e = static_cast<int>((h >> 8) % 27) - 14;  // -14 .. 12
    return static_cast<std::uint16_t>(sign | ((e + 15) << 10) | ((h >> 20) & 0x3ff));
  }
  const int e = static_cast<int>((h >> 8) % 41) - 20;  // -20 .. 20
  return static_cast<std::uint16_t>(sign | ((e + 127) << 7) | ((h >> 20) & 0x7f));
}

// The reduction of element i (global index) over n ranks, rounded once.
std::uint16_t reference(DataType t, ReduceOp op, std::uint64_t seed, int n, std::size_t i) {
  double acc = op == ReduceOp::prod ? 1.0 : 0.0;
  for (int q = 0; q < n; ++q) {
    const double v = decode16(t, input(t, op, seed, q, i));
    acc = op == ReduceOp::prod ? acc * v : acc + v;
  }
  if (op == ReduceOp::avg) acc /= n;
  return encode16(t, acc);
}

// Runs fn(comm) on n ranks with SHMRING_ALGO = algo (nullptr: unset) set in
// each child before its communicator exists. slot_bytes 0: the default.
void run(int n, const char* algo, const std::function<void(Communicator&)>& fn,
         std::size_t slot_bytes = 0) {
  const std::string job = test::unique_job_id("acc");
  auto status = test::run_processes(
      n,
      [&](int r) {
        if (algo)
          setenv("SHMRING_ALGO", algo, 1);
        else
          unsetenv("SHMRING_ALGO");
        Options o;
        o.rank = r;
        o.world_size = n;
        o.job_id = job;
        o.slot_bytes = slot_bytes;
        Communicator comm(o);
        fn(comm);
      },
      300);
  for (int r = 0; r < n; ++r)
    CHECK_MESSAGE(status[r] == 0, "N=", n, " algo=", std::string(algo ? algo : "unset"), ": rank ",
                  r, " status ", status[r]);
}

// Checks got[j] == reference(global index first + j) for j < count.
void expect_reference(const std::uint16_t* got, std::size_t count, std::size_t first, DataType t,
                      ReduceOp op, std::uint64_t seed, int n, const char* what, int rank) {
  for (std::size_t j = 0; j < count; ++j) {
    const std::uint16_t want = reference(t, op, seed, n, first + j);
    SHMRING_CHILD_CHECK(got[j] == want,
                        "%s %s %s N=%d rank %d: [%zu] = 0x%04x (%.9g), float64 reference rounded "
                        "once 0x%04x (%.9g)",
                        what, name(t), name(op), n, rank, first + j, got[j], decode16(t, got[j]),
                        want, decode16(t, want));
  }
}

// allreduce, reduce_scatter and reduce to every root, out of place and in
// place, for both 16-bit types and sum, avg, prod, against the reference.
void check_random_mixes(Communicator& comm, std::size_t count, std::uint64_t seed) {
  const int n = comm.size(), r = comm.rank();
  for (DataType t : {DataType::float16, DataType::bfloat16}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::prod}) {
      std::vector<std::uint16_t> send(count * n), recv(count * n, 0xdead);
      for (std::size_t i = 0; i < send.size(); ++i) send[i] = input(t, op, seed, r, i);
      comm.allreduce(send.data(), recv.data(), count, t, op);
      expect_reference(recv.data(), count, 0, t, op, seed, n, "allreduce", r);
      std::vector<std::uint16_t> inplace(send.begin(), send.begin() + count);
      comm.allreduce(inplace.data(), inplace.data(), count, t, op);
      expect_reference(inplace.data(), count, 0, t, op, seed, n, "in-place allreduce", r);

      comm.reduce_scatter(send.data(), recv.data(), count, t, op);
      expect_reference(recv.data(), count, r * count, t, op, seed, n, "reduce_scatter", r);
      std::vector<std::uint16_t> whole(send);  // in place: the result over our block
      comm.reduce_scatter(whole.data(), whole.data() + r * count, count, t, op);
      expect_reference(whole.data() + r * count, count, r * count, t, op, seed, n,
                       "in-place reduce_scatter", r);

      for (int root = 0; root < n; ++root) {
        std::fill(recv.begin(), recv.end(), 0xdead);
        comm.reduce(send.data(), recv.data(), count, t, op, root);
        if (r == root) expect_reference(recv.data(), count, 0, t, op, seed, n, "reduce", r);
        std::vector<std::uint16_t> own(send.begin(), send.begin() + count);
        comm.reduce(own.data(), own.data(), count, t, op, root);
        if (r == root) expect_reference(own.data(), count, 0, t, op, seed, n, "in-place reduce", r);
      }
    }
  }
}

}  // namespace

// The x86 tables sum chunks of many-input blocks in float32 and read
// MXCSR's flags for exactness (kernels/wide_loops.inc, flag_checked_sums).
// A quiet NaN input raises no flag, so a chunk whose other adds are all
// exact still holds one: its result must be the default NaN, as the
// portable loops give, not the input's payload. Lengths cover the short
// first chunk, a long one and a tail; the NaN sits in each of them, and
// the caller's MXCSR (here flush-to-zero and denormals-are-zero, which
// would lose subnormal inputs) comes back as it was.
TEST_CASE("many-input sums: a quiet NaN in an otherwise exact chunk stores the default NaN") {
  const detail::WideKernels& ref = detail::wide_kernels_portable();
  for (const detail::WideKernels* k : wide_tables()) {
    for (DataType t : {DataType::float16, DataType::bfloat16}) {
      const bool bf = t == DataType::bfloat16;
      const std::uint16_t qnan = bf ? 0x7fc5 : 0x7e05;  // quiet, with a payload
      for (int nsrc : {3, 4, 7}) {
        for (std::size_t len : {std::size_t{64}, std::size_t{1000}, std::size_t{2600}}) {
          for (std::size_t at : {std::size_t{5}, len / 2 + 3, len - 1}) {
            std::vector<std::vector<std::uint16_t>> src(nsrc, std::vector<std::uint16_t>(len));
            std::vector<const void*> ptrs;
            for (int q = 0; q < nsrc; ++q) {
              for (std::size_t e = 0; e < len; ++e)  // small integers: every add exact
                src[q][e] =
                    encode16(t, static_cast<double>(static_cast<int>((e * 7 + q * 3) % 9) - 4));
              ptrs.push_back(src[q].data());
            }
            src[static_cast<std::size_t>(nsrc) / 2][at] = qnan;
            std::vector<std::uint16_t> got(len), want(len);
            for (int form : {0, 2}) {
              const double q = form == 2 ? 4.0 : 1.0;  // avg by 4: the reciprocal path
#if defined(__x86_64__)
              const unsigned caller = (_mm_getcsr() & ~0x3fu) | 0x8040;  // FTZ, DAZ
              _mm_setcsr(caller);
#endif
              k->many[bf][form](got.data(), ptrs.data(), nsrc, len, q);
#if defined(__x86_64__)
              // Its mode comes back; its sticky flags may gain some, as
              // from any floating-point code.
              const unsigned after = _mm_getcsr() & ~0x3fu;
              _mm_setcsr(0x1f80);
              CHECK_MESSAGE(after == caller, std::string(k->isa), ": MXCSR mode 0x", std::hex,
                            caller, " came back as 0x", after);
#endif
              ref.many[bf][form](want.data(), ptrs.data(), nsrc, len, q);
              for (std::size_t j = 0; j < len; ++j)
                REQUIRE_MESSAGE(got[j] == want[j], std::string(k->isa), " ", std::string(name(t)),
                                " nsrc ", nsrc, " len ", len, form == 2 ? " avg" : " sum",
                                " element ", j, ": 0x", std::hex, got[j], " want 0x", want[j]);
              CHECK(want[at] == (bf ? 0x7fc0 : 0x7e00));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("case file, input 1: float16 avg of 4 x 30000 is 30000, not inf (count 5 and 2^20)") {
  for (const char* algo : {static_cast<const char*>(nullptr), "ring", "direct", "two_shot"}) {
    for (std::size_t count : {std::size_t{5}, std::size_t{1} << 20}) {
      run(4, algo, [count](Communicator& comm) {
        const std::uint16_t v30000 = encode16(DataType::float16, 30000.0);
        std::vector<std::uint16_t> buf(count, v30000);
        comm.allreduce(buf.data(), buf.data(), count, DataType::float16, ReduceOp::avg);
        for (std::size_t i = 0; i < count; ++i)
          SHMRING_CHILD_CHECK(buf[i] == v30000, "rank %d [%zu] = %g, want 30000", comm.rank(), i,
                              decode16(DataType::float16, buf[i]));
        // Mean 45000 of 20000, 40000, 60000, 60000 (sum 180000 > 65504),
        // rounded once.
        const double mine[] = {20000, 40000, 60000, 60000};
        std::vector<std::uint16_t> b(count, encode16(DataType::float16, mine[comm.rank()]));
        std::vector<std::uint16_t> out(count);
        comm.allreduce(b.data(), out.data(), count, DataType::float16, ReduceOp::avg);
        // 45000 itself is not a float16: the nearest is 44992.
        for (std::size_t i = 0; i < count; ++i)
          SHMRING_CHILD_CHECK(out[i] == encode16(DataType::float16, 45000.0),
                              "rank %d [%zu] = %g, want 44992", comm.rank(), i,
                              decode16(DataType::float16, out[i]));
        // The case's 20000, 40000, 60000, 80000 in bfloat16 (80000 is past
        // float16's range): the mean of the rounded inputs, rounded once.
        const double bf[] = {20000, 40000, 60000, 80000};
        double sum = 0;
        for (double x : bf) sum += decode16(DataType::bfloat16, encode16(DataType::bfloat16, x));
        const std::uint16_t want = encode16(DataType::bfloat16, sum / 4);
        std::vector<std::uint16_t> c(count, encode16(DataType::bfloat16, bf[comm.rank()]));
        comm.allreduce(c.data(), c.data(), count, DataType::bfloat16, ReduceOp::avg);
        for (std::size_t i = 0; i < count; ++i)
          SHMRING_CHILD_CHECK(c[i] == want, "rank %d bf16 [%zu] = %g, want %g", comm.rank(), i,
                              decode16(DataType::bfloat16, c[i]),
                              decode16(DataType::bfloat16, want));
      });
    }
  }
}

TEST_CASE("float16 avg and sum never overflow through a partial, at N=3 in every position") {
  // N=3, ring with small slots (many slices): each chunk reduces in another
  // order, so a rounded or 16-bit partial would overflow at some positions.
  for (const char* algo : {"ring", "direct"}) {
    run(
        3, algo,
        [](Communicator& comm) {
          const std::size_t count = 3001;
          const double big[] = {60000, 60000, -60000};
          std::vector<std::uint16_t> b(count, encode16(DataType::float16, big[comm.rank()]));
          std::vector<std::uint16_t> out(count);
          comm.allreduce(b.data(), out.data(), count, DataType::float16, ReduceOp::sum);
          for (std::size_t i = 0; i < count; ++i)
            SHMRING_CHILD_CHECK(decode16(DataType::float16, out[i]) == 60000.0,
                                "sum rank %d [%zu] = %g, want 60000", comm.rank(), i,
                                decode16(DataType::float16, out[i]));
          comm.allreduce(b.data(), out.data(), count, DataType::float16, ReduceOp::avg);
          for (std::size_t i = 0; i < count; ++i)
            SHMRING_CHILD_CHECK(decode16(DataType::float16, out[i]) == 20000.0,
                                "avg rank %d [%zu] = %g, want 20000", comm.rank(), i,
                                decode16(DataType::float16, out[i]));
        },
        4096);
  }
}

TEST_CASE(
    "case file, input 2: bfloat16 1 + 256 + 1 + 1 is 260 whatever the rank, algorithm or "
    "position") {
  for (const char* algo : {static_cast<const char*>(nullptr), "ring", "direct", "two_shot"}) {
    // count 1 (the case), then the 256 held by each rank in turn at every
    // position of a buffer cut into 4 chunks of several slices.
    run(
        4, algo,
        [](Communicator& comm) {
          const std::uint16_t one = encode16(DataType::bfloat16, 1.0);
          const std::uint16_t big = encode16(DataType::bfloat16, 256.0);
          const std::uint16_t want = encode16(DataType::bfloat16, 260.0);
          std::uint16_t x = comm.rank() == 1 ? big : one, y = 0;
          comm.allreduce(&x, &y, 1, DataType::bfloat16, ReduceOp::sum);
          SHMRING_CHILD_CHECK(y == want, "rank %d: %g, want 260", comm.rank(),
                              decode16(DataType::bfloat16, y));
          const std::size_t count = 4099;
          std::vector<std::uint16_t> in(count), out(count);
          for (std::size_t i = 0; i < count; ++i)
            in[i] = static_cast<int>(i % 4) == comm.rank() ? big : one;
          comm.allreduce(in.data(), out.data(), count, DataType::bfloat16, ReduceOp::sum);
          for (std::size_t i = 0; i < count; ++i)
            SHMRING_CHILD_CHECK(out[i] == want, "rank %d [%zu]: %g, want 260", comm.rank(), i,
                                decode16(DataType::bfloat16, out[i]));
          for (int root = 0; root < 4; ++root) {
            std::fill(out.begin(), out.end(), 0);
            comm.reduce(in.data(), out.data(), count, DataType::bfloat16, ReduceOp::sum, root);
            if (comm.rank() == root)
              for (std::size_t i = 0; i < count; ++i)
                SHMRING_CHILD_CHECK(out[i] == want, "reduce root %d [%zu]: %g, want 260", root, i,
                                    decode16(DataType::bfloat16, out[i]));
          }
          // reduce_scatter: 4 blocks of 1025.
          std::vector<std::uint16_t> s(4 * 1025), rs(1025);
          for (std::size_t i = 0; i < s.size(); ++i)
            s[i] = static_cast<int>(i % 4) == comm.rank() ? big : one;
          comm.reduce_scatter(s.data(), rs.data(), 1025, DataType::bfloat16, ReduceOp::sum);
          for (std::size_t i = 0; i < rs.size(); ++i)
            SHMRING_CHILD_CHECK(rs[i] == want, "reduce_scatter rank %d [%zu]: %g, want 260",
                                comm.rank(), i, decode16(DataType::bfloat16, rs[i]));
        },
        4096);
  }
}

TEST_CASE("random mixes of magnitudes equal the float64 reference rounded once, N=2..8, direct") {
  for (int n = 2; n <= 8; ++n)
    run(n, "direct", [n](Communicator& comm) { check_random_mixes(comm, 613, 100 + n); });
}

TEST_CASE(
    "random mixes of magnitudes equal the float64 reference rounded once, N=2..8, ring/chain") {
  // Small slots: every chunk crosses several slices (float64 partials).
  for (int n = 2; n <= 8; ++n)
    run(
        n, "ring", [n](Communicator& comm) { check_random_mixes(comm, 1501, 200 + n); }, 4096);
}

TEST_CASE(
    "random mixes of magnitudes equal the float64 reference rounded once, N=2..8, two-shot "
    "rounds") {
  // Small slots: 20000 elements take five rounds of 4096 (two_shot.cpp).
  for (int n = 2; n <= 8; ++n)
    run(
        n, "two_shot", [n](Communicator& comm) { check_random_mixes(comm, 20000, 500 + n); }, 4096);
}

TEST_CASE("random mixes, default algorithm choice and slots, N=4, a count past the direct buffer") {
  run(4, nullptr, [](Communicator& comm) { check_random_mixes(comm, 40000, 300); });
}

TEST_CASE("random mixes with 2 reduction threads per rank (oneTBB grains), ring and direct, N=3") {
  // Chunks of 46667 elements: full 32768-element float64 slices in the ring
  // and over 256 KiB of 16-bit data in the direct path, so both split.
  for (const char* algo : {"ring", "direct"}) {
    setenv("SHMRING_THREADS", "2", 1);
    setenv("SHMRING_DIRECT_BYTES", "1048576", 1);
    run(3, algo, [](Communicator& comm) { check_random_mixes(comm, 140001, 400); });
    unsetenv("SHMRING_THREADS");
    unsetenv("SHMRING_DIRECT_BYTES");
  }
}

TEST_CASE("random mixes with 2 reduction threads per rank, two-shot rounds, N=3") {
  // 400001 16-bit elements in rounds of 512 KiB (default slots): a part of
  // 87381 elements touches (3 + 2) x 2 bytes each, so its reduction and the
  // copy over our own half split into grains; the two peers' parts (341
  // KiB) are gathered as one split job.
  setenv("SHMRING_THREADS", "2", 1);
  run(3, "two_shot", [](Communicator& comm) { check_random_mixes(comm, 400001, 450); });
  unsetenv("SHMRING_THREADS");
}

TEST_CASE("16-bit min and max stay exact and propagate NaN on both paths") {
  for (const char* algo : {"ring", "direct"})
    run(
        5, algo,
        [](Communicator& comm) {
          const int n = comm.size(), r = comm.rank();
          const std::size_t count = 2003;
          for (DataType t : {DataType::float16, DataType::bfloat16}) {
            std::vector<std::uint16_t> in(count), out(count);
            auto v = [&](int q, std::size_t i) {
              if (i % 97 == 5 && static_cast<int>(i % n) == q)
                return t == DataType::float16 ? std::uint16_t{0x7e00} : std::uint16_t{0x7fc0};
              return input(t, ReduceOp::sum, 7, q, i);
            };
            for (std::size_t i = 0; i < count; ++i) in[i] = v(r, i);
            for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
              comm.allreduce(in.data(), out.data(), count, t, op);
              for (std::size_t i = 0; i < count; ++i) {
                double want = decode16(t, v(0, i));
                bool nan = std::isnan(want);
                for (int q = 1; q < n; ++q) {
                  const double x = decode16(t, v(q, i));
                  nan = nan || std::isnan(x);
                  want = op == ReduceOp::min ? std::min(want, x) : std::max(want, x);
                }
                const double got = decode16(t, out[i]);
                SHMRING_CHILD_CHECK(nan ? std::isnan(got) : got == want,
                                    "%s %s rank %d [%zu] = %g want %g", name(t),
                                    op == ReduceOp::min ? "min" : "max", r, i, got, want);
              }
            }
          }
        },
        4096);
}

TEST_CASE("16-bit sum/avg/prod: a NaN result is the default quiet NaN whatever made it") {
  // NaN inputs of either sign, quiet or signalling, with any payload, on one
  // rank or on all, and inf - inf (x86 makes a negative NaN of that, Arm a
  // positive one): the result is 0x7e00 (float16) or 0x7fc0 (bfloat16) on
  // every rank and at every position, so it depends neither on the rank
  // order nor on the machine (docs/design/accuracy.md).
  for (const char* algo : {"ring", "direct", "two_shot"})
    for (int n : {2, 3})
      run(n, algo, [](Communicator& comm) {
        const int n = comm.size(), r = comm.rank();
        const std::size_t count = 1031;  // past every vector width, with a tail
        for (DataType t : {DataType::float16, DataType::bfloat16}) {
          const bool bf = t == DataType::bfloat16;
          const std::uint16_t exp_ones = bf ? 0x7f80 : 0x7c00;
          const std::uint16_t quiet = bf ? 0x40 : 0x200;
          auto nan = [&](int q, std::size_t i) {  // sign, quietness and payload vary
            const std::uint16_t sign = ((q + i) & 1) ? 0x8000 : 0;
            const std::uint16_t payload = static_cast<std::uint16_t>(1 + (3 * q + i) % (quiet - 1));
            return static_cast<std::uint16_t>(sign | exp_ones | (i % 3 == 0 ? quiet : 0) | payload);
          };
          auto v = [&](int q, std::size_t i) -> std::uint16_t {
            switch (i % 7) {
              case 0:
                return static_cast<int>(i % n) == q ? nan(q, i) : encode16(t, 1.5);
              case 1:
                return nan(q, i);
              case 2:  // +inf, -inf, then finite: a NaN that the hardware makes
                return q == 0   ? exp_ones
                       : q == 1 ? static_cast<std::uint16_t>(0x8000 | exp_ones)
                                : encode16(t, 2.0);
              default:
                return encode16(t, static_cast<double>(static_cast<int>(i % 13) - 6 + q) / 2);
            }
          };
          std::vector<std::uint16_t> in(count), out(count);
          for (std::size_t i = 0; i < count; ++i) in[i] = v(r, i);
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::prod}) {
            comm.allreduce(in.data(), out.data(), count, t, op);
            for (std::size_t i = 0; i < count; ++i) {
              double exact = op == ReduceOp::prod ? 1.0 : 0.0;  // exact: at most 3 small values
              for (int q = 0; q < n; ++q)
                exact = op == ReduceOp::prod ? exact * decode16(t, v(q, i))
                                             : exact + decode16(t, v(q, i));
              if (op == ReduceOp::avg) exact /= n;
              const std::uint16_t want = encode16(t, exact);
              SHMRING_CHILD_CHECK(out[i] == want, "%s %s N=%d rank %d [%zu] = 0x%04x, want 0x%04x",
                                  name(t), name(op), n, r, i, out[i], want);
            }
          }
        }
      });
}
