// reduce_scatter_perf: the nccl-tests reduce_scatter table for shmring, plus the "floor" (every
// rank copying a buffer of the size column once, concurrently).
//
//   build/tools/shmrun -n 2 -- build/bench/reduce_scatter_perf -b 8 -e 128M -f 4
//
// Size = every rank's send buffer (ranks x count), count = elements each rank
// receives; busbw = algbw x (n-1)/n. In place: recv = send + rank x count.

#include "shmring_perf.hpp"

int main(int argc, char** argv) {
  return shmring::bench::shmring_perf_main(argc, argv, shmring::bench::Collective::reduce_scatter);
}
