// Timeouts and startup faults: a rank that never arrives at a collective or
// never attaches, ranks in different segments (job id, host identity), rank 0
// dying while the others attach, a registered rank dying before the set is
// complete, and a segment of our name that belongs to another user. Every
// rank gets a clear error within the timeout, and nothing is left in /dev/shm.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <boost/interprocess/shared_memory_object.hpp>
#include <filesystem>
#include <thread>

#include "base/config.hpp"
#include "faults.hpp"

using namespace shmring;
using test::contains;
namespace fs = std::filesystem;

namespace {

constexpr double kTimeoutS = 1.0;

Options opts(int r, int n, const std::string& job, double timeout = kTimeoutS) {
  Options o;
  o.rank = r;
  o.world_size = n;
  o.job_id = job;
  o.timeout_s = timeout;
  o.slots = 2;
  o.slot_bytes = 4096;
  o.threads = 1;
  return o;
}

double since_s(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string shm_path(const std::string& job) {
  return "/dev/shm/" + detail::segment_name(job, detail::host_hash());
}

bool wait_for_path(const std::string& p, double seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (fs::exists(p)) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

// Forks fn in a child; returns its pid.
pid_t spawn(const std::function<void()>& fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int code = 0;
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "uncaught: %s\n", e.what());
      code = 1;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(code);
  }
  return pid;
}

int wait_status(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return test::decode_status(st);
}

}  // namespace

TEST_CASE("a rank that never arrives: the others time out naming it and the step") {
  test::FaultBoard* board = test::FaultBoard::create();
  const std::string job = test::unique_job_id("late");
  auto status = test::run_processes(3, [&](int r) {
    Communicator comm(opts(r, 3, job));
    std::vector<float> x(10000, 1.0f);
    comm.allreduce(std::span<float>(x), ReduceOp::sum);  // #0 completes
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    auto t0 = std::chrono::steady_clock::now();
    try {
      comm.allreduce(std::span<float>(x), ReduceOp::sum);  // #1: rank 2 is late
      SHMRING_CHILD_CHECK(false, "rank %d: expected a timeout", r);
    } catch (const TimeoutError& e) {
      double s = since_s(t0);
      board->note(r, e.what());
      board->noticed_ns[r] = static_cast<std::int64_t>(s * 1e9);
      SHMRING_CHILD_CHECK(contains(e.what(), "rank(s) 2 never started collective #1"),
                          "rank %d: must name rank 2: %s", r, e.what());
      SHMRING_CHILD_CHECK(contains(e.what(), " step "), "rank %d: must name the step: %s", r,
                          e.what());
      // Upper bounds with room for a scheduler stall of several hundred ms
      // (faults.hpp), still below what a wrong path would take: two
      // timeouts in a row (2 s), or rank 2 waiting for its own.
      if (r != 2)
        SHMRING_CHILD_CHECK(s >= kTimeoutS * 0.9 && s < kTimeoutS + 0.8,
                            "rank %d: took %.2f s with a %.1f s timeout", r, s, kTimeoutS);
      else
        SHMRING_CHILD_CHECK(s < kTimeoutS * 0.9, "rank 2 must fail at once when it arrives: %.2f s",
                            s);
    }
  });
  CHECK(test::all_zero(status));
  for (int r = 0; r < 3; ++r)
    std::printf("late rank: rank %d after %.3f s: %s\n", r, board->noticed_ns[r] * 1e-9,
                board->message[r]);
  test::FaultBoard::destroy(board);
  CHECK(test::shm_files_with(job).empty());
}

TEST_CASE("a rank that never attaches: the others time out naming it") {
  const std::string job = test::unique_job_id("absent");
  auto status = test::run_processes(2, [&](int r) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      Communicator comm(opts(r, 3, job));
      SHMRING_CHILD_CHECK(false, "rank %d: expected a timeout", r);
    } catch (const TimeoutError& e) {
      double s = since_s(t0);
      std::printf("absent rank: rank %d after %.3f s: %s\n", r, s, e.what());
      SHMRING_CHILD_CHECK(contains(e.what(), "missing rank(s) 2"), "rank %d: %s", r, e.what());
      SHMRING_CHILD_CHECK(s < kTimeoutS + 1.0, "rank %d: %.2f s", r, s);
    }
  });
  CHECK(test::all_zero(status));
  CHECK(test::shm_files_with(job).empty());
}

