#pragma once

// Multi-process test harness: fork real processes, one per rank, and check
// their exit codes (as Gloo's tests do). A child reports a failure on stderr
// and exits non-zero; the parent's doctest CHECKs see the statuses.

#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "shmring/shmring.hpp"

namespace shmring::test {

/// A job id no other test (or run) shares: the run's tag (SHMRING_TEST_TAG,
/// set by tools/check so that its leak check sees only its own run), the
/// test's tag, pid, a counter and a random part.
inline std::string unique_job_id(const std::string& tag) {
  static std::atomic<int> counter{0};
  std::random_device rd;
  const char* run = std::getenv("SHMRING_TEST_TAG");
  return "t-" + std::string(run ? run : "") + tag + "-" + std::to_string(getpid()) + "-" +
         std::to_string(counter++) + "-" + std::to_string(rd() % 100000);
}

/// Exit status as a shell shows it: the code, or 128 + signal.
inline int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

/// Fails the current child: message on stderr, exit 1.
#define SHMRING_CHILD_CHECK(cond, ...)                                                    \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: child check failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                  \
      std::fprintf(stderr, "\n");                                                         \
      std::fflush(stderr);                                                                \
      _exit(1);                                                                           \
    }                                                                                     \
  } while (0)

/// Runs fn(rank) in `n` forked processes and returns their exit statuses.
/// A child exits 0 when fn returns, 1 when it throws (message on stderr).
/// Children still running after `timeout_s` are SIGKILLed (status 137).
/// How much slower than native the tests run: SHMRING_TEST_TIMEOUT_SCALE
/// (tools/check --cross sets 4 for qemu-user, as meson's
/// --timeout-multiplier there), at least 1.
inline double timeout_scale() {
  const char* scale = std::getenv("SHMRING_TEST_TIMEOUT_SCALE");
  return scale ? std::max(1.0, std::atof(scale)) : 1.0;
}

inline std::vector<int> run_processes(int n, const std::function<void(int)>& fn,
                                      double timeout_s = 120) {
  timeout_s *= timeout_scale();  // every job's limit, in emulated runs
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(n);
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: uncaught exception: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);  // not exit(): the parent's doctest state must not run twice
    }
    pids[r] = pid;
  }
  std::vector<int> status(n, -1);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (status[r] != -1) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = decode_status(st);
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "run_processes: timeout after %.0f s, killing the ranks\n", timeout_s);
      for (int r = 0; r < n; ++r)
        if (status[r] == -1) kill(pids[r], SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return status;
}

/// A word shared by the processes forked after it is made. A rank sets it
/// on reaching a point; another waits for it there. Use it, not a sleep,
/// wherever a test's outcome needs one rank to have got somewhere first:
/// under qemu-user and on a loaded machine a rank can be seconds late.
class SharedFlag {
 public:
  SharedFlag() {
    void* p = mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("SharedFlag: mmap failed");
    word_ = new (p) std::atomic<int>(0);
  }
  ~SharedFlag() { munmap(word_, sizeof(std::atomic<int>)); }
  SharedFlag(const SharedFlag&) = delete;
  SharedFlag& operator=(const SharedFlag&) = delete;

  void set(int value = 1) { word_->store(value, std::memory_order_release); }
  int get() const { return word_->load(std::memory_order_acquire); }
  /// Waits until the word is at least `value`; false after `timeout_s`
  /// (times timeout_scale()).
  bool wait_for(int value = 1, double timeout_s = 30) const {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(timeout_s * timeout_scale());
    while (get() < value) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

 private:
  std::atomic<int>* word_ = nullptr;
};

/// Waits until process `pid` is gone or a zombie (its memory released):
/// false after `timeout_s` (times timeout_scale()).
inline bool wait_until_dead(pid_t pid, double timeout_s = 30) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s * timeout_scale());
  const std::string stat = "/proc/" + std::to_string(pid) + "/stat";
  while (std::chrono::steady_clock::now() < deadline) {
    std::FILE* f = std::fopen(stat.c_str(), "r");
    if (f == nullptr) return true;
    char state = '?';
    // "pid (comm) S ...": the state follows the last ')'.
    char line[512] = {};
    const std::size_t n = std::fread(line, 1, sizeof line - 1, f);
    std::fclose(f);
    if (const char* close = std::strrchr(line, ')'); close && close + 2 < line + n)
      state = close[2];
    if (state == 'Z' || state == 'X') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

/// Runs fn(comm) on `n` ranks of a fresh communicator; returns exit statuses.
inline std::vector<int> run_ranks(int n, const std::function<void(Communicator&)>& fn,
                                  double timeout_s = 120, Options base = {}) {
  const std::string job = unique_job_id("job");
  return run_processes(
      n,
      [&](int r) {
        Options o = base;
        o.rank = r;
        o.world_size = n;
        o.job_id = job;
        Communicator comm(o);
        fn(comm);
      },
      timeout_s);
}

/// Whether one process may read a sibling's memory here (no Yama
/// ptrace_scope=1, no seccomp filter refusing process_vm_readv): what the
/// staged collectives' single-copy round needs. Tests that only hold on
/// that round skip without it.
inline bool sibling_reads_work() {
  static std::uint64_t word = 0x5eed;
  pid_t target = fork();
  if (target == 0) {
    pause();
    _exit(0);
  }
  pid_t reader = fork();
  if (reader == 0) {
    std::uint64_t seen = 0;
    struct iovec local {
      &seen, sizeof seen
    };
    struct iovec remote {
      &word, sizeof word
    };
    const bool ok =
        process_vm_readv(target, &local, 1, &remote, 1, 0) == sizeof seen && seen == word;
    _exit(ok ? 0 : 1);
  }
  int st = 0;
  waitpid(reader, &st, 0);
  kill(target, SIGKILL);
  waitpid(target, nullptr, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

inline bool all_zero(const std::vector<int>& v) {
  for (int s : v)
    if (s != 0) return false;
  return true;
}

}  // namespace shmring::test
