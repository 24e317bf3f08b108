#pragma once

// Plain or streaming stores for a rank's slot writes, chosen by what each
// costs this rank now (SHMRING_NT_STORES=auto on AMD).

#include <cstddef>
#include <cstdint>

namespace shmring::detail {

/// Picks, write by write, plain or streaming (non-temporal) stores for the
/// large slot writes of one rank, by the write rate it measures for each.
///
/// Why measure: on AMD which of the two is faster depends on where the
/// reader runs, and neither the topology the guest sees nor a probe at
/// start-up tells. On the 2-vCPU Zen 4 VM of
/// docs/performance/notes/2026-12-05-adaptive-slot-stores.md, plain writes of
/// 1 MiB allreduce slots ran at 42-44 GB/s while the two vCPUs shared an
/// L3 and at 2.4-4.9 GB/s while they did not (each reuse of a slot line
/// takes it back from the reader's cache on the other CCD); streaming
/// writes ran at 15-16 and 26-28 GB/s. The host moves the vCPUs between the
/// two placements during a job, and on a many-core EPYC a ring has
/// neighbours on both. The writer's own rate tells the states apart by
/// 2.5x or more, and the allreduce time follows it.
///
/// How: an estimate of ns per byte for each kind. The kind with the lower
/// estimate takes the writes, and each of them moves its estimate a quarter
/// of the way (a moving average; a write counts at most 4x the estimate,
/// so that one preempted write does not flip the choice). The other kind
/// is tried once when it has not been for kProbeWrites writes and
/// kProbeIntervalNs, and that one write sets its estimate, so a change of
/// placement is seen at the next try; a change that slows the chosen kind
/// shows in its own writes. The tries cost at most 1/kProbeWrites of the
/// writes at the slower kind's rate (4% where it is 10x slower). The first
/// write of each kind is not counted (first touches, cold caches); both
/// kinds are tried twice before the estimates decide, streaming first.
/// This is an epsilon-greedy bandit with a count- and time-based epsilon
/// (Sutton and Barto, "Reinforcement Learning", 2018, section 2.2); its
/// state is this rank's alone: the kind of store is invisible to the
/// reader, so ranks need not agree.
///
/// Thread safety: none; one instance per communicator, used by the thread
/// running its calls.
class SlotStoreChooser {
 public:
  enum class Kind : std::uint8_t { plain = 0, streaming = 1 };

  /// A kind not chosen is tried again after this many writes of the other
  /// and this long.
  static constexpr std::uint64_t kProbeWrites = 256;
  static constexpr std::uint64_t kProbeIntervalNs = 10'000'000;  // 10 ms
  /// Writes of each kind that are counted before the estimates decide
  /// (after the uncounted first one).
  static constexpr int kWarmupWrites = 1;

  /// The kind for a write starting at `now_ns` (any monotonic ns clock).
  Kind next(std::uint64_t now_ns) const;
  /// Books a write of `bytes` (> 0) of kind `k` that started at `start_ns`
  /// and ended at `end_ns`.
  void record(Kind k, std::size_t bytes, std::uint64_t start_ns, std::uint64_t end_ns);

  /// ns per byte measured for `k` so far; negative until counted.
  double ns_per_byte(Kind k) const { return est_[idx(k)]; }
  /// Writes of kind `k` booked so far (counted or not).
  std::uint64_t writes(Kind k) const { return writes_[idx(k)]; }

 private:
  static int idx(Kind k) { return static_cast<int>(k); }
  double est_[2] = {-1.0, -1.0};
  std::uint64_t writes_[2] = {0, 0};
  std::uint64_t last_ns_[2] = {0, 0};  // start of the kind's last write
  std::uint64_t last_n_[2] = {0, 0};   // total_ when the kind last wrote
  std::uint64_t total_ = 0;            // writes of both kinds
};

}  // namespace shmring::detail
