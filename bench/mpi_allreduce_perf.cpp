// mpi_allreduce_perf: the allreduce_perf table for MPI_Allreduce, to compare
// shmring with Open MPI on the same machine.
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/mpi_allreduce_perf -b 8 -e 128M

#include "mpi_perf.hpp"

int main(int argc, char** argv) {
  return shmring::bench::mpi_perf_main(argc, argv, shmring::bench::Collective::allreduce);
}
