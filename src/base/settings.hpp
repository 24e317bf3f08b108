#pragma once

// The one table of shmring's environment variables, and the one parser
// that reads them.
//
// Every SHMRING_* variable that shmring's code or scripts read is declared
// once in kSettings: its type, default, allowed values, audience, who reads
// it and one line of doc. The library reads its variables only through the
// typed lookups below, whose Name argument is checked against the table at
// compile time: reading an undeclared SHMRING_* name does not compile. The
// layers built over the public API (src/mpi, the torch backend) read theirs
// through shmring::settings (include/shmring/settings.hpp), the same parser
// by a name checked against the table at run time.
// `shmrun --info` prints the table with the values in effect, and
// docs/reference/environment.md is `shmrun --info --markdown`
// (tests/launcher/meson.build checks both, and that every SHMRING_* name in
// src/, python/ and tools/ is declared here).
//
// A refused value throws InvalidArgumentError "NAME='value': expected ...",
// naming the variable, the value as given and what was expected.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shmring::detail::settings {

/// Who sets a variable: users (user), benchmarks and performance work
/// (tuning), debugging (debug), or the repository's build and test scripts
/// (development; not read by the library).
enum class Audience : std::uint8_t { user, tuning, debug, development };

/// How the value is read. integer/number: a decimal in [lo, hi] (and a
/// multiple of `multiple` when it is not 0); choice: one of `choices`;
/// hex: 1 to 16 hex digits, not all zero; text: any non-empty string,
/// checked by its reader; bytes: a decimal integer >= 0, and 0 or at least
/// `lo` when lo is not 0 (bytes_of).
enum class Kind : std::uint8_t { integer, number, choice, hex, text, bytes };

struct Setting {
  std::string_view name;
  Kind kind;
  Audience audience;
  /// The default as a user would write it, or how it is decided.
  std::string_view default_value;
  /// Allowed values, as the refusal says after "expected ".
  std::string_view expected;
  std::string_view doc;
  /// Who reads it: "libshmring" (through this table), or where a reader
  /// outside the library lives.
  std::string_view readers = "libshmring";
  long long lo = 0, hi = 0;  ///< integer bounds
  long long multiple = 0;    ///< integer: a multiple of this (0: any)
  double number_lo = 0, number_hi = 0;
  /// choice: "value" or "spelling=value", comma-separated; the lookup
  /// returns the value. Compared case-insensitively unless exact_case.
  std::string_view choices = {};
  bool exact_case = false;
  /// bytes: the word "auto" (any case) reads as unset, so the reader decides.
  bool takes_auto = false;
};

inline constexpr long long kMaxRanks = 4096;

