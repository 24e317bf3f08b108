#pragma once

// Communicator::Impl: a rank's CommState (core/state.hpp, all an algorithm
// sees) plus what the front, the engine and point-to-point own.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "base/config.hpp"
#include "core/choices.hpp"
#include "core/ops.hpp"
#include "core/state.hpp"
#include "shmring/communicator.hpp"

namespace shmring {

namespace detail {
class Engine;
class P2p;
}  // namespace detail

struct Communicator::Impl : CommState {
  ~Impl();  // engine.cpp: stops the progress thread before anything else goes

  // ---- Front (src/api). ----
  // Argument copies of the v-collectives (collective_set.cpp), reused while
  // no queued request holds them, and the front's scratch block lists: a
  // blocking 16-byte alltoallv at N=2 spent a fifth of its time in malloc
  // and free. Touched only by the calling thread (calls are serialized).
  std::shared_ptr<VectorArgs> spare_vector_args;
  std::vector<std::pair<std::size_t, std::size_t>> scratch_send_blocks, scratch_recv_blocks;
  // config.algorithm as parsed once (SHMRING_ALGO): nullopt for "auto".
  // choose() runs on every call; comparing strings there cost 5 ns of an
  // 8-byte allreduce's 130.
  std::optional<Algorithm> forced_algorithm;
  // The algorithm table compiled for this communicator's inputs
  // (engine::compile_choices, once they are known): a call's choice is then
  // a scan of a few payload ranges. Empty until then.
  AlgorithmSteps choices;
  // The constructor's settings step (communicator.cpp): every option and
  // variable of this rank, checked before it attaches.
  void settings(const Options& options);
  bool asymmetric_fence_ok = false;  // register_asymmetric_fence() succeeded
  // Held while this communicator is oversubscribed: the process's later
  // communicators wait as crowded too (config.hpp job_crowding_hint).
  std::optional<detail::CrowdedMark> crowded;
  std::uint64_t splits = 0;  // split() calls so far (names sub-communicators)
  std::uint32_t rec_wanted = detail::kRecorderEntriesDefault;  // SHMRING_RECORDER_ENTRIES
  [[noreturn]] void reject_call(const InvalidArgumentError& e);

  // ---- stats() (Communicator::stats): per collective kind, updated by the
  // running thread (Impl::run, after end()), read by any. ----
  struct KindStats {
    std::atomic<std::uint64_t> calls{0}, bytes{0}, time_ns{0}, wait_ns{0};
  };
  std::array<KindStats, 13> kind_stats;  // index: CollectiveKind value (1..12)

  // ---- Engine (engine.cpp). Front functions call execute/submit/reject;
  // only run() touches the protocol state (CommState), on one thread at a
  // time. ----
  /// Runs one collective (begin, algo::*, end) on the calling thread.
  void run(const Op& op);
  /// A blocking call: inline when nothing is pending, else queued and awaited.
  void execute(const Op& op);
  /// A non-blocking call: queued for the progress thread (started now if needed).
  Request submit(const Op& op);
  /// A call whose arguments were refused: tells the peers in call order
  /// (inline, or as a queued marker), then throws `e` on this thread.
  [[noreturn]] void reject(const InvalidArgumentError& e);
  /// SHMRING_PROGRESS_CPU: the CPU the progress thread is pinned to, or -1.
  int progress_cpu = -1;
  /// Null until the first non-blocking call. Reset first, in ~Impl.
  std::unique_ptr<detail::Engine> engine;
  /// Point-to-point (p2p.cpp), made on the first send/recv. Declared after
  /// `engine`, so destroyed before anything else, while the segment (of the
  /// base, CommState) is mapped.
  std::once_flag p2p_once;
  std::shared_ptr<detail::P2p> p2p;
  // p2p.get() once made: every send/recv reads this instead of entering
  // std::call_once, which sets two thread-locals of libstdc++ on each call.
  std::atomic<detail::P2p*> p2p_made{nullptr};
};

}  // namespace shmring
