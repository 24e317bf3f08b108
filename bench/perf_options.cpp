// The command line of the *_perf tools: nccl-tests' options (-b -e -f -n
// -w -d -o -r -c), the timing ones (--min-time, --rounds, --budget) and the
// output ones (--csv, --json), with their checks.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <string>

#include "perf_internal.hpp"
#include "sizes.hpp"

namespace shmring::bench {

namespace {

constexpr TypeInfo kTypes[] = {
    {"int8", DataType::int8, 1},     {"uint8", DataType::uint8, 1},
    {"int32", DataType::int32, 4},   {"int64", DataType::int64, 8},
    {"half", DataType::float16, 2},  {"bfloat16", DataType::bfloat16, 2},
    {"float", DataType::float32, 4}, {"double", DataType::float64, 8},
};

}  // namespace

const TypeInfo& parse_type(const std::string& s) {
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

ReduceOp parse_op(const std::string& s) {
  static constexpr const char* kNames[] = {"sum", "prod", "min", "max", "avg"};
  for (int i = 0; i < 5; ++i)
    if (s == kNames[i]) return static_cast<ReduceOp>(i);
  throw CLI::ValidationError("-o",
                             fmt::format("operator '{}': expected sum, prod, min, max or avg", s));
}

const char* op_name(ReduceOp op) {
  static constexpr const char* kNames[] = {"sum", "prod", "min", "max", "avg"};
  return kNames[static_cast<int>(op)];
}

void add_perf_options(CLI::App& app, PerfOptions& o, Collective coll) {
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
  app.add_flag("--zeros", o.zeros,
               "Time zero-filled buffers, as the MPI benchmarks do (default: the check "
               "pattern, nonzero data like users')");
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

void validate(const PerfOptions& o) {
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

}  // namespace shmring::bench
