// Job and rank identity (docs/guide/errors.md): two jobs
// with one job id, two processes with one rank, a starting rank 0 taken for a
// dead one, launchers' variables that disagree. Every process involved fails
// within about a second naming the problem, or runs correctly; never a silent
// pairing, never a wrong result, never a wait for the timeout. Also: errors
// after the first read the same on every rank, and start with the rank.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <filesystem>
#include <new>
#include <span>
#include <thread>

#include "base/config.hpp"
#include "faults.hpp"
#include "harness.hpp"

using namespace shmring;
using test::contains;
namespace fs = std::filesystem;

namespace {

std::string shm_path(const std::string& job) {
  return "/dev/shm/" + detail::segment_name(job, detail::host_hash());
}

// Sets the environment of a process that a launcher would have started.
void set_env(const std::vector<std::pair<const char*, std::string>>& vars) {
  for (const char* v : {"SHMRING_RANK",
                        "SHMRING_WORLD_SIZE",
                        "SHMRING_LOCAL_RANK",
                        "SHMRING_LOCAL_WORLD_SIZE",
                        "SHMRING_JOB_ID",
                        "SHMRING_JOB_NONCE",
                        "RANK",
                        "WORLD_SIZE",
                        "LOCAL_RANK",
                        "LOCAL_WORLD_SIZE",
                        "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE",
                        "PMI_RANK",
                        "PMI_SIZE",
                        "MPI_LOCALRANKID",
                        "MPI_LOCALNRANKS",
                        "SLURM_PROCID",
                        "SLURM_NTASKS",
                        "SLURM_LOCALID",
                        "MASTER_ADDR",
                        "MASTER_PORT",
                        "TORCHELASTIC_RUN_ID"})
    unsetenv(v);
  for (const auto& [k, v] : vars) setenv(k, v.c_str(), 1);
}

// One process's outcome in a shared page: 1 = correct result, 2 = error
// (message kept), 3 = WRONG result.
struct Outcome {
  std::atomic<int> kind;
  std::atomic<std::int64_t> value;
  std::atomic<std::int64_t> done_ns;
  char message[512];
};
Outcome* shared_outcomes(int n) {
  void* p =
      mmap(nullptr, sizeof(Outcome) * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  std::memset(p, 0, sizeof(Outcome) * n);
  return static_cast<Outcome*>(p);
}

// Job `base`'s rank r holds base + r (1000, 1001 / 2000, 2001): the sum
// tells which ranks paired up.
void one_allreduce(Outcome& out, int base, int rank, int world) {
  try {
    Communicator c;  // from the environment
    std::int32_t x = base + rank;
    c.allreduce(std::span<std::int32_t>(&x, 1), ReduceOp::sum);
    std::int32_t want = 0;
    for (int r = 0; r < world; ++r) want += base + r;
    out.value = x;
    out.kind = x == want ? 1 : 3;
  } catch (const Error& e) {
    std::snprintf(out.message, sizeof out.message, "%s", e.what());
    out.kind = 2;
  }
  out.done_ns = test::mono_ns();
}

}  // namespace

TEST_CASE("input 2: two processes with rank 0 of one job both fail within a second") {
  const std::string job = test::unique_job_id("dup0");
  Outcome* out = shared_outcomes(2);
  const auto t0 = test::mono_ns();
  auto status = test::run_processes(
      2,
      [&](int i) {
        set_env({{"SHMRING_RANK", "0"},
                 {"SHMRING_WORLD_SIZE", "2"},
                 {"SHMRING_JOB_ID", job},
                 {"SHMRING_TIMEOUT", "10"}});
        one_allreduce(out[i], 1000, 0, 2);
      },
      60);
  for (int i = 0; i < 2; ++i) {
    INFO("process " << i << ": " << out[i].message);
    CHECK(status[i] == 0);
    CHECK(out[i].kind == 2);
    CHECK(contains(out[i].message, "two processes claim rank 0"));
    CHECK(contains(out[i].message, "rank 0: "));
    CHECK((out[i].done_ns - t0) * 1e-9 < 3.0);  // not the 10 s timeout
  }
  CHECK_FALSE(fs::exists(shm_path(job)));
  munmap(out, sizeof(Outcome) * 2);
}

TEST_CASE("two processes with rank 1: every rank of the job fails at once, naming rank 1") {
  const std::string job = test::unique_job_id("dup1");
  Outcome* out = shared_outcomes(3);
  const auto t0 = test::mono_ns();
  const int ranks[3] = {0, 1, 1};
  auto status = test::run_processes(
      3,
      [&](int i) {
        set_env({{"SHMRING_RANK", std::to_string(ranks[i])},
                 {"SHMRING_WORLD_SIZE", "3"},
                 {"SHMRING_JOB_ID", job},
                 {"SHMRING_TIMEOUT", "10"}});
        one_allreduce(out[i], 10, ranks[i], 3);
      },
      60);
  for (int i = 0; i < 3; ++i) {
    INFO("process " << i << ": " << out[i].message);
    CHECK(status[i] == 0);
    CHECK(out[i].kind == 2);
    CHECK(contains(out[i].message, "two processes claim rank 1"));
    CHECK((out[i].done_ns - t0) * 1e-9 < 3.0);
  }
  CHECK_FALSE(fs::exists(shm_path(job)));
  munmap(out, sizeof(Outcome) * 3);
}

TEST_CASE("input 1: two jobs (own nonces) given one job id never pair up, and fail fast") {
  // As two `shmrun -n 2 --job-id X` would start them: each job has its own
  // SHMRING_JOB_NONCE. Ten tries at the same moment.
  int ran = 0, failed = 0;
  for (int attempt = 0; attempt < 10; ++attempt) {
    const std::string job = test::unique_job_id("twojobs");
    Outcome* out = shared_outcomes(4);
    auto status = test::run_processes(
        4,
        [&](int i) {
          const int which = i / 2, rank = i % 2;
          set_env({{"SHMRING_RANK", std::to_string(rank)},
                   {"SHMRING_WORLD_SIZE", "2"},
                   {"SHMRING_JOB_ID", job},
                   {"SHMRING_JOB_NONCE", which == 0 ? "a1" : "b2"},
                   {"SHMRING_TIMEOUT", "4"}});
          one_allreduce(out[i], which == 0 ? 1000 : 2000, rank, 2);
        },
        60);
    for (int i = 0; i < 4; ++i) {
      INFO("attempt " << attempt << " process " << i << " (job " << i / 2 << " rank " << i % 2
                      << "): kind " << out[i].kind << " value " << out[i].value << ": "
                      << out[i].message);
      CHECK(status[i] == 0);
      CHECK(out[i].kind != 3);  // never a wrong result
      CHECK(out[i].kind != 0);
      if (out[i].kind == 2) {
        ++failed;
        // The error says what happened: the job id is shared; a process that
        // came after its job's segment was torn down may only time out.
        CHECK((contains(out[i].message, "two jobs share job id") ||
               contains(out[i].message, "timed out")));
      } else {
        ++ran;
      }
    }
    // Within a job, both ranks ran correctly or neither did.
    for (int j = 0; j < 2; ++j) CHECK((out[2 * j].kind == 1) == (out[2 * j + 1].kind == 1));
    CHECK_FALSE(fs::exists(shm_path(job)));
    munmap(out, sizeof(Outcome) * 4);
  }
  MESSAGE("ran correctly: " << ran << " processes, failed with a diagnosis: " << failed);
}

TEST_CASE("the collision is told to the other job's ranks: they fail now, not at the timeout") {
  // Job A (nonce a1) is waiting for its rank 1; job B's rank 1 (nonce b2)
  // arrives instead: both fail within a second with "two jobs share job id".
  const std::string job = test::unique_job_id("tell");
  Outcome* out = shared_outcomes(2);
  const auto t0 = test::mono_ns();
  pid_t a0 = fork();
  if (a0 == 0) {
    set_env({{"SHMRING_RANK", "0"},
             {"SHMRING_WORLD_SIZE", "2"},
             {"SHMRING_JOB_ID", job},
             {"SHMRING_JOB_NONCE", "a1"},
             {"SHMRING_TIMEOUT", "20"}});
    one_allreduce(out[0], 1000, 0, 2);
    _exit(0);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!fs::exists(shm_path(job)) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto status = test::run_processes(1, [&](int) {
    set_env({{"SHMRING_RANK", "1"},
             {"SHMRING_WORLD_SIZE", "2"},
             {"SHMRING_JOB_ID", job},
             {"SHMRING_JOB_NONCE", "b2"},
             {"SHMRING_TIMEOUT", "20"}});
    one_allreduce(out[1], 2000, 1, 2);
  });
  int st = 0;
  waitpid(a0, &st, 0);
  CHECK(status[0] == 0);
  CHECK(test::decode_status(st) == 0);
  for (int i = 0; i < 2; ++i) {
    INFO("process " << i << ": " << out[i].message);
    CHECK(out[i].kind == 2);
    CHECK(contains(out[i].message, "two jobs share job id"));
    CHECK((out[i].done_ns - t0) * 1e-9 < 5.0);
  }
  CHECK_FALSE(fs::exists(shm_path(job)));
  munmap(out, sizeof(Outcome) * 2);
}

TEST_CASE("a live rank 0's segment is never seen by name without its lock (no false 'stale')") {
  // The race of input 1: a second rank 0 looked between the first one's
  // create and lock, called it stale and removed it. Rank 0 now names the
  // file only once locked and ready: a watcher that finds the name must find
  // the lock held, or the file already unlinked.
  const std::string job = test::unique_job_id("race");
  const std::string path = shm_path(job);
  const std::string name = detail::segment_name(job, detail::host_hash());
  // The watcher is a process of its own, not a thread: this process forks
  // the ranks below, and a fork while another thread of it is busy in
  // system calls can leave the child stuck on a lock that thread held (seen
  // once under qemu-user: a child that never returned from the constructor).
  struct Board {
    std::atomic<int> stop, seen, unlocked;
  };
  void* mem =
      mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  auto* board = new (mem) Board{};
  const pid_t watcher = fork();
  REQUIRE(watcher >= 0);
  if (watcher == 0) {
    while (!board->stop.load()) {
      int fd = shm_open(name.c_str(), O_RDONLY, 0);
      if (fd < 0) continue;
      struct flock fl {};
      fl.l_type = F_WRLCK;
      fl.l_whence = SEEK_SET;
      fl.l_start = off_t{1} << 40;
      fl.l_len = 1;
      struct stat st {};
      if (fcntl(fd, F_OFD_GETLK, &fl) == 0 && fstat(fd, &st) == 0) {
        board->seen.fetch_add(1);
        if (fl.l_type == F_UNLCK && st.st_nlink > 0) board->unlocked.fetch_add(1);
      }
      close(fd);
    }
    _exit(0);
  }
  for (int i = 0; i < 20; ++i) {
    auto status = test::run_processes(1, [&](int) {
      try {
        Options o;
        o.rank = 0;
        o.world_size = 2;
        o.job_id = job;
        o.timeout_s = 0.05;
        Communicator c(o);
      } catch (const TimeoutError&) {
      }
    });
    CHECK(status[0] == 0);
  }
  board->stop.store(1);
  int ws = 0;
  CHECK(waitpid(watcher, &ws, 0) == watcher);
  CHECK((WIFEXITED(ws) && WEXITSTATUS(ws) == 0));
  const int seen = board->seen.load(), unlocked = board->unlocked.load();
  munmap(mem, sizeof(Board));
  MESSAGE("watcher saw the segment " << seen << " times");
  CHECK(unlocked == 0);
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE(
    "input 3: Open MPI's ranks with a container's RANK=0 WORLD_SIZE=1: an error naming both") {
  const std::string job = test::unique_job_id("mpienv");
  Outcome* out = shared_outcomes(2);
  auto status = test::run_processes(2, [&](int r) {
    set_env({{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
             {"OMPI_COMM_WORLD_SIZE", "2"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
             {"RANK", "0"},
             {"WORLD_SIZE", "1"},
             {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", "29500"},
             {"SHMRING_JOB_ID", job},
             {"SHMRING_TIMEOUT", "10"}});
    one_allreduce(out[r], 1, r, 2);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << out[r].message);
    CHECK(status[r] == 0);
    CHECK(out[r].kind == 2);
    CHECK(contains(out[r].message, "launchers' variables disagree"));
    CHECK(contains(out[r].message, "RANK=0 WORLD_SIZE=1"));
    CHECK(contains(out[r].message, "OMPI_COMM_WORLD_SIZE=2"));
  }
  munmap(out, sizeof(Outcome) * 2);
}

TEST_CASE("launchers that agree, or nest, are fine; each launcher's variables are read") {
  auto status = test::run_processes(1, [&](int) {
    auto cfg = [](std::vector<std::pair<const char*, std::string>> vars) {
      set_env(vars);
      return detail::resolve_config({});
    };
    // Open MPI and a torchrun-style set that agree.
    Config c = cfg({{"OMPI_COMM_WORLD_RANK", "1"},
                    {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"RANK", "1"},
                    {"WORLD_SIZE", "2"},
                    {"SHMRING_JOB_ID", "j"}});
    SHMRING_CHILD_CHECK(c.rank == 1 && c.world_size == 2, "agreeing sets");
    // MPICH / Hydra, with its local rank and size.
    c = cfg({{"PMI_RANK", "3"},
             {"PMI_SIZE", "4"},
             {"MPI_LOCALRANKID", "1"},
             {"MPI_LOCALNRANKS", "2"},
             {"SHMRING_JOB_ID", "j"}});
    SHMRING_CHILD_CHECK(
        c.rank == 3 && c.world_size == 4 && c.local_rank == 1 && c.local_world_size == 2,
        "MPICH: rank %d of %d, local %d of %d", c.rank, c.world_size, c.local_rank,
        c.local_world_size);
    // MPICH without SHMRING_JOB_ID: a job id of its own from Hydra's proxy.
    c = cfg({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}});
    SHMRING_CHILD_CHECK(c.job_id.rfind("mpich-", 0) == 0, "job id %s", c.job_id.c_str());
    // torchrun inside an srun task: Slurm's variables describe the task.
    c = cfg({{"SLURM_PROCID", "0"},
             {"SLURM_NTASKS", "1"},
             {"RANK", "2"},
             {"WORLD_SIZE", "4"},
             {"SHMRING_JOB_ID", "j"}});
    SHMRING_CHILD_CHECK(c.rank == 2 && c.world_size == 4, "torchrun in srun");
    // mpirun in a Slurm batch script of more tasks: Slurm is not compared.
    c = cfg({{"SLURM_PROCID", "0"},
             {"SLURM_NTASKS", "8"},
             {"OMPI_COMM_WORLD_RANK", "1"},
             {"OMPI_COMM_WORLD_SIZE", "2"},
             {"SHMRING_JOB_ID", "j"}});
    SHMRING_CHILD_CHECK(c.rank == 1 && c.world_size == 2, "mpirun in sbatch");
    // Same world size, different ranks: not one job.
    bool refused = false;
    try {
      cfg({{"OMPI_COMM_WORLD_RANK", "1"},
           {"OMPI_COMM_WORLD_SIZE", "2"},
           {"RANK", "0"},
           {"WORLD_SIZE", "2"},
           {"SHMRING_JOB_ID", "j"}});
    } catch (const InvalidArgumentError& e) {
      // The rank is what the variables disagree on: the message names the
      // process, not one of the two ranks.
      refused = std::string(e.what()).rfind("rank unknown (pid ", 0) == 0 &&
                contains(e.what(), "the launchers' variables disagree") &&
                contains(e.what(), "OMPI_COMM_WORLD_RANK=1");
      if (!refused) std::fprintf(stderr, "message: %s\n", e.what());
    }
    SHMRING_CHILD_CHECK(refused, "same size, other rank");
    // Errors before the rank is known still say who raises them.
    bool prefixed = false;
    try {
      cfg({{"SHMRING_RANK", "x"}, {"SHMRING_WORLD_SIZE", "2"}});
    } catch (const InvalidArgumentError& e) {
      prefixed = std::string(e.what()).rfind("rank unknown (pid ", 0) == 0;
    }
    SHMRING_CHILD_CHECK(prefixed, "prefix");
  });
  CHECK(status[0] == 0);
}

TEST_CASE("errors after the first read the same on every rank, and every one names its rank") {
  // Rank 1 passes avg on int32: it gets InvalidArgumentError, ranks 0 and 2
  // MismatchError naming rank 1's invalid call. Every later call, on every
  // rank, is AbortedError "rank R: communicator is unusable after an earlier
  // error: <the job's first error>", the same text after the rank.
  struct Board {
    char first[3][512];
    char second[3][512];
    std::atomic<int> second_code[3];
  };
  auto* b = static_cast<Board*>(
      mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(b != MAP_FAILED);
  std::memset(static_cast<void*>(b), 0, sizeof(Board));
  auto status = test::run_ranks(
      3,
      [&](Communicator& c) {
        const int r = c.rank();
        std::vector<std::int32_t> x(8, r);
        try {
          c.allreduce(std::span<std::int32_t>(x), r == 1 ? ReduceOp::avg : ReduceOp::sum);
        } catch (const Error& e) {
          std::snprintf(b->first[r], 512, "%d|%s", static_cast<int>(e.code()), e.what());
        }
        try {
          c.allreduce(std::span<std::int32_t>(x), ReduceOp::sum);
        } catch (const Error& e) {
          b->second_code[r] = static_cast<int>(e.code());
          std::snprintf(b->second[r], 512, "%s", e.what());
        }
      },
      60);
  CHECK(test::all_zero(status));
  auto after_rank = [](const char* m) {
    std::string s = m;
    auto colon = s.find(": ");
    return colon == std::string::npos ? s : s.substr(colon + 2);
  };
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << " first: " << b->first[r] << "\n second: " << b->second[r]);
    const std::string first = b->first[r];
    // Rank 1: its own InvalidArgumentError (code 1); ranks 0 and 2: the
    // job's first error, a MismatchError (code 2) raised by one of them.
    if (r == 1) {
      CHECK(first.rfind("1|rank 1: ", 0) == 0);
    } else {
      CHECK(first.rfind("2|rank ", 0) == 0);
      CHECK(contains(first, "rank 1 made an invalid call"));
    }
    CHECK(b->second_code[r] == static_cast<int>(ErrorCode::aborted));
    CHECK(std::string(b->second[r]).rfind("rank " + std::to_string(r) + ": ", 0) == 0);
    CHECK(after_rank(b->second[r]) == after_rank(b->second[0]));
    CHECK(contains(b->second[r], "unusable after an earlier error"));
  }
  munmap(b, sizeof(Board));
}
