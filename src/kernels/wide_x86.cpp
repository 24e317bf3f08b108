// The 16-bit reductions of kernels/wide.hpp with x86 vector instructions:
// AVX-512 (F, BW, VL, DQ: 16 elements a step) and AVX2 with F16C (8 a step).
// The same arithmetic as the portable loops of kernels/wide.cpp, lane by
// lane, so both give the same bits (tests/collectives/test_accuracy.cpp
// compares them): widen each input exactly to float64, combine in float64 in the
// order the caller gives, divide for avg, then round once (round to odd to
// float32, then to nearest even to 16 bits). Everything between the 16-bit
// loads and the 16-bit store stays in registers, so a step reads 2 bytes
// per element and input and writes 2 (or 8 for a float64 partial); the
// portable loops ran at 5-20 GB/s per core (build/bench/kernel_bench).
//
// Conversions (docs/design/accuracy.md gives the rounding argument):
//   bfloat16 -> float32   zero-extend and shift left by 16 (exact, NaN kept);
//   float16 -> float32    vcvtph2ps (exact; float16 subnormals are normal in
//                         float32, so the denormals-are-zero mode cannot
//                         touch them);
//   float32 -> float64    vcvtps2pd (exact);
//   float64 -> float32    round to odd: AVX-512 truncates with embedded
//                         rounding ({rz-sae}) and sets the last bit when the
//                         conversion was inexact; AVX2 rounds in the current
//                         mode, steps back one ulp where it rounded away from
//                         zero, then sets the last bit (the portable form);
//   float32 -> bfloat16   the integer round-to-nearest-even (vcvtneps2bf16
//                         treats subnormal inputs as zero, which would lose
//                         bfloat16's subnormals);
//   float32 -> float16    vcvtps2ph with round to nearest even; a NaN becomes
//                         the default quiet NaN 0x7e00, as in the portable
//                         loops (so is any bfloat16 NaN: 0x7fc0).
// Two 16-bit inputs summed (or averaged: each halved first) need no float64: the sum
// of two float16 or bfloat16 values rounded to float32 rounds to the same
// 16-bit value as the exact sum (docs/design/accuracy.md gives the
// argument), so those steps run 16 (8) float32 lanes a vector instead of
// 8 (4) float64 ones. Many inputs summed (or averaged) take float32 too,
// vector by vector, where the inputs' exponent span (AVX2) or a pair of
// sums rounded down and up (AVX-512) proves the float32 sum exact;
// bfloat16 (and float16 with AVX2) first tries MXCSR's flags, chunk by
// chunk (InexactWatch below)
// (docs/design/accuracy.md, "Many 16-bit inputs in float32"). The
// tails of fewer than one vector go to the portable loops.

#include "kernels/target.hpp"
#include "kernels/wide.hpp"
#include "kernels/wide_kernels.hpp"

#if defined(__x86_64__)

#include <immintrin.h>

// GCC 12's AVX-512 intrinsics start from self-initialised "undefined"
// vectors, which -Wmaybe-uninitialized reports at every inlined use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace shmring::detail {

namespace {

struct Add {};
struct Mul {};

// MXCSR as the flag-checked many-input sums of kernels/wide_loops.inc want
// it: every exception masked, round to nearest even, denormals kept (no
// flush-to-zero, no denormals-are-zero), no flag raised.
constexpr unsigned kMxcsrClean = 0x1f80;
// The flags an add that did not give the exact sum raises: precision
// (inexact), underflow, overflow, invalid (inf - inf) and divide-by-zero;
// not the denormal-operand flag, which an exact add of a subnormal raises.
constexpr unsigned kMxcsrNotExact = 0x20 | 0x10 | 0x08 | 0x04 | 0x01;

// This thread's MXCSR for the life of the object: kMxcsrClean from the
// constructor on, the caller's own (mode and sticky flags) back at the
// destructor. clear() lowers the flags; raised(written) says whether an
// operation since then was not exact. The memory clobbers order the two
// against the loads and stores around them, and raised() takes the buffer
// the sums were stored to as an input of its asm: the buffer counts as
// read there even though its address never leaves the function, so every
// store, and every add behind it, stays before the flags are read.
// The instructions are those of SSE; every set here has them.
class InexactWatch {
 public:
  InexactWatch() : saved_(read()) { clear(); }
  ~InexactWatch() { write(saved_); }
  InexactWatch(const InexactWatch&) = delete;
  InexactWatch& operator=(const InexactWatch&) = delete;

