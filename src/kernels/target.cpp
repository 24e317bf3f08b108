#include "kernels/target.hpp"

#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_SVE
#define HWCAP_SVE (1UL << 22)  // asm/hwcap.h, Linux 4.15
#endif
#endif

namespace shmring::detail {

bool sve_available() {
#if defined(__aarch64__)
  static const bool yes = (getauxval(AT_HWCAP) & HWCAP_SVE) != 0;
  return yes;
#else
  return false;
#endif
}

bool cpu_is_amd() {
#if defined(__x86_64__)
  static const bool amd = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") != 0;
  }();
  return amd;
#else
  return false;
#endif
}

bool cpu_is_zen4() {
#if defined(__x86_64__)
  static const bool zen4 = [] {
    __builtin_cpu_init();
    // Family 19h is Zen 3 and Zen 4; of the two only Zen 4 has AVX-512.
    return __builtin_cpu_is("amdfam19h") && __builtin_cpu_supports("avx512f");
  }();
  return zen4;
#else
  return false;
#endif
}

}  // namespace shmring::detail
