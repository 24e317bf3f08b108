#pragma once

// Shared driver of the *_perf benchmarks (shmring and MPI): options in the
// nccl-tests style, the timing loop, the result check, the "floor" (every
// rank copying a buffer of the size column once, concurrently) and the
// nccl-tests table, CSV and JSON output. One engine (run_perf) runs any of
// the collectives below with nccl-tests' conventions for the size column and
// the bus bandwidth.
//
// A backend provides the collectives it measures and the few helpers the
// driver needs:
//   int rank() const; int size() const; const char* name() const;
//   bool supports(DataType, ReduceOp) const;
//   void allreduce(const void* send, void* recv, std::size_t count, DataType, ReduceOp);
//   void barrier();
//   double max_over_ranks(double); double sum_over_ranks(double);
// and, for the other collectives, the members of the same name and arguments
// as shmring::Communicator (reduce_scatter, allgather, broadcast, reduce);
// run_perf asks for a member only when that collective is run.
// Only the enums of shmring/types.hpp are used here (header only), so the MPI
// benchmark does not link shmring.

#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "shmring/types.hpp"

#include "sizes.hpp"

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
  bool in_place_only = false;
  bool out_of_place_only = false;
  bool uneven = false;  // alltoall_perf --uneven: alltoallv with uneven counts
  bool even = false;    // allgatherv_perf --even: equal counts through allgatherv
  int root = 0;         // -r: broadcast and reduce
  // With -n: iterations shrink for large sizes so that one size moves about
  // this many bytes per round (at least 3 iterations, at most `iters`).
  double budget_bytes = 2.0 * (1u << 30);
};

struct TypeInfo {
  const char* name;
  DataType dtype;
  std::size_t size;
};

inline constexpr TypeInfo kTypes[] = {
    {"int8", DataType::int8, 1},     {"uint8", DataType::uint8, 1},
    {"int32", DataType::int32, 4},   {"int64", DataType::int64, 8},
    {"half", DataType::float16, 2},  {"bfloat16", DataType::bfloat16, 2},
    {"float", DataType::float32, 4}, {"double", DataType::float64, 8},
};

inline const TypeInfo& parse_type(const std::string& s) {
  std::string t = s;
  if (t == "float32") t = "float";
  if (t == "float64") t = "double";
  if (t == "float16") t = "half";
  if (t == "bf16") t = "bfloat16";
  for (const auto& ti : kTypes)
    if (t == ti.name) return ti;
  throw CLI::ValidationError(
      "-d", fmt::format("datatype '{}': expected one of int8, uint8, int32, int64, half, "
                        "bfloat16, float, double",
                        s));
}

inline ReduceOp parse_op(const std::string& s) {
  static constexpr const char* kNames[] = {"sum", "prod", "min", "max", "avg"};
  for (int i = 0; i < 5; ++i)
    if (s == kNames[i]) return static_cast<ReduceOp>(i);
  throw CLI::ValidationError("-o",
                             fmt::format("operator '{}': expected sum, prod, min, max or avg", s));
}

inline const char* op_name(ReduceOp op) {
  static constexpr const char* kNames[] = {"sum", "prod", "min", "max", "avg"};
  return kNames[static_cast<int>(op)];
}

inline void add_perf_options(CLI::App& app, PerfOptions& o,
                             Collective coll = Collective::allreduce) {
  app.add_option_function<std::string>(
         "-b,--minbytes", [&o](const std::string& s) { o.min_bytes = parse_bytes(s); },
         "Smallest size in bytes (8, 64K, 1M, ...)")
      ->default_str("8");
  app.add_option_function<std::string>(
         "-e,--maxbytes", [&o](const std::string& s) { o.max_bytes = parse_bytes(s); },
         "Largest size in bytes")
      ->default_str("128M");
  app.add_option("-f,--stepfactor", o.factor, "Multiply the size by this factor each step")
      ->check(CLI::Range(1.0001, 1e6))
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters,
                 "Timed calls per round (fewer for big sizes, see --budget); default: as many "
                 "as fill --min-time")
      ->check(CLI::Range(1, 1000000));
  app.add_option("-w,--warmup_iters", o.warmup,
                 "Warm-up calls per size; default: as many as fill a tenth of --min-time "
                 "(at least 2)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--min-time", o.min_time_s,
                 "Seconds the timed rounds of one size and phase last together, at least")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--rounds", o.rounds,
                 "Timed rounds per size and phase; the table shows the mean time over all "
                 "rounds and the min/median/max of the rounds' means")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("-d,--datatype", o.dtype,
                 "int8, uint8, int32, int64, half, bfloat16, float, double")
      ->capture_default_str();
  if (info(coll).has_op)
    app.add_option("-o,--op", o.op, "sum, prod, min, max, avg")->capture_default_str();
  if (info(coll).has_root)
    app.add_option("-r,--root", o.root, "Root rank (checked against the rank count once known)")
        ->capture_default_str();
  app.add_option("-c,--check", o.check, "Check the result (0: no, 1: yes)")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("-a,--algorithm", o.algorithm, "Algorithm (auto, ring, direct, two_shot)")
      ->capture_default_str();
  app.add_flag("-I,--vary", o.vary,
               "Rotate through buffers that together exceed the caches (cache-cold data)");
  app.add_flag("--csv", o.csv, "CSV output (rank 0, stdout)");
  app.add_flag("--json", o.json, "JSON output (rank 0, stdout)");
  app.add_flag("--no-floor", o.no_floor, "Skip the concurrent-memcpy floor measurement");
  app.add_flag("--in-place-only", o.in_place_only, "Skip the out-of-place measurement");
  app.add_flag("--out-of-place-only", o.out_of_place_only, "Skip the in-place measurement");
  if (coll == Collective::alltoall)
    app.add_flag("--uneven", o.uneven,
                 "Run alltoallv with uneven per-peer counts (rank i sends f((j-i) mod n) "
                 "elements to rank j, f growing with its argument, every rank sending and "
                 "receiving n x count in all)");
  if (coll == Collective::allgatherv)
    app.add_flag("--even", o.even,
                 "Equal counts (count per rank) instead of the default uneven ones "
                 "(rank r contributes about (r+1) / (n(n+1)/2) of the total)");
  app.add_option_function<std::string>(
         "--budget",
         [&o](const std::string& s) { o.budget_bytes = static_cast<double>(parse_bytes(s)); },
         "With -n: bytes one round may move (64M, 2G); caps the calls of large sizes")
      ->default_str("2G");
}