// clang-format off
inline constexpr Setting kSettings[] = {
  // --- user: who runs where, how long to wait, what to log ---------------
  {.name = "SHMRING_RANK", .kind = Kind::integer, .audience = Audience::user,
   .default_value = "the launcher's (shmrun sets it)", .expected = "",
   .doc = "This process's rank, below SHMRING_WORLD_SIZE.",
   .lo = 0, .hi = kMaxRanks - 1},
  {.name = "SHMRING_WORLD_SIZE", .kind = Kind::integer, .audience = Audience::user,
   .default_value = "the launcher's (shmrun sets it)", .expected = "",
   .doc = "Number of ranks of the job.", .lo = 1, .hi = kMaxRanks},
  {.name = "SHMRING_LOCAL_RANK", .kind = Kind::integer, .audience = Audience::user,
   .default_value = "SHMRING_RANK", .expected = "",
   .doc = "Rank among the processes on this host, below SHMRING_LOCAL_WORLD_SIZE.",
   .lo = 0, .hi = kMaxRanks - 1},
  {.name = "SHMRING_LOCAL_WORLD_SIZE", .kind = Kind::integer, .audience = Audience::user,
   .default_value = "SHMRING_WORLD_SIZE", .expected = "",
   .doc = "Ranks on this host, at most SHMRING_WORLD_SIZE.", .lo = 1, .hi = kMaxRanks},
  {.name = "SHMRING_JOB_ID", .kind = Kind::text, .audience = Audience::user,
   .default_value = "the launcher's job (shmrun: random)",
   .expected = "1 to 64 characters from [A-Za-z0-9._-]",
   .doc = "Names the job's segment: the same on every rank of one job.",
   .readers = "libshmring, shmrun (tools/shmrun.cpp)"},
  {.name = "SHMRING_JOB_NONCE", .kind = Kind::hex, .audience = Audience::user,
   .default_value = "none (shmrun sets a fresh one)",
   .expected = "1 to 16 hex digits, not all zero (shmrun sets it)",
   .doc = "Fresh per launch: tells two jobs given the same job id apart."},
  {.name = "SHMRING_TIMEOUT", .kind = Kind::number, .audience = Audience::user,
   .default_value = "300", .expected = "a number of seconds in [0.001, 1000000000]",
   .doc = "Seconds any wait may last before it fails with TimeoutError.",
   .readers = "libshmring, torch backend (python/torch/process_group.cpp)",
   .number_lo = 0.001, .number_hi = 1e9},
  {.name = "SHMRING_THREADS", .kind = Kind::integer, .audience = Audience::user,
   .default_value = "automatic (the rank's share of the job's CPUs)", .expected = "",
   .doc = "Reduction threads per rank (shmrun --threads).", .lo = 1, .hi = 1024},
  {.name = "SHMRING_OVERSUBSCRIBED", .kind = Kind::choice, .audience = Audience::user,
   .default_value = "auto", .expected = "1, 0 or auto",
   .doc = "1: the CPUs are shared with other busy processes, waits never spin; 0: they may.",
   .readers = "libshmring, libshmring_mpi (src/mpi/topology.cpp)", .choices = "1,0,auto", .exact_case = true},
  {.name = "SHMRING_DUMP_DIR", .kind = Kind::text, .audience = Audience::user,
   .default_value = "unset (no dump)", .expected = "a directory",
   .doc = "On a timeout or dead peer, the first rank to see it writes every rank's flight recorder here as JSON."},
  {.name = "SHMRING_TRACE", .kind = Kind::text, .audience = Audience::user,
   .default_value = "unset (no trace)", .expected = "a file path",
   .doc = "Writes every collective as a Chrome trace-event span; the ranks' parts are merged into this file when the job ends (docs/guide/tracing.md)."},
  {.name = "SHMRING_RECORDER_ENTRIES", .kind = Kind::integer, .audience = Audience::debug,
   .default_value = "64", .expected = "",
   .doc = "Calls each rank's flight recorder keeps (rank 0's value applies to the job); 0 turns it off.",
   .lo = 0, .hi = 65536},
  {.name = "SHMRING_PROGRESS_CPU", .kind = Kind::integer, .audience = Audience::user,
   .default_value = "unpinned",
   .expected = "a CPU number (one of this process's CPUs) or nothing",
   .doc = "CPU the progress thread of non-blocking calls is pinned to.",
   .lo = 0, .hi = 1023},
  {.name = "SHMRING_DEBUG", .kind = Kind::text, .audience = Audience::user,
   .default_value = "WARN", .expected = "TRACE, DEBUG, INFO, WARN, ERROR or OFF",
   .doc = "Log level on stderr; any other non-empty value means INFO."},
  {.name = "SHMRING_MPI_ON_ERROR", .kind = Kind::choice, .audience = Audience::user,
   .default_value = "abort", .expected = "abort or throw",
   .doc = "MPI layer: abort the MPI job on an error, or throw it to the caller.",
   .readers = "libshmring_mpi (src/mpi/topology.cpp)", .choices = "abort,throw"},

  // --- tuning: ring shape, algorithms, waits, copies ---------------------
  {.name = "SHMRING_SLOTS", .kind = Kind::integer, .audience = Audience::tuning,
   .default_value = "4", .expected = "",
   .doc = "Ring slots per rank (shmrun --slots).", .lo = 2, .hi = 62},
  {.name = "SHMRING_SLOT_BYTES", .kind = Kind::integer, .audience = Audience::tuning,
   .default_value = "262144", .expected = "a multiple of 4096 in [4096, 2^30]",
   .doc = "Bytes per ring slot (shmrun --slot-bytes).",
   .lo = 4096, .hi = 1ll << 30, .multiple = 4096},
  {.name = "SHMRING_DIRECT_BYTES", .kind = Kind::integer, .audience = Audience::tuning,
   .default_value = "65536", .expected = "a multiple of 4096 in [4096, 2^26]",
   .doc = "Largest per-rank message of the direct (small-message) path.",
   .lo = 4096, .hi = 1ll << 26, .multiple = 4096},
  {.name = "SHMRING_ALGO", .kind = Kind::choice, .audience = Audience::tuning,
   .default_value = "auto", .expected = "ring, direct, two_shot or auto",
   .doc = "Forces the allreduce algorithm; auto picks by size.",
   .choices = "ring,direct,two_shot,two-shot=two_shot,twoshot=two_shot,auto"},
  {.name = "SHMRING_SPIN_US", .kind = Kind::number, .audience = Audience::tuning,
   .default_value = "automatic (5, or 0 when oversubscribed)",
   .expected = "a number of microseconds in [0, 1000000]",
   .doc = "Microseconds a wait busy-spins before it yields.",
   .number_lo = 0, .number_hi = 1e6},
  {.name = "SHMRING_YIELD_US", .kind = Kind::number, .audience = Audience::tuning,
   .default_value = "automatic (2000)", .expected = "a number of microseconds in [0, 10000000]",
   .doc = "Microseconds a wait yields the CPU before it sleeps on a futex.",
   .number_lo = 0, .number_hi = 1e7},
  {.name = "SHMRING_NT_STORES", .kind = Kind::choice, .audience = Audience::tuning,
   .default_value = "auto", .expected = "auto, 0 or never, 1 or always",
   .doc = "Non-temporal stores for the copies peers read (slots; direct buffers, except the reductions'); auto: on AMD, copies of 16 KiB and more take whichever of plain and non-temporal stores each rank measures faster (into direct buffers only where ranks have CPUs of their own).",
   .choices = "auto,0=never,never,1=always,always"},
  {.name = "SHMRING_MIGRATE", .kind = Kind::integer, .audience = Audience::tuning,
   .default_value = "1", .expected = "",
   .doc = "1: a rank whose awaited peer shares its CPU moves to a free CPU of its mask; with "
          "more ranks than CPUs, ranks move until every CPU holds as many as the others.",
   .lo = 0, .hi = 1},
  {.name = "SHMRING_CMA", .kind = Kind::integer, .audience = Audience::tuning,
   .default_value = "1", .expected = "",
   .doc = "1: read peers' memory in one copy (process_vm_readv) where allowed; 0: never.",
   .lo = 0, .hi = 1},
  {.name = "SHMRING_CMA_LARGE", .kind = Kind::integer, .audience = Audience::tuning,
   .default_value = "measured at startup", .expected = "",
   .doc = "1: staged collectives' blocks past 256 KiB go in one copy too; 0: never.",
   .lo = 0, .hi = 1},
  {.name = "SHMRING_CMA_MIN_BYTES", .kind = Kind::integer, .audience = Audience::tuning,
   .default_value = "16384", .expected = "",
   .doc = "Smallest point-to-point message read in one copy.", .lo = 0, .hi = 1ll << 40},
  {.name = "SHMRING_MPI_ALGO", .kind = Kind::choice, .audience = Audience::tuning,
   .default_value = "auto", .expected = "auto, leaders, shards or flat",
   .doc = "MPI layer: the allreduce across nodes.",
   .readers = "libshmring_mpi (src/mpi/topology.cpp)", .choices = "auto,leaders,shards,flat"},
  {.name = "SHMRING_MPI_SHARDS_BYTES", .kind = Kind::bytes, .audience = Audience::tuning,
   .default_value = "auto (65536 where each rank has a CPU)",
   .expected = "auto or a number of bytes (an integer >= 0)",
   .doc = "MPI layer: messages from this size use the shards allreduce.",
   .readers = "libshmring_mpi (src/mpi/topology.cpp)", .takes_auto = true},
  {.name = "SHMRING_TORCH_SHARD_BYTES", .kind = Kind::bytes, .audience = Audience::tuning,
   .default_value = "4194304 (4 MiB)", .expected = "a number of bytes (an integer >= 0)",
   .doc = "torch backend across hosts: allreduces from this size take the sharded path.",
   .readers = "torch backend (python/torch/multi_node.cpp)"},
  {.name = "SHMRING_TORCH_JOB_TAG", .kind = Kind::text, .audience = Audience::development,
   .default_value = "none", .expected = "a job-id-safe tag",
   .doc = "Tag in the torch backend's job ids, so a launcher can find its segments.",
   .readers = "torch backend (python/torch/process_group.cpp), tools/fake-nodes"},
  {.name = "SHMRING_MPI_PIECE_BYTES", .kind = Kind::bytes, .audience = Audience::tuning,
   .default_value = "auto", .expected = "auto or a number of bytes (an integer >= 0)",
   .doc = "MPI layer: pipeline piece size of the hierarchical allreduce; 0: no pipelining.",
   .readers = "libshmring_mpi (src/mpi/topology.cpp)", .takes_auto = true},
  {.name = "SHMRING_MPI_CALL_BYTES", .kind = Kind::bytes, .audience = Audience::tuning,
   .default_value = "2097152", .expected = "0 (one call) or at least 4096 bytes",
   .doc = "MPI layer: most bytes one MPI call between nodes moves.",
   .readers = "libshmring_mpi (src/mpi/topology.cpp)", .lo = 4096},

  // --- debug ---------------------------------------------------------------
  {.name = "SHMRING_MEMBARRIER", .kind = Kind::integer, .audience = Audience::debug,
   .default_value = "1", .expected = "",
   .doc = "0: never use membarrier(2); every publish then fences.", .lo = 0, .hi = 1},
  {.name = "SHMRING_FAKE_NODE", .kind = Kind::text, .audience = Audience::debug,
   .default_value = "unset", .expected = "a node number",
   .doc = "Set by tools/fake-nodes: the fake node of this rank, for scripts to read.",
   .readers = "tools/fake-nodes (sets it)"},

  // --- development: the repository's build and test scripts ----------------
  {.name = "SHMRING_BUILD_DIR", .kind = Kind::text, .audience = Audience::development,
   .default_value = "build", .expected = "a directory",
   .doc = "Build directory of tools/check and tools/quickstart.",
   .readers = "tools/check, tools/quickstart"},
  {.name = "SHMRING_JOBS", .kind = Kind::text, .audience = Audience::development,
   .default_value = "2", .expected = "a number of jobs",
   .doc = "ninja -j of tools/sanitize.", .readers = "tools/sanitize"},
  {.name = "SHMRING_SANITIZE_BUILD_DIR", .kind = Kind::text,
   .audience = Audience::development, .default_value = "build-asan or build-tsan",
   .expected = "a directory", .doc = "Build directory of tools/sanitize.",
   .readers = "tools/sanitize"},
  {.name = "SHMRING_SANITIZE_TESTS", .kind = Kind::text, .audience = Audience::development,
   .default_value = "a list in tools/sanitize", .expected = "test names",
   .doc = "Tests tools/sanitize runs.", .readers = "tools/sanitize"},
  {.name = "SHMRING_TIMEOUT_MULT", .kind = Kind::text, .audience = Audience::development,
   .default_value = "3", .expected = "a number",
   .doc = "meson test --timeout-multiplier of tools/sanitize.", .readers = "tools/sanitize"},
  {.name = "SHMRING_TEST_QUICK", .kind = Kind::text, .audience = Audience::development,
   .default_value = "unset", .expected = "1",
   .doc = "1: the long tests run a smaller matrix (tools/sanitize sets it).",
   .readers = "tests, tools/sanitize"},
  {.name = "SHMRING_TEST_TAG", .kind = Kind::text, .audience = Audience::development,
   .default_value = "the test's pid", .expected = "a job-id-safe tag",
   .doc = "Tag in the tests' job ids, so that parallel runs never share a segment.",
   .readers = "tests/harness.hpp, tools/check, tools/sanitize"},
  {.name = "SHMRING_TEST_TIMEOUT_SCALE", .kind = Kind::text,
   .audience = Audience::development, .default_value = "1", .expected = "a number",
   .doc = "How much slower than native the tests run (tools/check sets 4 under emulation).",
   .readers = "tests/harness.hpp, tools/check"},
  {.name = "SHMRING_FUZZ_SECONDS", .kind = Kind::text, .audience = Audience::development,
   .default_value = "a bound in tests/faults/run_fuzz.sh", .expected = "seconds",
   .doc = "How long the header fuzzer runs.", .readers = "tests/faults/run_fuzz.sh"},
};
// clang-format on

