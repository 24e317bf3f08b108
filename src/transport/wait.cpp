#include "transport/wait.hpp"

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

#include "base/config.hpp"

namespace shmring::detail {

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, long timeout_us) {
  struct timespec ts;
  ts.tv_sec = timeout_us / 1'000'000;
  ts.tv_nsec = (timeout_us % 1'000'000) * 1000;
  // FUTEX_WAIT, not FUTEX_WAIT_PRIVATE: the word is shared between processes.
  // EAGAIN (value changed), EINTR and ETIMEDOUT all just return to the caller,
  // which re-checks its condition.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr,
          0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

bool register_asymmetric_fence() {
  if (settings::integer("SHMRING_MEMBARRIER").value_or(1) == 0) return false;
  const long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (cmds < 0 || !(cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED)) return false;
  return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0 &&
         syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0;
}

void asymmetric_fence_heavy() {
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) != 0)
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace shmring::detail
