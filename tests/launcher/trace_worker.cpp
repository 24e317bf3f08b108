// trace_worker: a fixed mix of calls for the SHMRING_TRACE test
// (check_trace.py), which knows what each rank's trace must hold:
//   world: 5 allreduces of 1000 floats, a barrier, 3 non-blocking
//          allreduces issued at once (the second and third wait in the
//          engine's queue), a barrier;
//   split by rank parity: 3 allreduces of 1000 floats.

#include <shmring/shmring.hpp>
#include <span>
#include <vector>

int main() {
  shmring::Communicator comm;
  std::vector<float> v(1000, 1.0f);
  for (int i = 0; i < 5; ++i) comm.allreduce(std::span<float>(v), shmring::ReduceOp::sum);
  comm.barrier();
  {
    shmring::Communicator half = comm.split(comm.rank() % 2, comm.rank());
    for (int i = 0; i < 3; ++i) half.allreduce(std::span<float>(v), shmring::ReduceOp::sum);
  }
  std::vector<std::vector<float>> bufs(3, std::vector<float>(1000, 1.0f));
  std::vector<shmring::Request> reqs;
  for (auto& b : bufs)
    reqs.push_back(comm.iallreduce(b.data(), b.data(), b.size(), shmring::DataType::float32,
                                   shmring::ReduceOp::sum));
  for (auto& r : reqs) r.wait();
  comm.barrier();
  return 0;
}
