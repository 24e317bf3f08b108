// Rendezvous and segment life cycle: mode 0600, the name carries uid, job id
// and host, it is unlinked once every rank attached, stale segments are
// replaced, live collisions refused; configuration from the environment.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>

#include <sched.h>
#include <sys/stat.h>

#include <boost/interprocess/shared_memory_object.hpp>
#include <filesystem>
#include <thread>

#include "base/config.hpp"
#include "harness.hpp"
#include "transport/segment.hpp"
#include "transport/segment_parts.hpp"

using namespace shmring;
namespace fs = std::filesystem;

namespace {
std::string shm_path(const std::string& job) {
  return "/dev/shm/" + detail::segment_name(job, detail::host_hash());
}
bool wait_for_path(const std::string& p, bool present, double seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (fs::exists(p) == present) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return fs::exists(p) == present;
}
// Options naming rank r of an n-rank job.
Options rank_options(int r, int n, const std::string& job) {
  Options o;
  o.rank = r;
  o.world_size = n;
  o.job_id = job;
  return o;
}
}  // namespace

TEST_CASE("the segment is created 0600 under a name with uid, job id and host, then unlinked") {
  const std::string job = test::unique_job_id("mode");
  const std::string path = shm_path(job);
  CHECK(path.find("shmring-" + std::to_string(getuid()) + "-" + job + "-") != std::string::npos);
  // Rank 0 alone: it creates the segment and waits for rank 1.
  pid_t r0 = fork();
  if (r0 == 0) {
    try {
      Communicator c(0, 2, job);
      int x = 1;
      c.allreduce(std::span<int>(&x, 1), ReduceOp::sum);
      _exit(x == 2 ? 0 : 3);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      _exit(1);
    }
  }
  REQUIRE(wait_for_path(path, true, 20));
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(st.st_uid == getuid());
  auto status = test::run_processes(1, [&](int) {
    Communicator c(1, 2, job);
    int x = 1;
    c.allreduce(std::span<int>(&x, 1), ReduceOp::sum);
    SHMRING_CHILD_CHECK(x == 2, "x=%d", x);
  });
  int st0 = 0;
  waitpid(r0, &st0, 0);
  CHECK(test::decode_status(st0) == 0);
  CHECK(status[0] == 0);
  CHECK_FALSE(fs::exists(path));  // unlinked once both attached
}

TEST_CASE("a stale segment whose creator died is replaced") {
  const std::string job = test::unique_job_id("stale");
  const std::string name = detail::segment_name(job, detail::host_hash());
  {
    // A leftover of a crashed job: exists, holds no creator lock.
    boost::interprocess::shared_memory_object shm(boost::interprocess::create_only, name.c_str(),
                                                  boost::interprocess::read_write);
    shm.truncate(8192);
  }
  REQUIRE(fs::exists("/dev/shm/" + name));
  auto status = test::run_processes(2, [&](int r) {
    Communicator c(r, 2, job);
    int x = r + 1;
    c.allreduce(std::span<int>(&x, 1), ReduceOp::sum);
    SHMRING_CHILD_CHECK(x == 3, "x=%d", x);
  });
  CHECK(test::all_zero(status));
  CHECK_FALSE(fs::exists("/dev/shm/" + name));
  boost::interprocess::shared_memory_object::remove(name.c_str());  // even if the above failed
}

