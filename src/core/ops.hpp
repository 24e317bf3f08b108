#pragma once

// One collective call as the layers pass it down: its kind, the algorithm
// chosen for it, its descriptor (published in shared memory, compared across
// ranks) and the Op that the engine runs.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shmring/types.hpp"

namespace shmring {

/// Collective kinds, as published in descriptors (values travel in shared memory).
enum class CollectiveKind : std::uint32_t {
  allreduce = 1,
  reduce_scatter = 2,
  allgather = 3,
  broadcast = 4,
  reduce = 5,
  barrier = 6,
  alltoall = 7,
  alltoallv = 8,
  gather = 9,
  scatter = 10,
  allgatherv = 11,
  reduce_scatter_v = 12,
  invalid = 0xff,  ///< a call this rank rejected (bad arguments)
};
const char* to_string(CollectiveKind k);

/// Which protocol moves a collective's data (published in the descriptor).
enum class Algorithm : std::uint32_t {
  ring = 1,         ///< pipelined slices around the ring (large messages)
  direct = 2,       ///< one-shot: every rank publishes its data once, readers take it (small)
  two_shot = 3,     ///< direct reduce-scatter, then direct allgather (mid sizes, many ranks)
  staged = 4,       ///< rounds through the direct buffers (alltoall, gather, ...; staged.cpp)
  low_latency = 5,  ///< data, descriptor and sequence number in one cache line (tiny)
};
const char* to_string(Algorithm a);

/// Why the core runs a collective the caller did not name: the peers'
/// mismatch messages say so (CommState::describe) instead of naming a call
/// their user never made. Published in the descriptor's kind word (bits 16
/// and up) and the low-latency line's packed word; part of the call, as the
/// kind is: a barrier on one rank does not match a finalize on another
/// (which would let the barrier return and the next call fail instead).
enum class CallPurpose : std::uint32_t {
  user = 0,      ///< the caller's own collective
  split = 1,     ///< Communicator::split's allgather of every rank's (color, key)
  finalize = 2,  ///< Communicator::finalize / ifinalize's barrier: the rank is leaving
};

/// One collective call as this rank sees it.
struct CollectiveDesc {
  CollectiveKind kind;
  std::uint64_t count;
  DataType dtype;
  ReduceOp op;
  int root;
  Algorithm algorithm = Algorithm::ring;
  std::uint64_t vhash = 0;  ///< staged v-collectives: hash of the count vectors
  std::uint64_t aux = 0;    ///< staged alltoallv: this rank's largest block to one peer, bytes
  CallPurpose purpose = CallPurpose::user;
};

/// The count and displacement vectors of a v-collective (size() entries
/// each, in elements), copied from the caller's spans so that a queued
/// request does not depend on them. Unused vectors stay empty.
struct VectorArgs {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
};

/// One collective call, as the front (argument checks, descriptor, choice
/// of algorithm; communicator.cpp) hands it to the engine (Impl::run,
/// engine.cpp), which runs it on the caller's thread or on the progress
/// thread. Buffers are the caller's; the engine borrows them until done.
struct Op {
  CollectiveDesc desc;  ///< kind invalid: a rejected call (publishes "invalid call")
  const void* send = nullptr;
  void* recv = nullptr;   ///< broadcast: the buffer
  std::size_t bytes = 0;  ///< bytes of this rank's result (the world-size-1 copy)
  std::shared_ptr<const VectorArgs> v = nullptr;  ///< alltoallv, allgatherv, reduce_scatter_v
  std::uint64_t queued_ns = 0;  ///< when the engine queued it (SHMRING_TRACE); 0: not queued
  std::shared_ptr<const std::string> refusal = nullptr;  ///< kind invalid: this rank's error
};

}  // namespace shmring