TEST_CASE("a rank that arrives after its job ran and ended is told it may be late or a duplicate") {
  const std::string job = test::unique_job_id("late-dup");
  // The job: ranks 0 and 1, one allreduce, gone.
  auto first = test::run_processes(2, [&](int r) {
    Communicator comm(opts(r, 2, job));
    int v = r + 1;
    comm.allreduce(std::span<int>(&v, 1), ReduceOp::sum);
    SHMRING_CHILD_CHECK(v == 3, "rank %d: %d", r, v);
  });
  REQUIRE(test::all_zero(first));
  // A second rank 1 of the same job (a duplicate, or a rank started late):
  // the segment is gone, and nothing is left to tell which; the message
  // says both, instead of only asking whether rank 0 runs.
  auto late = test::run_processes(1, [&](int) {
    try {
      Communicator comm(opts(1, 2, job));
      SHMRING_CHILD_CHECK(false, "expected a timeout");
    } catch (const TimeoutError& e) {
      std::printf("late rank 1: %s\n", e.what());
      SHMRING_CHILD_CHECK(contains(e.what(), "late or duplicate rank"), "%s", e.what());
    }
  });
  CHECK(test::all_zero(late));
  CHECK(test::shm_files_with(job).empty());
}

TEST_CASE("ranks in different segments (different job id) fail on every rank within the timeout") {
  const std::string job = test::unique_job_id("split");
  auto status = test::run_processes(2, [&](int r) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      Communicator comm(opts(r, 2, r == 0 ? job : job + "x"));
      int v = 1;
      comm.allreduce(std::span<int>(&v, 1), ReduceOp::sum);
      SHMRING_CHILD_CHECK(false, "rank %d: expected an error", r);
    } catch (const TimeoutError& e) {
      double s = since_s(t0);
      std::printf("different job id: rank %d after %.3f s: %s\n", r, s, e.what());
      SHMRING_CHILD_CHECK(s < kTimeoutS + 1.0, "rank %d: %.2f s", r, s);
      SHMRING_CHILD_CHECK(contains(e.what(), r == 0 ? "missing rank(s) 1" : "the creation"),
                          "rank %d: %s", r, e.what());
    }
  });
  CHECK(test::all_zero(status));
  CHECK(test::shm_files_with(job).empty());
}

TEST_CASE("ranks with different host identities fail on every rank within the timeout") {
  const std::string job = test::unique_job_id("host");
  auto status = test::run_processes(2, [&](int r) {
    if (r == 1) {
      // Another "host": a private UTS namespace with another hostname (root only).
      if (unshare(CLONE_NEWUTS) != 0 || sethostname("shmring-other-host", 18) != 0) _exit(77);
    }
    auto t0 = std::chrono::steady_clock::now();
    try {
      Communicator comm(opts(r, 2, job));
      SHMRING_CHILD_CHECK(false, "rank %d: expected an error", r);
    } catch (const TimeoutError& e) {
      double s = since_s(t0);
      std::printf("different host: rank %d after %.3f s: %s\n", r, s, e.what());
      SHMRING_CHILD_CHECK(s < kTimeoutS + 1.0, "rank %d: %.2f s", r, s);
    }
  });
  if (status[1] == 77) {
    MESSAGE("skipped: cannot unshare(CLONE_NEWUTS) here (needs root)");
    return;
  }
  CHECK(test::all_zero(status));
  CHECK(test::shm_files_with(job).empty());
}

