#pragma once

// The job's shared-memory segment: creation by rank 0, attachment and header
// validation by the others, unlinking once everyone is in, and per-rank
// liveness through open-file-description locks on the segment's descriptor.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/fork.hpp"
#include "transport/header_check.hpp"
#include "transport/layout.hpp"

namespace shmring::detail {

struct SegmentRequest {
  std::string name;
  int rank = 0;
  int world_size = 1;
  std::uint64_t slots = 0;
  std::uint64_t slot_bytes = 0;
  std::uint64_t direct_bytes = 0;
  std::uint32_t recorder_entries = 0;  // flight recorder entries per rank (layout.hpp)
  std::uint64_t host_hash = 0;
  std::chrono::steady_clock::time_point deadline;
  std::string job_id;           // for messages (the name when empty)
  std::uint64_t job_nonce = 0;  // the same on every rank of one job; 0: SHMRING_JOB_NONCE or none
  // This process registered for the asymmetric fence (wait.hpp
  // register_asymmetric_fence()); published as RankInfo::asymmetric_fence.
  bool asymmetric_fence = false;
  // Options::oversubscribed as this rank resolved it (-1, 0, 1); published
  // as RankInfo::oversubscribed.
  int oversubscribed = -1;
  // Non-empty: this rank refuses to start, for this reason (a bad setting of
  // its own). create_or_attach then only tells the job: rank 0 makes a
  // segment that says so, another rank records it in rank 0's; either stays
  // until every rank has arrived (or the deadline), so that ranks still
  // starting hear it too, and create_or_attach throws.
  std::string refusal;
};

class Segment {
 public:
  /// Rank 0 creates the segment (removing a stale one whose creator is dead);
  /// the others open and validate it. Returns once this rank is registered;
  /// call wait_all_attached() next. Throws InvalidArgumentError (collision,
  /// bad header, two processes claiming one rank, two jobs sharing the job
  /// id: then the live segment's ranks are aborted too), OutOfSharedMemoryError,
  /// TimeoutError, SystemError.
  static std::unique_ptr<Segment> create_or_attach(const SegmentRequest& req);
  ~Segment();  // unmaps; releases the liveness lock

  /// Blocks until every rank registered, then returns. The rank whose
  /// registration completed the set unlinks the name. On timeout, unlinks the
  /// name (so nothing is left behind) and throws TimeoutError.
  void wait_all_attached(std::chrono::steady_clock::time_point deadline);
  /// CPUs in the union of every rank's affinity mask (after wait_all_attached).
  int job_cpus();
  /// Whether every rank registered for the asymmetric fence (wait.hpp), so
  /// that counters may be published without a fence (after
  /// wait_all_attached).
  bool all_asymmetric_fence();
  /// The ranks' Options::oversubscribed together (after wait_all_attached):
  /// 1 when any rank asked for 1, 0 when every rank asked for 0, else -1.
  int oversubscribed_request();

