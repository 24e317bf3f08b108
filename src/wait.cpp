#include "wait.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

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

}  // namespace shmring::detail
