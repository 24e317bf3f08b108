// alltoall_perf: the nccl-tests alltoall table for shmring, plus the "floor".
//
//   build/tools/shmrun -n 4 -- build/bench/alltoall_perf -b 8 -e 128M -f 4
//   build/tools/shmrun -n 4 -- build/bench/alltoall_perf --uneven   # alltoallv
//
// Size = every rank's send (= recv) buffer (ranks x count), count = elements
// per peer; busbw = algbw x (n-1)/n. Out of place only (no in-place form).
// --uneven runs alltoallv: rank i sends f((j-i) mod n) elements to rank j,
// uneven per pair, n x count in all per rank.

#include "shmring_perf.hpp"

int main(int argc, char** argv) {
  return shmring::bench::shmring_perf_main(argc, argv, shmring::bench::Collective::alltoall);
}