  void clear() { write(kMxcsrClean); }
  bool raised(const void* written) const {
    unsigned v;
    asm volatile("stmxcsr %0" : "=m"(v) : "r"(written) : "memory");
    return (v & kMxcsrNotExact) != 0;
  }

 private:
  static unsigned read() {
    unsigned v;
    asm volatile("stmxcsr %0" : "=m"(v) : : "memory");
    return v;
  }
  static void write(unsigned v) { asm volatile("ldmxcsr %0" : : "m"(v) : "memory"); }
  unsigned saved_;
};

// kernels/wide_loops.inc's dependent call for the watch (kInexactFlag).
template <bool B>
inline InexactWatch inexact_watch(std::bool_constant<B>) {
  return InexactWatch{};
}

}  // namespace

// ---------------------------------------------------------------------------
// AVX-512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")

namespace {
namespace avx512 {

constexpr std::size_t kLanes = 16;
constexpr const char* kIsa = "avx512";

// 16 elements as float64.
struct V {
  __m512d lo, hi;
};

// 16 16-bit encodings.
using H = __m256i;
using F = __m512;

inline __attribute__((always_inline)) H load_h(const unsigned char* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// 16 16-bit values as float32 (exact).
template <bool Bf16>
inline __attribute__((always_inline)) F widen_h(H h) {
  if constexpr (Bf16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  else
    return _mm512_cvtph_ps(h);
}

template <bool Bf16>
inline __attribute__((always_inline)) F load16f(const unsigned char* p) {
  return widen_h<Bf16>(load_h(p));
}

// float32 -> float64 (exact).
inline __attribute__((always_inline)) V widen_f(F f) {
  return {_mm512_cvtps_pd(_mm512_castps512_ps256(f)),
          _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)))};
}

template <bool Bf16>
inline __attribute__((always_inline)) V load16(const unsigned char* p) {
  return widen_f(load16f<Bf16>(p));
}

inline __attribute__((always_inline)) F add_f(F a, F b) {
  return _mm512_add_ps(a, b);
}

// a * r in float32. r is a power of two in every use, and
// kernels/wide_loops.inc says at each use why the product is exact.
inline __attribute__((always_inline)) F scale_f(F a, float r) {
  return _mm512_mul_ps(a, _mm512_set1_ps(r));
}

// a + b rounded down and up by the instruction itself (EVEX embedded
// rounding, whatever MXCSR says): where both give the same value, no
// rounding happened (kernels/wide_loops.inc, the many-input sums).
constexpr bool kDirectedRounding = true;

// Exactness read from MXCSR's flags (InexactWatch above).
constexpr bool kInexactFlag = true;

// As b * 1 + a: the exact product is b, so the one rounding is that of
// a + b, signed zeros, inf and NaN included. A Zen 4 core issues FMAs on
// other pipes than adds and conversions, so the two directed sums run
// side by side (docs/performance/notes/2026-12-06-float16-many-input.md).
inline __attribute__((always_inline)) F add_down(F a, F b) {
  return _mm512_fmadd_round_ps(b, _mm512_set1_ps(1.0f), a,
                               _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}

inline __attribute__((always_inline)) F add_up(F a, F b) {
  return _mm512_add_round_ps(a, b, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
}

// Whether every lane of a equals b's (ordered: a NaN lane never does).
inline __attribute__((always_inline)) bool same_f(F a, F b) {
  return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ) == 0xffff;
}

inline __attribute__((always_inline)) __m512i bits_f(F f) {
  return _mm512_castps_si512(f);
}

// Each lane's largest magnitude (as encoding bits, sign cleared) and
// smallest nonzero magnitude less one (a zero wraps to 0xffff, so it never
// is the minimum unless every input is zero): the exponent span of
// docs/design/accuracy.md, "Many 16-bit inputs in float32".
struct Span {
  H top, low;
};

inline __attribute__((always_inline)) Span span_start() {
  return {_mm256_setzero_si256(), _mm256_set1_epi16(-1)};
}

inline __attribute__((always_inline)) void span_add(Span& s, H h) {
  const H mag = _mm256_and_si256(h, _mm256_set1_epi16(0x7fff));
  s.top = _mm256_max_epu16(s.top, mag);
  s.low = _mm256_min_epu16(s.low, _mm256_sub_epi16(mag, _mm256_set1_epi16(1)));
}

// Whether every lane has top_exp - low_exp <= window and top_exp <= ceiling
// (exponent fields; a subnormal's 0 counts as 1; m: the mantissa bits).
template <int M>
inline __attribute__((always_inline)) bool span_fits(const Span& s, int window, int ceiling) {
  const H top = _mm256_srli_epi16(s.top, M);
  const H low = _mm256_max_epi16(
      _mm256_srli_epi16(_mm256_add_epi16(s.low, _mm256_set1_epi16(1)), M), _mm256_set1_epi16(1));
  const H bad =
      _mm256_or_si256(_mm256_cmpgt_epi16(_mm256_sub_epi16(top, low), _mm256_set1_epi16(window)),
                      _mm256_cmpgt_epi16(top, _mm256_set1_epi16(ceiling)));
  return _mm256_testz_si256(bad, bad);
}

inline __attribute__((always_inline)) V load_wide(const unsigned char* p) {
  return {_mm512_loadu_pd(p), _mm512_loadu_pd(p + 64)};
}

inline __attribute__((always_inline)) void store_wide(unsigned char* p, V v) {
  _mm512_storeu_pd(p, v.lo);
  _mm512_storeu_pd(p + 64, v.hi);
}

template <class Op>
inline __attribute__((always_inline)) V apply(V a, V b) {
  if constexpr (std::is_same_v<Op, Mul>)
    return {_mm512_mul_pd(a.lo, b.lo), _mm512_mul_pd(a.hi, b.hi)};
  else
    return {_mm512_add_pd(a.lo, b.lo), _mm512_add_pd(a.hi, b.hi)};
}

inline __attribute__((always_inline)) V divide(V a, double q) {
  const __m512d qv = _mm512_set1_pd(q);
  return {_mm512_div_pd(a.lo, qv), _mm512_div_pd(a.hi, qv)};
}

inline __attribute__((always_inline)) V scale(V a, double r) {
  const __m512d rv = _mm512_set1_pd(r);
  return {_mm512_mul_pd(a.lo, rv), _mm512_mul_pd(a.hi, rv)};
}

// float64 -> float32 bits, rounded to odd.
inline __attribute__((always_inline)) __m256i round_to_odd(__m512d x) {
  const __m256 t = _mm512_cvt_roundpd_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask8 inexact = _mm512_cmp_pd_mask(_mm512_cvtps_pd(t), x, _CMP_NEQ_UQ);
  const __m256i b = _mm256_castps_si256(t);
  return _mm256_mask_or_epi32(b, inexact, b, _mm256_set1_epi32(1));
}

// 16 float32 values (as bits) rounded to nearest even to bfloat16, each in
// its lane's high half (the low half is left over); any NaN becomes the
// default quiet NaN.
inline __attribute__((always_inline)) __m512i bf16_high(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc00000));
}

