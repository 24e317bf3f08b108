#pragma once

// Two processes for the floor tools (line_floor, allreduce_floor): a fork
// that shares one anonymous mapping, each side optionally pinned to one of
// the first two CPUs of the affinity mask, and a handshake through that
// mapping so that neither starts before both are in place.

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <string>
#include <utility>

namespace shmring::bench {

/// What the two processes share besides the tool's own data: put one at the
/// start of the mapping's object.
struct PairStart {
  std::atomic<int> ready{0};   // processes pinned and in place
  std::atomic<int> failed{0};  // a process could not pin itself
};

/// The first two CPUs of the calling process's affinity mask, or -1s.
inline std::pair<int, int> first_two_cpus() {
  cpu_set_t mask;
  std::pair<int, int> cpus{-1, -1};
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    if (cpus.first < 0) {
      cpus.first = cpu;
    } else {
      cpus.second = cpu;
      break;
    }
  }
  return cpus;
}

/// A MAP_SHARED anonymous mapping of `bytes`, or nullptr (after perror).
inline void* shared_mapping(std::size_t bytes, const char* tool) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p != MAP_FAILED) return p;
  std::perror(tool);
  return nullptr;
}

/// The side of a started pair: `me` is 0 in the parent, 1 in the child.
struct PairSide {
  int me = -1;  // -1: the pair could not start (a message was printed)
  pid_t child = 0;
};

/// Forks; with bind "core" pins process 0 and 1 to the first and second
/// CPUs of the mask. Both sides return once both are in place; on failure
/// the child exits 1 and the parent returns me = -1 (after reaping it).
inline PairSide start_pair(PairStart& start, const std::string& bind, const char* tool) {
  const auto [cpu0, cpu1] = first_two_cpus();
  if (bind == "core" && cpu1 < 0) {
    std::fprintf(stderr, "%s: --bind-to core needs 2 CPUs in the affinity mask\n", tool);
    return {};
  }
  const pid_t child = fork();
  if (child < 0) {
    std::perror(tool);
    return {};
  }
  const int me = child == 0 ? 1 : 0;
  if (bind == "core") {
    const int cpu = me == 0 ? cpu0 : cpu1;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) {
      std::fprintf(stderr, "%s: cannot pin process %d to CPU %d\n", tool, me, cpu);
      start.failed.store(1);
    }
  }
  start.ready.fetch_add(1);
  while (start.ready.load() < 2) {
  }
  if (start.failed.load() != 0) {
    if (child == 0) _exit(1);
    waitpid(child, nullptr, 0);
    return {};
  }
  return {me, child};
}

/// Ends the pair: the child exits (status `status`); the parent reaps it
/// and returns whether both succeeded.
inline bool finish_pair(const PairSide& side, int status, const char* tool) {
  if (side.me == 1) _exit(status);
  int child_status = 0;
  waitpid(side.child, &child_status, 0);
  if (!WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0) {
    std::fprintf(stderr, "%s: the second process failed\n", tool);
    return false;
  }
  return status == 0;
}

}  // namespace shmring::bench
