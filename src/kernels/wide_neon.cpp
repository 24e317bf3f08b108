// The 16-bit reductions of kernels/wide.hpp with AArch64 Advanced SIMD
// (NEON, in every AArch64 CPU): 8 elements a step, through the same loops
// as the x86 kernels (kernels/wide_loops.inc) and the same arithmetic as
// the portable loops of kernels/wide.cpp, lane by lane, so all give the same
// bits (tests/collectives/test_accuracy.cpp compares every table with the
// portable one; under qemu-user in CI, see tools/cross/README.md).
//
// Conversions (docs/design/accuracy.md gives the rounding argument):
//   bfloat16 -> float32   widen with a shift left by 16 (ushll2 #16; exact,
//                         NaN kept);
//   float16 -> float32    fcvtl (exact: float16 subnormals are normal in
//                         float32);
//   float32 -> float64    fcvtl (exact);
//   float64 -> float32    fcvtxn, the one AArch64 instruction that rounds to
//                         odd. Past float32's range it gives the largest
//                         finite float32 where the portable loops give inf:
//                         both round to inf in 16 bits;
//   float32 -> bfloat16   the integer round-to-nearest-even (bfcvtn, where
//                         present, flushes subnormal inputs to zero);
//   float32 -> float16    fcvtn in FPCR's rounding mode (round to nearest
//                         even unless a program changed it, as for the
//                         portable loops' float arithmetic); a NaN becomes
//                         the default quiet NaN 0x7e00, as in the portable
//                         loops (so is any bfloat16 NaN: 0x7fc0).
// Like the portable loops these assume the default floating-point
// environment: flush-to-zero (FPCR.FZ) would flush bfloat16 subnormals.
// The SVE copy of the portable loops (kernels/target.hpp) stays beside this
// table: this one is picked first, for its float32 paths (two inputs; many
// inputs within the exponent window) and its one-instruction round to odd,
// which the plain float64 loops do not have.

#include "kernels/wide.hpp"
#include "kernels/wide_kernels.hpp"

#if defined(__aarch64__)

#include <arm_neon.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace shmring::detail {

namespace {

struct Add {};
struct Mul {};

namespace neon {

#define SHMRING_INLINE inline __attribute__((always_inline))

constexpr std::size_t kLanes = 8;
constexpr const char* kIsa = "neon";
constexpr bool kDirectedRounding = false;  // no rounding in the instruction
constexpr bool kFloat16Pairs = false;      // pair_sum_float32's loop serves float16
// The span check, not the FPU's flags (FPSR's cumulative inexact flag
// could serve as MXCSR's does on x86; not measured on an Arm core).
constexpr bool kInexactFlag = false;

// 8 16-bit encodings.
using H = uint16x8_t;
// 8 values as float32, and their bits.
struct F {
  float32x4_t lo, hi;
};
struct U {
  uint32x4_t lo, hi;
};
// 8 values as float64.
struct V {
  float64x2_t v0, v1, v2, v3;
};

// Byte loads and stores: elements of user buffers may sit at any address.
SHMRING_INLINE H load_h(const unsigned char* p) {
  return vreinterpretq_u16_u8(vld1q_u8(p));
}

// 8 16-bit values as float32 (exact).
template <bool Bf16>
SHMRING_INLINE F widen_h(H h) {
  if constexpr (Bf16) {
    return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)),
            vreinterpretq_f32_u32(vshll_high_n_u16(h, 16))};
  } else {
    const float16x8_t f = vreinterpretq_f16_u16(h);
    return {vcvt_f32_f16(vget_low_f16(f)), vcvt_high_f32_f16(f)};
  }
}

template <bool Bf16>
SHMRING_INLINE F load16f(const unsigned char* p) {
  return widen_h<Bf16>(load_h(p));
}

// float32 -> float64 (exact).
SHMRING_INLINE V widen_f(F f) {
  return {vcvt_f64_f32(vget_low_f32(f.lo)), vcvt_high_f64_f32(f.lo),
          vcvt_f64_f32(vget_low_f32(f.hi)), vcvt_high_f64_f32(f.hi)};
}

template <bool Bf16>
SHMRING_INLINE V load16(const unsigned char* p) {
  return widen_f(load16f<Bf16>(p));
}

SHMRING_INLINE F add_f(F a, F b) {
  return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)};
}

SHMRING_INLINE F scale_f(F a, float r) {
  const float32x4_t rv = vdupq_n_f32(r);
  return {vmulq_f32(a.lo, rv), vmulq_f32(a.hi, rv)};
}