// 32 bfloat16 encodings as 16 32-bit lanes (elements 2k and 2k+1 in lane
// k's low and high half), widened to float32 without a shuffle: the even
// elements by a shift, the odd ones by a mask (kernels/wide_loops.inc,
// pair_sum_float32).
inline __attribute__((always_inline)) __m512i load_pairs(const unsigned char* p) {
  return _mm512_loadu_si512(p);
}

inline __attribute__((always_inline)) F even_f(__m512i w) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

inline __attribute__((always_inline)) F odd_f(__m512i w) {
  return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xffff0000))));
}

// The first and the second 16 of 32 encodings loaded by load_pairs.
inline __attribute__((always_inline)) H lower_h(__m512i w) {
  return _mm512_castsi512_si256(w);
}

inline __attribute__((always_inline)) H upper_h(__m512i w) {
  return _mm512_extracti64x4_epi64(w, 1);
}

// The even and odd float32 values (as bits) rounded to bfloat16 and put
// back in place: 32 encodings.
inline __attribute__((always_inline)) void store_pairs(unsigned char* p, __m512i even,
                                                       __m512i odd) {
  _mm512_storeu_si512(p, _mm512_mask_blend_epi16(0xaaaaaaaa, _mm512_srli_epi32(bf16_high(even), 16),
                                                 bf16_high(odd)));
}