inline void validate(const PerfOptions& o) {
  // Sizes grow by multiplication: a minimum of 0 would never grow.
  if (o.min_bytes == 0)
    throw CLI::ValidationError("-b 0: expected a minimum size of at least 1 byte");
  if (o.min_bytes > o.max_bytes)
    throw CLI::ValidationError(
        fmt::format("-b {} is larger than -e {}: expected min <= max", o.min_bytes, o.max_bytes));
  if (o.csv && o.json) throw CLI::ValidationError("--csv and --json: choose one");
  if (o.in_place_only && o.out_of_place_only)
    throw CLI::ValidationError("--in-place-only and --out-of-place-only: choose one");
}

// ---- Values: conversions between the element types and double. ----

inline std::uint16_t bf16_from_double(double d) {
  float f = static_cast<float>(d);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>(u);
}
inline double bf16_to_double(std::uint16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline void store_value(void* base, std::size_t i, DataType t, double v) {
  switch (t) {
    case DataType::int8:
      static_cast<std::int8_t*>(base)[i] = static_cast<std::int8_t>(v);
      break;
    case DataType::uint8:
      static_cast<std::uint8_t*>(base)[i] = static_cast<std::uint8_t>(v);
      break;
    case DataType::int32:
      static_cast<std::int32_t*>(base)[i] = static_cast<std::int32_t>(v);
      break;
    case DataType::int64:
      static_cast<std::int64_t*>(base)[i] = static_cast<std::int64_t>(v);
      break;
    case DataType::float16:
      static_cast<_Float16*>(base)[i] = static_cast<_Float16>(v);
      break;
    case DataType::bfloat16:
      static_cast<std::uint16_t*>(base)[i] = bf16_from_double(v);
      break;
    case DataType::float32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DataType::float64:
      static_cast<double*>(base)[i] = v;
      break;
  }
}

inline double load_value(const void* base, std::size_t i, DataType t) {
  switch (t) {
    case DataType::int8:
      return static_cast<const std::int8_t*>(base)[i];
    case DataType::uint8:
      return static_cast<const std::uint8_t*>(base)[i];
    case DataType::int32:
      return static_cast<const std::int32_t*>(base)[i];
    case DataType::int64:
      return static_cast<double>(static_cast<const std::int64_t*>(base)[i]);
    case DataType::float16:
      return static_cast<double>(static_cast<const _Float16*>(base)[i]);
    case DataType::bfloat16:
      return bf16_to_double(static_cast<const std::uint16_t*>(base)[i]);
    case DataType::float32:
      return static_cast<const float*>(base)[i];
    case DataType::float64:
      return static_cast<const double*>(base)[i];
  }
  return 0;
}

// Test pattern: small integers that differ with rank and index (a wrong
// offset cannot pass), exact in every type and for every operator, so the
// expected value does not depend on the order of the reduction. uint8 gets
// non-negative values; prod uses {-1, 1, 2} so products stay small.
inline double pattern(int rank, std::size_t i, DataType t, ReduceOp op) {
  const auto k = static_cast<long long>((i * 13 + static_cast<std::size_t>(rank) * 7) % 17);
  if (op == ReduceOp::prod) {
    if ((i + static_cast<std::size_t>(rank)) % 5 == 0) return 2;
    return (t != DataType::uint8 && (i * 3 + static_cast<std::size_t>(rank)) % 7 == 0) ? -1 : 1;
  }
  return t == DataType::uint8 ? static_cast<double>(k % 9) : static_cast<double>(k - 8);
}

inline double expected_value(int nranks, std::size_t i, DataType t, ReduceOp op) {
  double acc = pattern(0, i, t, op);
  for (int r = 1; r < nranks; ++r) {
    double v = pattern(r, i, t, op);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        acc += v;
        break;
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == ReduceOp::avg) acc /= nranks;
  // Integer results wrap like the library's (two's complement).
  if (t == DataType::int8) acc = static_cast<std::int8_t>(static_cast<long long>(acc));
  if (t == DataType::uint8) acc = static_cast<std::uint8_t>(static_cast<long long>(acc));
  return acc;
}

// Relative tolerance: zero except for avg, whose final division rounds.
inline double tolerance(DataType t, ReduceOp op) {
  if (op != ReduceOp::avg) return 0;
  switch (t) {
    case DataType::float16:
      return 1.0 / 1024;
    case DataType::bfloat16:
      return 1.0 / 128;
    case DataType::float32:
      return 1e-6;
    default:
      return 1e-14;
  }
}

// Pattern of the collectives that only move data (allgather, broadcast):
// no reduction to keep exact, so a wider range, with a rank term that never
// repeats between two ranks at the same index (31 x dr is not a multiple of
// 199 for |dr| < 199). Exact in every type, bfloat16 included (|v| < 256).
inline double move_pattern(int rank, std::size_t i, DataType t) {
  const auto v = static_cast<long long>((i * 7 + static_cast<std::size_t>(rank) * 31 + 3) % 199);
  return t == DataType::uint8 ? static_cast<double>(v) : static_cast<double>(v - 99);
}

// Written into every output before a check, so a collective that leaves its
// output alone cannot pass on the results of the timed runs. Outside both
// patterns' ranges (and their sums for fewer than 15 ranks).
inline double poison(DataType t) {
  return t == DataType::uint8 ? 255 : 127;
}

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

// `total` elements in n parts that grow with the part's index: part k gets
// about (k+1) / (n(n+1)/2) of the total, the rounding remainder goes to the
// last, so the parts sum to `total` exactly and small totals leave zeros in
// the first parts (the case a v-collective must not trip on).
inline std::vector<std::size_t> uneven_split(std::size_t total, int n) {
  std::vector<std::size_t> parts(static_cast<std::size_t>(n));
  const std::size_t weights = static_cast<std::size_t>(n) * (n + 1) / 2;
  std::size_t given = 0;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    parts[k] = total * (k + 1) / weights;
    given += parts[k];
  }
  parts.back() += total - given;
  return parts;
}

