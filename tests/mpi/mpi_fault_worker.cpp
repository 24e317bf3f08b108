// A job that loses a rank in the middle of allreduces, for run_fault.py:
//
//   mpi_fault_worker kill|stop|stop-throw|mismatch|refuse VICTIM
//
// Every rank prints its node's segment name, then runs 4 MiB allreduces in a
// loop; 0.3 s in, rank VICTIM sends itself SIGKILL (it dies) or SIGSTOP (it
// hangs: its node's peers time out). The job must then end on every node
// with an error, quickly, leaving no segment behind; a loop that runs out
// (60 s) exits 0, which run_fault.py reports as a failure. stop-throw runs
// with SHMRING_MPI_ON_ERROR=throw: the rank that sees the error catches it,
// checks that the communicator now refuses work, and aborts the job itself.
// mismatch: the victim stays alive but, at round 20, calls allreduce with
// another count than its node's peers: its node's shmring stage fails
// (MismatchError) while the ranks of the other node wait inside MPI for
// that node's shards; the layer must abort the job (MPI_Abort) so that none
// of them waits forever.
// refuse: at round 20 the victim makes a call the layer refuses (avg on
// int32), catches the InvalidArgumentError and goes on; its node's peers
// must hear of that refusal (not take its next call for this one) and end
// the job naming it.

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
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "kill" && mode != "stop" && mode != "stop-throw" && mode != "mismatch" &&
      mode != "refuse") {
    fmt::print(stderr,
               "usage: mpi_fault_worker kill|stop|stop-throw|mismatch|refuse VICTIM_RANK\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int sig = mode == "kill" ? SIGKILL : SIGSTOP;
  if (mode == "stop-throw") setenv("SHMRING_MPI_ON_ERROR", "throw", 1);
  const int victim = std::atoi(argv[2]);
  shmring::mpi::Communicator comm(MPI_COMM_WORLD);
  fmt::print("rank {} node {} pid {} segment {}\n", comm.rank(), comm.node(), getpid(),
             comm.node_communicator().config().segment_name);
  std::fflush(stdout);
  comm.barrier();
  if (comm.rank() == victim && mode != "mismatch" && mode != "refuse")
    std::thread([sig] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(sig);
    }).detach();
  std::vector<float> buf(1 << 20, 1.0f);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  long rounds = 0;
  try {
    while (std::chrono::steady_clock::now() < end) {
      if (mode == "refuse" && comm.rank() == victim && rounds == 20) {
        try {
          comm.allreduce(buf.data(), buf.data(), buf.size(), shmring::DataType::int32,
                         shmring::ReduceOp::avg);
        } catch (const shmring::InvalidArgumentError& e) {
          fmt::print("rank {} refused its call: {}\n", comm.rank(), e.what());
          std::fflush(stdout);
        }
      }
      const bool odd = mode == "mismatch" && comm.rank() == victim && rounds == 20;
      comm.allreduce(std::span<float>(buf).first(buf.size() - (odd ? 4 : 0)),
                     shmring::ReduceOp::max);
      ++rounds;
    }
  } catch (const shmring::Error& e) {
    fmt::print("rank {} caught {}: {}\n", comm.rank(), shmring::to_string(e.code()), e.what());
    try {
      comm.barrier();
      fmt::print("rank {}: FAIL the broken communicator ran a barrier\n", comm.rank());
    } catch (const shmring::AbortedError& again) {
      fmt::print("rank {} refused: {}\n", comm.rank(), again.what());
    }
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  fmt::print("rank {}: {} allreduces and no failure\n", comm.rank(), rounds);
  MPI_Finalize();
  return 0;
}
