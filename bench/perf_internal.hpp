#pragma once

// What the driver's files share (perf_common.hpp lists them): the types,
// values and layouts of one call, one row's timings, and the functions one
// file gives the others.

#include <fmt/format.h>

#include <unistd.h>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "perf_common.hpp"

namespace shmring::bench {

inline double busbw_factor(Collective c, int n) {
  if (n <= 1) return 1.0;
  switch (c) {
    case Collective::allreduce:
      return 2.0 * (n - 1) / n;
    case Collective::reduce_scatter:
    case Collective::allgather:
    case Collective::alltoall:
    case Collective::alltoallv:
    case Collective::gather:
    case Collective::scatter:
    case Collective::allgatherv:
      return static_cast<double>(n - 1) / n;
    case Collective::broadcast:
    case Collective::reduce:
      return 1.0;
  }
  return 1.0;
}

// nccl-tests' size column is the largest buffer of one rank: the gathered
// recv buffer of allgather, allgatherv and gather (at the root), the full
// send buffer of reduce_scatter, alltoall and scatter (at the root), the
// buffer otherwise. The count column is the count the call takes (per rank
// for allgather, reduce_scatter, gather and scatter, per peer for alltoall;
// the mean of the uneven counts for alltoallv and allgatherv), so size =
// count x element size x the number of blocks below.
inline std::size_t blocks(Collective c, int n) {
  switch (c) {
    case Collective::allreduce:
    case Collective::broadcast:
    case Collective::reduce:
      return 1;
    default:
      return static_cast<std::size_t>(n);
  }
}

struct TypeInfo {
  const char* name;
  DataType dtype;
  std::size_t size;
};

// perf_options.cpp: the names of the -d and -o options.
const TypeInfo& parse_type(const std::string& s);
ReduceOp parse_op(const std::string& s);
const char* op_name(ReduceOp op);

// ---- Values (perf_check.cpp): conversions between the element types and
// double, and the patterns the check expects.

void store_value(void* base, std::size_t i, DataType t, double v);
double load_value(const void* base, std::size_t i, DataType t);

// Test pattern: small integers that differ with rank and index (a wrong
// offset cannot pass), exact in every type and for every operator, so the
// expected value does not depend on the order of the reduction. uint8 gets
// non-negative values; prod uses {-1, 1, 2} so products stay small.
double pattern(int rank, std::size_t i, DataType t, ReduceOp op);

// ---- Buffers ----

struct Buffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit Buffer(std::size_t n) : bytes(n) {
    if (posix_memalign(&p, 4096, std::max<std::size_t>(n, 64)) != 0)
      throw std::runtime_error(fmt::format("cannot allocate {} bytes", n));
    std::memset(p, 0, std::max<std::size_t>(n, 64));  // fault the pages in now, not while timed
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

inline std::size_t llc_bytes() {
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? static_cast<std::size_t>(l3) : (32u << 20);
}

inline std::byte* at(void* base, std::size_t elems, std::size_t elem_size) {
  return static_cast<std::byte*>(base) + elems * elem_size;
}

// ---- One call ----

// Counts and displacements (elements) of one rank's alltoall(v) or
// allgatherv call; empty for the other collectives.
struct VLayout {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
};

VLayout v_layout(Collective c, std::size_t count, int n, int me, bool even);

// The arguments of one collective call in the driver's terms: `count` is the
// count column (per rank for allgather and reduce_scatter).
struct Call {
  Collective coll;
  std::size_t count;
  DataType dtype;
  std::size_t elem_size;
  ReduceOp op;
  int root;
  VLayout v;  // alltoall(v), allgatherv
};

// Runs the call (perf_check.cpp): out of place send -> recv; in place in
// `buf` with nccl-tests' offsets.
void invoke(PerfBackend& b, const Call& c, const void* send, void* recv);
void invoke_in_place(PerfBackend& b, const Call& c, void* buf);

// ---- One row ----

struct Timing {
  double us = 0, algbw = 0, busbw = 0;
  long long wrong = 0;
  // Per-call time of the first call of the phase, and the min / median /
  // max over rounds of each round's mean: one stall cannot hide in (or
  // fake) the mean without showing here.
  double first_us = 0, min_us = 0, med_us = 0, max_us = 0;
  int calls = 0;  // timed calls, all rounds together
};
struct Row {
  std::size_t bytes = 0, count = 0;
  Timing oop, ip;
  double floor_us = 0;
  int iters = 0;
};

// Runs the collective once on fresh inputs and counts, over all ranks, the
// output elements that differ from the exact expected value. `send` and
// `recv` hold the size column's bytes each; in place uses `recv` only.
long long check_once(PerfBackend& b, const Call& c, void* send, void* recv, bool in_place);

// ---- Output (perf_output.cpp) ----

// The phases a run measures: a collective's forms, less the one the options skip.
inline bool has_in_place_phase(const PerfOptions& o, Collective c) {
  return info(c).has_in_place && !o.out_of_place_only;
}
inline bool has_out_of_place_phase(const PerfOptions& o, Collective c) {
  return info(c).has_out_of_place && !o.in_place_only;
}

struct RowLabels {
  const char* backend;
  int nranks;
  const char* type;
  const char* op;
  Collective coll;
  int root;      // -1: none
  bool has_oop;  // the collective has an out-of-place form
  bool has_ip;   // the in-place phase runs (the collective has one, not --out-of-place-only)
};

void print_header(const PerfOptions& o, const char* backend, int nranks, Collective coll);
void print_row(const PerfOptions& o, const RowLabels& l, const Row& r, bool first);

}  // namespace shmring::bench