/// A declaration is consistent with itself: a byte count says "auto" in its
/// default exactly when it takes the word, and names its minimum in what it
/// expects.
constexpr bool bytes_declarations_consistent() {
  for (const Setting& s : kSettings) {
    if (s.kind != Kind::bytes) continue;
    if (s.default_value.starts_with("auto") != s.takes_auto) return false;
    if (s.takes_auto != s.expected.starts_with("auto or ")) return false;
    if (s.lo < 0 || (s.lo > 0 && s.expected.find("at least") == std::string_view::npos))
      return false;
  }
  return true;
}
static_assert(bytes_declarations_consistent());

/// Index of `name` in kSettings, or kSettings' size when undeclared.
constexpr std::size_t index_of(std::string_view name) {
  std::size_t i = 0;
  for (const Setting& s : kSettings) {
    if (s.name == name) return i;
    ++i;
  }
  return i;
}

/// Called only by a Name that is not in the table: not constexpr, so such a
/// Name does not compile.
void undeclared_setting_name();

/// A declared variable's name; a string that is not in kSettings is a
/// compile-time error.
class Name {
 public:
  consteval Name(const char* name) : index_(index_of(name)) {  // NOLINT: implicit on purpose
    if (index_ == std::size(kSettings)) undeclared_setting_name();
  }
  const Setting& setting() const { return kSettings[index_]; }