// Span over 32 encodings loaded as pairs (load_pairs): the same per-lane
// top and low as Span, on 32 16-bit lanes.
struct PairSpan {
  __m512i top, low;
};

inline __attribute__((always_inline)) PairSpan pair_span_start() {
  return {_mm512_setzero_si512(), _mm512_set1_epi16(-1)};
}

inline __attribute__((always_inline)) void pair_span_add(PairSpan& s, __m512i w) {
  const __m512i mag = _mm512_and_si512(w, _mm512_set1_epi16(0x7fff));
  s.top = _mm512_max_epu16(s.top, mag);
  s.low = _mm512_min_epu16(s.low, _mm512_sub_epi16(mag, _mm512_set1_epi16(1)));
}

template <int M>
inline __attribute__((always_inline)) bool pair_span_fits(const PairSpan& s, int window,
                                                          int ceiling) {
  const __m512i top = _mm512_srli_epi16(s.top, M);
  const __m512i low = _mm512_max_epi16(
      _mm512_srli_epi16(_mm512_add_epi16(s.low, _mm512_set1_epi16(1)), M), _mm512_set1_epi16(1));
  const __mmask32 bad =
      _mm512_cmpgt_epi16_mask(_mm512_sub_epi16(top, low), _mm512_set1_epi16(window)) |
      _mm512_cmpgt_epi16_mask(top, _mm512_set1_epi16(ceiling));
  return bad == 0;
}

// 16 float32 values (as bits) rounded to nearest even to 16 bits. MaybeNaN
// false: the caller knows that no value is a NaN (float16 then skips the
// default-NaN fix-up).
template <bool Bf16, bool MaybeNaN = true>
inline __attribute__((always_inline)) void store16f(unsigned char* p, __m512i u) {
  __m256i h;
  if constexpr (Bf16) {
    h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_high(u), 16));
  } else {
    const __m512 f = _mm512_castsi512_ps(u);
    h = _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if constexpr (MaybeNaN) {
      const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
      h = _mm256_mask_mov_epi16(h, nan, _mm256_set1_epi16(0x7e00));
    }
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
}

template <bool Bf16>
inline __attribute__((always_inline)) void store16(unsigned char* p, V v) {
  store16f<Bf16>(
      p, _mm512_inserti64x4(_mm512_castsi256_si512(round_to_odd(v.lo)), round_to_odd(v.hi), 1));
}

// The two-input float16 sum (or avg) in 256-bit halves, rounded once in
// float32 as kernels/wide_loops.inc's pair_sum_float32 does. On a Zen 4
// core vcvtph2ps and vcvtps2ph on 512-bit registers take more than twice
// their 256-bit forms, and the NaN fix-up is a branch on a mask that is
// nearly always clear: 1.2-1.3x the 512-bit loop's speed in cache
// (docs/performance/notes/2026-12-06-float16-many-input.md). A Zen 5 core
// runs the 512-bit loop 1.7x faster than these halves
// (docs/performance/notes/2026-12-07-zen5-float16-pairs.md), and Intel's
// AVX-512 cores run the 512-bit conversions at full width too, so
// elsewhere float16_pairs declines (returns false) and pair_sum_float32's
// own loop runs. n is a multiple of 16. Called as
// float16_pairs(std::bool_constant<Half>{}, ...).
constexpr bool kFloat16Pairs = true;