inline std::vector<std::size_t> packed_displs(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> displs(counts.size());
  std::size_t offset = 0;
  for (std::size_t j = 0; j < counts.size(); ++j) {
    displs[j] = offset;
    offset += counts[j];
  }
  return displs;
}

// The layout of rank `me` for a count column of `count`:
// - alltoall: count elements to and from every peer, blocks in rank order.
// - alltoallv: rank i sends f((j - i) mod n) elements to rank j, f =
//   uneven_split(n x count): every rank sends and receives n x count in all
//   (each f value once per row and column), the pair (i, j) differs from
//   (j, i), and the blocks to oneself are the smallest.
// - allgatherv: rank r contributes uneven_split(n x count)[r] elements
//   (count each with `even`), packed in rank order.
inline VLayout v_layout(Collective c, std::size_t count, int n, int me, bool even) {
  VLayout v;
  const auto un = static_cast<std::size_t>(n);
  const auto ume = static_cast<std::size_t>(me);
  switch (c) {
    case Collective::alltoall:
      v.send_counts.assign(un, count);
      v.recv_counts.assign(un, count);
      break;
    case Collective::alltoallv: {
      const std::vector<std::size_t> f = uneven_split(un * count, n);
      for (std::size_t j = 0; j < un; ++j) {
        v.send_counts.push_back(f[(j + un - ume) % un]);
        v.recv_counts.push_back(f[(ume + un - j) % un]);
      }
      break;
    }
    case Collective::allgatherv:
      v.recv_counts = even ? std::vector<std::size_t>(un, count) : uneven_split(un * count, n);
      v.send_counts = {v.recv_counts[ume]};
      break;
    default:
      return v;
  }
  v.send_displs = packed_displs(v.send_counts);
  v.recv_displs = packed_displs(v.recv_counts);
  return v;
}

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

// Out of place: send -> recv. In place: everything in `buf`, which holds the
// size column's bytes, with nccl-tests' offsets (allgather sends from
// buf + rank x count, reduce_scatter receives there; reduce and broadcast
// use buf for both).
template <class Backend>
void invoke(Backend& b, const Call& c, const void* send, void* recv) {
  auto missing = [&] {
    throw std::logic_error(fmt::format("backend {} has no {}", b.name(), info(c.coll).name));
  };
  switch (c.coll) {
    case Collective::allreduce:
      b.allreduce(send, recv, c.count, c.dtype, c.op);
      return;
    case Collective::reduce_scatter:
      if constexpr (requires { b.reduce_scatter(send, recv, c.count, c.dtype, c.op); })
        b.reduce_scatter(send, recv, c.count, c.dtype, c.op);
      else
        missing();
      return;
    case Collective::allgather:
      if constexpr (requires { b.allgather(send, recv, c.count, c.dtype); })
        b.allgather(send, recv, c.count, c.dtype);
      else
        missing();
      return;
    case Collective::broadcast:
      if constexpr (requires { b.broadcast(recv, c.count, c.dtype, c.root); })
        b.broadcast(recv, c.count, c.dtype, c.root);
      else
        missing();
      return;
    case Collective::reduce:
      if constexpr (requires { b.reduce(send, recv, c.count, c.dtype, c.op, c.root); })
        b.reduce(send, recv, c.count, c.dtype, c.op, c.root);
      else
        missing();
      return;
    case Collective::alltoall:
      if constexpr (requires { b.alltoall(send, recv, c.count, c.dtype); })
        b.alltoall(send, recv, c.count, c.dtype);
      else
        missing();
      return;
    case Collective::alltoallv:
      if constexpr (requires {
                      b.alltoallv(send, c.v.send_counts, c.v.send_displs, recv, c.v.recv_counts,
                                  c.v.recv_displs, c.dtype);
                    })
        b.alltoallv(send, c.v.send_counts, c.v.send_displs, recv, c.v.recv_counts, c.v.recv_displs,
                    c.dtype);
      else
        missing();
      return;
    case Collective::gather:
      if constexpr (requires { b.gather(send, recv, c.count, c.dtype, c.root); })
        b.gather(send, recv, c.count, c.dtype, c.root);
      else
        missing();
      return;
    case Collective::scatter:
      if constexpr (requires { b.scatter(send, recv, c.count, c.dtype, c.root); })
        b.scatter(send, recv, c.count, c.dtype, c.root);
      else
        missing();
      return;
    case Collective::allgatherv:
      if constexpr (requires {
                      b.allgatherv(send, c.v.send_counts[0], recv, c.v.recv_counts, c.v.recv_displs,
                                   c.dtype);
                    })
        b.allgatherv(send, c.v.send_counts[0], recv, c.v.recv_counts, c.v.recv_displs, c.dtype);
      else
        missing();
      return;
  }
}

