// mpi_scatter_perf: scatter_perf's table for Open MPI (MPI_Scatter), to compare
// shmring with Open MPI on the same machine (bench/compare --coll scatter).
//
//   mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 4
//   build/bench/mpi_scatter_perf

#include "mpi_perf.hpp"

int main(int argc, char** argv) {
  return shmring::bench::mpi_perf_main(argc, argv, shmring::bench::Collective::scatter);
}