  Header& header() { return *header_; }
  RankArea& rank_area(int r) {
    return *reinterpret_cast<RankArea*>(base_ + layout_.rank_area_offset +
                                        static_cast<std::size_t>(r) * kRankAreaBytes);
  }
  std::byte* slot(int r, std::uint64_t k) {
    return base_ + layout_.slot_offset + (static_cast<std::uint64_t>(r) * slots_ + k) * slot_bytes_;
  }
  /// Direct-path buffer `b` (0 or 1) of rank `r`.
  std::byte* direct(int r, std::uint64_t b) {
    return base_ + layout_.direct_offset +
           (static_cast<std::uint64_t>(r) * kDirectBuffers + b) * direct_bytes_;
  }
  std::uint64_t direct_bytes() const { return direct_bytes_; }
  /// Start of the point-to-point region (layout.hpp, p2p.hpp).
  std::byte* p2p_base() { return base_ + layout_.p2p_offset; }
  /// Rank r's flight recorder head (null when the job has no recorders);
  /// its entries follow it (recorder_entry).
  RecorderHead* recorder(int r) {
    if (layout_.recorder_entries == 0) return nullptr;
    return reinterpret_cast<RecorderHead*>(base_ + layout_.recorder_offset +
                                           static_cast<std::uint64_t>(r) *
                                               recorder_rank_bytes(layout_.recorder_entries));
  }
  std::uint64_t recorder_entries() const { return layout_.recorder_entries; }
  const Layout& layout() const { return layout_; }
  std::byte* base() { return base_; }
  /// Line `line` of entry `entry` of rank `r`'s eager ring (layout.hpp);
  /// block b starts at line b * kEagerBlockLines.
  EagerLine& eager_line(int r, std::uint64_t entry, std::uint64_t line) {
    const std::uint64_t lines = eager_lines_per_entry(static_cast<std::uint64_t>(world_size_));
    return *reinterpret_cast<EagerLine*>(
        base_ + layout_.eager_offset +
        ((static_cast<std::uint64_t>(r) * kEagerEntries + entry) * lines + line) *
            sizeof(EagerLine));
  }
  std::uint64_t slots() const { return slots_; }
  std::uint64_t slot_bytes() const { return slot_bytes_; }
  std::uint64_t total_bytes() const { return layout_.total_bytes; }
  const std::string& name() const { return name_; }

  /// True while rank `r`'s process holds its liveness lock, i.e. has not
  /// exited (a zombie has already released it). One fcntl call.
  bool rank_alive(int r) const;
  /// Removes the name (idempotent).
  void unlink_name();
  /// True in a process forked (without exec) from the one that attached:
  /// there the segment is neither mapped nor open, and must not be used.
  bool forked_away() const noexcept { return fork_generation_registered() != fork_generation_; }
  /// The process that attached this rank.
  int owner_pid() const noexcept { return owner_pid_; }

 private:
  Segment() = default;
  struct Mapping;
  struct Opening;  // create_or_attach's steps (segment_parts.hpp)
  std::unique_ptr<Mapping> map_;
  std::byte* base_ = nullptr;
  Header* header_ = nullptr;
  Layout layout_{};
  std::uint64_t slots_ = 0, slot_bytes_ = 0, direct_bytes_ = 0;
  int fd_ = -1;
  int rank_ = 0;
  int world_size_ = 1;
  std::string name_;
  bool unlinked_ = false;
  bool registered_ = false;  // this process holds the rank (lock taken, state published)
  std::uint64_t fork_generation_ = 0;
  int owner_pid_ = 0;
};

/// Stale/colliding segment inspection for `shmrun --list/--cleanup`.
struct SegmentInfo {
  std::string name;
  std::uint64_t bytes = 0;
  int creator_pid = 0;
  bool creator_alive = false;
};
/// Segments of this user in /dev/shm with the shmring prefix.
std::vector<SegmentInfo> list_segments();

}  // namespace shmring::detail

namespace shmring::detail {

/// Sets the abort word if no rank did before (first error wins) and wakes
/// every sleeper. Returns true if this call's reason is the one recorded.
bool raise_abort(Segment& seg, int world_size, std::uint32_t code, int rank,
                 const std::string& reason);
/// The recorded abort, if any: (code, rank, reason). A record being written
/// is waited for, at most 2 s: one whose writer never finishes it (killed
/// between its claim and its code) reads as peer_failure from rank -1, with
/// a reason that says so, rather than hanging every reader.
struct AbortInfo {
  std::uint32_t code;
  int rank;
  std::string reason;
};
std::optional<AbortInfo> read_abort(const Header& h);

/// Whether any rank has claimed the abort record: the one load of the
/// per-call check, before read_abort reads the record.
inline bool abort_claimed(const Header& h) {
  return h.abort_code.load(std::memory_order_acquire) != kAbortNone;
}

}  // namespace shmring::detail
