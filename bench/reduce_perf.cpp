// reduce_perf: the nccl-tests reduce table for shmring, plus the "floor" (every
// rank copying a buffer of the size column once, concurrently).
//
//   build/tools/shmrun -n 2 -- build/bench/reduce_perf -b 8 -e 128M -f 4 -r 1
//
// Size = the buffer; busbw = algbw (factor 1). In place: recv == send at the
// root. -r picks the root (the only rank whose result is checked).

#include "shmring_perf.hpp"

int main(int argc, char** argv) {
  return shmring::bench::shmring_perf_main(argc, argv, shmring::bench::Collective::reduce);
}
