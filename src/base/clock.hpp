#pragma once

// Clocks for the per-call bookkeeping (flight recorder, stats(), traces).
// mono_ns() is CLOCK_MONOTONIC through the vDSO: 25-50 ns a read on a VM
// with kvm-clock, and every collective reads it twice, which is a tenth of
// an 8-byte allreduce at N=2. FastClock reads the CPU's invariant cycle
// counter (x86 TSC, Arm's virtual counter: 5-20 ns) and converts it to the
// CLOCK_MONOTONIC timeline, re-anchoring on the real clock every few ms
// (docs/design/recorder.md, "Cost").

#include <cstdint>
#include <ctime>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace shmring::detail {

/// CLOCK_MONOTONIC in ns: comparable between the processes of a host.
inline std::uint64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

/// True where the cycle counter ticks at a constant rate through frequency
/// changes and idle states, the same on every CPU (x86: the kernel's
/// constant_tsc and nonstop_tsc flags; AArch64: always). Read once.
bool cycle_counter_usable();

/// The raw cycle counter (unscaled); meaningful only where usable.
inline std::uint64_t cycle_counter() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#elif defined(__aarch64__)
  std::uint64_t v;
  asm volatile("mrs %0, cntvct_el0" : "=r"(v));
  return v;
#else
  return 0;
#endif
}

/// CLOCK_MONOTONIC ns read through the cycle counter: within about a
/// microsecond of mono_ns() (a rate measured once per process, refined at
/// each re-anchor, about every 4 ms), never going back between two calls.
/// Falls back to mono_ns() where the counter is not usable.
///
/// Thread safety: none; one instance per thread of use (a communicator's
/// running thread: begin and end run one call at a time).
class FastClock {
 public:
  std::uint64_t now() {
    const std::uint64_t t = cycle_counter();
    if (t - tick0_ >= span_) return reanchor(t);
    std::uint64_t ns = ns0_ + static_cast<std::uint64_t>(static_cast<double>(t - tick0_) * rate_);
    if (ns < last_) ns = last_;
    last_ = ns;
    return ns;
  }

 private:
  std::uint64_t reanchor(std::uint64_t t);
  std::uint64_t tick0_ = 0, ns0_ = 0, span_ = 0, last_ = 0;
  std::uint64_t first_tick_ = 0, first_ns_ = 0;
  double rate_ = 0;  // ns per tick
};

}  // namespace shmring::detail
