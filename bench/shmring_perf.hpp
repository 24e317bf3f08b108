#pragma once

// main() of the shmring *_perf tools (shmring_perf.cpp): each
// <collective>_perf.cpp is its collective's main() over this.

#include "perf_common.hpp"

namespace shmring::bench {

// Parses the options of `coll`'s tool, forces the algorithm (-a) and runs
// the table over shmring::Communicator. Returns the process's exit code.
int shmring_perf_main(int argc, char** argv, Collective coll);

}  // namespace shmring::bench