template <class Backend>
void invoke_in_place(Backend& b, const Call& c, void* buf) {
  const auto mine = static_cast<std::size_t>(b.rank()) * c.count;
  switch (c.coll) {
    case Collective::reduce_scatter:
      invoke(b, c, buf, at(buf, mine, c.elem_size));
      return;
    case Collective::allgather:
    case Collective::gather:
      invoke(b, c, at(buf, mine, c.elem_size), buf);
      return;
    case Collective::scatter:
      invoke(b, c, buf, at(buf, mine, c.elem_size));
      return;
    case Collective::allgatherv:
      invoke(b, c, at(buf, c.v.recv_displs[static_cast<std::size_t>(b.rank())], c.elem_size), buf);
      return;
    case Collective::alltoall:
    case Collective::alltoallv:
      throw std::logic_error(fmt::format("{} has no in-place form", info(c.coll).name));
    default:
      invoke(b, c, buf, buf);
      return;
  }
}

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

// Times `body(i)` (one call) on every rank: warm-up, then o.rounds timed
// rounds, each started by a barrier, each round's time the slowest rank's.
// Every count that more than one rank must agree on comes from a
// max_over_ranks, so the ranks always make the same number of calls.
template <class Backend>
Timing time_phase(Backend& b, const PerfOptions& o, std::size_t bytes, auto&& body) {
  using clock = std::chrono::steady_clock;
  auto elapsed_us = [](clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(clock::now() - t0).count();
  };
  Timing t;
  int call = 0;
  b.barrier();
  auto t0 = clock::now();
  body(call++);
  t.first_us = b.max_over_ranks(elapsed_us(t0));
  double per_call_us = t.first_us;
  if (o.warmup >= 0) {
    for (int i = 1; i < o.warmup; ++i) body(call++);
  } else {
    // Doubling batches until a tenth of --min-time has passed; the last
    // batch estimates the per-call time of the timed rounds.
    const double warm_us = std::max(1e3, o.min_time_s * 1e5);
    double spent_us = t.first_us;
    for (int batch = 1; spent_us < warm_us && batch <= (1 << 20); batch *= 2) {
      t0 = clock::now();
      for (int i = 0; i < batch; ++i) body(call++);
      const double us = b.max_over_ranks(elapsed_us(t0));
      spent_us += us;
      per_call_us = us / batch;
    }
  }
  int per_round = 0;
  if (o.iters > 0) {
    per_round = std::clamp(static_cast<int>(o.budget_bytes / static_cast<double>(bytes)), 3,
                           std::max(3, o.iters));
    per_round = std::min(per_round, o.iters);
  } else {
    const double round_us = o.min_time_s * 1e6 / o.rounds;
    per_round =
        static_cast<int>(std::clamp(std::ceil(round_us / std::max(per_call_us, 1e-3)), 1.0, 1e7));
  }
  std::vector<double> means;
  double total_us = 0;
  for (int r = 0; r < o.rounds; ++r) {
    b.barrier();
    t0 = clock::now();
    for (int i = 0; i < per_round; ++i) body(call++);
    const double us = b.max_over_ranks(elapsed_us(t0));
    total_us += us;
    means.push_back(us / per_round);
  }
  std::sort(means.begin(), means.end());
  t.calls = per_round * o.rounds;
  t.us = total_us / t.calls;
  t.min_us = means.front();
  t.med_us = means[(means.size() - 1) / 2];
  t.max_us = means.back();
  return t;
}

