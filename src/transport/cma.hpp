#pragma once

// Cross-memory attach (process_vm_readv): one copy from another process's
// memory into ours, the kernel walking the other's page tables. Used by
// point-to-point messages (p2p.cpp) and by the staged collectives' single-copy
// round (staged.cpp). It needs ptrace access to the other process: Yama's
// ptrace_scope=1 allows only descendants unless the target called
// prctl(PR_SET_PTRACER), and seccomp filters (some containers) refuse it.

#include <tbb/task_arena.h>

#include <cstddef>
#include <cstdint>

namespace shmring::detail {

/// Reads `bytes` at address `addr` of process `pid` into `dst`, retrying
/// partial reads. Returns 0 or an errno: ESRCH (no such process), EPERM
/// (not allowed), EFAULT (a range not mapped), ENOSYS. Thread-safe.
int cma_read(int pid, std::byte* dst, std::uint64_t addr, std::uint64_t bytes);

/// cma_read split in 1 MiB reads across `arena`'s threads from 8 MiB (one
/// thread's copy rarely uses the bandwidth of two cores); on the calling
/// thread below that or without an arena. Returns 0 or one of the errnos.
int cma_read_parallel(tbb::task_arena* arena, int pid, std::byte* dst, std::uint64_t addr,
                      std::uint64_t bytes);

/// Whether `bytes` at `dst` are memory this process can write: tells, after
/// an EFAULT from cma_read, our own bad buffer from the peer's (the kernel
/// answers EFAULT for both). Overwrites the range (with zeros, 64 KiB at a
/// time); for error paths.
bool cma_local_writable(std::byte* dst, std::uint64_t bytes);

/// How much slower a process_vm_readv of 512 KiB is than a memcpy of the
/// same cache-hot bytes on this machine (their times' ratio, the fastest of
/// three each, reading this process's own memory); measured once per
/// process, on the first call (about 0.1 ms), then cached. Infinity when
/// the kernel refuses the read (seccomp). The staged collectives read
/// blocks larger than 256 KiB in one copy only where this ratio is low
/// (staged.cpp single_copy_max). Thread-safe.
double cma_copy_ratio();

/// The highest cma_copy_ratio() at which blocks past 256 KiB go in one copy.
/// Measured on two 2-core VMs, N=2 (docs/performance/notes/2026-12-01-intel-single-copy.md): where
/// the ratio was 1.7-1.9 (Intel Xeon, 2 MiB L2) one copy took alltoall and
/// allgatherv of 1-4 MiB from 1.2-1.6x Open MPI's time to its time, and
/// scatter of 2 MiB from 2x to 0.6x; where it was about 3.7 (AMD EPYC) the
/// slot rounds, two pipelined copies on two CPUs, were faster from 512 KiB.
inline constexpr double kCmaLargeMaxRatio = 2.5;

/// Bytes from which cma_read_parallel splits a read.
inline constexpr std::uint64_t kCmaParallelMinBytes = 8u << 20;

/// Lets any process of this user read us under Yama ptrace_scope=1
/// (prctl PR_SET_PTRACER_ANY); nothing elsewhere. For SHMRING_CMA=1.
void allow_cma_readers();

}  // namespace shmring::detail
