#pragma once

// The driver of the *_perf benchmarks (shmring and MPI), compiled once into
// the bench's static library: options in the nccl-tests style, the size
// sweep, the timing loop, the result check, the "floor" (every rank copying
// a buffer of the size column once, concurrently) and the nccl-tests table,
// CSV and JSON output. One engine (run_perf) runs any of the collectives
// below with nccl-tests' conventions for the size column and the bus
// bandwidth. Its parts:
//   perf_common.cpp  the sweep, the timing and run_perf
//   perf_options.cpp the command line (add_perf_options, validate)
//   perf_check.cpp   the test patterns, the calls and their exact check
//   perf_output.cpp  the header, rows, CSV and JSON
//   perf_internal.hpp what those share
// Each tool is one small file with its main(): <collective>_perf.cpp over
// shmring_perf.cpp, mpi_<collective>_perf.cpp over mpi_perf.cpp.
//
// A backend derives from PerfBackend and overrides the collectives it
// measures (the members of the same name and arguments as
// shmring::Communicator); run_perf calls one only when that collective is
// run. Only the enums of shmring/types.hpp are used here (header only), so
// the MPI benchmarks do not link shmring.

#include <CLI/CLI.hpp>
#include <cstddef>
#include <span>
#include <string>

#include "shmring/types.hpp"

namespace shmring::bench {

enum class Collective {
  allreduce,
  reduce_scatter,
  allgather,
  broadcast,
  reduce,
  alltoall,
  alltoallv,
  gather,
  scatter,
  allgatherv
};

// What the driver needs to know of a collective: its name, whether it takes
// an operator or a root, whether it has an out-of-place form, and the bus
// bandwidth factor of nccl-tests (the share of the size column that crosses
// each rank's link in an optimal algorithm).
struct CollectiveInfo {
  const char* name;
  bool has_op;
  bool has_root;
  bool has_out_of_place;
  bool has_in_place = true;
};

inline constexpr CollectiveInfo info(Collective c) {
  switch (c) {
    case Collective::allreduce:
      return {"allreduce", true, false, true};
    case Collective::reduce_scatter:
      return {"reduce_scatter", true, false, true};
    case Collective::allgather:
      return {"allgather", false, false, true};
    case Collective::broadcast:
      // shmring's broadcast has one buffer: it is always in place.
      return {"broadcast", false, true, false};
    case Collective::reduce:
      return {"reduce", true, true, true};
    case Collective::alltoall:
      return {"alltoall", false, false, true, false};
    case Collective::alltoallv:
      return {"alltoallv", false, false, true, false};
    case Collective::gather:
      return {"gather", false, true, true};
    case Collective::scatter:
      return {"scatter", false, true, true};
    case Collective::allgatherv:
      return {"allgatherv", false, false, true};
  }
  return {"?", false, false, false};
}

struct PerfOptions {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = 128u << 20;
  double factor = 2;
  // Timing (see time_phase): by default each size runs warm-up calls for
  // at least a tenth of `min_time_s`, then `rounds` rounds that together
  // last at least `min_time_s` on the slowest rank, as OSU and Open MPI's
  // tests do; -n / -w fix the counts instead.
  int iters = 0;    // -n: calls per round; 0 = by time
  int warmup = -1;  // -w: warm-up calls; -1 = by time
  double min_time_s = 0.1;
  int rounds = 5;
  std::string dtype = "float";
  std::string op = "sum";
  int check = 1;
  std::string algorithm = "auto";
  bool vary = false;  // -I: rotate through a pool of buffers larger than the caches
  bool csv = false;
  bool json = false;
  bool no_floor = false;
  bool zeros = false;  // --zeros: time zero-filled buffers instead of the check pattern
  bool in_place_only = false;
  bool out_of_place_only = false;
  bool uneven = false;  // alltoall_perf --uneven: alltoallv with uneven counts
  bool even = false;    // allgatherv_perf --even: equal counts through allgatherv
  int root = 0;         // -r: broadcast and reduce
  // With -n: iterations shrink for large sizes so that one size moves about
  // this many bytes per round (at least 3 iterations, at most `iters`).
  double budget_bytes = 2.0 * (1u << 30);
};

// What run_perf needs of a library: rank, size, the collectives and the few
// helpers the driver uses. A collective the backend does not override
// throws std::logic_error naming the backend and the collective.
class PerfBackend {
 public:
  virtual ~PerfBackend() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;
  virtual bool supports(DataType t, ReduceOp op) const = 0;
  virtual void barrier() = 0;
  virtual double max_over_ranks(double v) = 0;
  virtual double sum_over_ranks(double v) = 0;

  virtual void allreduce(const void* send, void* recv, std::size_t count, DataType t,
                         ReduceOp op) = 0;
  virtual void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType t,
                              ReduceOp op);
  virtual void allgather(const void* send, void* recv, std::size_t send_count, DataType t);
  virtual void broadcast(void* buffer, std::size_t count, DataType t, int root);
  virtual void reduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                      int root);
  virtual void alltoall(const void* send, void* recv, std::size_t count, DataType t);
  virtual void alltoallv(const void* send, std::span<const std::size_t> send_counts,
                         std::span<const std::size_t> send_displs, void* recv,
                         std::span<const std::size_t> recv_counts,
                         std::span<const std::size_t> recv_displs, DataType t);
  virtual void gather(const void* send, void* recv, std::size_t count, DataType t, int root);
  virtual void scatter(const void* send, void* recv, std::size_t count, DataType t, int root);
  virtual void allgatherv(const void* send, std::size_t send_count, void* recv,
                          std::span<const std::size_t> recv_counts,
                          std::span<const std::size_t> displs, DataType t);
};

// The options of `coll`'s tool (-o only with an operator, -r only with a
// root, --uneven for alltoall, --even for allgatherv).
void add_perf_options(CLI::App& app, PerfOptions& o, Collective coll = Collective::allreduce);

// Throws CLI::ValidationError for options that contradict each other.
void validate(const PerfOptions& o);

// Runs `coll` over the sizes of `o` and prints one row per size on rank 0.
// Returns 0 when every checked element was right, 1 otherwise.
int run_perf(PerfBackend& b, const PerfOptions& o, Collective coll);

}  // namespace shmring::bench
