#pragma once

// Keeping the ranks of a job off each other's CPU.
//
// Two ranks that share one CPU can only hand it to each other: every wait
// then costs a context switch (with a spin phase, the whole spin first), and
// a 0.2 us allreduce takes 8-20 us. The scheduler stacks them easily and
// rarely separates them: a futex wake-up may place the sleeper on its
// waker's CPU, and two tasks that always run are "cache hot", so the idle
// CPU beside them does not pull one over (a case found by a new user:
// after one futex sleep, 1000 back-to-back calls all ran stacked).
//
// So each rank publishes the CPU it runs on whenever a wait does not
// succeed at once, and a waiter that finds the peer it waits for on its own
// CPU moves itself to a CPU of its affinity mask that no rank of the job
// occupies (sched_setaffinity to that CPU, then straight back to its own
// mask: the thread stays where it was moved, and its mask is unchanged).
// Where no such CPU exists (more ranks than CPUs, or ranks pinned), the
// waiter skips its spin and yields, which hands the CPU to the peer.
// One rank of a job moves at a time (a claim word in the header): two
// stacked ranks that both noticed it would otherwise both move, to the same
// free CPU. Moves are rate-limited with a backoff, so that a scheduler that
// keeps putting the ranks back together (foreign load) costs little.

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>

namespace shmring::detail {

/// The CPU this thread runs on now, or -1.
inline int current_cpu() noexcept {
  return sched_getcpu();
}

/// Per-rank state of the mechanism above (not shared).
class Unstacker {
 public:
  /// `enabled`: SHMRING_MIGRATE (default on).
  explicit Unstacker(bool enabled = true) : enabled_(enabled) {}

  /// Moves this thread off `cpu` (which the peer it waits for also runs on)
  /// to a CPU of its affinity mask for which `occupied(c)` is false, unless
  /// a move happened too recently. `announce(target)` runs just before the
  /// move, so that peers see where we go before we get there. Returns the
  /// CPU it runs on afterwards, or -1 when it did not move.
  int move_off(int cpu, const std::function<bool(int)>& occupied,
               const std::function<void(int)>& announce);

  std::uint64_t moves() const noexcept { return moves_; }

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  std::uint64_t moves_ = 0;
  Clock::time_point last_move_{};
  std::chrono::microseconds hold_off_{0};  // no move before last_move_ + hold_off_
};

}  // namespace shmring::detail