// Runs the collective once on fresh inputs and counts, over all ranks, the
// output elements that differ from the exact expected value. `send` and
// `recv` hold the size column's bytes each; in place uses `recv` only.
template <class Backend>
long long check_once(Backend& b, const Call& c, void* send, void* recv, bool in_place) {
  const int n = b.size(), me = b.rank();
  const std::size_t count = c.count, mine = static_cast<std::size_t>(me) * count;
  const DataType t = c.dtype;
  const double tol = tolerance(t, c.op);
  long long wrong = 0;
  auto expect = [&](const void* out, std::size_t i, double want) {
    double got = load_value(out, i, t);
    if (!(std::abs(got - want) <= tol * std::max(1.0, std::abs(want)))) ++wrong;
  };
  auto fill = [&](void* p, std::size_t from, std::size_t to, auto&& value) {
    for (std::size_t i = from; i < to; ++i) store_value(p, i, t, value(i));
  };
  auto reduced = [&](std::size_t i) { return pattern(me, i, t, c.op); };
  auto bad = [&](std::size_t) { return poison(t); };

  switch (c.coll) {
    case Collective::allreduce:
    case Collective::reduce: {
      void* in = in_place ? recv : send;
      fill(in, 0, count, reduced);
      if (!in_place) fill(recv, 0, count, bad);
      invoke(b, c, in, recv);
      if (c.coll == Collective::allreduce || me == c.root)
        for (std::size_t i = 0; i < count; ++i) expect(recv, i, expected_value(n, i, t, c.op));
      break;
    }
    case Collective::reduce_scatter: {
      // Element j of every rank's send buffer is pattern(rank, j); rank r
      // receives block r of the reduction.
      void* in = in_place ? recv : send;
      fill(in, 0, count * static_cast<std::size_t>(n), reduced);
      void* out = in_place ? at(recv, mine, c.elem_size) : recv;
      if (!in_place) fill(recv, 0, count, bad);
      invoke(b, c, in, out);
      for (std::size_t i = 0; i < count; ++i) expect(out, i, expected_value(n, mine + i, t, c.op));
      break;
    }
    case Collective::allgather: {
      const std::size_t total = count * static_cast<std::size_t>(n);
      fill(recv, 0, total, bad);
      void* in = in_place ? at(recv, mine, c.elem_size) : send;
      fill(in, 0, count, [&](std::size_t i) { return move_pattern(me, i, t); });
      invoke(b, c, in, recv);
      for (std::size_t j = 0; j < total; ++j)
        expect(recv, j, move_pattern(static_cast<int>(j / count), j % count, t));
      break;
    }
    case Collective::broadcast: {
      // Every rank starts from its own values; all must end with root's.
      fill(recv, 0, count, [&](std::size_t i) { return move_pattern(me, i, t); });
      invoke(b, c, recv, recv);
      for (std::size_t i = 0; i < count; ++i) expect(recv, i, move_pattern(c.root, i, t));
      break;
    }
    case Collective::alltoall:
    case Collective::alltoallv: {
      // Rank i's send element x is move_pattern(i, x): block j of my recv
      // must hold what rank j sent from its offset for me.
      const VLayout& v = c.v;
      fill(send, 0, count * static_cast<std::size_t>(n),
           [&](std::size_t i) { return move_pattern(me, i, t); });
      fill(recv, 0, count * static_cast<std::size_t>(n), bad);
      invoke(b, c, send, recv);
      for (int j = 0; j < n; ++j) {
        const auto uj = static_cast<std::size_t>(j);
        const std::size_t from =
            v_layout(c.coll, count, n, j, false).send_displs[static_cast<std::size_t>(me)];
        for (std::size_t k = 0; k < v.recv_counts[uj]; ++k)
          expect(recv, v.recv_displs[uj] + k, move_pattern(j, from + k, t));
      }
      break;
    }
    case Collective::gather: {
      // Root's recv block r must hold rank r's count elements.
      const std::size_t total = count * static_cast<std::size_t>(n);
      if (me == c.root) fill(recv, 0, total, bad);
      void* in = in_place ? at(recv, mine, c.elem_size) : send;
      fill(in, 0, count, [&](std::size_t i) { return move_pattern(me, i, t); });
      invoke(b, c, in, recv);
      if (me == c.root)
        for (std::size_t j = 0; j < total; ++j)
          expect(recv, j, move_pattern(static_cast<int>(j / count), j % count, t));
      break;
    }
    case Collective::scatter: {
      // Block r of root's send holds rank r's values; every rank checks its own.
      void* in = in_place ? recv : send;
      if (me == c.root)
        fill(in, 0, count * static_cast<std::size_t>(n), [&](std::size_t j) {
          return move_pattern(static_cast<int>(j / count), j % count, t);
        });
      void* out = in_place ? at(recv, mine, c.elem_size) : recv;
      if (!(in_place && me == c.root)) fill(out, 0, count, bad);
      invoke(b, c, in, out);
      for (std::size_t i = 0; i < count; ++i) expect(out, i, move_pattern(me, i, t));
      break;
    }
    case Collective::allgatherv: {
      const VLayout& v = c.v;
      const auto ume = static_cast<std::size_t>(me);
      fill(recv, 0, count * static_cast<std::size_t>(n), bad);
      void* in = in_place ? at(recv, v.recv_displs[ume], c.elem_size) : send;
      fill(in, 0, v.recv_counts[ume], [&](std::size_t i) { return move_pattern(me, i, t); });
      invoke(b, c, in, recv);
      for (int j = 0; j < n; ++j) {
        const auto uj = static_cast<std::size_t>(j);
        for (std::size_t k = 0; k < v.recv_counts[uj]; ++k)
          expect(recv, v.recv_displs[uj] + k, move_pattern(j, k, t));
      }
      break;
    }
  }
  return static_cast<long long>(b.sum_over_ranks(static_cast<double>(wrong)));
}

// ---- Output ----

inline double busbw_factor(int n) {
  return busbw_factor(Collective::allreduce, n);
}

