#include "base/fork.hpp"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace shmring::detail {

std::atomic<unsigned> g_fork_generation{0};

namespace {

// The handler runs in the child while every other thread of the parent is
// gone; the parent's tracked descriptors are guarded by g_fork_mutex, held
// across fork so that the child never sees a list half changed.
std::atomic<std::int64_t> g_forked_at_ns{-1};
std::mutex g_fork_mutex;
std::vector<int>& fork_fds() {
  static auto* fds = new std::vector<int>();  // never destroyed: atfork may run late
  return *fds;
}
void fork_prepare() {
  g_fork_mutex.lock();
}
void fork_parent() {
  g_fork_mutex.unlock();
}
void fork_child() {
  for (int fd : fork_fds()) ::close(fd);
  fork_fds().clear();
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);  // async-signal-safe, as is all of this handler
  g_forked_at_ns.store(std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec,
                       std::memory_order_relaxed);
  g_fork_mutex.unlock();
}

// A function-local static rather than std::call_once: fork_generation() runs
// on every collective (CommState::begin), and libstdc++'s call_once sets
// thread-locals on each call, reached through __tls_get_addr from a shared
// library; a static's guard is one load.
void register_handler() {
  static const bool registered = [] {
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    return true;
  }();
  (void)registered;
}

// Registered at load too, so that a child forked before the first
// communicator still learns when it was forked (forked_at_realtime_ns).
[[maybe_unused]] const bool g_registered_at_load = (register_handler(), true);

}  // namespace

unsigned fork_generation() {
  register_handler();
  return g_fork_generation.load(std::memory_order_relaxed);
}

std::int64_t forked_at_realtime_ns() {
  return g_forked_at_ns.load(std::memory_order_relaxed);
}

void track_fd(int fd) {
  register_handler();
  std::lock_guard<std::mutex> lock(g_fork_mutex);
  fork_fds().push_back(fd);
}

void untrack_fd(int fd) {
  std::lock_guard<std::mutex> lock(g_fork_mutex);
  auto& v = fork_fds();
  for (auto it = v.begin(); it != v.end(); ++it)
    if (*it == fd) {
      v.erase(it);
      return;
    }
}

}  // namespace shmring::detail