SHMRING_INLINE U bits_f(F f) {
  return {vreinterpretq_u32_f32(f.lo), vreinterpretq_u32_f32(f.hi)};
}

// As the x86 kernels' Span (kernels/wide_x86.cpp): per lane, the largest
// magnitude's encoding and the smallest nonzero one's less one.
struct Span {
  H top, low;
};

SHMRING_INLINE Span span_start() {
  return {vdupq_n_u16(0), vdupq_n_u16(0xffff)};
}

SHMRING_INLINE void span_add(Span& s, H h) {
  const H mag = vandq_u16(h, vdupq_n_u16(0x7fff));
  s.top = vmaxq_u16(s.top, mag);
  s.low = vminq_u16(s.low, vsubq_u16(mag, vdupq_n_u16(1)));
}

// Whether every lane has top_exp - low_exp <= window and top_exp <= ceiling
// (exponent fields; a subnormal's 0 counts as 1; M: the mantissa bits).
// span_bad: the lanes whose span fails; span_fits: whether none does.
template <int M>
SHMRING_INLINE uint16x8_t span_bad(const Span& s, int window, int ceiling) {
  const int16x8_t top = vreinterpretq_s16_u16(vshrq_n_u16(s.top, M));
  const int16x8_t low = vmaxq_s16(
      vreinterpretq_s16_u16(vshrq_n_u16(vaddq_u16(s.low, vdupq_n_u16(1)), M)), vdupq_n_s16(1));
  return vorrq_u16(vcgtq_s16(vsubq_s16(top, low), vdupq_n_s16(static_cast<std::int16_t>(window))),
                   vcgtq_s16(top, vdupq_n_s16(static_cast<std::int16_t>(ceiling))));
}

template <int M>
SHMRING_INLINE bool span_fits(const Span& s, int window, int ceiling) {
  return vmaxvq_u16(span_bad<M>(s, window, ceiling)) == 0;
}

SHMRING_INLINE V load_wide(const unsigned char* p) {
  return {vreinterpretq_f64_u8(vld1q_u8(p)), vreinterpretq_f64_u8(vld1q_u8(p + 16)),
          vreinterpretq_f64_u8(vld1q_u8(p + 32)), vreinterpretq_f64_u8(vld1q_u8(p + 48))};
}

SHMRING_INLINE void store_wide(unsigned char* p, V v) {
  vst1q_u8(p, vreinterpretq_u8_f64(v.v0));
  vst1q_u8(p + 16, vreinterpretq_u8_f64(v.v1));
  vst1q_u8(p + 32, vreinterpretq_u8_f64(v.v2));
  vst1q_u8(p + 48, vreinterpretq_u8_f64(v.v3));
}

template <class Op>
SHMRING_INLINE V apply(V a, V b) {
  if constexpr (std::is_same_v<Op, Mul>)
    return {vmulq_f64(a.v0, b.v0), vmulq_f64(a.v1, b.v1), vmulq_f64(a.v2, b.v2),
            vmulq_f64(a.v3, b.v3)};
  else
    return {vaddq_f64(a.v0, b.v0), vaddq_f64(a.v1, b.v1), vaddq_f64(a.v2, b.v2),
            vaddq_f64(a.v3, b.v3)};
}

SHMRING_INLINE V divide(V a, double q) {
  const float64x2_t qv = vdupq_n_f64(q);
  return {vdivq_f64(a.v0, qv), vdivq_f64(a.v1, qv), vdivq_f64(a.v2, qv), vdivq_f64(a.v3, qv)};
}

SHMRING_INLINE V scale(V a, double r) {
  const float64x2_t rv = vdupq_n_f64(r);
  return {vmulq_f64(a.v0, rv), vmulq_f64(a.v1, rv), vmulq_f64(a.v2, rv), vmulq_f64(a.v3, rv)};
}

// 4 float32 values (as bits) rounded to nearest even to bfloat16, each in
// its lane's high half (the low half is left over); any NaN becomes the
// default quiet NaN.
SHMRING_INLINE uint32x4_t bf16_high(uint32x4_t u) {
  const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
  const uint32x4_t rounded = vaddq_u32(u, vaddq_u32(lsb, vdupq_n_u32(0x7fff)));
  const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
  return vbslq_u32(nan, vdupq_n_u32(0x7fc00000), rounded);
}

SHMRING_INLINE uint16x4_t bf16_of(uint32x4_t u) {
  return vshrn_n_u32(bf16_high(u), 16);
}

