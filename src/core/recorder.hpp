#pragma once

// The flight recorder's writer (docs/design/recorder.md): each rank keeps
// its last R calls in its own part of the segment's recorder region
// (transport/layout.hpp RecorderEntry), written with relaxed stores inside a
// seqlock, so that its peers (error messages), a dump and `shmrun --status`
// can read them at any time. Times are CLOCK_MONOTONIC ns (base/clock.hpp;
// a call's start and end through FastClock, within about a microsecond),
// comparable across the processes of a host.

#include <atomic>
#include <cstdint>

#include "base/clock.hpp"
#include "core/ops.hpp"
#include "transport/layout.hpp"

namespace shmring::detail {

/// Opens a seqlock section on `e` (version odd) and returns its version.
inline std::uint64_t recorder_open(RecorderEntry& e) {
  const std::uint64_t v = e.version.load(std::memory_order_relaxed);
  e.version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  return v + 1;
}
/// Closes it (version even again): a reader that saw `v - 1` before and
/// sees `v + 1` now knows the entry changed under it.
inline void recorder_close(RecorderEntry& e, std::uint64_t v) {
  e.version.store(v + 1, std::memory_order_release);
}

inline std::uint32_t pack_desc(const CollectiveDesc& d) {
  return (static_cast<std::uint32_t>(d.kind) & 0xff) |
         (static_cast<std::uint32_t>(d.dtype) & 0xff) << 8 |
         (static_cast<std::uint32_t>(d.op) & 0xff) << 16 |
         (static_cast<std::uint32_t>(d.algorithm) & 0xff) << 24;
}

/// Writes call `seq` (0-based) into `e` in state `state`, started at `now`.
inline void recorder_write_call(RecorderEntry& e, std::uint64_t seq, const CollectiveDesc& d,
                                std::uint64_t bytes, std::uint32_t state, std::uint64_t now) {
  const std::uint64_t v = recorder_open(e);
  e.seq.store(seq + 1, std::memory_order_relaxed);
  e.count.store(d.count, std::memory_order_relaxed);
  e.bytes.store(bytes, std::memory_order_relaxed);
  e.start_ns.store(now, std::memory_order_relaxed);
  e.end_ns.store(0, std::memory_order_relaxed);
  e.kind_dtype_op_algorithm.store(pack_desc(d), std::memory_order_relaxed);
  e.root.store(d.root, std::memory_order_relaxed);
  e.state.store(state, std::memory_order_relaxed);
  e.step.store(-1, std::memory_order_relaxed);
  recorder_close(e, v);
}

/// Ends the call in `e`: completed or failed at `now`, its last step.
inline void recorder_end_call(RecorderEntry& e, std::uint32_t state, std::uint64_t now, int step) {
  const std::uint64_t v = recorder_open(e);
  e.end_ns.store(now, std::memory_order_relaxed);
  e.state.store(state, std::memory_order_relaxed);
  e.step.store(step, std::memory_order_relaxed);
  recorder_close(e, v);
}

/// Point-to-point: `head`'s newest call is now this one, started at `now`.
/// The writer holds the p2p engine's lock (one writer at a time).
inline void recorder_p2p_begin(RecorderHead& h, bool is_send, DataType dtype, int peer, int tag,
                               std::uint64_t count, std::uint64_t now) {
  const std::uint64_t v = h.p2p_version.load(std::memory_order_relaxed) + 1;
  h.p2p_version.store(v, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  h.p2p_calls.store(h.p2p_calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  h.p2p_count.store(count, std::memory_order_relaxed);
  h.p2p_start_ns.store(now, std::memory_order_relaxed);
  h.p2p_end_ns.store(0, std::memory_order_relaxed);
  h.p2p_kind_dtype.store((is_send ? 1u : 2u) | static_cast<std::uint32_t>(dtype) << 8,
                         std::memory_order_relaxed);
  h.p2p_peer.store(peer, std::memory_order_relaxed);
  h.p2p_tag.store(tag, std::memory_order_relaxed);
  h.p2p_state.store(kCallStarted, std::memory_order_relaxed);
  h.p2p_version.store(v + 1, std::memory_order_release);
}
/// Ends `head`'s newest point-to-point call: completed or failed at `now`.
inline void recorder_p2p_end(RecorderHead& h, std::uint32_t state, std::uint64_t now) {
  const std::uint64_t v = h.p2p_version.load(std::memory_order_relaxed) + 1;
  h.p2p_version.store(v, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  h.p2p_end_ns.store(now, std::memory_order_relaxed);
  h.p2p_state.store(state, std::memory_order_relaxed);
  h.p2p_version.store(v + 1, std::memory_order_release);
}

}  // namespace shmring::detail
