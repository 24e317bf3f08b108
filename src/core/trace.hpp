#pragma once

// SHMRING_TRACE=FILE: every collective of every communicator of this process
// as a Chrome trace-event span (docs/guide/tracing.md). Each communicator
// keeps its spans in memory (a vector, no I/O while the job runs); when the
// process's last traced communicator goes away, the process writes its part
// (FILE.<host>.<pid>.part) and, if it is the last rank of its largest
// communicator to do so, merges every rank's part into FILE.
//
// Thread safety: add() is called by the thread running the communicator's
// collectives (one at a time, engine.cpp); open() and the destructor by the
// communicator's owner. The process-wide part is guarded by a mutex.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/ops.hpp"

namespace shmring::detail {

/// One collective as it ran on this rank. Times: CLOCK_MONOTONIC ns.
struct TraceSpan {
  CollectiveDesc desc;
  std::uint64_t seq = 0;        ///< the communicator's collective number (from 0)
  std::uint64_t bytes = 0;      ///< this rank's result bytes (Op::bytes)
  std::uint64_t queued_ns = 0;  ///< when the engine queued it; 0: it ran at once
  std::uint64_t start_ns = 0, end_ns = 0;
  std::uint64_t wait_ns = 0;  ///< time blocked on a peer (stats() wait_ns)
  bool failed = false;
};

/// One communicator's spans.
class TraceLog {
 public:
  /// Null when SHMRING_TRACE is unset or empty. `job` names the
  /// communicator (its job id); `rank` and `size` are its own.
  static std::unique_ptr<TraceLog> open(const std::string& job, int rank, int size);
  ~TraceLog();  ///< hands the spans to the process's part (see above)
  TraceLog(const TraceLog&) = delete;
  TraceLog& operator=(const TraceLog&) = delete;

  void add(const TraceSpan& s) { spans_.push_back(s); }

 private:
  TraceLog(std::string path, const std::string& job, int rank, int size);
  std::string path_;
  std::size_t index_;  ///< in the process's part: creation order
  std::vector<TraceSpan> spans_;
};

}  // namespace shmring::detail
