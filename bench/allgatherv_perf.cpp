// allgatherv_perf: an allgather table for shmring's allgatherv with uneven
// counts (rank r contributes about (r+1) / (n(n+1)/2) of the total; --even:
// count each), plus the "floor".
//
//   build/tools/shmrun -n 4 -- build/bench/allgatherv_perf -b 8 -e 128M -f 4
//
// Size = every rank's recv buffer (ranks x count), count = the mean of the
// counts; busbw = algbw x (n-1)/n. In place: send = recv + displs[rank].

#include "shmring_perf.hpp"

int main(int argc, char** argv) {
  return shmring::bench::shmring_perf_main(argc, argv, shmring::bench::Collective::allgatherv);
}
