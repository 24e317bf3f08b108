// broadcast_perf: the nccl-tests broadcast table for shmring, plus the "floor" (every
// rank copying a buffer of the size column once, concurrently).
//
//   build/tools/shmrun -n 2 -- build/bench/broadcast_perf -b 8 -e 128M -f 4 -r 1
//
// Size = the buffer; busbw = algbw (factor 1). shmring's broadcast has one
// buffer, so only the in-place columns are measured. -r picks the root.

#include "shmring_perf.hpp"

int main(int argc, char** argv) {
  return shmring::bench::shmring_perf_main(argc, argv, shmring::bench::Collective::broadcast);
}