TEST_CASE("rank 0 dying while the others attach fails them at once and leaves nothing") {
  // Rank 1 starts first and waits; rank 0 creates the segment and is killed
  // as soon as the name appears (before, during or after rank 1 attaches).
  // Rank 1's process must be older than the file: a dead creator's file
  // older than it is indistinguishable from an earlier job's stale one,
  // which it waits out to the timeout (two test cases below). Waiting for
  // rank 1 to reach its constructor, then 20 ms (two clock ticks), makes
  // sure of that on a loaded machine.
  test::SharedFlag at_ctor;
  for (int trial = 0; trial < 5; ++trial) {
    const std::string job = test::unique_job_id("r0dies");
    test::FaultBoard* board = test::FaultBoard::create();
    at_ctor.set(0);
    pid_t r1 = spawn([&] {
      try {
        at_ctor.set();
        Communicator comm(opts(1, 3, job, 30));
        SHMRING_CHILD_CHECK(false, "rank 1: expected an error");
      } catch (const PeerFailureError& e) {
        board->note(1, e.what());
        SHMRING_CHILD_CHECK(contains(e.what(), "rank 0 (pid"), "rank 1: %s", e.what());
      }
    });
    REQUIRE(at_ctor.wait_for(1, 10));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pid_t r0 = spawn([&] { Communicator comm(opts(0, 3, job, 30)); });
    REQUIRE(wait_for_path(shm_path(job), 10));
    std::this_thread::sleep_for(std::chrono::milliseconds(trial * 3));
    board->fault_ns.store(test::mono_ns());
    kill(r0, SIGKILL);
    CHECK(wait_status(r0) == 128 + SIGKILL);
    CHECK(wait_status(r1) == 0);
    double s = board->latency_s(1);
    std::printf("rank 0 killed during attach (+%d ms): rank 1 after %.3f s: %s\n", trial * 3, s,
                board->message[1]);
    CHECK(s < test::kDetectionBoundS);
    CHECK(test::shm_files_with(job).empty());
    test::FaultBoard::destroy(board);
  }
}

