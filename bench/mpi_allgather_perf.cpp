// mpi_allgather_perf: allgather_perf's table for Open MPI (MPI_Allgather), to
// compare shmring with Open MPI on the same machine (bench/compare --coll
// allgather; the even baseline of allgatherv).
//
//   mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 4
//   build/bench/mpi_allgather_perf

#include "mpi_perf.hpp"

int main(int argc, char** argv) {
  return shmring::bench::mpi_perf_main(argc, argv, shmring::bench::Collective::allgather);
}