TEST_CASE("process_start_realtime_ns: when this process was forked or started") {
  const std::int64_t before = detail::realtime_ns();
  // This test process was not forked: /proc's start time, rounded up a tick.
  const std::int64_t tick_ns = 1'000'000'000 / sysconf(_SC_CLK_TCK);
  const std::int64_t self = detail::process_start_realtime_ns();
  CHECK(self > 0);
  CHECK(self <= before + tick_ns);
  CHECK(before - self < std::int64_t{3600} * 1'000'000'000);  // not the boot time
  // A forked child: the fork handler's time, exact.
  auto status = test::run_processes(1, [&](int) {
    const std::int64_t started = detail::process_start_realtime_ns();
    const std::int64_t now = detail::realtime_ns();
    SHMRING_CHILD_CHECK(started >= before && started <= now,
                        "forked after %lld, now %lld: started %lld", static_cast<long long>(before),
                        static_cast<long long>(now), static_cast<long long>(started));
  });
  CHECK(test::all_zero(status));
}

TEST_CASE("a second rank 0 is a collision: both fail at once, naming the duplicate rank") {
  const std::string job = test::unique_job_id("collide");
  const std::string path = shm_path(job);
  pid_t holder = fork();
  if (holder == 0) {
    try {
      Options o = rank_options(0, 2, job);
      o.timeout_s = 5;
      Communicator c(o);  // waits for rank 1, until the second rank 0 aborts the job
    } catch (const InvalidArgumentError& e) {
      _exit(std::string(e.what()).find("claim rank 0") != std::string::npos ? 0 : 4);
    } catch (...) {
      _exit(2);
    }
    _exit(3);
  }
  REQUIRE(wait_for_path(path, true, 20));
  auto status = test::run_processes(1, [&](int) {
    bool collided = false;
    try {
      Communicator c(0, 2, job);
    } catch (const InvalidArgumentError& e) {
      collided = std::string(e.what()).find("two processes claim rank 0") != std::string::npos;
      std::fprintf(stderr, "(expected) %s\n", e.what());
    }
    SHMRING_CHILD_CHECK(collided, "a second rank 0 must get a collision error");
  });
  CHECK(status[0] == 0);
  int st = 0;
  waitpid(holder, &st, 0);
  CHECK(test::decode_status(st) == 0);  // the holder failed with the same diagnosis...
  CHECK_FALSE(fs::exists(path));        // ...and removed its segment
}

TEST_CASE("ranks adopt rank 0's slot settings; the resolved config is reported") {
  const std::string job = test::unique_job_id("adopt");
  auto status = test::run_processes(2, [&](int r) {
    Options o = rank_options(r, 2, job);
    o.slots = r == 0 ? 3 : 5;
    o.slot_bytes = r == 0 ? 8192 : 4096;
    Communicator c(o);
    SHMRING_CHILD_CHECK(c.config().slots == 3 && c.config().slot_bytes == 8192,
                        "rank %d uses %zu x %zu", r, c.config().slots, c.config().slot_bytes);
    std::vector<float> x(10000, 1.0f);
    c.allreduce(std::span<float>(x), ReduceOp::sum);
    SHMRING_CHILD_CHECK(x[9999] == 2.0f, "x=%g", x[9999]);
  });
  CHECK(test::all_zero(status));
}

TEST_CASE("a world-size disagreement fails on every rank, not at the timeout") {
  const std::string job = test::unique_job_id("wsize");
  auto status = test::run_processes(2, [&](int r) {
    Options o = rank_options(r, r == 0 ? 2 : 3, job);
    o.timeout_s = 30;
    auto t0 = std::chrono::steady_clock::now();
    bool refused = false;
    try {
      Communicator c(o);
    } catch (const InvalidArgumentError& e) {
      refused = std::string(e.what()).find("world size") != std::string::npos;
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SHMRING_CHILD_CHECK(refused, "rank %d: expected a world size error", r);
    SHMRING_CHILD_CHECK(s < 10, "rank %d took %.1f s", r, s);
  });
  CHECK(test::all_zero(status));
}

TEST_CASE("configuration from the environment: shmrun, torchrun, and bad values") {
  auto status = test::run_processes(1, [&](int) {
    clearenv();
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
    Config c = detail::resolve_config({});
    SHMRING_CHILD_CHECK(c.rank == 1 && c.world_size == 4 && c.local_world_size == 2, "torchrun");
    SHMRING_CHILD_CHECK(c.job_id.find("torch-127.0.0.1_29500") == 0, "job id %s", c.job_id.c_str());
    // shmrun's variables win over an outer launcher's that fit around them
    // (torchrun's 4 ranks may each have started shmrun... here 1 of 4 < 5).
    setenv("SHMRING_RANK", "2", 1);
    setenv("SHMRING_WORLD_SIZE", "5", 1);
    setenv("SHMRING_JOB_ID", "abc", 1);
    c = detail::resolve_config({});
    SHMRING_CHILD_CHECK(c.rank == 2 && c.world_size == 5 && c.job_id == "abc", "shmrun vars");
    auto expect_error = [](const char* var, const char* value, const char* needle) {
      setenv(var, value, 1);
      bool ok = false;
      try {
        detail::resolve_config({});
      } catch (const InvalidArgumentError& e) {
        ok = std::string(e.what()).find(needle) != std::string::npos;
        if (!ok) std::fprintf(stderr, "message was: %s\n", e.what());
      }
      unsetenv(var);
      return ok;
    };
    // A local rank is bounded by the local size, and the message says so.
    SHMRING_CHILD_CHECK(expect_error("SHMRING_LOCAL_RANK", "5",
                                     "SHMRING_LOCAL_RANK='5': expected an integer in [0, 4] (below "
                                     "SHMRING_WORLD_SIZE=5)"),
                        "local rank past the world");
    setenv("SHMRING_LOCAL_WORLD_SIZE", "2", 1);
    SHMRING_CHILD_CHECK(expect_error("SHMRING_LOCAL_RANK", "2",
                                     "SHMRING_LOCAL_RANK='2': expected an integer in [0, 1] (below "
                                     "SHMRING_LOCAL_WORLD_SIZE=2)"),
                        "local rank past the local size");
    SHMRING_CHILD_CHECK(expect_error("SHMRING_LOCAL_WORLD_SIZE", "6",
                                     "SHMRING_LOCAL_WORLD_SIZE='6': expected an integer in [1, 5] "
                                     "(at most SHMRING_WORLD_SIZE=5, the ranks in all)"),
                        "local size past the world");
    SHMRING_CHILD_CHECK(expect_error("SHMRING_SLOTS", "1", "SHMRING_SLOTS='1'"), "slots");
    SHMRING_CHILD_CHECK(expect_error("SHMRING_SLOT_BYTES", "12345", "multiple of 4096"), "bytes");
    SHMRING_CHILD_CHECK(expect_error("SHMRING_SLOT_BYTES", "1000",
                                     "SHMRING_SLOT_BYTES='1000': expected a multiple of 4096"),
                        "bytes below the range: the same message");
    SHMRING_CHILD_CHECK(expect_error("SHMRING_TIMEOUT", "soon", "SHMRING_TIMEOUT='soon'"),
                        "timeout");
    SHMRING_CHILD_CHECK(expect_error("SHMRING_ALGO", "fastest", "SHMRING_ALGO='fastest'"),
                        "algorithm from the environment");
    setenv("SHMRING_ALGO", "Two-Shot", 1);
    c = detail::resolve_config({});
    SHMRING_CHILD_CHECK(c.algorithm == "two_shot", "SHMRING_ALGO spelling: %s",
                        c.algorithm.c_str());
    unsetenv("SHMRING_ALGO");
    SHMRING_CHILD_CHECK(expect_error("SHMRING_JOB_ID", "a/b", "job id 'a/b'"), "job id");
    setenv("SHMRING_WORLD_SIZE", "3", 1);
    SHMRING_CHILD_CHECK(expect_error("SHMRING_RANK", "3", "SHMRING_RANK='3'"), "rank range");
    clearenv();
    bool none = false;
    try {
      detail::resolve_config({});
    } catch (const InvalidArgumentError& e) {
      none = std::string(e.what()).find("shmrun") != std::string::npos;
    }
    SHMRING_CHILD_CHECK(none, "no launcher: the message must say how to run");
  });
  CHECK(status[0] == 0);
}

TEST_CASE("placement: threads, spin and oversubscription from the ranks' affinity masks") {
  auto placed = [](int world, int local, int my_cpus, int job_cpus) {
    Config c;
    c.world_size = world;
    c.local_world_size = local;
    c.threads = 0;
    c.spin_us = c.yield_us = -1;
    detail::apply_placement(c, my_cpus, job_cpus);
    return c;
  };
  // Unbound ranks on 16 CPUs share them.
  Config c = placed(4, 4, 16, 16);
  CHECK(c.threads == 4);
  CHECK_FALSE(c.oversubscribed);
  CHECK(c.spin_us > 0);
  CHECK(c.yield_us == 2000);  // before a futex sleep, whose wake-up costs 30-360 us
  // One CPU each (shmrun --bind-to core): 1 thread, not oversubscribed.
  c = placed(16, 16, 1, 16);
  CHECK(c.threads == 1);
  CHECK_FALSE(c.oversubscribed);
  // A whole job of 4 under `taskset -c 0,1`: oversubscribed, no spin.
  c = placed(4, 4, 2, 2);
  CHECK(c.threads == 1);
  CHECK(c.oversubscribed);
  CHECK(c.spin_us == 0);
  CHECK(c.yield_us > 0);
  // Each of 2 ranks with 8 CPUs of its own: 8 threads each.
  c = placed(2, 2, 8, 16);
  CHECK(c.threads == 8);
  // Explicit settings win.
  Config e;
  e.world_size = e.local_world_size = 4;
  e.threads = 3;
  e.spin_us = 7;
  e.yield_us = 9;
  detail::apply_placement(e, 2, 2);
  CHECK((e.threads == 3 && e.spin_us == 7 && e.yield_us == 9));
  CHECK(e.oversubscribed);
  // The job's Options::oversubscribed overrides the masks either way.
  auto requested = [](int world, int job_cpus, int request) {
    Config r;
    r.world_size = r.local_world_size = world;
    r.spin_us = r.yield_us = -1;
    detail::apply_placement(r, job_cpus, job_cpus, request);
    return r;
  };
  c = requested(2, 16, 1);
  CHECK(c.oversubscribed);
  CHECK(c.spin_us == 0);
  c = requested(4, 2, 0);
  CHECK_FALSE(c.oversubscribed);
  CHECK(c.spin_us > 0);
  CHECK(requested(4, 2, -1).oversubscribed);
  CHECK_FALSE(requested(2, 16, -1).oversubscribed);
}

TEST_CASE("placement: ring slices of at most 64 KiB where ranks share CPUs") {
  auto sliced = [](std::size_t slot_bytes, int request) {
    Config c;
    c.world_size = c.local_world_size = 2;
    c.slot_bytes = slot_bytes;
    c.spin_us = c.yield_us = -1;
    detail::apply_placement(c, 1, 2, request);
    return c.slice_bytes;
  };
  CHECK(sliced(256 * 1024, 1) == 64 * 1024);
  CHECK(sliced(256 * 1024, 0) == 256 * 1024);
  CHECK(sliced(1 << 20, 0) == 1 << 20);
  CHECK(sliced(16 * 1024, 1) == 16 * 1024);  // smaller slots stay as they are
}

TEST_CASE("the job's CPUs are the union of every rank's affinity mask") {
  if (std::thread::hardware_concurrency() < 2) {
    MESSAGE("skipped: one CPU");
    return;
  }
  // Pinned to CPUs 0 and 1: 2 job CPUs for 2 ranks; both on CPU 0: 1 CPU,
  // oversubscribed, so waits do not spin.
  for (bool same_cpu : {false, true}) {
    const std::string job = test::unique_job_id(same_cpu ? "cpus-same" : "cpus-own");
    auto status = test::run_processes(2, [&](int r) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(same_cpu ? 0 : r, &one);
      SHMRING_CHILD_CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "sched_setaffinity");
      Communicator comm(r, 2, job);
      const Config& c = comm.config();
      SHMRING_CHILD_CHECK(c.job_cpus == (same_cpu ? 1 : 2), "rank %d: job_cpus %d", r, c.job_cpus);
      SHMRING_CHILD_CHECK(c.oversubscribed == same_cpu, "rank %d: oversubscribed %d", r,
                          static_cast<int>(c.oversubscribed));
      SHMRING_CHILD_CHECK(c.threads == 1, "rank %d: threads %d", r, c.threads);
      SHMRING_CHILD_CHECK((c.spin_us == 0) == same_cpu, "rank %d: spin %g", r, c.spin_us);
      int x = r + 1;
      comm.allreduce(std::span<int>(&x, 1), ReduceOp::sum);
      SHMRING_CHILD_CHECK(x == 3, "x=%d", x);
    });
    CHECK(test::all_zero(status));
  }
}

