#pragma once

// Shared driver of the *_perf benchmarks (shmring and MPI): options in the
// nccl-tests style, the timing loop, the result check, the "floor" (every
// rank copying its buffer once, concurrently) and the nccl-tests table, CSV
// and JSON output.
//
// A backend provides the collective and the few helpers the driver needs:
//   int rank() const; int size() const; const char* name() const;
//   bool supports(DataType, ReduceOp) const;
//   void allreduce(const void* send, void* recv, std::size_t count, DataType, ReduceOp);
//   void barrier();
//   double max_over_ranks(double); double sum_over_ranks(double);
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
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "shmring/types.hpp"

namespace shmring::bench {

struct PerfOptions {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = 128u << 20;
  double factor = 2;
  int iters = 20;
  int warmup = 5;
  std::string dtype = "float";
  std::string op = "sum";
  int check = 1;
  std::string algorithm = "auto";
  bool vary = false;  // -I: rotate through a pool of buffers larger than the caches
  bool csv = false;
  bool json = false;
  bool no_floor = false;
  bool in_place_only = false;
  // Iterations shrink for large sizes so that one size moves about this many
  // bytes per timed phase (at least 3 iterations, at most `iters`).
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

// "64K", "1M", "2G", "100" -> bytes.
inline std::size_t parse_bytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0)
    throw CLI::ValidationError(fmt::format("size '{}': expected bytes like 8, 64K, 1M, 1G", s));
  std::string unit(end);
  double mul = 1;
  if (unit == "K" || unit == "k" || unit == "KiB")
    mul = 1024.0;
  else if (unit == "M" || unit == "m" || unit == "MiB")
    mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "g" || unit == "GiB")
    mul = 1024.0 * 1024 * 1024;
  else if (!unit.empty())
    throw CLI::ValidationError(
        fmt::format("size '{}': unknown unit '{}' (use K, M or G)", s, unit));
  return static_cast<std::size_t>(v * mul);
}

inline void add_perf_options(CLI::App& app, PerfOptions& o) {
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
  app.add_option("-n,--iters", o.iters, "Timed iterations per size (fewer for big sizes)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "Warm-up iterations per size")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("-d,--datatype", o.dtype,
                 "int8, uint8, int32, int64, half, bfloat16, float, double")
      ->capture_default_str();
  app.add_option("-o,--op", o.op, "sum, prod, min, max, avg")->capture_default_str();
  app.add_option("-c,--check", o.check, "Check the result (0: no, 1: yes)")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("-a,--algorithm", o.algorithm, "Algorithm (auto, ring, direct)")
      ->capture_default_str();
  app.add_flag("-I,--vary", o.vary,
               "Rotate through buffers that together exceed the caches (cache-cold data)");
  app.add_flag("--csv", o.csv, "CSV output (rank 0, stdout)");
  app.add_flag("--json", o.json, "JSON output (rank 0, stdout)");
  app.add_flag("--no-floor", o.no_floor, "Skip the concurrent-memcpy floor measurement");
  app.add_flag("--in-place-only", o.in_place_only, "Skip the out-of-place measurement");
  app.add_option_function<std::string>(
         "--budget",
         [&o](const std::string& s) { o.budget_bytes = static_cast<double>(parse_bytes(s)); },
         "Bytes one timed phase may move (64M, 2G); sets the iterations of large sizes")
      ->default_str("2G");
}

inline void validate(const PerfOptions& o) {
  if (o.min_bytes > o.max_bytes)
    throw CLI::ValidationError(
        fmt::format("-b {} is larger than -e {}: expected min <= max", o.min_bytes, o.max_bytes));
  if (o.csv && o.json) throw CLI::ValidationError("--csv and --json: choose one");
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

// ---- One row ----

struct Timing {
  double us = 0, algbw = 0, busbw = 0;
  long long wrong = 0;
};
struct Row {
  std::size_t bytes = 0, count = 0;
  Timing oop, ip;
  double floor_us = 0;
  int iters = 0;
};

template <class Backend>
double time_loop(Backend& b, int iters, int warmup, auto&& body) {
  for (int i = 0; i < warmup; ++i) body(i);
  b.barrier();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) body(i);
  auto t1 = std::chrono::steady_clock::now();
  double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
  return b.max_over_ranks(us);
}