// allreduce_perf keeps the table, CSV and JSON it always had (bench/compare
// reads them); the other collectives add nccl-tests' root column (-1 where
// there is none) and, in CSV and JSON, the collective's name.
inline const char* size_column(Collective c) {
  switch (c) {
    case Collective::allgather:
    case Collective::allgatherv:
      return "recv (ranks x count)";
    case Collective::reduce_scatter:
      return "send (ranks x count)";
    case Collective::alltoall:
    case Collective::alltoallv:
      return "send = recv (ranks x count)";
    case Collective::gather:
      return "root's recv (ranks x count)";
    case Collective::scatter:
      return "root's send (ranks x count)";
    default:
      return "buffer";
  }
}

inline const char* count_column(Collective c) {
  switch (c) {
    case Collective::alltoall:
      return " (per peer)";
    case Collective::alltoallv:
    case Collective::allgatherv:
      return " (per rank, on average)";
    default:
      return blocks(c, 2) > 1 ? " (per rank)" : "";
  }
}

// The phases a run measures: a collective's forms, less the one the options skip.
inline bool has_in_place_phase(const PerfOptions& o, Collective c) {
  return info(c).has_in_place && !o.out_of_place_only;
}
inline bool has_out_of_place_phase(const PerfOptions& o, Collective c) {
  return info(c).has_out_of_place && !o.in_place_only;
}

inline void print_header(const PerfOptions& o, const char* backend, int nranks, Collective coll) {
  const bool extra = coll != Collective::allreduce;
  if (o.csv) {
    fmt::print(
        "backend,nranks,size,count,type,redop,iters,oop_time_us,oop_algbw,oop_busbw,oop_wrong,"
        "ip_time_us,ip_algbw,ip_busbw,ip_wrong,floor_us,floor_ratio{},ip_first_us,ip_min_us,"
        "ip_med_us,ip_max_us,oop_first_us,oop_min_us,oop_med_us,oop_max_us\n",
        extra ? ",collective,root" : "");
    return;
  }
  if (o.json) return;
  fmt::print(
      "# {} {}_perf: {} ranks, minBytes {} maxBytes {} step factor {} {} check {} "
      "algorithm {}{}{}\n",
      backend, info(coll).name, nranks, o.min_bytes, o.max_bytes, o.factor,
      fmt::format("{} rounds of {}, warm-up {}", o.rounds,
                  o.iters > 0 ? fmt::format("{} calls", o.iters)
                              : fmt::format("{:g} s / {} (at least)", o.min_time_s, o.rounds),
                  o.warmup >= 0 ? fmt::format("{} calls", o.warmup)
                                : fmt::format("{:g} s", std::max(1e-3, o.min_time_s / 10))),
      o.check, o.algorithm, info(coll).has_root ? fmt::format(" root {}", o.root) : "",
      o.vary ? " (cache-cold: -I)" : "");
  if (extra)
    fmt::print("# size = {} bytes, count = elements per call{}; busbw = algbw x {}\n",
               size_column(coll), count_column(coll),
               coll == Collective::broadcast || coll == Collective::reduce ? "1" : "(n-1)/n");
  if (coll == Collective::alltoallv || coll == Collective::allgatherv)
    fmt::print("# counts: {}\n",
               coll == Collective::alltoallv
                   ? "uneven: rank i sends f((j-i) mod n) to rank j, f(k) ~ (k+1) x 2 count/(n+1)"
               : o.even ? "even: count from every rank"
                        : "uneven: rank r sends f(r) ~ (r+1) x 2 count/(n+1)");
  const bool ip = has_in_place_phase(o, coll);
  fmt::print(
      "# floor = every rank copies its buffer once, concurrently (memcpy); "
      "floor/{0} = floor time / {1} time\n"
      "# time = mean over all timed calls; {1} first = the first call of the size, "
      "min/med/max = over the rounds' means\n#\n",
      ip ? "ip" : "oop", ip ? "in-place" : "out-of-place");
  const std::string root_h = extra ? fmt::format(" {:>4}", "root") : "";
  const std::string root_u = extra ? fmt::format(" {:>4}", "") : "";
  fmt::print("#{:>{}} {:>32} {:>32} {:>18} {:>39}\n", "", extra ? 48 : 43, "out-of-place",
             "in-place", "", ip ? "in-place spread" : "out-of-place spread");
  fmt::print(
      "#{:>11} {:>12} {:>8} {:>6}{} {:>4} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6} "
      "{:>9} {:>8} {:>9} {:>9} {:>9} {:>9}\n",
      "size", "count", "type", "redop", root_h, "n", "time", "algbw", "busbw", "#wrong", "time",
      "algbw", "busbw", "#wrong", "floor", ip ? "floor/ip" : "floor/oop", "first", "min", "med",
      "max");
  fmt::print(
      "#{:>11} {:>12} {:>8} {:>6}{} {:>4} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6} "
      "{:>9} {:>8} {:>9} {:>9} {:>9} {:>9}\n",
      "(B)", "(elements)", "", "", root_u, "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
      "(GB/s)", "", "(us)", "", "(us)", "(us)", "(us)", "(us)");
}

