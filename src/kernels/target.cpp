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

}  // namespace shmring::detail
