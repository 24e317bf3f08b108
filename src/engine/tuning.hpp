#pragma once

// Which algorithm a collective takes: one table of measured crossovers
// (tuning.cpp), read the same way on every rank. docs/design/algorithms.md
// explains each path and the measurements behind each row.

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "core/choices.hpp"
#include "core/comm.hpp"
#include "core/ops.hpp"

namespace shmring::engine {

/// What every rank knows alike about its job when it picks an algorithm.
struct TuningInputs {
  int world_size = 1;
  bool oversubscribed = false;        ///< Config::oversubscribed: ranks share CPUs
  std::uint64_t direct_bytes = 0;     ///< one direct buffer's bytes (Config::direct_bytes)
  std::optional<Algorithm> forced{};  ///< SHMRING_ALGO, nullopt for "auto"
};

/// Where the ranks run, as a row of the table reads it.
enum class Placement : std::uint8_t {
  any,
  alone,    ///< every rank on CPUs of its own
  crowded,  ///< ranks share CPUs (oversubscribed)
};

/// Which collectives a row applies to (a bit per CollectiveKind).
using KindMask = std::uint32_t;
constexpr KindMask kind_bit(CollectiveKind k) {
  return KindMask{1} << static_cast<unsigned>(k);
}

/// A payload bound that is the direct buffer's size rather than a constant.
inline constexpr std::uint64_t kDirectBuffer = ~std::uint64_t{0} - 1;
inline constexpr std::uint64_t kUnbounded = ~std::uint64_t{0};

/// One row of the table: collectives of `kinds`, world sizes in
/// [min_ranks, max_ranks], placement, a payload (the largest per-rank buffer
/// the collective puts in shared memory, bytes) in (above, up_to], and for
/// allreduce, reduce_scatter and reduce whether the datatype and operator
/// accumulate wide (16-bit sum/prod/avg; see kernels/wide.hpp) take
/// `algorithm`. The first row that
/// matches wins.
struct Crossover {
  KindMask kinds;
  int min_ranks, max_ranks;
  Placement placement;
  std::uint64_t above, up_to;
  bool wide_only;
  Algorithm algorithm;
  const char* why;  ///< the measurement behind the row, one line
};

/// The table, in the order it is read.
std::span<const Crossover> crossovers();

/// The algorithm for a collective whose largest per-rank buffer in shared
/// memory would be `payload` bytes; `wide`: an allreduce, reduce_scatter or
/// reduce whose 16-bit reduction accumulates wide (its ring or chain would
/// carry float64 partials).
/// A forced algorithm (SHMRING_ALGO) applies where it can run; barriers
/// always take the low-latency line. Pure function of its inputs: every
/// rank gets the same answer.
Algorithm choose(CollectiveKind kind, std::uint64_t payload, bool wide, const TuningInputs& in);

/// The row that choose() used (nullptr when a forced algorithm decided).
const Crossover* choose_row(CollectiveKind kind, std::uint64_t payload, bool wide,
                            const TuningInputs& in);

/// A table of the choices for `in` at payloads 8 B .. 64 MiB, one line per
/// collective and size range, with the reason (shmrun --info -n N).
std::string describe_choices(const TuningInputs& in);

/// The choices for fixed inputs as payload ranges (core/choices.hpp): for
/// each collective and wide flag, the answer of choose() is constant
/// between consecutive row bounds, so evaluating it once per range gives
/// the same answer at every payload.
AlgorithmSteps compile_choices(const TuningInputs& in);

/// A communicator's inputs to the table.
inline TuningInputs tuning_inputs(const Communicator::Impl& c) {
  return {c.size, c.config.oversubscribed, c.seg->direct_bytes(), c.forced_algorithm};
}
/// A communicator's choice: its compiled ranges (Impl::choices, filled once
/// its inputs are known), else the table. Every rank compiles the same.
inline Algorithm choose(const Communicator::Impl& c, CollectiveKind kind, std::uint64_t payload,
                        bool wide = false) {
  if (c.choices.oversubscribed == c.config.oversubscribed)
    if (auto a = c.choices.find(kind, payload, wide)) return *a;
  return choose(kind, payload, wide, tuning_inputs(c));
}

}  // namespace shmring::engine
