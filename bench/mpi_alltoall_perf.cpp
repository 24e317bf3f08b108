// mpi_alltoall_perf: alltoall_perf's table for Open MPI (MPI_Alltoall; --uneven:
// MPI_Alltoallv), to compare shmring with Open MPI on the same machine
// (bench/compare --coll alltoall).
//
//   mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 4
//   build/bench/mpi_alltoall_perf

#include "mpi_perf.hpp"

int main(int argc, char** argv) {
  return shmring::bench::mpi_perf_main(argc, argv, shmring::bench::Collective::alltoall);
}