// 8 float16 values as float32 (exact).
inline __attribute__((always_inline)) __m256 load8h(const unsigned char* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <bool Half>
inline __attribute__((always_inline)) bool float16_pairs(std::bool_constant<Half>, unsigned char* d,
                                                         const unsigned char* x,
                                                         const unsigned char* y, std::size_t n) {
  if (!cpu_is_zen4()) return false;
  const __m256 half = _mm256_set1_ps(0.5f);
  for (std::size_t i = 0; i < n; i += 16) {
    __m256 a1 = load8h(x + 2 * i), a2 = load8h(x + 2 * i + 16);
    __m256 b1 = load8h(y + 2 * i), b2 = load8h(y + 2 * i + 16);
    if constexpr (Half) {  // halve first: the sum of two may pass float32's range
      a1 = _mm256_mul_ps(a1, half);
      a2 = _mm256_mul_ps(a2, half);
      b1 = _mm256_mul_ps(b1, half);
      b2 = _mm256_mul_ps(b2, half);
    }
    const __m256 s1 = _mm256_add_ps(a1, b1), s2 = _mm256_add_ps(a2, b2);
    __m128i h1 = _mm256_cvtps_ph(s1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m128i h2 = _mm256_cvtps_ph(s2, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask8 nan1 = _mm256_cmp_ps_mask(s1, s1, _CMP_UNORD_Q);
    const __mmask8 nan2 = _mm256_cmp_ps_mask(s2, s2, _CMP_UNORD_Q);
    if (__builtin_expect((nan1 | nan2) != 0, 0)) {  // the default quiet NaN
      h1 = _mm_mask_mov_epi16(h1, nan1, _mm_set1_epi16(0x7e00));
      h2 = _mm_mask_mov_epi16(h2, nan2, _mm_set1_epi16(0x7e00));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * i), h1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * i + 16), h2);
  }
  return true;
}

#include "kernels/wide_loops.inc"
}  // namespace avx512
}  // namespace

#pragma GCC pop_options

// ---------------------------------------------------------------------------
// AVX-512 BF16 (Cooper Lake, Sapphire Rapids, Zen 4): the AVX-512 table
// with the bfloat16 pair sums rounded by vcvtne2ps2bf16, one instruction
// for 32 results, where the integer form takes 16. It rounds to nearest
// even as avx512::store_pairs does, but reads a float32 subnormal as zero
// and keeps a NaN's payload, so a vector with either (fpclass) rounds the
// integer way: the same bits either way. store_pairs rounds the two-input
// sums (pair_sum_float32) and the many-input sums that stay in float32
// (many_to_narrow's block loop: the direct and two-shot paths at N > 2).
// The loops are compiled again here, under this target, rather than
// shared with a store callback: a template defined under the AVX-512
// pragma is compiled without AVX-512 BF16, so it could not inline this
// store_pairs, and a call per 32 elements would cost more than the
// instruction saves.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,f16c")

namespace {
namespace avx512bf16 {

// The AVX-512 set's primitives, but for kIsa and store_pairs below,
// which hide theirs.
using namespace avx512;

constexpr const char* kIsa = "avx512bf16";

// The even and odd float32 values (as bits) rounded to bfloat16 and put
// back in place: 32 encodings.
inline __attribute__((always_inline)) void store_pairs(unsigned char* p, __m512i even,
                                                       __m512i odd) {
  const __m512 e = _mm512_castsi512_ps(even), o = _mm512_castsi512_ps(odd);
  constexpr int kNanOrSubnormal = 0x01 | 0x20 | 0x80;  // QNaN, denormal, SNaN
  if (__builtin_expect((_mm512_fpclass_ps_mask(e, kNanOrSubnormal) |
                        _mm512_fpclass_ps_mask(o, kNanOrSubnormal)) != 0,
                       0)) {
    avx512::store_pairs(p, even, odd);
    return;
  }
  // vcvtne2ps2bf16 puts the even sums' 16 encodings first, then the odd
  // ones'; output element 2k comes from k and 2k+1 from 16 + k.
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i r = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(o, e));
  _mm512_storeu_si512(p, _mm512_permutexvar_epi16(interleave, r));
}

#include "kernels/wide_loops.inc"
}  // namespace avx512bf16
}  // namespace

#pragma GCC pop_options

// ---------------------------------------------------------------------------
// AVX2 + F16C
#pragma GCC push_options
#pragma GCC target("avx2,f16c")