 private:
  std::size_t index_;
};

/// The declaration of `name` (runtime names: the launchers' variables),
/// or nullptr.
const Setting* find(std::string_view name);

/// The SHMRING_* variables of this process's environment that kSettings
/// does not declare (a misspelt name is ignored by every reader), each
/// with the declared name nearest to it ("" when none is near: at most a
/// third of its letters differ), in environment order.
struct UnknownVariable {
  std::string name;
  std::string_view nearest;
};
std::vector<UnknownVariable> unknown_variables();
/// The declared name nearest to `name` (a SHMRING_* name), as
/// unknown_variables() chooses it; "" when none is near.
std::string_view nearest(std::string_view name);

/// The variable's text, or nullopt when unset or empty. The one place the
/// library reads a SHMRING_* variable.
std::optional<std::string> text(Name name);

/// An integer in the table's range (and multiple). `lo`, `hi` narrow it
/// where the range depends on another value (a rank below the world size);
/// `why` says where the bound comes from, in parentheses after the range.
std::optional<long long> integer(Name name);
std::optional<long long> integer(Name name, long long lo, long long hi, std::string_view why = {});
/// A number in the table's range (finite).
std::optional<double> number(Name name);
/// One of the table's choices, as its value (spellings mapped, lower case
/// unless exact_case).
std::optional<std::string> choice(Name name);
/// 1 to 16 hex digits, not all zero.
std::optional<std::uint64_t> hex(Name name);