TEST_CASE("Options::oversubscribed and SHMRING_OVERSUBSCRIBED: one setting for the whole job") {
  // Ranks on 2 CPUs of their own (or unbound on more) are not oversubscribed
  // by their masks; a request from any rank makes the job so on every rank,
  // since the ranks' algorithm choices must agree.
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const bool spare = sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) >= 2;
  struct Case {
    int request0, request1;  // -1 automatic, 0, 1; 2: SHMRING_OVERSUBSCRIBED=1 instead
    bool want;
  };
  for (Case k : {Case{-1, -1, !spare}, Case{1, -1, true}, Case{-1, 2, true}, Case{0, 1, true},
                 Case{0, 0, false}}) {
    INFO("requests ", k.request0, " ", k.request1);
    const std::string job = test::unique_job_id("oversub");
    auto status = test::run_processes(2, [&](int r) {
      const int request = r == 0 ? k.request0 : k.request1;
      Options o = rank_options(r, 2, job);
      if (request == 2)
        setenv("SHMRING_OVERSUBSCRIBED", "1", 1);
      else
        o.oversubscribed = request;
      Communicator c(o);
      SHMRING_CHILD_CHECK(c.config().oversubscribed == k.want, "rank %d: oversubscribed %d", r,
                          static_cast<int>(c.config().oversubscribed));
      SHMRING_CHILD_CHECK((c.config().spin_us == 0) == k.want, "rank %d: spin %g", r,
                          c.config().spin_us);
      // The paths chosen from it agree: allgathers on both sides of its
      // staged window at N=2 (160 KiB to 640 KiB blocks when oversubscribed).
      for (std::size_t bytes : {std::size_t{8}, std::size_t{160} * 1024 - 1,
                                std::size_t{160} * 1024, std::size_t{640} * 1024}) {
        std::vector<std::uint8_t> mine(bytes), all(2 * bytes);
        for (std::size_t i = 0; i < bytes; ++i) mine[i] = static_cast<std::uint8_t>(i * 7 + r);
        c.allgather(mine.data(), all.data(), bytes, DataType::uint8);
        for (int q = 0; q < 2; ++q)
          for (std::size_t i = 0; i < bytes; i += 997)
            SHMRING_CHILD_CHECK(all[q * bytes + i] == static_cast<std::uint8_t>(i * 7 + q),
                                "rank %d: %zu bytes, block %d, byte %zu", r, bytes, q, i);
      }
    });
    CHECK(test::all_zero(status));
  }
  // split(): a child of a crowded parent is crowded too (the parent's other
  // ranks stay busy beside it), though its own ranks' CPUs would not say so;
  // a parent's explicit 0 carries over likewise.
  for (int parent_request : {1, 0}) {
    INFO("parent request ", parent_request);
    const std::string job = test::unique_job_id("oversub-split");
    auto status = test::run_processes(4, [&](int r) {
      Options o = rank_options(r, 4, job);
      o.oversubscribed = parent_request;
      Communicator parent(o);
      Communicator child = parent.split(r % 2);
      SHMRING_CHILD_CHECK(child.config().oversubscribed == (parent_request == 1),
                          "rank %d: child oversubscribed %d", r,
                          static_cast<int>(child.config().oversubscribed));
      int x = r;
      child.allreduce(std::span<int>(&x, 1), ReduceOp::sum);
      SHMRING_CHILD_CHECK(x == (r % 2 == 0 ? 2 : 4), "rank %d: x=%d", r, x);
    });
    CHECK(test::all_zero(status));
  }
  // A bad value is refused before any segment exists, naming it.
  for (const char* bad_env : {static_cast<const char*>(nullptr), "yes"}) {
    auto status = test::run_processes(1, [&](int) {
      Options o = rank_options(0, 1, test::unique_job_id("oversub-bad"));
      if (bad_env)
        setenv("SHMRING_OVERSUBSCRIBED", bad_env, 1);
      else
        o.oversubscribed = 2;
      std::string what;
      try {
        Communicator c(o);
      } catch (const InvalidArgumentError& e) {
        what = e.what();
      }
      const std::string want = bad_env ? "SHMRING_OVERSUBSCRIBED='yes'" : "oversubscribed=2";
      SHMRING_CHILD_CHECK(what.find(want) != std::string::npos, "message: '%s'", what.c_str());
    });
    CHECK(test::all_zero(status));
  }
}

