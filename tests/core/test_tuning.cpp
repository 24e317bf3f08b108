// The algorithm table (src/engine/tuning.cpp): its crossovers as measured
// (docs/design/algorithms.md), the forced paths, and that every row is
// reachable and the table ends in a row that takes everything.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <set>

#include "engine/tuning.hpp"

using namespace shmring;
using engine::choose;
using engine::TuningInputs;
using K = CollectiveKind;

namespace {
constexpr std::uint64_t kDirect = 64 * 1024;
TuningInputs alone(int n) {
  return {n, false, kDirect, std::nullopt};
}
TuningInputs crowded(int n) {
  return {n, true, kDirect, std::nullopt};
}
}  // namespace

TEST_CASE("allreduce crossovers") {
  CHECK(choose(K::allreduce, 8, false, alone(2)) == Algorithm::low_latency);
  CHECK(choose(K::allreduce, 512, false, alone(2)) == Algorithm::direct);
  CHECK(choose(K::allreduce, 513, false, alone(2)) == Algorithm::ring);
  CHECK(choose(K::allreduce, 4096, false, alone(8)) == Algorithm::direct);
  CHECK(choose(K::allreduce, 4097, false, alone(8)) == Algorithm::ring);
  CHECK(choose(K::allreduce, 16 * 1024, false, crowded(3)) == Algorithm::direct);
  CHECK(choose(K::allreduce, 16 * 1024 + 1, false, crowded(3)) == Algorithm::ring);
  // 16-bit at N=3 crowded: one-shot up to the direct buffer (no float64
  // partials), the two-shot rounds past it.
  CHECK(choose(K::allreduce, 16 * 1024 + 1, true, crowded(3)) == Algorithm::direct);
  CHECK(choose(K::allreduce, kDirect, true, crowded(3)) == Algorithm::direct);
  CHECK(choose(K::allreduce, kDirect + 1, true, crowded(3)) == Algorithm::two_shot);
  CHECK(choose(K::allreduce, 16 * 1024, false, crowded(4)) == Algorithm::direct);
  CHECK(choose(K::allreduce, 16 * 1024 + 1, false, crowded(4)) == Algorithm::two_shot);
  CHECK(choose(K::allreduce, 8 * 1024 + 1, false, crowded(8)) == Algorithm::two_shot);
  // Past the direct buffer: the ring, except 16-bit sums and crowded ranks at N > 2.
  CHECK(choose(K::allreduce, kDirect + 1, false, alone(4)) == Algorithm::ring);
  CHECK(choose(K::allreduce, kDirect + 1, true, alone(4)) == Algorithm::two_shot);
  // 16-bit on CPUs of their own: two-shot from 8 KiB, not the ring's float64
  // partials; one-shot below; N=2 keeps the ring (no partial travels).
  CHECK(choose(K::allreduce, 4096, true, alone(4)) == Algorithm::direct);
  CHECK(choose(K::allreduce, 4097, true, alone(4)) == Algorithm::two_shot);
  CHECK(choose(K::allreduce, kDirect, true, alone(3)) == Algorithm::two_shot);
  CHECK(choose(K::allreduce, 4097, false, alone(4)) == Algorithm::ring);
  CHECK(choose(K::allreduce, 4097, true, alone(2)) == Algorithm::ring);
  CHECK(choose(K::allreduce, kDirect + 1, true, alone(2)) == Algorithm::ring);
  CHECK(choose(K::allreduce, 64 << 20, false, crowded(4)) == Algorithm::two_shot);
}

TEST_CASE("16-bit reduce_scatter past the direct buffer at N > 2: the staged rounds") {
  // The ring would carry float64 partials; the staged rounds read all N
  // 16-bit blocks and reduce in registers. Float types and N = 2 keep the ring.
  for (bool crowd : {false, true}) {
    const TuningInputs n3 = crowd ? crowded(3) : alone(3);
    CHECK(choose(K::reduce_scatter, kDirect, true, n3) == Algorithm::direct);
    CHECK(choose(K::reduce_scatter, kDirect + 1, true, n3) == Algorithm::staged);
    CHECK(choose(K::reduce_scatter, 64 << 20, true, crowd ? crowded(8) : alone(8)) ==
          Algorithm::staged);
    CHECK(choose(K::reduce_scatter, kDirect + 1, false, n3) == Algorithm::ring);
    CHECK(choose(K::reduce_scatter, kDirect + 1, true, crowd ? crowded(2) : alone(2)) ==
          Algorithm::ring);
  }
  CHECK(engine::describe_choices(alone(3)).find("reduce_scatter (16-bit)") != std::string::npos);
}

TEST_CASE("16-bit reduce past the direct buffer at N > 2: the staged rounds") {
  // The chain would carry float64 partials; the root reads all N 16-bit
  // blocks from the staged rounds and reduces in registers. Float types and
  // N = 2 keep the chain (Algorithm::ring).
  for (bool crowd : {false, true}) {
    const TuningInputs n3 = crowd ? crowded(3) : alone(3);
    CHECK(choose(K::reduce, kDirect, true, n3) == Algorithm::direct);
    CHECK(choose(K::reduce, kDirect + 1, true, n3) == Algorithm::staged);
    CHECK(choose(K::reduce, 64 << 20, true, crowd ? crowded(8) : alone(8)) == Algorithm::staged);
    CHECK(choose(K::reduce, kDirect + 1, false, n3) == Algorithm::ring);
    CHECK(choose(K::reduce, kDirect + 1, true, crowd ? crowded(2) : alone(2)) == Algorithm::ring);
  }
  CHECK(engine::describe_choices(alone(4)).find("reduce (16-bit)") != std::string::npos);
}

