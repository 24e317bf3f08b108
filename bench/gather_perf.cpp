// gather_perf: the nccl-tests gather table for shmring, plus the "floor".
//
//   build/tools/shmrun -n 4 -- build/bench/gather_perf -b 8 -e 128M -f 4 -r 0
//
// Size = root's recv buffer (ranks x count), count = elements each rank
// sends; busbw = algbw x (n-1)/n. In place: send = recv + rank x count.

#include "shmring_perf.hpp"

int main(int argc, char** argv) {
  return shmring::bench::shmring_perf_main(argc, argv, shmring::bench::Collective::gather);
}
