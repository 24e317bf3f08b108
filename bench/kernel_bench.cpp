// kernel_bench: the reduction kernels two ways, side by side in one run.
//   - shmring::detail::reduce: GCC target_clones (AVX-512 / AVX2 / SSE2,
//     picked by the loader), the library's kernels;
//   - Highway (libhwy 1.0.3): the same three kernels with HWY_DYNAMIC_DISPATCH
//     over Highway's compiled targets.
// Kernels: float32 sum, float32 max (IEEE maximum) and bfloat16 sum
// (widened to float32, rounded back to nearest even). Sizes are per input
// array: 4 KiB (L1), 256 KiB (L2), 64 MiB (DRAM). GB/s counts the bytes a
// call moves: two inputs read and one output written. Both versions must
// give identical bits; a difference is reported and fails the run.
// Then three tables of the library's own kernels: its 16-bit steps (portable
// loops beside the vector table this CPU runs), four inputs at equal
// bytes, float32's pairwise passes beside the 16-bit one-pass kernels, and
// the few elements of a low-latency call, in ns per call.
//
//   build/bench/kernel_bench [seconds-per-cell]

// Highway compiles this file once per target, re-including it from here.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/kernel_bench.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

HWY_BEFORE_NAMESPACE();
namespace shmring::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void sum_f32(float* HWY_RESTRICT d, const float* a, const float* b, std::size_t n) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::Add(hn::LoadU(df, a + i), hn::LoadU(df, b + i)), df, d + i);
  for (; i < n; ++i) d[i] = a[i] + b[i];
}

// The library's vmax: IEEE 754-2019 maximum (+0 > -0: equal inputs AND
// their bits), and any NaN gives the default quiet NaN.
void max_f32(float* HWY_RESTRICT d, const float* a, const float* b, std::size_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const std::size_t lanes = hn::Lanes(df);
  const auto qnan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto x = hn::LoadU(df, a + i);
    auto y = hn::LoadU(df, b + i);
    auto equal = hn::BitCast(df, hn::And(hn::BitCast(du, x), hn::BitCast(du, y)));
    auto r = hn::IfThenElse(hn::Lt(x, y), y, hn::IfThenElse(hn::Lt(y, x), x, equal));
    // IsNaN, not Ne(x, x): Highway's Ne is an ordered compare (false on NaN).
    r = hn::IfThenElse(hn::Or(hn::IsNaN(x), hn::IsNaN(y)), qnan, r);
    hn::StoreU(r, df, d + i);
  }
  for (; i < n; ++i) {
    std::uint32_t ua, ub;
    std::memcpy(&ua, &a[i], 4);
    std::memcpy(&ub, &b[i], 4);
    const std::uint32_t ue = ua & ub;
    float equal;
    std::memcpy(&equal, &ue, 4);
    const float r = a[i] < b[i] ? b[i] : b[i] < a[i] ? a[i] : equal;
    d[i] = a[i] != a[i] || b[i] != b[i] ? std::numeric_limits<float>::quiet_NaN() : r;
  }
}

HWY_INLINE std::uint16_t bf16_round_scalar(float f) {
  std::uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  std::uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

void sum_bf16(std::uint16_t* HWY_RESTRICT d, const std::uint16_t* a, const std::uint16_t* b,
              std::size_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<std::uint16_t, decltype(df)> d16;
  const std::size_t lanes = hn::Lanes(df);
  const auto bias = hn::Set(du, 0x7fffu);
  const auto one = hn::Set(du, 1u);
  const auto abs_mask = hn::Set(du, 0x7fffffffu);
  const auto inf = hn::Set(du, 0x7f800000u);
  const auto quiet = hn::Set(du, 0x40u);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto x = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, a + i))));
    auto y = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, b + i))));
    auto u = hn::BitCast(du, hn::Add(x, y));
    auto hi = hn::ShiftRight<16>(u);
    auto rounded = hn::ShiftRight<16>(hn::Add(hn::Add(u, bias), hn::And(hi, one)));
    auto is_nan = hn::Gt(hn::And(u, abs_mask), inf);
    auto r = hn::IfThenElse(is_nan, hn::Or(hi, quiet), rounded);
    // Values are < 2^16: the signed-to-unsigned saturating demotion is exact.
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, r)), d16, d + i);
  }
  for (; i < n; ++i) {
    std::uint32_t ua = static_cast<std::uint32_t>(a[i]) << 16, ub = static_cast<std::uint32_t>(b[i])
                                                                    << 16;
    float fa, fb;
    __builtin_memcpy(&fa, &ua, 4);
    __builtin_memcpy(&fb, &ub, 4);
    d[i] = bf16_round_scalar(fa + fb);
  }
}

}  // namespace shmring::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/reduce.hpp"
#include "kernels/wide_kernels.hpp"

