// SlotStoreChooser (src/kernels/slot_stores.hpp): plain or streaming slot
// writes by the rate each kind is measured at, on a simulated clock.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/slot_stores.hpp"

using shmring::detail::SlotStoreChooser;
using Kind = SlotStoreChooser::Kind;

namespace {

constexpr std::size_t kSlice = 256 * 1024;

// Drives a chooser through writes of kSlice bytes on a simulated clock: a
// write of kind k takes ns_per_byte[k] * kSlice ns, and `gap_ns` passes
// between writes (the rest of a call).
struct Sim {
  SlotStoreChooser c;
  std::uint64_t now = 1'000'000;
  double ns_per_byte[2] = {0.025, 0.065};  // plain, streaming: the shared-L3 state
  std::uint64_t gap_ns = 2'000;

  Kind write(double slow = 1.0) {
    const Kind k = c.next(now);
    const auto took = static_cast<std::uint64_t>(ns_per_byte[static_cast<int>(k)] * slow *
                                                 static_cast<double>(kSlice));
    c.record(k, kSlice, now, now + took);
    now += took + gap_ns;
    return k;
  }
  // Writes n and returns how many were of kind k.
  int count(int n, Kind k) {
    int hits = 0;
    for (int i = 0; i < n; ++i) hits += write() == k;
    return hits;
  }
};

}  // namespace

TEST_CASE("both kinds are tried twice, streaming first, before the estimates decide") {
  Sim s;
  std::vector<Kind> first;
  for (int i = 0; i < 4; ++i) first.push_back(s.write());
  CHECK(first == std::vector<Kind>{Kind::streaming, Kind::plain, Kind::streaming, Kind::plain});
  // The first write of each kind is not counted; the second is.
  CHECK(s.c.ns_per_byte(Kind::plain) == doctest::Approx(0.025));
  CHECK(s.c.ns_per_byte(Kind::streaming) == doctest::Approx(0.065));
}

TEST_CASE("the faster kind takes the writes; the other is tried only after 256 writes and 10 ms") {
  for (const bool plain_faster : {true, false}) {
    CAPTURE(plain_faster);
    Sim s;
    if (!plain_faster) {
      s.ns_per_byte[0] = 0.40;  // the other-CCD state: plain 2.5 GB/s
      s.ns_per_byte[1] = 0.037;
    }
    const Kind fast = plain_faster ? Kind::plain : Kind::streaming;
    const Kind slow = plain_faster ? Kind::streaming : Kind::plain;
    for (int i = 0; i < 4; ++i) s.write();
    // The next try comes after 256 writes or 10 ms, whichever is later.
    const double per_write_ns =
        s.ns_per_byte[static_cast<int>(fast)] * static_cast<double>(kSlice) + 2000;
    const int due = std::max(static_cast<int>(SlotStoreChooser::kProbeWrites),
                             static_cast<int>(1e7 / per_write_ns) + 1);
    const std::uint64_t before = s.c.writes(slow);
    int since_try = 0, tries = 0, worst_gap = 0;
    const int n = 6 * due;
    for (int i = 0; i < n; ++i) {
      if (s.write() == slow) {
        ++tries;
        CHECK(since_try >= static_cast<int>(SlotStoreChooser::kProbeWrites));
        worst_gap = std::max(worst_gap, since_try);
        since_try = 0;
      } else {
        ++since_try;
      }
    }
    CHECK(s.c.writes(slow) - before == static_cast<std::uint64_t>(tries));
    CHECK(tries >= 5);  // tried again and again, not given up on
    CHECK(tries <= 6);
    CHECK(worst_gap <= due + 1);
    CHECK(s.c.writes(fast) >= static_cast<std::uint64_t>(n - 6));
  }
}

TEST_CASE("tries wait for 10 ms as well when writes come quickly") {
  Sim s;
  s.ns_per_byte[0] = 0.001;  // 0.26 us writes, no gap: 256 writes in under 0.1 ms
  s.gap_ns = 0;
  std::vector<std::uint64_t> tried_at;  // start of each streaming write
  while (tried_at.size() < 5) {
    const std::uint64_t at = s.now;
    if (s.write() == Kind::streaming) tried_at.push_back(at);
  }
  // The two warm-up writes, then tries 10 ms apart (to within one write).
  for (std::size_t i = 2; i < tried_at.size(); ++i) {
    CAPTURE(i);
    CHECK(tried_at[i] - tried_at[i - 1] >= SlotStoreChooser::kProbeIntervalNs);
    CHECK(tried_at[i] - tried_at[i - 1] < SlotStoreChooser::kProbeIntervalNs + 1000);
  }
}

TEST_CASE("a placement change is followed both ways") {
  Sim s;  // shared L3: plain wins
  for (int i = 0; i < 4; ++i) s.write();
  CHECK(s.count(100, Kind::plain) == 100);

  // The reader moves to another CCD: plain writes slow down 16x. The chosen
  // kind's own writes show it, and the choice turns within a few writes.
  s.ns_per_byte[0] = 0.40;
  s.ns_per_byte[1] = 0.037;
  int turned_after = -1;
  for (int i = 0; i < 10 && turned_after < 0; ++i)
    if (s.write() == Kind::streaming) turned_after = i;
  CHECK(turned_after >= 0);
  CHECK(turned_after <= 3);
  // Long enough for a few tries of plain, each 16x slower.
  const int streamed = s.count(3000, Kind::streaming);
  CHECK(streamed >= 2995);
  CHECK(streamed < 3000);

  // And back: plain gets fast again while streaming has every write. Only
  // a try can show it, and the first try (within about 530 writes here)
  // turns the choice: its one write replaces plain's stale estimate.
  s.ns_per_byte[0] = 0.025;
  s.ns_per_byte[1] = 0.065;
  CHECK(s.count(2000, Kind::plain) > 1400);
}

TEST_CASE("one preempted write does not flip the choice") {
  Sim s;
  for (int i = 0; i < 4; ++i) s.write();
  for (int i = 0; i < 50; ++i) s.write();
  CHECK(s.write(100.0) == Kind::plain);  // 2.5 ms descheduled in the middle of a 6.5 us copy
  CHECK(s.count(50, Kind::plain) == 50);
}
