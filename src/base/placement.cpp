#include "base/placement.hpp"

#include <algorithm>

#include "base/log.hpp"

namespace shmring::detail {

namespace {
// After a move, the next one waits at least this long; a move that follows
// its predecessor within 4x the hold-off doubles it (the scheduler put us
// back: foreign load, or ranks that outnumber the free CPUs), up to 1 s.
constexpr std::chrono::microseconds kMinHoldOff{200};
constexpr std::chrono::microseconds kMaxHoldOff{1'000'000};
}  // namespace

int Unstacker::move_off(int cpu, const std::function<bool(int)>& occupied,
                        const std::function<void(int)>& announce) {
  if (!enabled_ || cpu < 0) return -1;
  const auto now = Clock::now();
  if (moves_ > 0 && now < last_move_ + hold_off_) return -1;
  cpu_set_t home;
  CPU_ZERO(&home);
  if (sched_getaffinity(0, sizeof home, &home) != 0) return -1;
  int target = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (c != cpu && CPU_ISSET(c, &home) && !occupied(c)) {
      target = c;
      break;
    }
  }
  if (target < 0) return -1;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(target, &one);
  announce(target);
  if (sched_setaffinity(0, sizeof one, &one) != 0) return -1;
  // Back to the caller's own mask at once: we stay on `target` until the
  // scheduler has a reason to move us.
  sched_setaffinity(0, sizeof home, &home);
  hold_off_ = moves_ > 0 && now < last_move_ + 4 * hold_off_
                  ? std::min(kMaxHoldOff, 2 * std::max(hold_off_, kMinHoldOff))
                  : kMinHoldOff;
  last_move_ = now;
  ++moves_;
  SHMRING_LOG(debug, "moved from CPU {} to CPU {}: the peer it waited for ran on CPU {}", cpu,
              current_cpu(), cpu);
  return current_cpu();
}

}  // namespace shmring::detail
