// A job that loses a rank in the middle of allreduces, for run_fault.py:
//
//   mpi_fault_worker kill|stop VICTIM
//
// Every rank prints its node's segment name, then runs 4 MiB allreduces in a
// loop; 0.3 s in, rank VICTIM sends itself SIGKILL (it dies) or SIGSTOP (it
// hangs: its node's peers time out). The job must then end on every node
// with an error, quickly, leaving no segment behind; a loop that runs out
// (60 s) exits 0, which run_fault.py reports as a failure.

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <shmring/mpi.hpp>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc != 3 || (std::strcmp(argv[1], "kill") != 0 && std::strcmp(argv[1], "stop") != 0)) {
    fmt::print(stderr, "usage: mpi_fault_worker kill|stop VICTIM_RANK\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int sig = std::strcmp(argv[1], "kill") == 0 ? SIGKILL : SIGSTOP;
  const int victim = std::atoi(argv[2]);
  shmring::mpi::Communicator comm(MPI_COMM_WORLD);
  fmt::print("rank {} node {} segment {}\n", comm.rank(), comm.node(),
             comm.node_communicator().config().segment_name);
  std::fflush(stdout);
  comm.barrier();
  if (comm.rank() == victim)
    std::thread([sig] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(sig);
    }).detach();
  std::vector<float> buf(1 << 20, 1.0f);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  long rounds = 0;
  while (std::chrono::steady_clock::now() < end) {
    comm.allreduce(std::span<float>(buf), shmring::ReduceOp::max);
    ++rounds;
  }
  fmt::print("rank {}: {} allreduces and no failure\n", comm.rank(), rounds);
  MPI_Finalize();
  return 0;
}
