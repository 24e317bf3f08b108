// The algorithm table (tuning.hpp). Each row's `why` names its measurement
// in one line; docs/design/algorithms.md keeps the full tables. Every input
// is the same on every rank (world size, the oversubscription verdict all
// ranks agree on, the segment's direct buffer, SHMRING_ALGO), so every rank
// picks the same algorithm without talking.

#include "engine/tuning.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <vector>

#include "transport/layout.hpp"

namespace shmring::engine {

namespace {

using K = CollectiveKind;
constexpr KindMask kAny = ~KindMask{0};
constexpr int kAnyRanks = 1 << 20;
constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB;

constexpr KindMask operator|(CollectiveKind a, CollectiveKind b) {
  return kind_bit(a) | kind_bit(b);
}
constexpr KindMask operator|(KindMask a, CollectiveKind b) {
  return a | kind_bit(b);
}

// clang-format off
constexpr std::array kTable = {
  Crossover{kind_bit(K::barrier), 1, kAnyRanks, Placement::any, 0, kUnbounded, false,
            Algorithm::low_latency,
            "a barrier is one line per rank and one synchronisation"},
  Crossover{K::allreduce | K::allgather | K::alltoall, 2, kAnyRanks, Placement::any, 0,
            detail::kLowLatencyBytes, false, Algorithm::low_latency,
            "data, descriptor and sequence number in one cache line: 8 B allreduce N=2 0.3-0.5 us"},
  Crossover{kind_bit(K::allgather), 2, 2, Placement::alone, 4 * KiB - 1, 2 * MiB - 1, false,
            Algorithm::staged,
            "single-copy rounds read each block from its writer: 128 KiB 4.5 vs 11.5 us (ring)"},
  Crossover{kind_bit(K::allgather), 2, 2, Placement::crowded, 160 * KiB - 1, 640 * KiB - 1, false,
            Algorithm::staged,
            "crowded, a 512 KiB round waits less often than the ring: 512 KiB 28 vs 41 us"},
  Crossover{K::alltoall | K::gather | K::scatter | K::alltoallv | K::allgatherv |
                K::reduce_scatter_v,
            1, kAnyRanks, Placement::any, 0, kUnbounded, false, Algorithm::staged,
            "the staged rounds through the direct buffers (single copy where the kernel allows)"},
  Crossover{kind_bit(K::allreduce), 3, kAnyRanks, Placement::any, kDirectBuffer, kUnbounded, true,
            Algorithm::two_shot,
            "16-bit sums reduce all N copies in registers; the ring carries float64 partials: "
            "bf16 N=4 1 MiB 356 vs 1457 us"},
  Crossover{kind_bit(K::reduce_scatter), 3, kAnyRanks, Placement::any, kDirectBuffer, kUnbounded,
            true, Algorithm::staged,
            "16-bit: the staged rounds reduce all N copies in registers; the ring carries float64 "
            "partials: bf16 N=3 1 MiB 255 vs 514 us"},
  Crossover{kind_bit(K::reduce), 3, kAnyRanks, Placement::any, kDirectBuffer, kUnbounded, true,
            Algorithm::staged,
            "16-bit: the root reduces the N staged copies in registers; the chain carries float64 "
            "partials: bf16 N=4 1 MiB 253 vs 771 us"},
  Crossover{kind_bit(K::allreduce), 3, kAnyRanks, Placement::crowded, kDirectBuffer, kUnbounded,
            false, Algorithm::two_shot,
            "two synchronisations a round, not 2(N-1) a slice: float32 N=4 1 MiB 297 vs 405 us"},
  Crossover{kAny, 1, kAnyRanks, Placement::any, kDirectBuffer, kUnbounded, false, Algorithm::ring,
            "past the direct buffer the ring's slots carry any size at 2(N-1)/N of the data"},
  Crossover{kind_bit(K::allreduce), 2, 2, Placement::any, 512, kUnbounded, false, Algorithm::ring,
            "N=2: the ring's two steps beat reading both buffers from 1 KiB: 4 KiB 0.60 vs 0.88 us"},
  Crossover{kind_bit(K::allreduce), 8, kAnyRanks, Placement::crowded, 8 * KiB, kUnbounded, false,
            Algorithm::two_shot,
            "crowded N>=8: reading N whole buffers costs more than a second sync: 64 KiB 48 vs 95 us"},
  Crossover{kind_bit(K::allreduce), 4, 7, Placement::crowded, 16 * KiB, kUnbounded, false,
            Algorithm::two_shot,
            "crowded N=4: two-shot from 32 KiB, 64 KiB 28.1 vs 42.3 us (one-shot)"},
  Crossover{kind_bit(K::allreduce), 3, 3, Placement::crowded, 16 * KiB, kDirectBuffer, true,
            Algorithm::direct,
            "crowded N=3, 16-bit: the ring's partials are float64; one-shot 32 KiB 25 vs 62 us, "
            "64 KiB 47 vs 89 (medians of 7)"},
  Crossover{kind_bit(K::allreduce), 3, 3, Placement::crowded, 16 * KiB, kUnbounded, false,
            Algorithm::ring,
            "crowded N=3: one-shot up to 16 KiB, the ring from 32 KiB (11.9 vs 13.1 us)"},
  Crossover{kind_bit(K::allreduce), 3, kAnyRanks, Placement::alone, 4 * KiB, kDirectBuffer, true,
            Algorithm::two_shot,
            "CPUs of their own, 16-bit: the ring's partials are float64, two-shot reads 16-bit "
            "copies: bf16 N=4 8 KiB 5.5 vs 8.9 us, 32 KiB 16.6 vs 20.4 (16-core Xeon)"},
  Crossover{kind_bit(K::allreduce), 1, kAnyRanks, Placement::alone, 4 * KiB, kUnbounded, false,
            Algorithm::ring,
            "CPUs of their own: one-shot up to 4 KiB, the ring from 8 KiB (N=16: 20.7 vs 27.0 us)"},
  Crossover{kAny, 1, kAnyRanks, Placement::any, 0, kUnbounded, false, Algorithm::direct,
            "one-shot: each rank publishes once and reads its peers' buffers"},
};
// clang-format on

std::uint64_t resolve(std::uint64_t bound, const TuningInputs& in) {
  return bound == kDirectBuffer ? in.direct_bytes : bound;
}

bool matches(const Crossover& r, CollectiveKind kind, std::uint64_t payload, bool wide,
             const TuningInputs& in) {
  if ((r.kinds & kind_bit(kind)) == 0) return false;
  if (in.world_size < r.min_ranks || in.world_size > r.max_ranks) return false;
  if (r.placement == Placement::alone && in.oversubscribed) return false;
  if (r.placement == Placement::crowded && !in.oversubscribed) return false;
  if (r.wide_only && !wide) return false;
  const std::uint64_t above = resolve(r.above, in);
  // A row starting at 0 includes payload 0; otherwise the range is (above, up_to].
  if (r.above != 0 && payload <= above) return false;
  return payload <= resolve(r.up_to, in);
}

// SHMRING_ALGO: the forced path where it can run. Past the direct buffer only
// the ring (and the two-shot rounds, for allreduce) carry any size.
Algorithm forced_choice(CollectiveKind kind, std::uint64_t payload, const TuningInputs& in) {
  const Algorithm f = *in.forced;
  if (f == Algorithm::ring) return Algorithm::ring;
  if (f == Algorithm::two_shot && kind == K::allreduce) return Algorithm::two_shot;
  if (payload > in.direct_bytes) return Algorithm::ring;
  return Algorithm::direct;
}

}  // namespace

std::span<const Crossover> crossovers() {
  return kTable;
}

const Crossover* choose_row(CollectiveKind kind, std::uint64_t payload, bool wide,
                            const TuningInputs& in) {
  if (in.forced && kind != K::barrier) return nullptr;
  for (const Crossover& r : kTable)
    if (matches(r, kind, payload, wide, in)) return &r;
  return nullptr;  // unreachable: the last row matches everything
}

Algorithm choose(CollectiveKind kind, std::uint64_t payload, bool wide, const TuningInputs& in) {
  if (const Crossover* r = choose_row(kind, payload, wide, in)) return r->algorithm;
  return in.forced ? forced_choice(kind, payload, in) : Algorithm::direct;
}

AlgorithmSteps compile_choices(const TuningInputs& in) {
  // Every bound any row or the forced paths compare a payload with.
  std::vector<std::uint64_t> bounds = {0, in.direct_bytes, kUnbounded};
  for (const Crossover& r : kTable) {
    bounds.push_back(resolve(r.above, in));
    bounds.push_back(resolve(r.up_to, in));
  }
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  AlgorithmSteps steps;
  steps.oversubscribed = in.oversubscribed;
  for (unsigned k = 1; k < AlgorithmSteps::kKinds; ++k) {
    const auto kind = static_cast<CollectiveKind>(k);
    for (bool wide : {false, true}) {
      // Payload 0, then each range (bounds[i-1], bounds[i]]: every row's
      // test is the same throughout a range, so its upper end decides it.
      Algorithm run = choose(kind, 0, wide, in);
      std::uint64_t run_end = 0;
      bool ok = true;
      for (std::size_t i = 1; i < bounds.size() && ok; ++i) {
        const Algorithm a = choose(kind, bounds[i], wide, in);
        if (a != run) {
          ok = steps.add(kind, wide, run_end, run);
          run = a;
        }
        run_end = bounds[i];
      }
      // A full row is left partial: find() misses past it and the caller
      // asks the table.
      if (ok) (void)steps.add(kind, wide, run_end, run);
    }
  }
  return steps;
}

std::string describe_choices(const TuningInputs& in) {
  constexpr std::array kinds = {K::allreduce, K::reduce_scatter, K::allgather, K::broadcast,
                                K::reduce,    K::barrier,        K::alltoall,  K::gather,
                                K::scatter,   K::allgatherv,     K::alltoallv, K::reduce_scatter_v};
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t s = 8; s <= 64 * MiB; s *= 2) sizes.push_back(s);
  auto human = [](std::uint64_t b) {
    if (b >= MiB && b % MiB == 0) return fmt::format("{} MiB", b / MiB);
    if (b >= KiB && b % KiB == 0) return fmt::format("{} KiB", b / KiB);
    return fmt::format("{} B", b);
  };
  std::string out = fmt::format(
      "algorithm choices for N={} ranks, {}, direct buffer {}{} (payload: the largest "
      "per-rank buffer in shared memory)\n",
      in.world_size, in.oversubscribed ? "ranks sharing CPUs" : "ranks on CPUs of their own",
      human(in.direct_bytes),
      in.forced ? fmt::format(", SHMRING_ALGO={}", to_string(*in.forced)) : std::string());
  for (K kind : kinds) {
    if (kind == K::barrier) {  // no payload: one row, not a size range
      const Crossover* row = choose_row(kind, 0, false, in);
      out += fmt::format("  {:<23} {:>18} {:<12} {}\n", to_string(kind), "(no data)",
                         to_string(choose(kind, 0, false, in)),
                         row ? row->why : "forced by SHMRING_ALGO");
      continue;
    }
    for (bool wide : {false, true}) {
      if (wide && kind != K::allreduce && kind != K::reduce_scatter && kind != K::reduce) continue;
      // Runs of sizes with the same algorithm and row.
      std::size_t i = 0;
      while (i < sizes.size()) {
        const Crossover* row = choose_row(kind, sizes[i], wide, in);
        const Algorithm a = choose(kind, sizes[i], wide, in);
        std::size_t j = i;
        while (j + 1 < sizes.size() && choose_row(kind, sizes[j + 1], wide, in) == row &&
               choose(kind, sizes[j + 1], wide, in) == a)
          ++j;
        out +=
            fmt::format("  {:<23} {:>7} .. {:<7} {:<12} {}\n",
                        std::string(to_string(kind)) + (wide ? " (16-bit)" : ""), human(sizes[i]),
                        human(sizes[j]), to_string(a), row ? row->why : "forced by SHMRING_ALGO");
        i = j + 1;
      }
    }
  }
  return out;
}

}  // namespace shmring::engine
