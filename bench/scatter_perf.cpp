// scatter_perf: the nccl-tests scatter table for shmring, plus the "floor".
//
//   build/tools/shmrun -n 4 -- build/bench/scatter_perf -b 8 -e 128M -f 4 -r 0
//
// Size = root's send buffer (ranks x count), count = elements each rank
// receives; busbw = algbw x (n-1)/n. In place: recv = send + rank x count.

#include "shmring_perf.hpp"

int main(int argc, char** argv) {
  return shmring::bench::shmring_perf_main(argc, argv, shmring::bench::Collective::scatter);
}
