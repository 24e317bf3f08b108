// Chunk and slice arithmetic at counts past 2^32 (no allocation).

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "core/chunking.hpp"

using namespace shmring::detail;

TEST_CASE("chunks of 2^33 + 5 elements over 3, 7 and 8 ranks tile the buffer exactly") {
  const std::size_t count = (std::size_t{1} << 33) + 5;
  for (int n : {3, 7, 8}) {
    std::size_t next = 0;
    for (int c = 0; c < n; ++c) {
      Range r = chunk_range(count, n, c);
      CHECK(r.begin == next);
      CHECK((r.count == count / n || r.count == count / n + 1));
      next = r.begin + r.count;
    }
    CHECK(next == count);
  }
}

TEST_CASE("slices of a 2^33-element chunk cover it in order, the last one short") {
  const std::size_t count = std::size_t{1} << 35;  // 2^33 elements per chunk at N=4
  const std::size_t slice = (256 * 1024) / 4;      // float32 in a 256 KiB slot
  const int n = 4;
  const std::size_t rounds = ring_rounds(count, n, slice);
  CHECK(rounds == (std::size_t{1} << 33) / slice);
  Range c3 = chunk_range(count, n, 3);
  CHECK(c3.begin == 3 * (std::size_t{1} << 33));
  Range last = slice_range(c3, rounds - 1, slice);
  CHECK(last.begin + last.count == count);
  Range past = slice_range(c3, rounds, slice);
  CHECK(past.count == 0);
  CHECK(past.begin == c3.begin + c3.count);
  // Uneven: one more element makes chunk 0 one longer and adds a round.
  CHECK(ring_rounds(count + 1, n, slice) == rounds + 1);
  CHECK(chunk_range(count + 1, n, 0).count == (std::size_t{1} << 33) + 1);
  CHECK(chunk_range(count + 1, n, 1).begin == (std::size_t{1} << 33) + 1);
}

TEST_CASE("small counts: fewer elements than ranks, and zero") {
  CHECK(ring_rounds(0, 4, 100) == 1);  // a zero-count call still runs one round
  CHECK(chunk_range(2, 4, 0).count == 1);
  CHECK(chunk_range(2, 4, 1).count == 1);
  CHECK(chunk_range(2, 4, 2).count == 0);
  CHECK(chunk_range(2, 4, 3).begin == 2);
  CHECK(slice_range(chunk_range(2, 4, 3), 0, 100).count == 0);
  CHECK(ring_mod(-1, 4) == 3);
  CHECK(ring_mod(-9, 4) == 3);
}