namespace shmring::bench {
HWY_EXPORT(sum_f32);
HWY_EXPORT(max_f32);
HWY_EXPORT(sum_bf16);
}  // namespace shmring::bench

namespace {

using shmring::DataType;
using shmring::ReduceOp;

struct Aligned {
  void* p;
  explicit Aligned(std::size_t n) {
    if (posix_memalign(&p, 4096, n) != 0) std::abort();
    std::memset(p, 0, n);
  }
  ~Aligned() { std::free(p); }
};

bool is_nan_bits(std::uint32_t u, std::size_t esize) {
  return esize == 4 ? (u & 0x7fffffffu) > 0x7f800000u : (u & 0x7fffu) > 0x7f80u;
}

// Bitwise equal, except that two NaNs with different payloads count as equal
// (and are counted): which input's payload x86 keeps when both are NaN
// depends on operand order, which the compiler may swap for a commutative add.
bool same_values(const void* x, const void* y, std::size_t n, std::size_t esize,
                 std::size_t& payload_diffs) {
  bool same = true;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u = 0, v = 0;
    std::memcpy(&u, static_cast<const char*>(x) + i * esize, esize);
    std::memcpy(&v, static_cast<const char*>(y) + i * esize, esize);
    if (u == v) continue;
    if (is_nan_bits(u, esize) && is_nan_bits(v, esize)) {
      ++payload_diffs;
      continue;
    }
    same = false;
  }
  return same;
}

// A candidate for the library: bfloat16 sum as one fused target_clones loop
// (widen, add, round in registers) instead of widen-to-stack / add / narrow.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void fused_sum_bf16(
    void* dst, const void* a, const void* b, std::size_t n) {
  typedef std::uint16_t u16a __attribute__((aligned(1)));
  auto* d = static_cast<u16a*>(dst);
  auto* x = static_cast<const u16a*>(a);
  auto* y = static_cast<const u16a*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t ua = static_cast<std::uint32_t>(x[i]) << 16;
    std::uint32_t ub = static_cast<std::uint32_t>(y[i]) << 16;
    float fa, fb;
    std::memcpy(&fa, &ua, 4);
    std::memcpy(&fb, &ub, 4);
    float f = fa + fb;
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    std::uint32_t nan = (u >> 16) | 0x40u;
    d[i] = static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

// Seconds per call of f, over repetitions that last at least `seconds`.
template <class F>
double seconds_per_call(double seconds, F&& f) {
  f();  // warm the caches and the dispatch
  long reps = 1;
  for (;;) {
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < reps; ++i) {
      f();
      asm volatile("" ::: "memory");
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= seconds) return s / static_cast<double>(reps);
    reps = s > 0 ? std::max(reps * 2, static_cast<long>(reps * seconds / s * 1.1)) : reps * 2;
  }
}

template <class F>
double gbps(std::size_t bytes, double seconds, F&& f) {
  return 3.0 * static_cast<double>(bytes) / seconds_per_call(seconds, f) / 1e9;
}

// The best vector table of the 16-bit kernels this CPU runs (as the
// library picks it), or the portable loops.
const shmring::detail::WideKernels& best_wide_kernels() {
  const shmring::detail::WideKernels* best = shmring::detail::wide_kernels_avx512bf16();
  if (!best) best = shmring::detail::wide_kernels_avx512();
  if (!best) best = shmring::detail::wide_kernels_avx2();
  if (!best) best = shmring::detail::wide_kernels_neon();
  return best ? *best : shmring::detail::wide_kernels_portable();
}

