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
// CPU moves itself to the CPU of its affinity mask that the fewest ranks of
// the job occupy, if that is fewer than share its own (sched_setaffinity to
// that CPU, then straight back to its own mask: the thread stays where it
// was moved, and its mask is unchanged). With a CPU per rank that is a free
// CPU; where no CPU holds fewer, or ranks are pinned, the waiter skips its
// spin and yields, which hands the CPU to the peer.
//
// With more ranks than CPUs (oversubscribed) the same rule spreads them
// evenly: the scheduler as readily leaves three of four ranks on one of two
// CPUs for a whole run (each of the three gets a third of a CPU and the
// lone rank waits for them: an allreduce of 64 KiB took 43-45 us against
// 27-29 us with two ranks per CPU, in whichever of the two placements a
// fresh job happened to start; docs/performance/notes/2026-12-07-crowded-spread.md).
// A crowded waiter counts the ranks on its CPU and moves when a CPU of its
// mask holds fewer others than its own does, until every CPU holds
// floor(N/C) or ceil(N/C) ranks.
//
// Spreading stops where another program wants a CPU: ranks that outnumber
// the CPUs yield while they wait, and a yield hands the whole slice to that
// program's task, so a rank moved onto the CPU a busy loop held waited for
// it there (float32 1 MiB at N=4 on 2 CPUs beside one busy loop: 7.1-9.7
// ms against 0.41-0.95 ms unmoved). Such a program is seen by its count:
// more tasks runnable on the machine than the job has ranks.
//
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

  /// Moves this thread off `cpu` to the CPU of its affinity mask that holds
  /// the fewest of the job's other ranks (`ranks_on(c)`: how many, besides
  /// us, run on CPU c), if that CPU holds fewer than `cpu` does, unless a
  /// move happened too recently. `announce(target)` runs just before the
  /// move, so that peers see where we go before we get there. Returns the
  /// CPU it runs on afterwards, or -1 when it did not move.
  int move_off(int cpu, const std::function<int(int)>& ranks_on,
               const std::function<void(int)>& announce);

  /// Keeps move_off from looking for the next `d` (a caller that found a
  /// reason not to move).
  void quiet_for(std::chrono::microseconds d) { quiet_until_ = Clock::now() + d; }

  /// Whether move_off may move now: enabled, past the hold-off of the last
  /// move, and past the quiet time after a look that found no CPU to move
  /// to (kQuietAfterMiss, placement.cpp), so that a caller that checks at
  /// every wait makes the system call at most that often.
  bool may_look() const {
    const auto now = Clock::now();
    return enabled_ && now >= quiet_until_ && (moves_ == 0 || now >= last_move_ + hold_off_);
  }
  std::uint64_t moves() const noexcept { return moves_; }

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  std::uint64_t moves_ = 0;
  Clock::time_point last_move_{};
  std::chrono::microseconds hold_off_{0};  // no move before last_move_ + hold_off_
  Clock::time_point quiet_until_{};        // no look before this (a look found no CPU)
};

/// Whether more tasks are runnable on the machine right now than `ranks`
/// (the kernel's count in /proc/loadavg, every CPU's, this thread's too):
/// some program besides the job's ranks wants a CPU. True when it cannot be
/// read. A crowded rank does not move then (see above).
bool others_runnable(int ranks);

}  // namespace shmring::detail