namespace {
namespace avx2 {

constexpr std::size_t kLanes = 8;
constexpr const char* kIsa = "avx2";
constexpr bool kDirectedRounding = false;  // no rounding in the instruction
constexpr bool kFloat16Pairs = false;      // pair_sum_float32's loop serves float16
constexpr bool kInexactFlag = true;        // InexactWatch above

struct V {
  __m256d lo, hi;
};

// 8 16-bit encodings.
using H = __m128i;
using F = __m256;

inline __attribute__((always_inline)) H load_h(const unsigned char* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// 8 16-bit values as float32 (exact).
template <bool Bf16>
inline __attribute__((always_inline)) F widen_h(H h) {
  if constexpr (Bf16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  else
    return _mm256_cvtph_ps(h);
}

template <bool Bf16>
inline __attribute__((always_inline)) F load16f(const unsigned char* p) {
  return widen_h<Bf16>(load_h(p));
}

// float32 -> float64 (exact).
inline __attribute__((always_inline)) V widen_f(F f) {
  return {_mm256_cvtps_pd(_mm256_castps256_ps128(f)), _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1))};
}

template <bool Bf16>
inline __attribute__((always_inline)) V load16(const unsigned char* p) {
  return widen_f(load16f<Bf16>(p));
}

inline __attribute__((always_inline)) F add_f(F a, F b) {
  return _mm256_add_ps(a, b);
}

inline __attribute__((always_inline)) F scale_f(F a, float r) {
  return _mm256_mul_ps(a, _mm256_set1_ps(r));
}

inline __attribute__((always_inline)) __m256i bits_f(F f) {
  return _mm256_castps_si256(f);
}

// As avx512::Span.
struct Span {
  H top, low;
};

inline __attribute__((always_inline)) Span span_start() {
  return {_mm_setzero_si128(), _mm_set1_epi16(-1)};
}

inline __attribute__((always_inline)) void span_add(Span& s, H h) {
  const H mag = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
  s.top = _mm_max_epu16(s.top, mag);
  s.low = _mm_min_epu16(s.low, _mm_sub_epi16(mag, _mm_set1_epi16(1)));
}

template <int M>
inline __attribute__((always_inline)) bool span_fits(const Span& s, int window, int ceiling) {
  const H top = _mm_srli_epi16(s.top, M);
  const H low =
      _mm_max_epi16(_mm_srli_epi16(_mm_add_epi16(s.low, _mm_set1_epi16(1)), M), _mm_set1_epi16(1));
  const H bad = _mm_or_si128(_mm_cmpgt_epi16(_mm_sub_epi16(top, low), _mm_set1_epi16(window)),
                             _mm_cmpgt_epi16(top, _mm_set1_epi16(ceiling)));
  return _mm_testz_si128(bad, bad);
}

inline __attribute__((always_inline)) V load_wide(const unsigned char* p) {
  return {_mm256_loadu_pd(reinterpret_cast<const double*>(p)),
          _mm256_loadu_pd(reinterpret_cast<const double*>(p + 32))};
}

inline __attribute__((always_inline)) void store_wide(unsigned char* p, V v) {
  _mm256_storeu_pd(reinterpret_cast<double*>(p), v.lo);
  _mm256_storeu_pd(reinterpret_cast<double*>(p + 32), v.hi);
}

template <class Op>
inline __attribute__((always_inline)) V apply(V a, V b) {
  if constexpr (std::is_same_v<Op, Mul>)
    return {_mm256_mul_pd(a.lo, b.lo), _mm256_mul_pd(a.hi, b.hi)};
  else
    return {_mm256_add_pd(a.lo, b.lo), _mm256_add_pd(a.hi, b.hi)};
}

inline __attribute__((always_inline)) V divide(V a, double q) {
  const __m256d qv = _mm256_set1_pd(q);
  return {_mm256_div_pd(a.lo, qv), _mm256_div_pd(a.hi, qv)};
}

inline __attribute__((always_inline)) V scale(V a, double r) {
  const __m256d rv = _mm256_set1_pd(r);
  return {_mm256_mul_pd(a.lo, rv), _mm256_mul_pd(a.hi, rv)};
}

// The low 32 bits of each 64-bit lane of a compare result.
inline __attribute__((always_inline)) __m128i narrow_mask(__m256d m) {
  const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(m), idx));
}

// float64 -> float32 bits, rounded to odd (in any rounding mode).
inline __attribute__((always_inline)) __m128i round_to_odd(__m256d x) {
  const __m128 f = _mm256_cvtpd_ps(x);
  const __m256d back = _mm256_cvtps_pd(f);
  const __m256d abs = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffll));
  const __m128i inexact = narrow_mask(_mm256_cmp_pd(back, x, _CMP_NEQ_UQ));
  const __m128i away =
      narrow_mask(_mm256_cmp_pd(_mm256_and_pd(back, abs), _mm256_and_pd(x, abs), _CMP_GT_OQ));
  const __m128i one = _mm_set1_epi32(1);
  __m128i b = _mm_castps_si128(f);
  b = _mm_sub_epi32(b, _mm_and_si128(away, one));  // away implies inexact
  return _mm_or_si128(b, _mm_and_si128(inexact, one));
}

