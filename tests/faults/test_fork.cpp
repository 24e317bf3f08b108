// A process forked from a rank without exec (docs/guide/errors.md): it must not keep the rank
// looking alive, must not speak for it when it exits, and gets a clear error if it uses the
// inherited communicator, while the parent carries on untouched. It may make a communicator of its
// own.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <optional>
#include <span>
#include <thread>

#include "faults.hpp"
#include "harness.hpp"

using namespace shmring;
using test::contains;

namespace {

// Pids that the test must reap or end itself (a helper outlives its rank).
struct Pids {
  std::atomic<int> rank[8];
  std::atomic<int> helper[8];
  std::atomic<int> loops[8];
};
Pids* shared_pids() {
  void* p = mmap(nullptr, sizeof(Pids), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  std::memset(p, 0, sizeof(Pids));
  return static_cast<Pids*>(p);
}

// Allreduces until an error: each is checked (ranks hold 10r + i).
void allreduce_until_error(Communicator& c, test::FaultBoard& board, Pids& pids) {
  const int n = c.size(), r = c.rank();
  try {
    for (int it = 0;; ++it) {
      std::vector<std::int64_t> x(64);
      for (int i = 0; i < 64; ++i) x[i] = 10 * r + i + it;
      c.allreduce(std::span<std::int64_t>(x), ReduceOp::sum);
      for (int i = 0; i < 64; ++i)
        SHMRING_CHILD_CHECK(x[i] == 10 * n * (n - 1) / 2 + n * (i + it), "rank %d: wrong sum", r);
      pids.loops[r] = it + 1;
    }
  } catch (const Error& e) {
    board.note(r, e.what());
    SHMRING_CHILD_CHECK(e.code() == ErrorCode::peer_failure || e.code() == ErrorCode::aborted,
                        "rank %d: %s", r, e.what());
  }
}

void wait_loops(Pids& p, int n, int at_least) {
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int r = 0; r < n; ++r)
    while (p.loops[r] < at_least && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace

TEST_CASE("input 1: a rank dies while its forked helper sleeps: PeerFailureError at once") {
  const int n = 3;
  auto* board = test::FaultBoard::create();
  Pids* pids = shared_pids();
  const std::string job = test::unique_job_id("forkalive");
  std::thread killer([&] {
    wait_loops(*pids, n, 20);
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (pids->helper[1] == 0 && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    board->fault_ns = test::mono_ns();
    kill(pids->rank[1], SIGKILL);
  });
  auto status = test::run_processes(
      n,
      [&](int r) {
        pids->rank[r] = getpid();
        Options o;
        o.rank = r;
        o.world_size = n;
        o.job_id = job;
        o.timeout_s = 20;
        Communicator c(o);
        if (r == 1) {
          pid_t h = fork();
          if (h == 0) {  // a helper that only sleeps (a data loader, a writer)
            std::this_thread::sleep_for(std::chrono::seconds(60));
            _exit(0);
          }
          pids->helper[1] = h;
        }
        allreduce_until_error(c, *board, *pids);
      },
      60);
  killer.join();
  if (pids->helper[1] > 0) {
    kill(pids->helper[1], SIGKILL);
    waitpid(pids->helper[1], nullptr, 0);
  }
  CHECK(status[1] == 128 + SIGKILL);
  for (int r : {0, 2}) {
    INFO("rank " << r << ": " << board->message[r]);
    CHECK(status[r] == 0);
    CHECK(board->latency_s(r) >= 0);
    CHECK(board->latency_s(r) < test::kDetectionBoundS);  // not the 20 s timeout
    // Each survivor's first error is the job's: the death, as it happened.
    CHECK(contains(board->message[r], "rank 1 (pid"));
    CHECK(contains(board->message[r], "died"));
  }
  test::FaultBoard::destroy(board);
  munmap(pids, sizeof(Pids));
}

TEST_CASE("input 2: a forked helper's exit does not speak for its rank") {
  // Rank 0 forks a helper that calls exit(0), which runs the destructor of
  // the communicator it inherited (a static here, as a Python object or a
  // global would be). The parents go on; then rank 0 is SIGKILLed: the
  // survivors must report a death, not "destroyed its communicator".
  const int n = 3;
  auto* board = test::FaultBoard::create();
  Pids* pids = shared_pids();
  const std::string job = test::unique_job_id("forkexit");
  std::thread killer([&] {
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (pids->helper[0] == 0 && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const int after = pids->loops[0] + 20;  // the parents go on after the helper's exit
    wait_loops(*pids, n, after);
    board->fault_ns = test::mono_ns();
    kill(pids->rank[0], SIGKILL);
  });
  auto status = test::run_processes(
      n,
      [&](int r) {
        pids->rank[r] = getpid();
        static std::optional<Communicator> comm;  // destroyed by exit()
        Options o;
        o.rank = r;
        o.world_size = n;
        o.job_id = job;
        o.timeout_s = 20;
        comm.emplace(o);
        for (int i = 0; i < 5; ++i) comm->barrier();
        if (r == 0) {
          pid_t h = fork();
          if (h == 0) std::exit(0);  // runs ~Communicator in the child
          waitpid(h, nullptr, 0);
          pids->helper[0] = h;
        }
        allreduce_until_error(*comm, *board, *pids);
        _exit(0);
      },
      60);
  killer.join();
  CHECK(status[0] == 128 + SIGKILL);
  for (int r : {1, 2}) {
    INFO("rank " << r << ": " << board->message[r]);
    CHECK(status[r] == 0);
    CHECK(board->latency_s(r) >= 0);
    CHECK(board->latency_s(r) < test::kDetectionBoundS);
    CHECK_FALSE(contains(board->message[r], "destroyed its communicator"));
    CHECK(contains(board->message[r], "rank 0 (pid"));
    CHECK(contains(board->message[r], "died"));
  }
  test::FaultBoard::destroy(board);
  munmap(pids, sizeof(Pids));
}

TEST_CASE("input 3: a forked child's collective on the inherited communicator fails at once") {
  // Each of 2 ranks forks a child that calls allreduce on the communicator it
  // inherited: the child gets InvalidArgumentError naming the owner, the
  // parents carry on with correct results, and the children can make a
  // communicator of their own.
  const std::string kids_job = test::unique_job_id("forkkids");
  auto status = test::run_ranks(
      2,
      [&](Communicator& c) {
        const int r = c.rank();
        std::int32_t warm = r;
        c.allreduce(std::span<std::int32_t>(&warm, 1), ReduceOp::sum);
        pid_t child = fork();
        if (child == 0) {
          int code = 0;
          try {
            std::int32_t x = 100 + r;
            c.allreduce(std::span<std::int32_t>(&x, 1), ReduceOp::sum);
            std::fprintf(stderr, "child of rank %d: the inherited allreduce ran (x=%d)\n", r, x);
            code = 2;
          } catch (const InvalidArgumentError& e) {
            const std::string m = e.what();
            const bool clear = contains(m, "belongs to process " + std::to_string(getppid())) &&
                               contains(m, "a forked child must create its own") &&
                               m.rfind("rank " + std::to_string(r) + " (forked child pid ", 0) == 0;
            if (!clear) {
              std::fprintf(stderr, "child of rank %d: message: %s\n", r, m.c_str());
              code = 3;
            }
          }
          // ... and other calls on it fail alike rather than touch the segment.
          try {
            c.barrier();
            code = code ? code : 4;
          } catch (const InvalidArgumentError&) {
          }
          // A communicator of its own works.
          try {
            Communicator mine(r, 2, kids_job);
            std::int32_t y = 1000 + r;
            mine.allreduce(std::span<std::int32_t>(&y, 1), ReduceOp::sum);
            if (y != 2001) code = code ? code : 5;
          } catch (const std::exception& e) {
            std::fprintf(stderr, "child of rank %d: own communicator: %s\n", r, e.what());
            code = code ? code : 6;
          }
          _exit(code);  // its inherited communicator is not destroyed: _exit
        }
        int st = 0;
        waitpid(child, &st, 0);
        SHMRING_CHILD_CHECK(test::decode_status(st) == 0, "rank %d: child status %d", r,
                            test::decode_status(st));
        // The parents are untouched.
        for (int it = 0; it < 10; ++it) {
          std::int32_t x = 10 * r + it;
          c.allreduce(std::span<std::int32_t>(&x, 1), ReduceOp::sum);
          SHMRING_CHILD_CHECK(x == 10 + 2 * it, "rank %d: %d", r, x);
        }
      },
      60);
  CHECK(test::all_zero(status));
}

TEST_CASE("a forked child that exits normally leaves its parent's rank attached and usable") {
  // exit() in a child with live communicators on the stack of its parent:
  // neither the finalized mark nor an abort may reach the job.
  auto status = test::run_ranks(
      2,
      [&](Communicator& c) {
        pid_t child = fork();
        if (child == 0) {
          {
            Communicator moved = std::move(c);  // destroyed in the child
          }
          std::exit(0);
        }
        waitpid(child, nullptr, 0);
        std::int32_t x = c.rank() + 1;
        c.allreduce(std::span<std::int32_t>(&x, 1), ReduceOp::sum);
        SHMRING_CHILD_CHECK(x == 3, "rank %d: %d", c.rank(), x);
      },
      60);
  CHECK(test::all_zero(status));
}
