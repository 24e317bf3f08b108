// launcher_worker: a worker with scripted behaviour for the shmrun fault
// injection tests (test_shmrun.py). Rank and world size come from shmrun.
//
//   launcher_worker exit RANK CODE [before-init]  rank RANK exits CODE after a
//                                                 few allreduces (or before it
//                                                 joins the communicator); the
//                                                 others allreduce until they fail
//   launcher_worker segv RANK                     rank RANK dies of SIGSEGV
//   launcher_worker end_at FILE HOW...            after one allreduce, says
//                                                 "ready", waits for FILE to
//                                                 exist, then ends as HOW[rank]
//                                                 says: exit1, segv or abort
//   launcher_worker loop [ignore-int|ignore-all]  allreduce forever; rank 0 says
//                                                 "looping" once all are in;
//                                                 ignoring SIGINT (and SIGTERM)
//   launcher_worker hang                          rank 0 sleeps, others wait in
//                                                 an allreduce that never completes
//   launcher_worker lines COUNT LENGTH            COUNT lines of LENGTH bytes on
//                                                 stdout and stderr, then a last
//                                                 line without a newline on each
//   launcher_worker env                           prints its environment facts
//   launcher_worker create                        joins as rank 0 of 2 and waits
//                                                 (leaves a segment when killed)
//   launcher_worker once                          one allreduce, then exits 0

#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <shmring/shmring.hpp>
#include <span>
#include <string>
#include <vector>