inline std::string wrong_str(const PerfOptions& o, long long w) {
  return o.check ? fmt::format("{}", w) : std::string("N/A");
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

inline void print_row(const PerfOptions& o, const RowLabels& l, const Row& r, bool first) {
  // The floor ratio and the spread columns are the in-place phase's, or the
  // out-of-place one's where there is no in-place phase.
  const Timing& main = l.has_ip ? r.ip : r.oop;
  const double ratio = main.us > 0 && r.floor_us > 0 ? r.floor_us / main.us : 0;
  const bool extra = l.coll != Collective::allreduce;
  if (o.csv) {
    const std::string oop = l.has_oop ? fmt::format("{:.3f},{:.4f},{:.4f},{}", r.oop.us,
                                                    r.oop.algbw, r.oop.busbw, r.oop.wrong)
                                      : std::string(",,,");
    auto spread = [](const Timing& t) {
      return fmt::format("{:.3f},{:.3f},{:.3f},{:.3f}", t.first_us, t.min_us, t.med_us, t.max_us);
    };
    const std::string ip = l.has_ip ? fmt::format("{:.3f},{:.4f},{:.4f},{}", r.ip.us, r.ip.algbw,
                                                  r.ip.busbw, r.ip.wrong)
                                    : std::string(",,,");
    fmt::print("{},{},{},{},{},{},{},{},{},{:.3f},{:.4f}{},{},{}\n", l.backend, l.nranks, r.bytes,
               r.count, l.type, l.op, r.iters, oop, ip, r.floor_us, ratio,
               extra ? fmt::format(",{},{}", info(l.coll).name, l.root) : "",
               l.has_ip ? spread(r.ip) : std::string(",,,"),
               l.has_oop ? spread(r.oop) : std::string(",,,"));
  } else if (o.json) {
    const std::string oop =
        l.has_oop ? fmt::format(
                        "{{\"time_us\": {:.3f}, \"algbw\": {:.4f}, \"busbw\": {:.4f}, "
                        "\"wrong\": {}}}",
                        r.oop.us, r.oop.algbw, r.oop.busbw, r.oop.wrong)
                  : std::string("null");
    fmt::print(
        "{}\n  {{{}\"backend\": \"{}\", \"nranks\": {}, \"size\": {}, \"count\": {}, "
        "\"type\": \"{}\", \"redop\": \"{}\", {}\"iters\": {}, "
        "\"out_of_place\": {}, "
        "\"in_place\": {}, \"floor_us\": {:.3f}, \"floor_ratio\": {:.4f}}}",
        first ? "[" : ",", extra ? fmt::format("\"collective\": \"{}\", ", info(l.coll).name) : "",
        l.backend, l.nranks, r.bytes, r.count, l.type, l.op,
        extra ? fmt::format("\"root\": {}, ", l.root) : "", r.iters, oop,
        l.has_ip ? fmt::format("{{\"time_us\": {:.3f}, \"algbw\": {:.4f}, \"busbw\": {:.4f}, "
                               "\"wrong\": {}, \"first_us\": {:.3f}, \"min_us\": {:.3f}, "
                               "\"med_us\": {:.3f}, \"max_us\": {:.3f}}}",
                               r.ip.us, r.ip.algbw, r.ip.busbw, r.ip.wrong, r.ip.first_us,
                               r.ip.min_us, r.ip.med_us, r.ip.max_us)
                 : std::string("null"),
        r.floor_us, ratio);
  } else {
    const std::string root = extra ? fmt::format(" {:>4}", l.root) : "";
    const std::string oop = l.has_oop
                                ? fmt::format("{:>9.2f} {:>7.2f} {:>7.2f} {:>6}", r.oop.us,
                                              r.oop.algbw, r.oop.busbw, wrong_str(o, r.oop.wrong))
                                : fmt::format("{:>9} {:>7} {:>7} {:>6}", "-", "-", "-", "-");
    const std::string ip = l.has_ip ? fmt::format("{:>9.2f} {:>7.2f} {:>7.2f} {:>6}", r.ip.us,
                                                  r.ip.algbw, r.ip.busbw, wrong_str(o, r.ip.wrong))
                                    : fmt::format("{:>9} {:>7} {:>7} {:>6}", "-", "-", "-", "-");
    fmt::print(
        " {:>11} {:>12} {:>8} {:>6}{} {:>4} {} {} {:>9.2f} {:>8.2f} {:>9.2f} {:>9.2f} {:>9.2f} "
        "{:>9.2f}\n",
        r.bytes, r.count, l.type, l.op, root, l.nranks, oop, ip, r.floor_us, ratio, main.first_us,
        main.min_us, main.med_us, main.max_us);
  }
  std::fflush(stdout);
}

// ---- The driver ----

// Runs `coll` over the sizes of `o` and prints one row per size on rank 0.
// Returns 0 when every checked element was right, 1 otherwise.
template <class Backend>
int run_perf(Backend& b, const PerfOptions& o, Collective coll) {
  if (coll == Collective::alltoall && o.uneven) coll = Collective::alltoallv;
  const CollectiveInfo ci = info(coll);
  const TypeInfo& ti = parse_type(o.dtype);
  // Collectives without an operator move data only: any type they support
  // for a sum is fine.
  const ReduceOp op = ci.has_op ? parse_op(o.op) : ReduceOp::sum;
  if (!b.supports(ti.dtype, op))
    throw CLI::ValidationError(
        ci.has_op ? fmt::format("{} does not support datatype {} with operator {}", b.name(),
                                ti.name, o.op)
                  : fmt::format("{} does not support datatype {}", b.name(), ti.name));
  const int n = b.size();
  if (ci.has_root && (o.root < 0 || o.root >= n))
    throw CLI::ValidationError(
        "-r", fmt::format("root {}: expected a rank in [0, {}) for {} ranks", o.root, n, n));
  const bool has_oop = has_out_of_place_phase(o, coll);
  const bool has_ip = has_in_place_phase(o, coll);
  if (!has_oop && !has_ip)
    throw CLI::ValidationError(fmt::format(
        "{} has no {} form: drop {}", ci.name, o.in_place_only ? "in-place" : "out-of-place",
        o.in_place_only ? "--in-place-only" : "--out-of-place-only"));
  const bool printer = b.rank() == 0;
  if (printer) print_header(o, b.name(), n, coll);
  // --in-place-only prints zeros in the out-of-place columns (as it always
  // did); a collective without an out-of-place form prints none.
  const RowLabels labels{b.name(),
                         n,
                         ti.name,
                         ci.has_op ? op_name(op) : "none",
                         coll,
                         ci.has_root ? o.root : -1,
                         ci.has_out_of_place,
                         has_ip};

  // Sizes: the size column for a count of at least one element (per rank
  // for the collectives with ranks x count buffers).
  const std::size_t unit = ti.size * blocks(coll, n);
  std::vector<std::size_t> sizes;
  for (double s = static_cast<double>(o.min_bytes);
       s <= static_cast<double>(o.max_bytes) * 1.0000001; s *= o.factor) {
    std::size_t bytes = std::max(unit, static_cast<std::size_t>(s) / unit * unit);
    if (sizes.empty() || sizes.back() != bytes) sizes.push_back(bytes);
  }

  double busbw_sum = 0;
  long long wrong_total = 0;
  bool first = true;
  for (std::size_t bytes : sizes) {
    const std::size_t count = bytes / unit;
    const Call call{
        coll, count, ti.dtype, ti.size, op, o.root, v_layout(coll, count, n, b.rank(), o.even)};
    // Both buffers hold the size column's bytes: out of place uses the part
    // of each the call needs, in place and the floor use all of recv.
    // Cache-cold mode (-I) rotates through page-aligned buffers carved from
    // one pool per side that together exceed the caches; one allocation
    // (not one per buffer, each rounded up to pages) keeps small sizes from
    // asking for millions of pages.
    const std::size_t stride = (bytes + 4095) / 4096 * 4096;
    const std::size_t nbuf =
        o.vary ? std::max<std::size_t>(1, (4 * llc_bytes() + stride - 1) / stride) : 1;
    Buffer send_pool(nbuf * stride), recv_pool(nbuf * stride);
    std::vector<void*> send(nbuf), recv(nbuf);
    for (std::size_t k = 0; k < nbuf; ++k) {
      send[k] = at(send_pool.p, k * stride, 1);
      recv[k] = at(recv_pool.p, k * stride, 1);
      for (std::size_t i = 0; i < bytes / ti.size; ++i)
        store_value(send[k], i, ti.dtype, pattern(b.rank(), i, ti.dtype, op));
    }
    Row row;
    row.bytes = bytes;
    row.count = call.count;
    auto fill = [&](Timing t) {
      t.algbw = static_cast<double>(bytes) / t.us / 1e3;
      t.busbw = t.algbw * busbw_factor(coll, n);
      return t;
    };
    if (has_oop) {
      row.oop = fill(time_phase(b, o, bytes, [&](int i) {
        auto k = static_cast<std::size_t>(i) % nbuf;
        invoke(b, call, send[k], recv[k]);
      }));
      if (o.check) row.oop.wrong = check_once(b, call, send[0], recv[0], false);
    }
    if (has_ip) {
      row.ip = fill(time_phase(b, o, bytes, [&](int i) {
        auto k = static_cast<std::size_t>(i) % nbuf;
        invoke_in_place(b, call, recv[k]);
      }));
      if (o.check) row.ip.wrong = check_once(b, call, send[0], recv[0], true);
    }
    row.iters = has_ip ? row.ip.calls : row.oop.calls;
    if (!o.no_floor)
      row.floor_us = time_phase(b, o, bytes, [&](int i) {
                       auto k = static_cast<std::size_t>(i) % nbuf;
                       std::memcpy(recv[k], send[k], bytes);
                       // Keep the copy from being optimised away or reordered past the clock.
                       asm volatile("" : : "r"(recv[k]) : "memory");
                     }).us;
    wrong_total += row.oop.wrong + row.ip.wrong;
    busbw_sum += has_oop && has_ip ? (row.oop.busbw + row.ip.busbw) / 2
                 : has_ip          ? row.ip.busbw
                                   : row.oop.busbw;
    if (printer) print_row(o, labels, row, first);
    first = false;
  }
  if (printer) {
    if (o.json) {
      fmt::print("{}\n", first ? "[]" : "\n]");
    } else if (!o.csv) {
      fmt::print("# Out of bounds values : {} {}\n", wrong_total, wrong_total ? "FAILED" : "OK");
      fmt::print("# Avg bus bandwidth    : {:.4f} \n#\n",
                 sizes.empty() ? 0.0 : busbw_sum / static_cast<double>(sizes.size()));
    }
  }
  return wrong_total == 0 ? 0 : 1;
}

template <class Backend>
int run_allreduce_perf(Backend& b, const PerfOptions& o) {
  return run_perf(b, o, Collective::allreduce);
}

}  // namespace shmring::bench
