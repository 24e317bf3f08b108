// allreduce_perf: the nccl-tests allreduce table for shmring, plus the "floor" (every
// rank copying a buffer of the size column once, concurrently).
//
//   build/tools/shmrun -n 2 -- build/bench/allreduce_perf -b 8 -e 128M -f 4
//
// Size = the buffer; busbw = algbw x 2(n-1)/n. bench/compare reads its CSV.

#include "shmring_perf.hpp"

int main(int argc, char** argv) {
  return shmring::bench::shmring_perf_main(argc, argv, shmring::bench::Collective::allreduce);
}