template <class Backend>
long long check_once(Backend& b, void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                     bool in_place) {
  for (std::size_t i = 0; i < count; ++i) store_value(send, i, t, pattern(b.rank(), i, t, op));
  void* out = in_place ? send : recv;
  b.allreduce(send, out, count, t, op);
  const double tol = tolerance(t, op);
  long long wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double want = expected_value(b.size(), i, t, op);
    double got = load_value(out, i, t);
    if (!(std::abs(got - want) <= tol * std::max(1.0, std::abs(want)))) ++wrong;
  }
  return static_cast<long long>(b.sum_over_ranks(static_cast<double>(wrong)));
}

// ---- Output ----

inline double busbw_factor(int n) {
  return n > 1 ? 2.0 * (n - 1) / n : 1.0;
}

inline void print_header(const PerfOptions& o, const char* backend, int nranks, const char* ttype) {
  if (o.csv) {
    fmt::print(
        "backend,nranks,size,count,type,redop,iters,oop_time_us,oop_algbw,oop_busbw,oop_wrong,"
        "ip_time_us,ip_algbw,ip_busbw,ip_wrong,floor_us,floor_ratio\n");
    return;
  }
  if (o.json) return;
  fmt::print(
      "# {} allreduce_perf: {} ranks, minBytes {} maxBytes {} step factor {} iters {} "
      "warmup {} check {} algorithm {}{}\n",
      backend, nranks, o.min_bytes, o.max_bytes, o.factor, o.iters, o.warmup, o.check, o.algorithm,
      o.vary ? " (cache-cold: -I)" : "");
  fmt::print(
      "# floor = every rank copies its buffer once, concurrently (memcpy); "
      "floor/ip = floor time / in-place time\n#\n");
  fmt::print("#{:>43} {:>32} {:>32} {:>18}\n", "", "out-of-place", "in-place", "");
  fmt::print(
      "#{:>11} {:>12} {:>8} {:>6} {:>4} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6} "
      "{:>9} {:>8}\n",
      "size", "count", "type", "redop", "n", "time", "algbw", "busbw", "#wrong", "time", "algbw",
      "busbw", "#wrong", "floor", "floor/ip");
  fmt::print(
      "#{:>11} {:>12} {:>8} {:>6} {:>4} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6} "
      "{:>9} {:>8}\n",
      "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
      "", "(us)", "");
  (void)ttype;
}

inline std::string wrong_str(const PerfOptions& o, long long w) {
  return o.check ? fmt::format("{}", w) : std::string("N/A");
}

inline void print_row(const PerfOptions& o, const char* backend, int nranks, const char* tname,
                      const char* oname, const Row& r, bool first) {
  const double ratio = r.ip.us > 0 && r.floor_us > 0 ? r.floor_us / r.ip.us : 0;
  if (o.csv) {
    fmt::print(
        "{},{},{},{},{},{},{},{:.3f},{:.4f},{:.4f},{},{:.3f},{:.4f},{:.4f},{},{:.3f},{:.4f}\n",
        backend, nranks, r.bytes, r.count, tname, oname, r.iters, r.oop.us, r.oop.algbw,
        r.oop.busbw, r.oop.wrong, r.ip.us, r.ip.algbw, r.ip.busbw, r.ip.wrong, r.floor_us, ratio);
  } else if (o.json) {
    fmt::print(
        "{}\n  {{\"backend\": \"{}\", \"nranks\": {}, \"size\": {}, \"count\": {}, "
        "\"type\": \"{}\", \"redop\": \"{}\", \"iters\": {}, "
        "\"out_of_place\": {{\"time_us\": {:.3f}, \"algbw\": {:.4f}, \"busbw\": {:.4f}, "
        "\"wrong\": {}}}, "
        "\"in_place\": {{\"time_us\": {:.3f}, \"algbw\": {:.4f}, \"busbw\": {:.4f}, "
        "\"wrong\": {}}}, \"floor_us\": {:.3f}, \"floor_ratio\": {:.4f}}}",
        first ? "[" : ",", backend, nranks, r.bytes, r.count, tname, oname, r.iters, r.oop.us,
        r.oop.algbw, r.oop.busbw, r.oop.wrong, r.ip.us, r.ip.algbw, r.ip.busbw, r.ip.wrong,
        r.floor_us, ratio);
  } else {
    fmt::print(
        " {:>11} {:>12} {:>8} {:>6} {:>4} {:>9.2f} {:>7.2f} {:>7.2f} {:>6} {:>9.2f} "
        "{:>7.2f} {:>7.2f} {:>6} {:>9.2f} {:>8.2f}\n",
        r.bytes, r.count, tname, oname, nranks, r.oop.us, r.oop.algbw, r.oop.busbw,
        wrong_str(o, r.oop.wrong), r.ip.us, r.ip.algbw, r.ip.busbw, wrong_str(o, r.ip.wrong),
        r.floor_us, ratio);
  }
  std::fflush(stdout);
}

