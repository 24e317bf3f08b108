#include "base/placement.hpp"

#include <algorithm>
#include <cstdio>

#include "base/log.hpp"

namespace shmring::detail {

namespace {
// After a move, the next one waits at least this long; a move that follows
// its predecessor within 4x the hold-off doubles it (the scheduler put us
// back: foreign load, or ranks that outnumber the free CPUs), up to 1 s.
constexpr std::chrono::microseconds kMinHoldOff{200};
constexpr std::chrono::microseconds kMaxHoldOff{1'000'000};
// After a look that found no CPU to move to, the next one waits this long.
constexpr std::chrono::microseconds kQuietAfterMiss{1'000};
}  // namespace

int Unstacker::move_off(int cpu, const std::function<int(int)>& ranks_on,
                        const std::function<void(int)>& announce) {
  if (cpu < 0 || !may_look()) return -1;
  const auto now = Clock::now();
  cpu_set_t home;
  CPU_ZERO(&home);
  if (sched_getaffinity(0, sizeof home, &home) != 0) return -1;
  int target = -1, fewest = ranks_on(cpu);
  for (int c = 0; c < CPU_SETSIZE && fewest > 0; ++c) {
    if (c == cpu || !CPU_ISSET(c, &home)) continue;
    const int k = ranks_on(c);
    if (k < fewest) {
      target = c;
      fewest = k;
    }
  }
  if (target < 0) {
    quiet_until_ = now + kQuietAfterMiss;
    return -1;
  }
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
  SHMRING_LOG(debug, "moved from CPU {} ({} other ranks of the job) to CPU {} ({})", cpu,
              ranks_on(cpu), current_cpu(), fewest);
  return current_cpu();
}

bool others_runnable(int ranks) {
  // "0.52 0.48 0.40 3/187 4242": the fourth field is runnable/total tasks.
  std::FILE* f = std::fopen("/proc/loadavg", "re");
  if (f == nullptr) return true;
  double avg[3];
  int runnable = 0, total = 0;
  const int got = std::fscanf(f, "%lf %lf %lf %d/%d", &avg[0], &avg[1], &avg[2], &runnable, &total);
  std::fclose(f);
  return got != 5 || runnable > ranks;
}

}  // namespace shmring::detail