/// The lookups for a declaration found at run time (find()): for the
/// public shmring::settings functions (include/shmring/settings.hpp), which
/// serve the layers over the public API.
std::optional<std::string> text_of(const Setting& s);
std::optional<std::string> choice_of(const Setting& s);
/// Kind::bytes: a decimal integer >= 0 that fits in 64 bits (0 or at least
/// lo where lo is set); nullopt when unset, and for the word "auto" where
/// the declaration takes_auto.
std::optional<std::uint64_t> bytes_of(const Setting& s);

/// Throws InvalidArgumentError "NAME='value': expected <what>".
[[noreturn]] void refuse(std::string_view name, std::string_view value, std::string_view what);

/// Parses `raw` as `s` says, throwing as the lookups do; for checking a
/// value before it is set (shmrun --info, -x). Kind::text: accepted.
void check(const Setting& s, const std::string& raw);

/// The parsers behind the lookups, for the other launchers' variables
/// (RANK, OMPI_COMM_WORLD_SIZE, ...) that share their messages.
long long parse_integer(std::string_view name, const std::string& raw, long long lo, long long hi,
                        long long multiple, std::string_view expected, std::string_view why);
/// `expected`: the words after "expected " (the unit too); empty: "a
/// number in [lo, hi]".
double parse_number(std::string_view name, const std::string& raw, double lo, double hi,
                    std::string_view expected = {});

std::string_view audience_name(Audience a);
std::string_view kind_name(Kind k);
/// "[lo, hi]", the choices, or the expected text: what --info shows as
/// the allowed values.
std::string allowed(const Setting& s);

}  // namespace shmring::detail::settings
