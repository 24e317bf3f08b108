#pragma once

// Which instruction sets the kernels are compiled for, in one place, so
// that every kernel file uses the same mechanism. Kernels are plain C++
// loops that the compiler vectorises for each target; intrinsics appear only
// inside blocks for one architecture (#if defined(__x86_64__), or
// __aarch64__ in kernels/wide_neon.cpp).
//
// SHMRING_TARGET_CLONES, written before a kernel's definition:
//   x86-64  GCC target_clones: x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA,
//           F16C) and the SSE2 baseline; the loader picks one (ifunc).
//   else    nothing: the loop is vectorised for the target's baseline, NEON
//           on AArch64 (every AArch64 CPU has it). GCC 12 (Debian 12) cannot
//           clone for AArch64 ("target does not support function version
//           dispatcher"; function multiversioning there came with GCC 14),
//           so SVE is reached another way (below).
//   ASan/TSan builds: nothing (ifunc resolvers run before their runtimes).
//
// SVE on AArch64: src/meson.build compiles each kernel file a second time
// with -march=armv8.2-a+sve and -DSHMRING_KERNEL_COPY_SVE, which puts that
// copy's definitions in namespace shmring::detail::sve
// (SHMRING_KERNELS_BEGIN / SHMRING_KERNELS_END around the file's contents).
// The baseline copy's entry point forwards to the SVE copy when
// sve_available() says the CPU has SVE (SHMRING_DISPATCH_SVE). The loops are
// the same C++ with -ffp-contract=off, so both copies give the same bits.

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define SHMRING_TARGET_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SHMRING_TARGET_CLONES
#endif

#if defined(SHMRING_KERNEL_COPY_SVE)
#define SHMRING_KERNELS_BEGIN namespace sve {
#define SHMRING_KERNELS_END }
#else
#define SHMRING_KERNELS_BEGIN
#define SHMRING_KERNELS_END
#endif

// Set in the baseline copy when an SVE copy is linked beside it.
#if defined(__aarch64__) && defined(SHMRING_HAVE_SVE_COPY) && !defined(SHMRING_KERNEL_COPY_SVE)
#define SHMRING_DISPATCH_SVE 1
#endif

namespace shmring::detail {

/// Whether this CPU (and kernel) runs SVE instructions: AT_HWCAP's SVE bit
/// on AArch64 Linux, false elsewhere. Cached after the first call.
bool sve_available();

/// Whether this is an AMD x86 CPU (`__builtin_cpu_is("amd")`), for the
/// choices measured only there; false elsewhere. Cached after the first call.
bool cpu_is_amd();

/// Whether this is an AMD Zen 4 core (family 19h with AVX-512): it runs a
/// 512-bit instruction as two 256-bit halves, so some conversions cost more
/// than twice their 256-bit forms there; Zen 5 (family 1Ah) and Intel's
/// AVX-512 cores run them at full width. False elsewhere. Cached after the
/// first call.
bool cpu_is_zen4();

}  // namespace shmring::detail
