#pragma once

// Waiting on a sequence counter in shared memory: spin with `pause`, then
// sched_yield, then sleep on a shared futex. The writer only pays for a
// FUTEX_WAKE when a sleeper announced itself in `waiters`.
//
// Lost-wakeup argument. The writer's store S (the counter) is followed in
// program order by its load L (`waiters`); the sleeper's RMW W (`waiters`)
// by a full barrier, then its load of `futex_gen` and its re-check R of the
// counter, and it sleeps only while `futex_gen` is unchanged. If R misses
// S, then L comes after W and sees waiters > 0, and the writer bumps
// `futex_gen` (so FUTEX_WAIT returns at once) before waking. That needs S
// ordered before L, which x86 and AArch64 only give with a fence. Two forms:
//   - asymmetric (the default where the kernel allows it): every process
//     registers for membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED), and the
//     sleeper, after W, calls it: every running thread of every registered
//     process executes a full barrier before the call returns (a thread not
//     running got one when it was switched out). Wherever that barrier falls
//     in the writer's program, either S is visible before R or L comes
//     after W. The writer pays a compiler barrier; the sleeper pays the
//     IPIs once per sleep slice, after its spin and yield phases. This is
//     the technique of Linux's membarrier(2) page ("asymmetric fences", also
//     liburcu's and folly's); on the 2-core Intel VM it took an 8-byte
//     gather from 0.19 to 0.13-0.15 us and a scatter from 0.25 to 0.12-0.15
//     (docs/performance/notes/2026-12-01-intel-fences-eager.md): the fence stalled the writer until
//     its store owned a line its peer polls. tests/core/test_wait.cpp runs
//     the argument as a litmus test.
//   - symmetric (membarrier refused: old kernel, seccomp; or
//     SHMRING_MEMBARRIER=0): the writer's store is seq_cst (MFENCE on x86,
//     STLR then an LDAR load on AArch64).
// Writers go light only when every rank of the job registered and could
// call membarrier (Config::asymmetric_fence); a sleeper always tries
// membarrier and fences itself where it is refused.
//
// Ordering on weakly ordered CPUs (reviewed for AArch64): every publish of a
// sequence counter is publish() below, at least a release store (STLR on
// AArch64), so the slot or buffer contents written before it are visible to
// whoever sees the new value. Every read of a counter that gates access to
// shared data is an acquire load (LDAR) in wait_at_least(); the seq_cst
// loads of the futex phase are stronger still. The relaxed fields beside
// them (descriptor entries, cpu masks, pid) are written before a release of
// their own and read after an acquire.

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "transport/layout.hpp"