TEST_CASE("rank 0 dying before a slow rank 1 looked fails rank 1 at once, not at the timeout") {
  // Rank 1's process starts first, but reaches its Communicator only after
  // rank 0 created the segment and died (a loaded machine; qemu-user): the
  // file is younger than rank 1's process, so it is no earlier job's
  // leftover, and rank 1 fails at once instead of waiting out its timeout.
  const std::string job = test::unique_job_id("r0early");
  test::FaultBoard* board = test::FaultBoard::create();
  test::SharedFlag go;
  pid_t r1 = spawn([&] {
    SHMRING_CHILD_CHECK(go.wait_for(1, 30), "rank 1: never told to start");
    try {
      Communicator comm(opts(1, 2, job, 20));
      SHMRING_CHILD_CHECK(false, "rank 1: expected an error");
    } catch (const PeerFailureError& e) {
      board->note(1, e.what());
      SHMRING_CHILD_CHECK(contains(e.what(), "rank 0 (pid") && contains(e.what(), "died"),
                          "rank 1: %s", e.what());
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past rank 1's clock tick
  pid_t r0 = spawn([&] { Communicator comm(opts(0, 2, job, 30)); });
  REQUIRE(wait_for_path(shm_path(job), 10));
  kill(r0, SIGKILL);
  CHECK(wait_status(r0) == 128 + SIGKILL);
  board->fault_ns.store(test::mono_ns());
  go.set();
  CHECK(wait_status(r1) == 0);
  const double s = board->latency_s(1);
  std::printf("rank 0 died before rank 1 looked: rank 1 after %.3f s: %s\n", s, board->message[1]);
  CHECK(s >= 0);
  CHECK(s < test::kDetectionBoundS);
  CHECK(test::shm_files_with(job).empty());
  test::FaultBoard::destroy(board);
}

TEST_CASE(
    "a segment left by a rank 0 that died before the others looked is removed at the timeout") {
  const std::string job = test::unique_job_id("r0gone");
  pid_t r0 = spawn([&] { Communicator comm(opts(0, 2, job, 30)); });
  REQUIRE(wait_for_path(shm_path(job), 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(r0, SIGKILL);
  CHECK(wait_status(r0) == 128 + SIGKILL);
  CHECK(fs::exists(shm_path(job)));  // stale: nobody is left to remove it
  auto status = test::run_processes(1, [&](int) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      Communicator comm(opts(1, 2, job));
      SHMRING_CHILD_CHECK(false, "expected a timeout");
    } catch (const TimeoutError& e) {
      std::printf("stale segment at attach: rank 1 after %.3f s: %s\n", since_s(t0), e.what());
      SHMRING_CHILD_CHECK(contains(e.what(), "has been removed"), "%s", e.what());
    }
  });
  CHECK(status[0] == 0);
  CHECK(test::shm_files_with(job).empty());
}

TEST_CASE("a registered rank dying before every rank attached fails the others at once") {
  const std::string job = test::unique_job_id("regdies");
  test::FaultBoard* board = test::FaultBoard::create();
  pid_t r0 = spawn([&] {
    try {
      Communicator comm(opts(0, 3, job, 30));
      SHMRING_CHILD_CHECK(false, "rank 0: expected an error");
    } catch (const PeerFailureError& e) {
      board->note(0, e.what());
      SHMRING_CHILD_CHECK(contains(e.what(), "rank 1 (pid"), "rank 0: %s", e.what());
    }
  });
  REQUIRE(wait_for_path(shm_path(job), 10));
  // Timed from rank 1 reaching its constructor, not from the fork: a rank 1
  // killed before it registered is unknown to rank 0, which then waits for
  // its timeout (30 s) instead.
  test::SharedFlag at_ctor;
  pid_t r1 = spawn([&] {
    at_ctor.set();
    Communicator comm(opts(1, 3, job, 30));  // rank 2 never comes
  });
  REQUIRE(at_ctor.wait_for(1, 10));
  // Rank 1 has registered by then (given longer in emulated runs).
  std::this_thread::sleep_for(
      std::chrono::milliseconds(static_cast<int>(300 * test::timeout_scale())));
  board->fault_ns.store(test::mono_ns());
  kill(r1, SIGKILL);
  CHECK(wait_status(r1) == 128 + SIGKILL);
  CHECK(wait_status(r0) == 0);
  std::printf("registered rank 1 killed during startup: rank 0 after %.3f s: %s\n",
              board->latency_s(0), board->message[0]);
  CHECK(board->latency_s(0) < test::kDetectionBoundS);
  CHECK(test::shm_files_with(job).empty());
  test::FaultBoard::destroy(board);
}

TEST_CASE("another user's segment of our name is neither opened nor removed") {
  if (geteuid() != 0) {
    MESSAGE("skipped: needs root to chown a file to another uid");
    return;
  }
  const std::string job = test::unique_job_id("foreign");
  const std::string path = shm_path(job);
  {
    boost::interprocess::shared_memory_object shm(
        boost::interprocess::create_only, detail::segment_name(job, detail::host_hash()).c_str(),
        boost::interprocess::read_write, boost::interprocess::permissions(0600));
    shm.truncate(8192);
  }
  REQUIRE(chown(path.c_str(), 4242, 4242) == 0);
  auto status = test::run_processes(2, [&](int r) {
    try {
      Communicator comm(opts(r, 2, job));
      SHMRING_CHILD_CHECK(false, "rank %d: expected an error", r);
    } catch (const InvalidArgumentError& e) {
      std::printf("foreign segment: rank %d: %s\n", r, e.what());
      SHMRING_CHILD_CHECK(contains(e.what(), "belongs to uid 4242"), "rank %d: %s", r, e.what());
    }
  });
  CHECK(test::all_zero(status));
  CHECK(fs::exists(path));  // not ours to remove
  fs::remove(path);
}

// The same for a bad local rank or local world size in the launcher's
// variables (rank, world size and job id from the environment, as shmrun
// and torchrun give them): the rank knows who it is, so it tells its peers.
TEST_CASE("a bad local rank or size on one rank fails every rank at once, naming both") {
  struct Bad {
    const char* var;
    const char* value;
  };
  const Bad bads[] = {{"SHMRING_LOCAL_RANK", "banana"}, {"SHMRING_LOCAL_WORLD_SIZE", "0"}};
  for (int n : {2, 3}) {
    for (const Bad& bad : bads) {
      for (int bad_rank : {0, n - 1}) {
        CAPTURE(n);
        const std::string var = bad.var;
        CAPTURE(var);
        CAPTURE(bad_rank);
        const std::string job = test::unique_job_id("badlocal");
        auto st = test::run_processes(
            n,
            [&](int r) {
              setenv("SHMRING_TIMEOUT", "30", 1);
              setenv("SHMRING_RANK", std::to_string(r).c_str(), 1);
              setenv("SHMRING_WORLD_SIZE", std::to_string(n).c_str(), 1);
              setenv("SHMRING_JOB_ID", job.c_str(), 1);
              setenv("SHMRING_LOCAL_RANK", std::to_string(r).c_str(), 1);
              setenv("SHMRING_LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
              if (r == bad_rank) setenv(bad.var, bad.value, 1);
              const auto t0 = std::chrono::steady_clock::now();
              try {
                Communicator comm;
                SHMRING_CHILD_CHECK(false, "rank %d: started although rank %d has %s=%s", r,
                                    bad_rank, bad.var, bad.value);
              } catch (const InvalidArgumentError& e) {
                const std::string who = "rank " + std::to_string(bad_rank) + ": ";
                SHMRING_CHILD_CHECK(contains(e.what(), who) && contains(e.what(), bad.var) &&
                                        contains(e.what(), bad.value),
                                    "rank %d: the message names not all of '%s', %s, %s: %s", r,
                                    who.c_str(), bad.var, bad.value, e.what());
              } catch (const Error& e) {
                SHMRING_CHILD_CHECK(false, "rank %d: after %.1f s, not InvalidArgumentError: %s", r,
                                    since_s(t0), e.what());
              }
              SHMRING_CHILD_CHECK(since_s(t0) < 10, "rank %d: failed only after %.1f s", r,
                                  since_s(t0));
            },
            60);
        CHECK(test::all_zero(st));
        CHECK(!fs::exists(shm_path(job)));
      }
    }
  }
}

// A bad setting on one rank only: that rank cannot start, and its peers,
// who would wait for it until SHMRING_TIMEOUT (30 s here), fail within
// seconds with an error naming the rank and the variable (README, "Errors").
// Rank 0 creates the segment, so its refusal takes another path than the
// others'. In the 3-rank jobs, one good rank comes 0.3 s late and must find
// the news, not wait for a segment already gone.
TEST_CASE("a bad setting on one rank fails every rank at once, naming the rank and the variable") {
  struct Bad {
    const char* var;
    const char* value;
  };
  // An integer out of range and one that is no number, a size (read
  // outside the settings parser), an enum, a number (the deadline itself).
  const Bad bads[] = {{"SHMRING_SLOTS", "1"},
                      {"SHMRING_SLOTS", "banana"},
                      {"SHMRING_CMA_MIN_BYTES", "-5"},
                      {"SHMRING_NT_STORES", "maybe"},
                      {"SHMRING_TIMEOUT", "soon"}};
  for (int n : {2, 3}) {
    for (const Bad& bad : bads) {
      for (int bad_rank : {0, n - 1}) {
        CAPTURE(n);
        const std::string var = bad.var;
        CAPTURE(var);
        CAPTURE(bad_rank);
        const std::string job = test::unique_job_id("badset");
        const int late = n == 3 ? 1 : -1;  // a good rank either way
        auto st = test::run_processes(
            n,
            [&](int r) {
              setenv("SHMRING_TIMEOUT", "30", 1);
              if (r == bad_rank) setenv(bad.var, bad.value, 1);
              if (r == late) std::this_thread::sleep_for(std::chrono::milliseconds(300));
              Options o;
              o.rank = r;
              o.world_size = n;
              o.job_id = job;
              const auto t0 = std::chrono::steady_clock::now();
              try {
                Communicator comm(o);
                SHMRING_CHILD_CHECK(false, "rank %d: started although rank %d has %s=%s", r,
                                    bad_rank, bad.var, bad.value);
              } catch (const InvalidArgumentError& e) {
                const std::string who = "rank " + std::to_string(bad_rank) + ": ";
                SHMRING_CHILD_CHECK(contains(e.what(), who) && contains(e.what(), bad.var),
                                    "rank %d: the message names neither '%s' nor %s: %s", r,
                                    who.c_str(), bad.var, e.what());
              } catch (const Error& e) {
                SHMRING_CHILD_CHECK(false, "rank %d: after %.1f s, not InvalidArgumentError: %s", r,
                                    since_s(t0), e.what());
              }
              SHMRING_CHILD_CHECK(since_s(t0) < 10, "rank %d: failed only after %.1f s", r,
                                  since_s(t0));
            },
            60);
        CHECK(test::all_zero(st));
        CHECK(!fs::exists(shm_path(job)));
      }
    }
  }
}
