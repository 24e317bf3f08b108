#pragma once

// main() of the Open MPI *_perf tools (mpi_perf.cpp): each
// mpi_<collective>_perf.cpp is its collective's main() over this, with the
// options, check and columns of the shmring tool of the same collective.

#include "perf_common.hpp"

namespace shmring::bench {

// MPI_Init, the options of `coll`'s tool (-a is accepted and ignored), the
// table over MPI_COMM_WORLD, MPI_Finalize. Returns the process's exit code.
int mpi_perf_main(int argc, char** argv, Collective coll);

}  // namespace shmring::bench
