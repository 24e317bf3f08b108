#pragma once

// AlgorithmSteps: one communicator's algorithm choices as data, so that a
// call's choice is a scan of a few payload ranges rather than a walk of the
// whole table. engine::compile_choices (src/engine/tuning.hpp) fills it once
// from the table and the communicator's inputs, which do not change while it
// lives; the table stays the one place the choices are made
// (docs/design/algorithms.md).

#include <array>
#include <cstdint>
#include <optional>

#include "core/ops.hpp"

namespace shmring {

class AlgorithmSteps {
 public:
  /// The most payload ranges one (collective, wide) pair may have.
  static constexpr std::size_t kMaxSteps = 24;
  /// Collective kinds by value (1..12; 0 unused).
  static constexpr std::size_t kKinds = 13;

  /// Appends the range up to `up_to` bytes (inclusive; above the previous
  /// range's end) taking `a`. Returns false when full.
  bool add(CollectiveKind kind, bool wide, std::uint64_t up_to, Algorithm a) {
    Row& r = rows_[index(kind)][wide ? 1 : 0];
    if (r.count == kMaxSteps) return false;
    r.steps[r.count++] = {up_to, a};
    return true;
  }

  /// The placement the steps were compiled for (TuningInputs::oversubscribed).
  /// A communicator whose Config::oversubscribed no longer says the same (a
  /// white-box test rewrites it) asks the table instead.
  bool oversubscribed = false;

  /// The algorithm for a payload of `bytes`, or nullopt where nothing was
  /// compiled (the caller then asks the table).
  std::optional<Algorithm> find(CollectiveKind kind, std::uint64_t bytes, bool wide) const {
    const Row& r = rows_[index(kind)][wide ? 1 : 0];
    for (std::size_t i = 0; i < r.count; ++i)
      if (bytes <= r.steps[i].up_to) return r.steps[i].algorithm;
    return std::nullopt;
  }

 private:
  struct Step {
    std::uint64_t up_to;
    Algorithm algorithm;
  };
  struct Row {
    std::array<Step, kMaxSteps> steps{};
    std::size_t count = 0;
  };
  static std::size_t index(CollectiveKind kind) {
    const auto k = static_cast<std::size_t>(kind);
    return k < kKinds ? k : 0;
  }
  std::array<std::array<Row, 2>, kKinds> rows_{};
};

}  // namespace shmring
