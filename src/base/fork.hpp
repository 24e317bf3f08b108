#pragma once

// Fork without exec. A child forked from a rank inherits its threads' state
// but not its threads, and its descriptors with their locks: one counter of
// forks and one pthread_atfork handler serve every object that must notice
// it is a child's copy (requests, the engine, point-to-point, the segment).

#include <atomic>
#include <cstdint>

namespace shmring::detail {

/// The count of forks fork_generation() returns (fork.cpp).
extern std::atomic<unsigned> g_fork_generation;

/// Bumped in every child right after fork() (pthread_atfork): an object that
/// recorded another generation was inherited, and its threads did not come
/// along. The first call registers the handler.
unsigned fork_generation();

/// fork_generation() without the registration: for the per-call check of
/// an object whose constructor called fork_generation() (the handler is
/// registered by then), one load.
inline unsigned fork_generation_registered() {
  return g_fork_generation.load(std::memory_order_relaxed);
}

/// When this process was last forked from its parent without exec, on
/// CLOCK_REALTIME in nanoseconds, read by the child right after fork(); -1
/// if it was not forked since the library was loaded (the handler is
/// registered at load). Exact where /proc/self/stat's start time is not:
/// qemu-user reports a forked child's start as its parent's.
std::int64_t forked_at_realtime_ns();

/// Closes `fd` in every child forked from now on, right after fork (the
/// segment's descriptor: its open-file-description lock says "rank r is
/// alive", and a child must not keep it so). Registers the handler.
void track_fd(int fd);
/// Stops closing `fd` in later children (it is about to be closed).
void untrack_fd(int fd);

}  // namespace shmring::detail