TEST_CASE("other collectives") {
  CHECK(choose(K::barrier, 0, false, alone(4)) == Algorithm::low_latency);
  CHECK(choose(K::allgather, 8 * 1024, false, alone(2)) == Algorithm::staged);
  CHECK(choose(K::allgather, 8 * 1024, false, crowded(2)) == Algorithm::direct);
  CHECK(choose(K::allgather, 256 * 1024, false, crowded(2)) == Algorithm::staged);
  CHECK(choose(K::allgather, 2 << 20, false, alone(2)) == Algorithm::ring);
  CHECK(choose(K::broadcast, kDirect, false, alone(4)) == Algorithm::direct);
  CHECK(choose(K::broadcast, kDirect + 1, false, alone(4)) == Algorithm::ring);
  CHECK(choose(K::gather, 1 << 20, false, alone(4)) == Algorithm::staged);
}

TEST_CASE("a forced algorithm applies where it can run") {
  TuningInputs in = alone(4);
  in.forced = Algorithm::direct;
  CHECK(choose(K::allreduce, 8, false, in) == Algorithm::direct);  // not the line
  CHECK(choose(K::allreduce, kDirect + 1, false, in) == Algorithm::ring);
  CHECK(choose(K::barrier, 0, false, in) == Algorithm::low_latency);
  in.forced = Algorithm::two_shot;
  CHECK(choose(K::allreduce, 64 << 20, false, in) == Algorithm::two_shot);
  CHECK(choose(K::broadcast, 8, false, in) == Algorithm::direct);
  in.forced = Algorithm::ring;
  CHECK(choose(K::allreduce, 8, false, in) == Algorithm::ring);
}

TEST_CASE("every row is reachable and the last takes everything") {
  const auto rows = engine::crossovers();
  REQUIRE(!rows.empty());
  const auto& last = rows.back();
  CHECK(last.kinds == ~engine::KindMask{0});
  CHECK(last.min_ranks == 1);
  CHECK(last.above == 0);
  CHECK(last.up_to == engine::kUnbounded);
  std::set<const engine::Crossover*> used;
  for (int n : {1, 2, 3, 4, 8, 16})
    for (bool ov : {false, true})
      for (int k = 1; k <= 12; ++k)
        for (bool wide : {false, true})
          for (std::uint64_t p = 0; p <= (std::uint64_t{256} << 20); p = p ? p * 2 : 1)
            used.insert(engine::choose_row(static_cast<K>(k), p, wide,
                                           TuningInputs{n, ov, kDirect, std::nullopt}));
  for (const auto& r : rows) CHECK_MESSAGE(used.count(&r) == 1, "unreachable row: " << r.why);
  for (const auto& r : rows) CHECK(std::string(r.why).size() > 10);
}

TEST_CASE("describe_choices names each collective and its reason") {
  const std::string s = engine::describe_choices(alone(4));
  CHECK(s.find("N=4") != std::string::npos);
  CHECK(s.find("allreduce (16-bit)") != std::string::npos);
  CHECK(s.find("two-shot") != std::string::npos);
  CHECK(s.find("reduce_scatter_v") != std::string::npos);
  // A barrier moves no data: one row, no size range.
  CHECK(s.find("barrier                          (no data) low-latency") != std::string::npos);
  CHECK(s.find("barrier                     8 B") == std::string::npos);
}

TEST_CASE("the compiled choices give the table's answer at every payload") {
  // Payloads: every bound of every row, one either side, and powers of two.
  std::set<std::uint64_t> payloads = {0, 1, 2, ~std::uint64_t{0}, ~std::uint64_t{0} - 1};
  for (int s = 0; s < 64; ++s) payloads.insert(std::uint64_t{1} << s);
  for (std::uint64_t direct : {std::uint64_t{4096}, kDirect, std::uint64_t{1} << 22})
    for (const auto& r : engine::crossovers())
      for (std::uint64_t b : {r.above, r.up_to, direct})
        for (std::uint64_t d : {std::uint64_t{0}, std::uint64_t{1}}) {
          payloads.insert(b + d);
          payloads.insert(b - d);
        }
  const std::optional<Algorithm> forced[] = {std::nullopt, Algorithm::ring, Algorithm::direct,
                                             Algorithm::two_shot};
  int checked = 0;
  for (int n : {1, 2, 3, 4, 5, 7, 8, 9, 16, 64})
    for (bool crowded_ranks : {false, true})
      for (std::uint64_t direct : {std::uint64_t{4096}, kDirect, std::uint64_t{1} << 22})
        for (const auto& f : forced) {
          const TuningInputs in{n, crowded_ranks, direct, f};
          const AlgorithmSteps steps = engine::compile_choices(in);
          for (unsigned k = 1; k <= 12; ++k)
            for (bool wide : {false, true})
              for (std::uint64_t p : payloads) {
                const auto kind = static_cast<K>(k);
                const auto got = steps.find(kind, p, wide);
                REQUIRE_MESSAGE(got.has_value(), "N=", n, " kind ", k, " payload ", p);
                REQUIRE_MESSAGE(*got == choose(kind, p, wide, in), "N=", n, " crowded ",
                                crowded_ranks, " direct ", direct, " kind ", k, " wide ", wide,
                                " payload ", p);
                ++checked;
              }
        }
  CHECK(checked > 100000);
}
