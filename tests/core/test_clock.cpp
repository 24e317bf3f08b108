// FastClock (src/base/clock.hpp): the cycle counter on CLOCK_MONOTONIC's
// timeline, used for every call's start and end.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include "base/clock.hpp"

using shmring::detail::FastClock;
using shmring::detail::mono_ns;

namespace {
std::int64_t diff(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::int64_t>(a) - static_cast<std::int64_t>(b);
}
}  // namespace

TEST_CASE("FastClock stays on CLOCK_MONOTONIC's timeline across re-anchors") {
  FastClock clock;
  std::uint64_t last = clock.now();
  std::int64_t worst = 0;
  // Sleeps of 0-9 ms cross the re-anchoring interval (about 4 ms) often;
  // the busy loops run between anchors on the counter alone.
  for (int i = 0; i < 60; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(150 * (i % 10) * (i % 10)));
    for (int k = 0; k < 1000; ++k) {
      const std::uint64_t before = mono_ns();
      const std::uint64_t fast = clock.now();
      const std::uint64_t after = mono_ns();
      REQUIRE(fast >= last);  // never goes back
      last = fast;
      // Between the two real reads, give or take the rate's error and a
      // descheduling between the reads (generous: a loaded 2-core VM).
      const std::int64_t off =
          fast < before ? diff(before, fast) : (fast > after ? diff(fast, after) : 0);
      if (off > worst) worst = off;
    }
  }
  MESSAGE("worst distance from CLOCK_MONOTONIC: " << worst << " ns");
  CHECK(worst < 200000);
}

TEST_CASE("FastClock measures a sleep as the real clock does") {
  FastClock clock;
  (void)clock.now();
  const std::uint64_t m0 = mono_ns(), f0 = clock.now();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const std::uint64_t f1 = clock.now(), m1 = mono_ns();
  const double real = static_cast<double>(m1 - m0), fast = static_cast<double>(f1 - f0);
  CHECK(fast > 0.98 * real - 100000);
  CHECK(fast < 1.02 * real + 100000);
}