// 16 bfloat16 encodings as 8 32-bit lanes (elements 2k and 2k+1 in lane
// k's low and high half), widened to float32 without a shuffle: the even
// elements by a shift, the odd ones by a mask (kernels/wide_loops.inc,
// pair_sum_float32).
SHMRING_INLINE U load_pairs(const unsigned char* p) {
  return {vreinterpretq_u32_u8(vld1q_u8(p)), vreinterpretq_u32_u8(vld1q_u8(p + 16))};
}

SHMRING_INLINE F even_f(U w) {
  return {vreinterpretq_f32_u32(vshlq_n_u32(w.lo, 16)),
          vreinterpretq_f32_u32(vshlq_n_u32(w.hi, 16))};
}

SHMRING_INLINE F odd_f(U w) {
  const uint32x4_t mask = vdupq_n_u32(0xffff0000);
  return {vreinterpretq_f32_u32(vandq_u32(w.lo, mask)),
          vreinterpretq_f32_u32(vandq_u32(w.hi, mask))};
}

// The first and the second 8 of 16 encodings loaded by load_pairs.
SHMRING_INLINE H lower_h(U w) {
  return vreinterpretq_u16_u32(w.lo);
}

SHMRING_INLINE H upper_h(U w) {
  return vreinterpretq_u16_u32(w.hi);
}

// The even and odd float32 values (as bits) rounded to bfloat16 and put
// back in place (sri: the odd lane's high half over the even one shifted
// down): 16 encodings.
SHMRING_INLINE void store_pairs(unsigned char* p, U even, U odd) {
  vst1q_u8(p, vreinterpretq_u8_u32(vsriq_n_u32(bf16_high(odd.lo), bf16_high(even.lo), 16)));
  vst1q_u8(p + 16, vreinterpretq_u8_u32(vsriq_n_u32(bf16_high(odd.hi), bf16_high(even.hi), 16)));
}

// Span over 16 encodings loaded as pairs (load_pairs): one Span per half.
struct PairSpan {
  Span lo, hi;
};

SHMRING_INLINE PairSpan pair_span_start() {
  return {span_start(), span_start()};
}

SHMRING_INLINE void pair_span_add(PairSpan& s, U w) {
  span_add(s.lo, vreinterpretq_u16_u32(w.lo));
  span_add(s.hi, vreinterpretq_u16_u32(w.hi));
}

template <int M>
SHMRING_INLINE bool pair_span_fits(const PairSpan& s, int window, int ceiling) {
  // One horizontal reduction for both halves.
  return vmaxvq_u16(vorrq_u16(span_bad<M>(s.lo, window, ceiling),
                              span_bad<M>(s.hi, window, ceiling))) == 0;
}

// 8 float32 values (as bits) rounded to nearest even to 16 bits. MaybeNaN
// false: the caller knows that no value is a NaN (float16 then skips the
// default-NaN fix-up).
template <bool Bf16, bool MaybeNaN = true>
SHMRING_INLINE void store16f(unsigned char* p, U u) {
  H h;
  if constexpr (Bf16) {
    h = vcombine_u16(bf16_of(u.lo), bf16_of(u.hi));
  } else {
    const float32x4_t lo = vreinterpretq_f32_u32(u.lo), hi = vreinterpretq_f32_u32(u.hi);
    h = vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(lo), hi));
    if constexpr (MaybeNaN) {
      const H nan = vcombine_u16(vmovn_u32(vmvnq_u32(vceqq_f32(lo, lo))),
                                 vmovn_u32(vmvnq_u32(vceqq_f32(hi, hi))));
      h = vbslq_u16(nan, vdupq_n_u16(0x7e00), h);
    }
  }
  vst1q_u8(p, vreinterpretq_u8_u16(h));
}

// float64 -> float32 bits, rounded to odd (fcvtxn, fcvtxn2).
SHMRING_INLINE U round_to_odd(V v) {
  return {vreinterpretq_u32_f32(vcvtx_high_f32_f64(vcvtx_f32_f64(v.v0), v.v1)),
          vreinterpretq_u32_f32(vcvtx_high_f32_f64(vcvtx_f32_f64(v.v2), v.v3))};
}

template <bool Bf16>
SHMRING_INLINE void store16(unsigned char* p, V v) {
  store16f<Bf16>(p, round_to_odd(v));
}

#undef SHMRING_INLINE

#include "kernels/wide_loops.inc"

}  // namespace neon
}  // namespace

const WideKernels* wide_kernels_neon() {
  return &neon::kTable;
}

}  // namespace shmring::detail

#else

namespace shmring::detail {

const WideKernels* wide_kernels_neon() {
  return nullptr;
}

}  // namespace shmring::detail

#endif  // __aarch64__
