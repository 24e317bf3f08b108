#pragma once

// Every algorithm's entry point, one family per file of this folder (and the
// staged collectives in staged/). Each runs between the engine's begin() and
// end() of one collective (engine/engine.cpp) over the communicator state of
// core/state.hpp (CommState); docs/design/protocols.md gives each one's steps and bytes.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/state.hpp"

namespace shmring {

namespace algo {
// Ring algorithms (ring.cpp): reduce-scatter and/or allgather passes.
void allreduce_ring(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                    ReduceOp op);
void reduce_scatter_ring(CommState& c, const void* send, void* recv, std::size_t recv_count,
                         DataType dtype, ReduceOp op);
void allgather_ring(CommState& c, const void* send, void* recv, std::size_t send_count,
                    DataType dtype);
/// allgatherv through the ring's slots: chunk k is block k of `recv` (its
/// recv_counts[k] elements at recv_displs[k]), so the blocks may differ in
/// size and sit anywhere in `recv`; rounds follow the largest block.
void allgatherv_ring(CommState& c, const void* send, void* recv, const VectorArgs& v,
                     DataType dtype);
// Chain algorithms from / to a root (chain.cpp).
void broadcast_chain(CommState& c, void* buffer, std::size_t count, DataType dtype, int root);
void reduce_chain(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                  ReduceOp op, int root);
// One-shot small-message algorithms (direct.cpp).
void allreduce_direct(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                      ReduceOp op);
void reduce_scatter_direct(CommState& c, const void* send, void* recv, std::size_t recv_count,
                           DataType dtype, ReduceOp op);
void allgather_direct(CommState& c, const void* send, void* recv, std::size_t send_count,
                      DataType dtype);
void broadcast_direct(CommState& c, void* buffer, std::size_t count, DataType dtype, int root);
void reduce_direct(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                   ReduceOp op, int root);
// One cache line per rank (low_latency.cpp).
void allreduce_low_latency(CommState& c, const void* send, void* recv, std::size_t count,
                           DataType dtype, ReduceOp op);
void barrier_low_latency(CommState& c);
/// allgather of at most kLowLatencyBytes per rank, alltoall of at most
/// kLowLatencyBytes per rank's whole send buffer: the line carries it.
void allgather_low_latency(CommState& c, const void* send, void* recv, std::size_t count,
                           DataType dtype);
void alltoall_low_latency(CommState& c, const void* send, void* recv, std::size_t count,
                          DataType dtype);
/// alltoallv at N=2 whose blocks to and from the peer are each at most
/// kLowLatencyBytes: the line carries our block for the peer.
void alltoallv_low_latency(CommState& c, const void* send, void* recv, const VectorArgs& v,
                           DataType dtype);
/// allgatherv whose every block is at most kLowLatencyBytes.
void allgatherv_low_latency(CommState& c, const void* send, void* recv, const VectorArgs& v,
                            DataType dtype);
void allreduce_two_shot(CommState& c, const void* send, void* recv, std::size_t count,
                        DataType dtype, ReduceOp op);
/// The two-shot allreduce for any size, in rounds of half the slot area
/// (two_shot.cpp); the engine runs it where allreduce_two_shot's direct
/// buffer is too small.
void allreduce_two_shot_rounds(CommState& c, const void* send, void* recv, std::size_t count,
                               DataType dtype, ReduceOp op);
// Staged algorithms through the direct buffers, in rounds (staged.cpp).
// Any world size (size 1: the local copy only).
void alltoall_staged(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype);
void alltoallv_staged(CommState& c, const void* send, void* recv, const VectorArgs& v,
                      DataType dtype);
void gather_staged(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                   int root);
void scatter_staged(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                    int root);
void allgatherv_staged(CommState& c, const void* send, void* recv, const VectorArgs& v,
                       DataType dtype);
/// allgather through the staged rounds and their single copy, as
/// allgatherv_staged with equal blocks in rank order.
void allgather_staged(CommState& c, const void* send, void* recv, std::size_t count,
                      DataType dtype);
void reduce_scatter_v_staged(CommState& c, const void* send, void* recv, const VectorArgs& v,
                             DataType dtype, ReduceOp op);
/// reduce as a gather whose root reduces, in rank order, what the others
/// stage (one lane): every rank's 16-bit block meets in the root's
/// registers, where the chain (chain.cpp) would pass float64 partials.
void reduce_staged(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                   ReduceOp op, int root);
/// Bytes per lane when a direct buffer is cut into `lanes` equal lanes (a
/// multiple of 16, so whole elements of every datatype); 0 if too small.
std::size_t staged_lane_bytes(std::size_t buffer_bytes, int lanes);
/// Hash of a count vector (equal vectors, equal hashes).
std::uint64_t staged_vector_hash(const std::vector<std::size_t>& counts);
/// This rank's term of the alltoallv pair sum (0 over all ranks when every
/// recv_counts[j] of rank i equals send_counts[i] of rank j).
std::uint64_t staged_pair_hash(int rank, const std::vector<std::size_t>& send_counts,
                               const std::vector<std::size_t>& recv_counts);
/// Fails the job: rank i sends `sent` elements to rank j by its send_counts,
/// rank j expects `expected` by its recv_counts (alltoallv).
[[noreturn]] void alltoallv_pair_mismatch(CommState& c, int i, int j, std::uint64_t sent,
                                          std::uint64_t expected);
/// alltoallv at N=2 on the low-latency line: the descriptor word both ranks
/// compute alike when they agree, the counts 0 -> 1 (low half) and 1 -> 0
/// (high half), each at most kLowLatencyBytes elements.
std::uint64_t alltoallv_line_word(int rank, const VectorArgs& v);
}  // namespace algo

}  // namespace shmring
