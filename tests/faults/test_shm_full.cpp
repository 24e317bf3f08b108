// /dev/shm too small, for real: in a private mount namespace (root only) with
// a 16 MiB tmpfs on /dev/shm, a job asks for a 64 MiB segment (2 ranks x 4
// slots x 8 MiB). Every rank gets OutOfSharedMemoryError naming the bytes
// needed and the bytes free, at startup; nobody dies of SIGBUS, and the
// namespace's /dev/shm is empty afterwards. Skipped where unshare or mount is
// not permitted.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>

#include "faults.hpp"

using namespace shmring;

namespace {

constexpr int kSkip = 77;

// Runs fn in a child inside a fresh mount namespace with a `size` tmpfs on
// /dev/shm; returns the child's status (kSkip when the namespace is refused).
int in_small_shm(const char* size, const std::function<int()>& fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0) _exit(kSkip);
    // Private propagation first: the tmpfs must not appear outside.
    if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(kSkip);
    std::string opts = std::string("size=") + size + ",mode=1777";
    if (mount("tmpfs", "/dev/shm", "tmpfs", 0, opts.c_str()) != 0) _exit(kSkip);
    _exit(fn());
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return test::decode_status(st);
}

Options opts(int r, const std::string& job, double timeout) {
  Options o;
  o.rank = r;
  o.world_size = 2;
  o.job_id = job;
  o.slots = 4;
  o.slot_bytes = 8 << 20;
  o.timeout_s = timeout;
  o.threads = 1;
  return o;
}

}  // namespace

TEST_CASE("a 64 MiB segment on a 16 MiB /dev/shm: OutOfSharedMemoryError on every rank") {
  const std::string job = test::unique_job_id("full");
  int st = in_small_shm("16m", [&] {
    auto status = test::run_processes(2, [&](int r) {
      auto t0 = std::chrono::steady_clock::now();
      try {
        Communicator c(opts(r, job, 30));
        SHMRING_CHILD_CHECK(false, "rank %d: expected OutOfSharedMemoryError", r);
      } catch (const OutOfSharedMemoryError& e) {
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("/dev/shm 16 MiB, 64 MiB asked: rank %d after %.3f s: %s\n", r, s, e.what());
        std::string m = e.what();
        SHMRING_CHILD_CHECK(m.find("needs 67") != std::string::npos, "rank %d: %s", r, e.what());
        SHMRING_CHILD_CHECK(m.find("bytes free") != std::string::npos, "rank %d: %s", r, e.what());
        SHMRING_CHILD_CHECK(s < 5, "rank %d: %.2f s", r, s);
      }
    });
    for (int r = 0; r < 2; ++r)
      if (status[r] != 0) {
        std::fprintf(stderr, "rank %d status %d%s\n", r, status[r],
                     status[r] == 128 + SIGBUS ? " (SIGBUS)" : "");
        return 1;
      }
    auto left = test::shm_files_with("shmring-");
    if (!left.empty()) {
      std::fprintf(stderr, "left in /dev/shm: %s\n", left[0].c_str());
      return 2;
    }
    return 0;
  });
  if (st == kSkip) {
    MESSAGE("skipped: unshare(CLONE_NEWNS) or mount not permitted here (needs root)");
    return;
  }
  CHECK(st == 0);
}

TEST_CASE("a /dev/shm too full even for the header: a clear error, still no SIGBUS") {
  const std::string job = test::unique_job_id("full0");
  int st = in_small_shm("1m", [&] {
    // Fill the tmpfs so that not even one header page is free.
    int fd = open("/dev/shm/filler", O_CREAT | O_RDWR, 0600);
    off_t len = 1 << 20;
    while (len > 0 && posix_fallocate(fd, 0, len) != 0) len -= 4096;
    close(fd);
    auto status = test::run_processes(2, [&](int r) {
      auto t0 = std::chrono::steady_clock::now();
      try {
        Communicator c(opts(r, job, 1));
        SHMRING_CHILD_CHECK(false, "rank %d: expected an error", r);
      } catch (const Error& e) {
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("/dev/shm full: rank %d after %.3f s (%s): %s\n", r, s,
                    std::string(to_string(e.code())).c_str(), e.what());
        if (r == 0)
          SHMRING_CHILD_CHECK(e.code() == ErrorCode::out_of_shared_memory, "rank 0: %s", e.what());
      }
    });
    unlink("/dev/shm/filler");
    for (int r = 0; r < 2; ++r)
      if (status[r] != 0) return 1;
    return test::shm_files_with("shmring-").empty() ? 0 : 2;
  });
  if (st == kSkip) {
    MESSAGE("skipped: unshare(CLONE_NEWNS) or mount not permitted here (needs root)");
    return;
  }
  CHECK(st == 0);
}