namespace {

int rank_from_env() {
  const char* r = std::getenv("SHMRING_RANK");
  return r ? std::atoi(r) : -1;
}

[[noreturn]] void allreduce_forever(shmring::Communicator& comm, bool announce) {
  std::vector<float> buf(1 << 16, 1.0f);
  for (long i = 0;; ++i) {
    comm.allreduce(std::span<float>(buf), shmring::ReduceOp::max);
    if (i == 0 && announce && comm.rank() == 0) {
      std::printf("looping\n");
      std::fflush(stdout);
    }
  }
}

void no_core_dump() {
  rlimit none{0, 0};
  setrlimit(RLIMIT_CORE, &none);
}

// The threads of process `pid`, from /proc.
int thread_count(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  return -1;
}

int run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const int rank = rank_from_env();
  if (mode == "exit" && argc >= 4) {
    const int who = std::atoi(argv[2]);
    const int code = std::atoi(argv[3]);
    const bool before_init = argc > 4 && std::strcmp(argv[4], "before-init") == 0;
    if (before_init && rank == who) {
      usleep(100'000);  // long enough for rank 0 to have created the segment
      return code;
    }
    shmring::Communicator comm;
    std::vector<float> buf(1024, 1.0f);
    for (int i = 0; i < 3; ++i) comm.allreduce(std::span<float>(buf), shmring::ReduceOp::sum);
    if (rank == who) return code;
    allreduce_forever(comm, false);
  }
  if (mode == "once") {
    shmring::Communicator comm;
    std::vector<float> buf(16, 1.0f);
    comm.allreduce(std::span<float>(buf), shmring::ReduceOp::sum);
    return 0;
  }
  if (mode == "segv" && argc >= 3) {
    shmring::Communicator comm;
    std::vector<float> buf(1024, 1.0f);
    comm.allreduce(std::span<float>(buf), shmring::ReduceOp::sum);
    if (rank == std::atoi(argv[2])) {
      no_core_dump();
      volatile int* volatile p = nullptr;
      *p = 1;
    }
    allreduce_forever(comm, false);
  }
  if (mode == "end_at" && argc >= 4 + rank) {
    shmring::Communicator comm;
    std::vector<float> buf(16, 1.0f);
    comm.allreduce(std::span<float>(buf), shmring::ReduceOp::sum);
    std::printf("ready %d\n", rank);
    std::fflush(stdout);
    while (access(argv[2], F_OK) != 0) usleep(1000);
    no_core_dump();
    const std::string how = argv[3 + rank];
    if (how == "abort") std::abort();
    if (how == "segv") {
      volatile int* volatile p = nullptr;
      *p = 1;
    }
    return 1;
  }
  if (mode == "loop") {
    const std::string how = argc > 2 ? argv[2] : "";
    if (how == "ignore-int" || how == "ignore-all") signal(SIGINT, SIG_IGN);
    if (how == "ignore-all") signal(SIGTERM, SIG_IGN);
    shmring::Communicator comm;
    allreduce_forever(comm, true);
  }
  if (mode == "hang") {
    shmring::Communicator comm;
    if (comm.rank() == 0) {
      std::printf("hanging\n");
      std::fflush(stdout);
      for (;;) pause();
    }
    std::vector<float> buf(16, 1.0f);
    comm.allreduce(std::span<float>(buf), shmring::ReduceOp::sum);
    return 0;
  }
  if (mode == "lines" && argc >= 4) {
    const long count = std::atol(argv[2]);
    const long length = std::atol(argv[3]);
    // Full buffering on both streams: writes of 64 KiB cut lines anywhere,
    // which is what the launcher must put back together.
    static char out_buf[1 << 16], err_buf[1 << 16];
    std::setvbuf(stdout, out_buf, _IOFBF, sizeof out_buf);
    std::setvbuf(stderr, err_buf, _IOFBF, sizeof err_buf);
    for (long i = 0; i < count; ++i) {
      for (FILE* f : {stdout, stderr}) {
        // "<rank> <stream> <index> " then filler up to `length` bytes.
        char head[64];
        int n =
            std::snprintf(head, sizeof head, "%d %s %ld ", rank, f == stdout ? "out" : "err", i);
        std::string line(head, static_cast<std::size_t>(n));
        line.resize(static_cast<std::size_t>(length), static_cast<char>('a' + rank % 26));
        std::fputs(line.c_str(), f);
        std::fputc('\n', f);
      }
    }
    std::fprintf(stdout, "%d out last", rank);
    std::fprintf(stderr, "%d err last", rank);
    return 0;
  }
  if (mode == "env") {
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof set, &set);
    std::string cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) {
        if (!cpus.empty()) cpus += ',';
        cpus += std::to_string(c);
      }
    std::printf("rank=%d", rank);
    for (const char* k :
         {"SHMRING_RANK", "SHMRING_WORLD_SIZE", "SHMRING_LOCAL_RANK", "SHMRING_LOCAL_WORLD_SIZE",
          "SHMRING_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
          "MASTER_PORT", "SHMRING_THREADS", "SHMRING_SLOTS", "SHMRING_SLOT_BYTES", "EXTRA",
          "OMP_NUM_THREADS", "MKL_NUM_THREADS", "SHMRING_JOB_NONCE"}) {
      const char* v = std::getenv(k);
      std::printf(" %s=%s", k, v ? v : "<unset>");
    }
    std::printf(" cpus=%s launcher_threads=%d\n", cpus.c_str(), thread_count(getppid()));
    return 0;
  }
  if (mode == "comm") {
    // A communicator from shmrun's environment and one barrier: a bad
    // SHMRING_* setting fails here, on every rank alike.
    shmring::Communicator comm;
    comm.barrier();
    return 0;
  }
  if (mode == "sum" && argc >= 3) {
    // One allreduce of base + rank (job A's ranks hold 1000, 1001...): the
    // sum tells which ranks paired up.
    shmring::Communicator comm;
    std::int32_t x = std::atoi(argv[2]) + comm.rank();
    comm.allreduce(std::span<std::int32_t>(&x, 1), shmring::ReduceOp::sum);
    std::printf("rank=%d sum=%d\n", comm.rank(), x);
    return 0;
  }
  if (mode == "create") {
    shmring::Options o;
    o.rank = 0;
    o.world_size = 2;
    o.job_id = argc > 2 ? argv[2] : "stale";
    shmring::Communicator comm(o);  // waits for rank 1, which never comes
    return 0;
  }
  std::fprintf(stderr, "launcher_worker: unknown mode or missing arguments (see the source)\n");
  return 64;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const shmring::Error& e) {
    std::fprintf(stderr, "launcher_worker: rank %d: %s\n", rank_from_env(), e.what());
    return 1;
  }
}