// The 16-bit steps of the collectives (kernels/wide.hpp), the portable
// loops beside the table this CPU runs, on one core. GB/s counts the bytes
// a call reads and writes: a float64 partial is 8 bytes an element.
void wide_table(double seconds) {
  const shmring::detail::WideKernels& portable = shmring::detail::wide_kernels_portable();
  const shmring::detail::WideKernels* best = &best_wide_kernels();
  fmt::print("\n# 16-bit steps of the collectives: portable loops vs {} (GB/s, one core)\n",
             best->isa);
  fmt::print(
      "# narrow: round(a + b) to 16 bits (N=2 ring step, direct N=2); wide: a + b as\n"
      "# float64 (ring step at N>2, a: 16-bit or float64 partial); many4: round(s0 + s1\n"
      "# + s2 + s3) (direct and two-shot paths at N=4); many4 avg: the same / 4; many4\n"
      "# grad: gradient-like inputs (a quarter zeros, the rest spread over 12 binades,\n"
      "# random signs); many4 wide: inputs spread over 24 binades (the float64 path)\n");
  fmt::print("{:>16} {:>9} {:>10} {:>10} {:>8}\n", "kernel", "size", "portable", best->isa,
             "speedup");
  const std::size_t kSizes[] = {4u << 10, 256u << 10, 64u << 20};
  for (int bf = 1; bf >= 0; --bf) {
    for (int kind = 0; kind < 8; ++kind) {
      const char* names[] = {"narrow 16+16", "wide 16+16", "wide w+16",  "narrow w+16",
                             "many4",        "many4 avg",  "many4 grad", "many4 wide"};
      for (std::size_t bytes : kSizes) {
        const std::size_t n = bytes / 2;
        Aligned a(n * 8), b(bytes), c(bytes), d(bytes), out(n * 8);
        std::uint16_t* pa = static_cast<std::uint16_t*>(a.p);
        for (std::size_t i = 0; i < n; ++i) {
          const std::uint16_t v =
              static_cast<std::uint16_t>(bf ? 0x3f80 + (i % 97) : 0x3c00 + (i % 97));
          pa[i] = v;
          static_cast<std::uint16_t*>(b.p)[i] = v;
          static_cast<std::uint16_t*>(c.p)[i] = v;
          static_cast<std::uint16_t*>(d.p)[i] = v;
        }
        if (kind >= 6) {  // each source its own values, exponents spread
          std::uint64_t state = 0x2545f4914f6cdd1dull;
          const int spread = kind == 6 ? 12 : 24;
          for (void* src : {a.p, b.p, c.p, d.p})
            for (std::size_t i = 0; i < n; ++i) {
              state ^= state << 13;
              state ^= state >> 7;
              state ^= state << 17;
              const int e = static_cast<int>(state % static_cast<std::uint64_t>(spread));
              const unsigned mant = static_cast<unsigned>(state >> 20);
              const unsigned sign = static_cast<unsigned>(state >> 40) & 0x8000u;
              std::uint16_t v =
                  bf ? static_cast<std::uint16_t>(sign | ((127 - e) << 7) | (mant & 0x7f))
                     : static_cast<std::uint16_t>(sign | ((28 - e) << 10) | (mant & 0x3ff));
              if (kind == 6 && (state >> 50) % 4 == 0) v = 0;
              static_cast<std::uint16_t*>(src)[i] = v;
            }
        }
        double moved = 0;  // bytes per element
        auto run = [&](const shmring::detail::WideKernels& k) {
          switch (kind) {
            case 0:
              k.to_narrow[bf][0][0](out.p, a.p, b.p, n, 1.0);
              break;
            case 1:
              k.to_wide[bf][0][0](out.p, a.p, b.p, n);
              break;
            case 2:
              k.to_wide[bf][0][1](out.p, out.p, b.p, n);
              break;
            case 3:
              k.to_narrow[bf][0][1](b.p, out.p, c.p, n, 1.0);
              break;
            default: {
              const void* srcs[4] = {a.p, b.p, c.p, d.p};
              k.many[bf][kind == 5 ? 2 : 0](out.p, srcs, 4, n, kind == 5 ? 4.0 : 1.0);
            }
          }
        };
        moved = kind == 0 ? 6 : kind == 1 ? 12 : kind == 2 ? 18 : kind == 3 ? 12 : 10;
        auto rate = [&](const shmring::detail::WideKernels& k) {
          // gbps() counts 3 x its byte argument per call.
          return gbps(static_cast<std::size_t>(moved * n / 3), seconds, [&] { run(k); });
        };
        const double p = rate(portable);
        const double v = rate(*best);
        const std::string size = bytes >= (1u << 20) ? fmt::format("{}MiB", bytes >> 20)
                                                     : fmt::format("{}KiB", bytes >> 10);
        fmt::print("{:>16} {:>9} {:>10.2f} {:>10.2f} {:>8.2f}\n",
                   fmt::format("{} {}", bf ? "bf16" : "f16", names[kind]), size, p, v, v / p);
      }
    }
  }
}

