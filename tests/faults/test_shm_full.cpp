// /dev/shm too small, for real: in a private mount namespace (root only) with
// a 16 MiB tmpfs on /dev/shm, a job asks for a 64 MiB segment (2 ranks x 4
// slots x 8 MiB); with a container's 64 MiB, 64 ranks at the default sizes.
// Every rank gets OutOfSharedMemoryError naming the bytes needed and free,
// each part of the segment with what sets it (the point-to-point queues have
// no setting), and what to change in Docker or Kubernetes, at startup; nobody
// dies of SIGBUS, and the namespace's /dev/shm is empty afterwards. Skipped
// where unshare or mount is not permitted.

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

// The parts of the message every rank must see (the others get rank 0's
// through the segment header, so it must arrive whole).
void check_full_message(int r, const std::string& m, const std::vector<std::string>& words) {
  for (const char* w :
       {"rank 0: cannot reserve", "SHMRING_SLOTS", "SHMRING_SLOT_BYTES", "SHMRING_DIRECT_BYTES",
        "point-to-point queues", "no setting",
        "docker run --shm-size=", "emptyDir volume with medium: Memory", "mounted at /dev/shm"})
    SHMRING_CHILD_CHECK(m.find(w) != std::string::npos, "rank %d: no '%s' in: %s", r, w, m.c_str());
  for (const std::string& w : words)
    SHMRING_CHILD_CHECK(m.find(w) != std::string::npos, "rank %d: no '%s' in: %s", r, w.c_str(),
                        m.c_str());
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
        // 2 x 4 x 8 MiB of slots; 2 x 2 x 64 KiB direct; 2 x 192 KiB + 4 x
        // 1 KiB of point-to-point queues.
        check_full_message(r, e.what(),
                           {"needs 67", "bytes (16.0 MiB) free",
                            "ring slots 64.0 MiB (2 ranks x 4 x 8388608 bytes",
                            "(2 x 2 x 65536 bytes; SHMRING_DIRECT_BYTES)",
                            "(1 KiB x ranks^2 + 192 KiB x ranks; no setting)"});
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

TEST_CASE("64 ranks at the default sizes on a container's 64 MiB /dev/shm: every part named") {
  const std::string job = test::unique_job_id("full64");
  constexpr int kRanks = 64;
  int st = in_small_shm("64m", [&] {
    auto status = test::run_processes(kRanks, [&](int r) {
      Options o;
      o.rank = r;
      o.world_size = kRanks;
      o.job_id = job;
      o.timeout_s = 60;
      o.threads = 1;
      o.slots = 4;
      o.slot_bytes = 256 * 1024;
      try {
        Communicator c(o);
        SHMRING_CHILD_CHECK(false, "rank %d: expected OutOfSharedMemoryError", r);
      } catch (const OutOfSharedMemoryError& e) {
        if (r == 0 || r == kRanks - 1)
          std::printf("/dev/shm 64 MiB, 64 ranks: rank %d: %s\n", r, e.what());
        // The point-to-point queues (16.0 MiB here) are no part of the
        // slots that SHMRING_SLOTS and SHMRING_SLOT_BYTES shrink.
        check_full_message(
            r, e.what(),
            {"ring slots 64.0 MiB (64 ranks x 4 x 262144 bytes",
             "direct buffers 8.0 MiB (64 x 2 x 65536 bytes", "point-to-point queues 16.0 MiB"});
      }
    });
    for (int r = 0; r < kRanks; ++r)
      if (status[r] != 0) {
        std::fprintf(stderr, "rank %d status %d\n", r, status[r]);
        return 1;
      }
    return test::shm_files_with("shmring-").empty() ? 0 : 2;
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