// As avx512::bf16_high: 8 lanes.
inline __attribute__((always_inline)) __m256i bf16_high(__m256i u) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  // Magnitudes are below 2^31: the signed compare is the unsigned one.
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc00000), nan);
}

// As avx512's: 16 bfloat16 encodings as 8 32-bit lanes.
inline __attribute__((always_inline)) __m256i load_pairs(const unsigned char* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

inline __attribute__((always_inline)) F even_f(__m256i w) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

inline __attribute__((always_inline)) F odd_f(__m256i w) {
  return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xffff0000))));
}

// The first and the second 8 of 16 encodings loaded by load_pairs.
inline __attribute__((always_inline)) H lower_h(__m256i w) {
  return _mm256_castsi256_si128(w);
}

inline __attribute__((always_inline)) H upper_h(__m256i w) {
  return _mm256_extracti128_si256(w, 1);
}

inline __attribute__((always_inline)) void store_pairs(unsigned char* p, __m256i even,
                                                       __m256i odd) {
  const __m256i w =
      _mm256_blend_epi16(_mm256_srli_epi32(bf16_high(even), 16), bf16_high(odd), 0xaa);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), w);
}

// As avx512::PairSpan: 16 encodings.
struct PairSpan {
  __m256i top, low;
};

inline __attribute__((always_inline)) PairSpan pair_span_start() {
  return {_mm256_setzero_si256(), _mm256_set1_epi16(-1)};
}

inline __attribute__((always_inline)) void pair_span_add(PairSpan& s, __m256i w) {
  const __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7fff));
  s.top = _mm256_max_epu16(s.top, mag);
  s.low = _mm256_min_epu16(s.low, _mm256_sub_epi16(mag, _mm256_set1_epi16(1)));
}

template <int M>
inline __attribute__((always_inline)) bool pair_span_fits(const PairSpan& s, int window,
                                                          int ceiling) {
  const __m256i top = _mm256_srli_epi16(s.top, M);
  const __m256i low = _mm256_max_epi16(
      _mm256_srli_epi16(_mm256_add_epi16(s.low, _mm256_set1_epi16(1)), M), _mm256_set1_epi16(1));
  const __m256i bad =
      _mm256_or_si256(_mm256_cmpgt_epi16(_mm256_sub_epi16(top, low), _mm256_set1_epi16(window)),
                      _mm256_cmpgt_epi16(top, _mm256_set1_epi16(ceiling)));
  return _mm256_testz_si256(bad, bad);
}

// 8 float32 values (as bits) rounded to nearest even to 16 bits. MaybeNaN
// false: the caller knows that no value is a NaN (float16 then skips the
// default-NaN fix-up).
template <bool Bf16, bool MaybeNaN = true>
inline __attribute__((always_inline)) void store16f(unsigned char* p, __m256i u) {
  __m128i h;
  if constexpr (Bf16) {
    const __m256i r = _mm256_srli_epi32(bf16_high(u), 16);
    h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  } else {
    const __m256 f = _mm256_castsi256_ps(u);
    h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if constexpr (MaybeNaN) {
      const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
      const __m128i nan16 =
          _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
      h = _mm_blendv_epi8(h, _mm_set1_epi16(0x7e00), nan16);
    }
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
}

template <bool Bf16>
inline __attribute__((always_inline)) void store16(unsigned char* p, V v) {
  store16f<Bf16>(p, _mm256_set_m128i(round_to_odd(v.hi), round_to_odd(v.lo)));
}

#include "kernels/wide_loops.inc"
}  // namespace avx2
}  // namespace

#pragma GCC pop_options

// ---------------------------------------------------------------------------
// The tables (kTable of kernels/wide_loops.inc), where the CPU has the
// instructions.

const WideKernels* wide_kernels_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return ok ? &avx512::kTable : nullptr;
}

const WideKernels* wide_kernels_avx512bf16() {
  if (!wide_kernels_avx512() || !__builtin_cpu_supports("avx512bf16")) return nullptr;
  return &avx512bf16::kTable;
}

const WideKernels* wide_kernels_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return ok ? &avx2::kTable : nullptr;
}

}  // namespace shmring::detail

#endif  // __x86_64__