// The reductions of a low-latency call (algorithms/low_latency.cpp: at most
// 104 bytes a rank, so 26 float32 or 52 16-bit elements), in ns per call
// on one core: float32's reduce_short beside the 16-bit steps of the
// portable loops and of the table this CPU runs, two inputs (N=2) and four
// (N=4). Counts below a vector's lanes are all tail.
void short_table(double seconds) {
  const shmring::detail::WideKernels& portable = shmring::detail::wide_kernels_portable();
  const shmring::detail::WideKernels* best = &best_wide_kernels();
  fmt::print("\n# low-latency reductions: ns per call, one core ({} lanes of {})\n", best->lanes,
             best->isa);
  fmt::print("{:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "elements", "f32 2",
             "bf16 2 p", "bf16 2 v", "f16 2 p", "f16 2 v", "bf16 4 v", "f16 4 v");
  alignas(64) std::uint16_t h[4][64];
  alignas(64) std::uint16_t out16[64];
  alignas(64) float f[2][64], out32[64];
  for (int i = 0; i < 64; ++i) {
    for (int s = 0; s < 4; ++s) h[s][i] = static_cast<std::uint16_t>(0x3c00 + 7 * i + s);
    f[0][i] = static_cast<float>(i);
    f[1][i] = static_cast<float>(2 * i + 1);
  }
  const void* four[4] = {h[0], h[1], h[2], h[3]};
  auto ns = [seconds](auto&& call) { return seconds_per_call(seconds, call) * 1e9; };
  for (std::size_t n : {1u, 4u, 8u, 16u, 26u, 52u}) {
    double t[7];
    t[0] = n <= 26 ? ns([&] {
      shmring::detail::reduce_short(out32, f[0], f[1], n, shmring::DataType::float32,
                                    shmring::ReduceOp::sum, 1);
    })
                   : 0.0;
    int col = 1;
    for (int bf = 1; bf >= 0; --bf)
      for (const shmring::detail::WideKernels* k : {&portable, best})
        t[col++] = ns([&] { k->to_narrow[bf][0][0](out16, h[0], h[1], n, 1.0); });
    for (int bf = 1; bf >= 0; --bf)
      t[col++] = ns([&] { best->many[bf][0](out16, four, 4, n, 1.0); });
    fmt::print("{:>9} {:>9} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f}\n", n,
               n <= 26 ? fmt::format("{:.1f}", t[0]) : std::string("-"), t[1], t[2], t[3], t[4],
               t[5], t[6]);
  }
}