// ---- The driver ----

template <class Backend>
int run_allreduce_perf(Backend& b, const PerfOptions& o) {
  const TypeInfo& ti = parse_type(o.dtype);
  const ReduceOp op = parse_op(o.op);
  if (!b.supports(ti.dtype, op))
    throw CLI::ValidationError(
        fmt::format("{} does not support datatype {} with operator {}", b.name(), ti.name, o.op));
  const bool root = b.rank() == 0;
  const int n = b.size();
  if (root) print_header(o, b.name(), n, ti.name);

  // Sizes: a multiple of the element size (at least one element).
  std::vector<std::size_t> sizes;
  for (double s = static_cast<double>(o.min_bytes);
       s <= static_cast<double>(o.max_bytes) * 1.0000001; s *= o.factor) {
    std::size_t bytes = std::max(ti.size, static_cast<std::size_t>(s) / ti.size * ti.size);
    if (sizes.empty() || sizes.back() != bytes) sizes.push_back(bytes);
  }

  double busbw_sum = 0;
  long long wrong_total = 0;
  bool first = true;
  for (std::size_t bytes : sizes) {
    const std::size_t count = bytes / ti.size;
    // Cache-cold mode: enough buffers that each is evicted before it comes back.
    const std::size_t nbuf =
        o.vary ? std::max<std::size_t>(1, (4 * llc_bytes() + bytes - 1) / bytes) : 1;
    std::vector<std::unique_ptr<Buffer>> send, recv;
    for (std::size_t k = 0; k < nbuf; ++k) {
      send.push_back(std::make_unique<Buffer>(bytes));
      recv.push_back(std::make_unique<Buffer>(bytes));
      for (std::size_t i = 0; i < count; ++i)
        store_value(send[k]->p, i, ti.dtype, pattern(b.rank(), i, ti.dtype, op));
    }
    const int iters = std::clamp(static_cast<int>(o.budget_bytes / static_cast<double>(bytes)), 3,
                                 std::max(3, o.iters));
    const int warmup = std::min(o.warmup, std::max(1, iters / 4));
    Row row;
    row.bytes = bytes;
    row.count = count;
    row.iters = std::min(iters, o.iters);
    auto fill = [&](Timing& t, double us) {
      t.us = us;
      t.algbw = static_cast<double>(bytes) / us / 1e3;
      t.busbw = t.algbw * busbw_factor(n);
    };
    if (!o.in_place_only) {
      fill(row.oop, time_loop(b, row.iters, warmup, [&](int i) {
             auto k = static_cast<std::size_t>(i) % nbuf;
             b.allreduce(send[k]->p, recv[k]->p, count, ti.dtype, op);
           }));
      if (o.check)
        row.oop.wrong = check_once(b, send[0]->p, recv[0]->p, count, ti.dtype, op, false);
    }
    fill(row.ip, time_loop(b, row.iters, warmup, [&](int i) {
           auto k = static_cast<std::size_t>(i) % nbuf;
           b.allreduce(recv[k]->p, recv[k]->p, count, ti.dtype, op);
         }));
    if (o.check) row.ip.wrong = check_once(b, recv[0]->p, nullptr, count, ti.dtype, op, true);
    if (!o.no_floor)
      row.floor_us = time_loop(b, row.iters, warmup, [&](int i) {
        auto k = static_cast<std::size_t>(i) % nbuf;
        std::memcpy(recv[k]->p, send[k]->p, bytes);
        // Keep the copy from being optimised away or reordered past the clock.
        asm volatile("" : : "r"(recv[k]->p) : "memory");
      });
    wrong_total += row.oop.wrong + row.ip.wrong;
    busbw_sum += o.in_place_only ? row.ip.busbw : (row.oop.busbw + row.ip.busbw) / 2;
    if (root) print_row(o, b.name(), n, ti.name, op_name(op), row, first);
    first = false;
  }
  if (root) {
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

}  // namespace shmring::bench
