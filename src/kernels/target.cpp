#include "kernels/target.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

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
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!cpu_is_amd() || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    // The family as CPUID leaf 1 gives it: the base family, plus the
    // extended family when the base one is 0xf (AMD's 17h and later).
    unsigned family = (eax >> 8) & 0xf;
    if (family == 0xf) family += (eax >> 20) & 0xff;
    __builtin_cpu_init();
    return family == 0x19 && __builtin_cpu_supports("avx512f");  // Zen 3 lacks AVX-512
  }();
  return zen4;
#else
  return false;
#endif
}

}  // namespace shmring::detail
