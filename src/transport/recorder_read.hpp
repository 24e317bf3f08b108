#pragma once

// Reading the flight recorders (layout.hpp RecorderEntry, docs/design/
// recorder.md) from any process that maps the segment, even read-only:
// only loads, never a store, lock or wait. Used by the error messages and
// dumps of the core (core/diagnose.cpp) and by `shmrun --status`.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "transport/layout.hpp"

namespace shmring::detail {

/// One call as a rank's recorder holds it (an entry read without tearing).
struct RecordedCall {
  std::uint64_t seq = 0;  // collective sequence number (0-based)
  std::uint64_t count = 0, bytes = 0;
  std::uint64_t start_ns = 0, end_ns = 0;  // CLOCK_MONOTONIC; end 0: not ended
  std::uint32_t kind = 0, dtype = 0, op = 0, algorithm = 0;
  std::int32_t root = -1;
  std::uint32_t state = 0;  // kCall*
  std::int32_t step = -1;
};

/// A rank's newest point-to-point call.
struct RecordedP2p {
  bool is_send = false;
  std::uint32_t dtype = 0;
  std::int32_t peer = -1, tag = 0;
  std::uint64_t count = 0, start_ns = 0, end_ns = 0;  // end 0: in flight
  std::uint32_t state = 0;                            // kCall*
};

/// What one rank's part of the segment says about it.
struct RankRecord {
  int rank = 0;
  std::int32_t pid = 0;
  std::uint32_t rank_state = 0;           // kRankAbsent / kRankAttached / kRankFinalized
  std::uint64_t announced = 0, done = 0;  // its counters
  bool has_recorder = false;
  std::uint64_t start_ns = 0, calls = 0, bytes = 0, wait_since_ns = 0, realtime_offset_ns = 0;
  std::int32_t waiting_for = -1, step = -1;
  std::vector<RecordedCall> history;  // oldest first, by sequence number
  std::uint64_t p2p_calls = 0;        // point-to-point calls posted
  std::optional<RecordedP2p> p2p;     // the newest (none yet, or changing while read)

  /// The newest call in `history` (nullopt when empty).
  std::optional<RecordedCall> latest() const;
  /// The newest completed call.
  std::optional<RecordedCall> last_completed() const;
};

/// Reads rank r's record from a mapping of the segment at `base` whose
/// layout is `l` (computed from a validated header). Entries that changed
/// while being read are retried a few times, then left out.
RankRecord read_rank_record(const std::byte* base, const Layout& l, int r);

/// "recv from rank 0 (tag 9, 262144 float32)"
std::string describe_p2p(const RecordedP2p& p);

/// Name of a recorded call's state ("queued", "started", ...).
const char* call_state_name(std::uint32_t state);

}  // namespace shmring::detail
