#include "base/clock.hpp"

#include <algorithm>
#include <fstream>
#include <string>

namespace shmring::detail {

namespace {

bool counter_flags() {
#if defined(__x86_64__) || defined(__i386__)
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0)
      return line.find(" constant_tsc") != std::string::npos &&
             line.find(" nonstop_tsc") != std::string::npos;
  return false;
#elif defined(__aarch64__)
  return true;
#else
  return false;
#endif
}

/// ns per tick, measured once per process over about 0.5 ms of the real
/// clock (a relative error near 1e-4, which the re-anchoring keeps to well
/// under a microsecond until the long-baseline rate takes over).
double initial_rate() {
#if defined(__aarch64__)
  std::uint64_t freq;
  asm volatile("mrs %0, cntfrq_el0" : "=r"(freq));
  if (freq != 0) return 1e9 / static_cast<double>(freq);
#endif
  const std::uint64_t n0 = mono_ns(), t0 = cycle_counter();
  std::uint64_t n1 = n0, t1 = t0;
  while (n1 - n0 < 500000) {
    n1 = mono_ns();
    t1 = cycle_counter();
  }
  return t1 > t0 ? static_cast<double>(n1 - n0) / static_cast<double>(t1 - t0) : 0.0;
}

}  // namespace

bool cycle_counter_usable() {
  static const bool usable = counter_flags();
  return usable;
}

std::uint64_t FastClock::reanchor(std::uint64_t t) {
  const std::uint64_t ns = std::max(mono_ns(), last_);
  last_ = ns;
  if (!cycle_counter_usable()) return ns;  // span_ stays 0: every call reads the real clock
  if (first_ns_ == 0) {
    static const double rate = initial_rate();
    if (rate <= 0) return ns;
    rate_ = rate;
    first_tick_ = t;
    first_ns_ = ns;
  } else if (ns - first_ns_ > 50000000 && t > first_tick_) {
    // Long baseline: the rate's error shrinks as the run goes on.
    rate_ = static_cast<double>(ns - first_ns_) / static_cast<double>(t - first_tick_);
  }
  tick0_ = t;
  ns0_ = ns;
  span_ = static_cast<std::uint64_t>(4e6 / rate_);  // about 4 ms
  return ns;
}

}  // namespace shmring::detail