TEST_CASE("counters publish without a fence only when every rank registered for membarrier") {
  // Config::asymmetric_fence: on where the kernel offers
  // MEMBARRIER_CMD_GLOBAL_EXPEDITED and no rank opted out; one rank with
  // SHMRING_MEMBARRIER=0 (as one whose seccomp filter refuses membarrier)
  // turns it off on every rank, since its sleeps could not fence the others.
  const long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  const bool kernel = cmds >= 0 && (cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0;
  for (int opt_out : {-1, 0, 1}) {
    INFO("rank opting out: ", opt_out);
    const std::string job = test::unique_job_id("fence");
    auto status = test::run_processes(2, [&](int r) {
      if (r == opt_out) setenv("SHMRING_MEMBARRIER", "0", 1);
      Communicator comm(r, 2, job);
      const bool want = kernel && opt_out < 0;
      SHMRING_CHILD_CHECK(comm.config().asymmetric_fence == want, "rank %d: asymmetric_fence %d", r,
                          static_cast<int>(comm.config().asymmetric_fence));
      int x = r + 1;
      comm.allreduce(std::span<int>(&x, 1), ReduceOp::sum);
      SHMRING_CHILD_CHECK(x == 3, "x=%d", x);
    });
    CHECK(test::all_zero(status));
  }
}