namespace shmring::detail {

/// FUTEX_WAIT on a shared (not private) 32-bit word; returns on wake, value
/// change, signal or after `timeout_us`.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, long timeout_us);
void futex_wake_all(std::atomic<std::uint32_t>& word);

/// Registers this process for the asymmetric fence (the header comment);
/// true when the kernel accepted and a first membarrier call succeeded,
/// false where membarrier is refused or SHMRING_MEMBARRIER=0. Registration
/// belongs to the process image: call it in every process that publishes (a
/// forked child is not registered). Each rank publishes the result
/// (RankInfo::asymmetric_fence), and writers go light only when every
/// rank's is true: a rank whose membarrier is refused (seccomp is per
/// process) could not fence a registered writer when it sleeps. Cheap (a
/// few syscalls); thread-safe.
bool register_asymmetric_fence();

/// The sleeper's half of the asymmetric fence, after its RMW of `waiters`:
/// membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED), or a seq_cst fence where it
/// is refused. Costs a syscall and IPIs (microseconds): sleep paths only.
void asymmetric_fence_heavy();

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

using Clock = std::chrono::steady_clock;

/// Wakes every sleeper on `c` (used after publishing, and on abort).
inline void wake(Counter& c) {
  c.futex_gen.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(c.futex_gen);
}

/// Publishes a new counter value: a release store, ordered before the load
/// of `waiters` by the asymmetric fence when `light` (every rank registered:
/// Config::asymmetric_fence), by a seq_cst store otherwise.
inline void publish(Counter& c, std::uint64_t v, bool light) {
  if (light) {
    c.value.store(v, std::memory_order_release);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // sleepers' membarrier fences us
    if (c.waiters.load(std::memory_order_relaxed) != 0) wake(c);
    return;
  }
  c.value.store(v, std::memory_order_seq_cst);
  if (c.waiters.load(std::memory_order_seq_cst) != 0) wake(c);
}

/// True on a thread shmring runs beside the user's (a communicator's
/// progress thread): its waits yield as configured rather than spin, since
/// the CPU it would hold may be the one the user's own thread computes on.
inline thread_local bool t_helper_thread = false;
/// The most a helper thread yields before it sleeps (a blocking wait yields
/// 2 ms by default): an idle or waiting helper must not hold a core a rank
/// needs.
inline constexpr std::int64_t kHelperMaxYieldNs = 200'000;

struct WaitPolicy {
  std::int64_t spin_ns = 5'000;  // the defaults of Config (SHMRING_SPIN_US / _YIELD_US)
  std::int64_t yield_ns = 2'000'000;
  long sleep_slice_us = 10'000;  // futex sleeps this long at most between slow checks
};

/// Polls `ready()` for the policy's spin phase (none when spin_ns is 0);
/// returns whether it became true. For waits on a flag other than a
/// Counter (a line's `seq`), before they fall back to a counter's slow path.
template <class Ready>
bool spin_until(const WaitPolicy& p, Ready&& ready) {
  if (ready()) return true;
  if (p.spin_ns <= 0) return false;
  const auto start = Clock::now();
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    if ((Clock::now() - start).count() >= p.spin_ns) return ready();
  }
}

/// Waits until c.value >= target. `slow_check(start)` (`start`: when the
/// wait began, a Clock::time_point) runs every ~sleep slice of the yield
/// phase, then once as the sleep phase begins and after every sleep slice;
/// it throws to end the wait (abort, dead peer, deadline). Returns the value
/// seen.
template <class SlowCheck>
std::uint64_t wait_at_least(Counter& c, std::uint64_t target, const WaitPolicy& p,
                            SlowCheck&& slow_check) {
  std::uint64_t v = c.value.load(std::memory_order_acquire);
  if (v >= target) return v;
  const auto start = Clock::now();
  // Phase 1: spin. Checking the clock every 64 pauses keeps its cost small.
  if (p.spin_ns > 0) {
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        cpu_relax();
        v = c.value.load(std::memory_order_acquire);
        if (v >= target) return v;
      }
      if ((Clock::now() - start).count() >= p.spin_ns) break;
    }
  }
  // Phase 2: yield the core (the producer may be waiting for it).
  auto last_check = Clock::now();
  const std::int64_t yield_end = p.spin_ns + p.yield_ns;
  while ((Clock::now() - start).count() < yield_end) {
    sched_yield();
    v = c.value.load(std::memory_order_acquire);
    if (v >= target) return v;
    auto now = Clock::now();
    if (now - last_check > std::chrono::microseconds(p.sleep_slice_us)) {
      slow_check(start);
      last_check = now;
    }
  }
  // Phase 3: futex sleep, in slices so that aborts, dead peers and the
  // deadline are noticed. A check first: the wait has outlasted the spin
  // and yield phases, and a peer that answers within the first slice must
  // not leave it unnoticed (the waiter's stats and recorder head).
  slow_check(start);
  for (;;) {
    c.waiters.fetch_add(1, std::memory_order_seq_cst);
    asymmetric_fence_heavy();
    std::uint32_t gen = c.futex_gen.load(std::memory_order_seq_cst);
    v = c.value.load(std::memory_order_seq_cst);
    if (v < target) futex_wait(c.futex_gen, gen, p.sleep_slice_us);
    c.waiters.fetch_sub(1, std::memory_order_seq_cst);
    v = c.value.load(std::memory_order_acquire);
    if (v >= target) return v;
    slow_check(start);
  }
}

}  // namespace shmring::detail
