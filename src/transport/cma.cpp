// Cross-memory attach reads (cma.hpp).

#include "transport/cma.hpp"

#include <sys/prctl.h>
#include <sys/uio.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>

namespace shmring::detail {

int cma_read(int pid, std::byte* dst, std::uint64_t addr, std::uint64_t bytes) {
  std::uint64_t done = 0;
  while (done < bytes) {
    struct iovec local {
      dst + done, static_cast<std::size_t>(bytes - done)
    };
    struct iovec remote {
      reinterpret_cast<void*>(addr + done), static_cast<std::size_t>(bytes - done)
    };
    ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    done += static_cast<std::uint64_t>(n);
  }
  return 0;
}

bool cma_local_writable(std::byte* dst, std::uint64_t bytes) {
  // Reads a scratch buffer of our own into each part of the range: only the
  // local side (a plain copy to user memory, as memcpy would write) is
  // tested, not whether the kernel can pin the range as a remote side. The
  // bytes written are overwritten later by the caller's data or error.
  static const std::byte scratch[64 * 1024] = {};
  const auto self = static_cast<int>(getpid());
  for (std::uint64_t done = 0; done < bytes; done += sizeof scratch) {
    const std::uint64_t n = std::min<std::uint64_t>(sizeof scratch, bytes - done);
    if (cma_read(self, dst + done, reinterpret_cast<std::uint64_t>(scratch), n) == EFAULT)
      return false;
  }
  return true;
}

// On the 2-core VM, 2 threads gave 9.2 GB/s at 16 and 64 MiB against 4.5-4.7
// with one (Open MPI, one copy by one thread: 4.5-5.0); at 4 MiB they were no
// faster (9.0-9.4 vs 9.6-10.1), hence kCmaParallelMinBytes = 8 MiB.
constexpr std::uint64_t kCmaGrainBytes = 1u << 20;

int cma_read_parallel(tbb::task_arena* arena, int pid, std::byte* dst, std::uint64_t addr,
                      std::uint64_t bytes) {
  if (arena == nullptr || arena->max_concurrency() < 2 || bytes < kCmaParallelMinBytes)
    return cma_read(pid, dst, addr, bytes);
  std::atomic<int> error{0};
  arena->execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::uint64_t>(0, bytes, kCmaGrainBytes),
        [&](const tbb::blocked_range<std::uint64_t>& r) {
          if (int e = cma_read(pid, dst + r.begin(), addr + r.begin(), r.size()); e != 0)
            error.store(e, std::memory_order_relaxed);
        },
        tbb::static_partitioner());
  });
  return error.load(std::memory_order_relaxed);
}

namespace {

double measure_cma_copy_ratio() {
  constexpr std::size_t kBytes = 512 * 1024;
  auto src = std::make_unique<std::byte[]>(kBytes);
  auto dst = std::make_unique<std::byte[]>(kBytes);
  std::memset(src.get(), 1, kBytes);  // touch both: no page faults timed
  std::memset(dst.get(), 2, kBytes);
  const auto self = static_cast<int>(getpid());
  const auto from = reinterpret_cast<std::uint64_t>(src.get());
  using clock = std::chrono::steady_clock;
  double cma = std::numeric_limits<double>::infinity(), copy = cma;
  // The first of four runs of each warms the caches and is not counted;
  // the fastest of the others is kept (a run that was preempted is slower,
  // never faster).
  for (int i = 0; i < 4; ++i) {
    const auto t0 = clock::now();
    if (cma_read(self, dst.get(), from, kBytes) != 0)
      return std::numeric_limits<double>::infinity();
    const auto t1 = clock::now();
    std::memcpy(dst.get(), src.get(), kBytes);
    asm volatile("" : : "r"(dst.get()) : "memory");  // the copy is not dead, and stays here
    const auto t2 = clock::now();
    if (i == 0) continue;
    cma = std::min(cma, std::chrono::duration<double>(t1 - t0).count());
    copy = std::min(copy, std::chrono::duration<double>(t2 - t1).count());
  }
  return cma / std::max(copy, 1e-9);
}

}  // namespace

double cma_copy_ratio() {
  static const double ratio = measure_cma_copy_ratio();
  return ratio;
}

void allow_cma_readers() {
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if (yama >> scope && scope == 1) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

}  // namespace shmring::detail