// Four inputs at equal bytes: float32 as the direct and two-shot paths
// reduce it (core/reduce_steps.hpp: three pairwise passes, s0 + s1, then
// + s2, then + s3, through shmring::detail::reduce) beside the 16-bit
// many-input kernels of the table this CPU runs (one pass, rounded once).
// Each input holds the same bytes in every row, so float32 has half the
// elements; GB/s counts the inputs read and the result written (5 x the
// bytes of one input), and the ratio is the 16-bit time over float32's for
// the same bytes: what the allreduce's 16-bit/float32 ratio at N=4 is made
// of where the reduction bounds it.
void many_input_table(double seconds) {
  const shmring::detail::WideKernels* best = &best_wide_kernels();
  fmt::print(
      "\n# 4 inputs at equal bytes (GB/s: 4 inputs read + 1 result written, one core):\n"
      "# f32: three pairwise passes ({}); bf16, f16: one pass ({}); time ratio 16-bit/f32\n",
      shmring::detail::kernel_isa(), best->isa);
  fmt::print("{:>9} {:>10} {:>10} {:>10} {:>9} {:>9}\n", "size", "f32 3-pass", "bf16 many4",
             "f16 many4", "bf16/f32", "f16/f32");
  const std::size_t kSizes[] = {4u << 10, 256u << 10, 64u << 20};
  for (std::size_t bytes : kSizes) {
    Aligned in[4] = {Aligned(bytes), Aligned(bytes), Aligned(bytes), Aligned(bytes)};
    Aligned out(bytes);
    double rate[3];
    for (int t = 0; t < 3; ++t) {
      const std::size_t n = t == 0 ? bytes / 4 : bytes / 2;
      for (int s = 0; s < 4; ++s)
        for (std::size_t i = 0; i < n; ++i) {
          if (t == 0) {
            static_cast<float*>(in[s].p)[i] = 1.0f + static_cast<float>((i + s) % 97) / 128.0f;
          } else {
            const unsigned one = t == 1 ? 0x3f80u : 0x3c00u;
            static_cast<std::uint16_t*>(in[s].p)[i] =
                static_cast<std::uint16_t>(one + (i + static_cast<std::size_t>(s)) % 97);
          }
        }
      const void* srcs[4] = {in[0].p, in[1].p, in[2].p, in[3].p};
      // gbps() counts 3 x its byte argument per call: 5 x bytes moved.
      rate[t] = gbps(bytes * 5 / 3, seconds, [&] {
        if (t == 0) {
          using shmring::DataType;
          using shmring::ReduceOp;
          shmring::detail::reduce(out.p, srcs[0], srcs[1], n, DataType::float32, ReduceOp::sum, 1);
          shmring::detail::reduce(out.p, out.p, srcs[2], n, DataType::float32, ReduceOp::sum, 1);
          shmring::detail::reduce(out.p, out.p, srcs[3], n, DataType::float32, ReduceOp::sum, 1);
        } else {
          best->many[t == 1 ? 1 : 0][0](out.p, srcs, 4, n, 1.0);
        }
      });
    }
    const std::string size =
        bytes >= (1u << 20) ? fmt::format("{}MiB", bytes >> 20) : fmt::format("{}KiB", bytes >> 10);
    fmt::print("{:>9} {:>10.2f} {:>10.2f} {:>10.2f} {:>9.2f} {:>9.2f}\n", size, rate[0], rate[1],
               rate[2], rate[0] / rate[1], rate[0] / rate[2]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.2;
  if (!(seconds > 0 && seconds < 100)) {
    fmt::print(stderr, "kernel_bench: seconds per cell '{}': expected a number in (0, 100)\n",
               argv[1]);
    return 2;
  }
  const std::int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  const std::int64_t best = targets & -targets;  // lower bit = better target
  fmt::print("# target_clones picks: {}; Highway picks: {}\n", shmring::detail::kernel_isa(),
             hwy::TargetName(best));
  fmt::print("# GB/s = (2 inputs read + 1 output written) / time; {} s per cell\n", seconds);
  fmt::print(
      "# same bits: identical output (odd lengths too); NaN payloads: NaN vs NaN with\n"
      "# another payload (both NaN, x86 keeps the first operand's; not an error)\n");
  fmt::print("{:>10} {:>9} {:>14} {:>12} {:>8} {:>9} {:>12}\n", "kernel", "size", "target_clones",
             "highway", "hwy/tc", "same bits", "NaN payloads");

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1000.f, 1000.f);
  const std::size_t kSizes[] = {4u << 10, 256u << 10, 64u << 20};
  int failures = 0;
  for (int kernel = 0; kernel < 4; ++kernel) {
    // kernel 3: bf16 sum again, the target_clones column running fused_sum_bf16.
    const bool bf16 = kernel >= 2;
    const bool fused = kernel == 3;
    const char* name = kernel == 0   ? "f32 sum"
                       : kernel == 1 ? "f32 max"
                       : kernel == 2 ? "bf16 sum"
                                     : "bf16 sum*";
    const std::size_t esize = bf16 ? 2 : 4;
    for (std::size_t bytes : kSizes) {
      const std::size_t n = bytes / esize;
      Aligned a(bytes), b(bytes), d1(bytes), d2(bytes);
      // Random values, with NaNs (two payloads), infinities and zeros of both
      // signs sprinkled in.
      for (std::size_t i = 0; i < n; ++i) {
        for (void* p : {a.p, b.p}) {
          float v = dist(rng);
          std::uint32_t special = rng() % 1000;
          if (special == 0) v = std::numeric_limits<float>::quiet_NaN();
          if (special == 1) {
            std::uint32_t u = 0x7f800001u + (rng() & 0xffff);
            std::memcpy(&v, &u, 4);
          }
          if (special == 2) v = std::numeric_limits<float>::infinity();
          if (special == 3 || special == 4) v = special == 3 ? -0.0f : 0.0f;  // max(-0, +0)
          if (bf16) {
            std::uint32_t u;
            std::memcpy(&u, &v, 4);
            static_cast<std::uint16_t*>(p)[i] = static_cast<std::uint16_t>(u >> 16);
          } else {
            static_cast<float*>(p)[i] = v;
          }
        }
      }
      const DataType dt = bf16 ? DataType::bfloat16 : DataType::float32;
      const ReduceOp op = kernel == 1 ? ReduceOp::max : ReduceOp::sum;
      auto run_tc = [&] {
        if (fused)
          fused_sum_bf16(d1.p, a.p, b.p, n);
        else
          shmring::detail::reduce(d1.p, a.p, b.p, n, dt, op);
      };
      auto run_hwy = [&] {
        if (kernel == 0) HWY_DYNAMIC_DISPATCH(shmring::bench::sum_f32)
        (static_cast<float*>(d2.p), static_cast<const float*>(a.p), static_cast<const float*>(b.p),
         n);
        else if (kernel == 1) HWY_DYNAMIC_DISPATCH(shmring::bench::max_f32)(
            static_cast<float*>(d2.p), static_cast<const float*>(a.p),
            static_cast<const float*>(b.p), n);
        else HWY_DYNAMIC_DISPATCH(shmring::bench::sum_bf16)(
            static_cast<std::uint16_t*>(d2.p), static_cast<const std::uint16_t*>(a.p),
            static_cast<const std::uint16_t*>(b.p), n);
      };
      // Odd lengths too, for the tails.
      bool same = true;
      std::size_t payload_diffs = 0;
      for (std::size_t m : {n, n - 1, std::size_t{7}}) {
        std::memset(d1.p, 0xa5, bytes);
        std::memset(d2.p, 0x5a, bytes);
        if (fused)
          fused_sum_bf16(d1.p, a.p, b.p, m);
        else
          shmring::detail::reduce(d1.p, a.p, b.p, m, dt, op);
        if (kernel == 0) HWY_DYNAMIC_DISPATCH(shmring::bench::sum_f32)
        (static_cast<float*>(d2.p), static_cast<const float*>(a.p), static_cast<const float*>(b.p),
         m);
        else if (kernel == 1) HWY_DYNAMIC_DISPATCH(shmring::bench::max_f32)(
            static_cast<float*>(d2.p), static_cast<const float*>(a.p),
            static_cast<const float*>(b.p), m);
        else HWY_DYNAMIC_DISPATCH(shmring::bench::sum_bf16)(
            static_cast<std::uint16_t*>(d2.p), static_cast<const std::uint16_t*>(a.p),
            static_cast<const std::uint16_t*>(b.p), m);
        if (!same_values(d1.p, d2.p, m, esize, payload_diffs)) {
          same = false;
          if (std::getenv("KERNEL_BENCH_DEBUG")) {
            for (std::size_t i = 0; i < m; ++i) {
              std::uint32_t x = 0, y = 0, p = 0, q = 0;
              std::memcpy(&x, static_cast<char*>(d1.p) + i * esize, esize);
              std::memcpy(&y, static_cast<char*>(d2.p) + i * esize, esize);
              std::memcpy(&p, static_cast<char*>(a.p) + i * esize, esize);
              std::memcpy(&q, static_cast<char*>(b.p) + i * esize, esize);
              if (x != y) {
                fmt::print("  {} m={} i={}: a={:08x} b={:08x} clones={:08x} hwy={:08x}\n", name, m,
                           i, p, q, x, y);
                break;
              }
            }
          }
        }
      }
      if (!same) ++failures;
      const double tc = gbps(bytes, seconds, run_tc);
      const double hw = gbps(bytes, seconds, run_hwy);
      std::string size = bytes >= (1u << 20) ? fmt::format("{}MiB", bytes >> 20)
                                             : fmt::format("{}KiB", bytes >> 10);
      fmt::print("{:>10} {:>9} {:>14.2f} {:>12.2f} {:>8.2f} {:>9} {:>12}\n", name, size, tc, hw,
                 hw / tc, same ? "yes" : "NO", payload_diffs);
    }
  }
  fmt::print(
      "# bf16 sum*: the target_clones column is a fused one-pass loop (fused_sum_bf16,\n"
      "# defined here), not the library's widen/add/narrow blocks\n");
  wide_table(seconds);
  many_input_table(seconds);
  short_table(seconds);
  return failures == 0 ? 0 : 1;
}

#endif  // HWY_ONCE
