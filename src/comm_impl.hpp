#pragma once

// Communicator internals shared by the collective algorithms.

#include <tbb/task_arena.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "layout.hpp"
#include "segment.hpp"
#include "shmring/communicator.hpp"
#include "wait.hpp"

namespace shmring {

/// Collective kinds, as published in descriptors (values travel in shared memory).
enum class CollectiveKind : std::uint32_t {
  allreduce = 1,
  reduce_scatter = 2,
  allgather = 3,
  broadcast = 4,
  reduce = 5,
  barrier = 6,
};
const char* to_string(CollectiveKind k);

/// One collective call as this rank sees it.
struct CollectiveDesc {
  CollectiveKind kind;
  std::uint64_t count;
  DataType dtype;
  ReduceOp op;
  int root;
};

struct Communicator::Impl {
  Config config;
  std::unique_ptr<detail::Segment> seg;
  std::unique_ptr<tbb::task_arena> arena;  // null when threads == 1
  detail::WaitPolicy wait_policy;
  int rank = 0, size = 1, left = 0, right = 0;

  // Ring edge state, all in slices (never reset, like the shared counters).
  std::uint64_t sent = 0;         // slices published into my slots (== my produced)
  std::uint64_t recvd = 0;        // slices of my left neighbour consumed (== my consumed)
  std::uint64_t collectives = 0;  // sequence number of the next collective

  // The collective in flight, for error messages.
  std::optional<CollectiveDesc> current;
  int step = -1;
  // First error seen (the communicator refuses work afterwards).
  std::optional<std::string> broken;

  detail::RankArea& my_area() { return seg->rank_area(rank); }
  detail::RankArea& area(int r) { return seg->rank_area(r); }

  /// Called by every wait's slow path: throws on abort, on a dead `peer`
  /// (unless `counter` reached `target` after all: a peer may publish its
  /// last slice and exit) and past the deadline. `what` names what is
  /// awaited, for the message.
  void check_progress(int peer, const char* what, std::chrono::steady_clock::time_point deadline,
                      const detail::Counter& counter, std::uint64_t target);

  // ---- Ring edge r -> r+1 (DESIGN "The ring protocol"). ----
  /// Waits until slot (sent mod K) is free, i.e. right's consumed >= sent-K+1.
  std::byte* acquire_send_slot();
  /// Publishes the slot just filled: produced = ++sent.
  void publish_send();
  /// Waits until left's produced > recvd; returns left's slot (recvd mod K).
  const std::byte* wait_recv_slot();
  /// Frees the slot just read: consumed = ++recvd.
  void release_recv();

  /// Starts a collective: refuses a broken communicator, publishes our
  /// descriptor (before any slot write).
  void begin(const CollectiveDesc& d);
  /// Compares left's descriptor with ours; call after the first
  /// wait_recv_slot() of the collective. Raises a mismatch on every rank.
  void check_left_descriptor();
  void end();

  /// Records `e` as the job's abort reason (first error wins), marks this
  /// communicator broken, rethrows the job's first error.
  [[noreturn]] void fail(const Error& e);

  std::string describe(const CollectiveDesc& d) const;

  // Parallel kernels inside this rank's arena.
  void reduce(void* dst, const void* a, const void* b, std::size_t n, DataType dt, ReduceOp op,
              int divisor = 1);
  void copy(void* dst, const void* src, std::size_t bytes);

  std::chrono::steady_clock::time_point deadline() const {
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               std::chrono::duration<double>(config.timeout_s));
  }
  std::chrono::steady_clock::time_point op_deadline;
};

namespace algo {
/// Ring allreduce (allreduce_ring.cpp).
void allreduce_ring(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                    DataType dtype, ReduceOp op);
}  // namespace algo

}  // namespace shmring
