// Hierarchical allreduce: scripts of stages over the communicators built at
// setup (topology.cpp). Terms as in impl.hpp: S = bytes of the buffer,
// L = ranks per node, M = nodes, N = L*M ranks.
//
// shards (large messages, balanced nodes), after Horovod's hierarchical
// allreduce; chunk = count / L elements, remainder = count - L*chunk:
//   1. reduce-scatter in the node (shmring): local rank j ends with shard j,
//      the node's reduction of elements [j*chunk, (j+1)*chunk), written into
//      its own place in recv.                      ~ S(L-1)/L bytes per rank
//   2. allreduce of shard j across nodes (MPI over cross j): the L local
//      ranks of a node do this at the same time, each on its own
//      communicator, so the network carries S/L per rank, not S per node.
//                                                  ~ 2(M-1)/M * S/L per rank
//   3. the remainder (< L elements), when there is one, through the
//      leaders: reduce to the leader, MPI allreduce among leaders, broadcast.
//   4. allgather in the node (shmring): every rank gets every shard.
//                                                  ~ S(L-1)/L bytes per rank
//   Predicted time = t_rs(S, L) + t_mpi(S/L, M) + t_ag(S, L).
//
// leaders (small messages, or nodes of different sizes), after Open MPI
// HAN's fallback:
//   1. reduce to the leader in the node (shmring).
//   2. allreduce among the leaders (MPI over leaders), full S.
//   3. broadcast from the leader in the node (shmring).
//
// shards, pipelined (allreduce_pipeline.cpp): the same stages on pieces of
// the buffer, overlapped; taken when the message holds more than one piece
// (SHMRING_MPI_PIECE_BYTES).
//
// flat: one MPI_Allreduce over every rank (the baseline, for comparison).
//
// One node: the node's shmring allreduce, nothing else. One rank per node
// (automatic): flat.
//
// avg: the node stages sum; the MPI stage divides once by N (mpi_reduce.cpp).

#include <fmt/format.h>

#include <cstring>

#include "impl.hpp"

namespace shmring::mpi {

namespace {

// Inside a node an avg is a sum: the one division happens after the MPI stage.
ReduceOp node_op(ReduceOp op) {
  return op == ReduceOp::avg ? ReduceOp::sum : op;
}

const std::byte* at(const void* p, std::size_t elems, std::size_t esize) {
  return static_cast<const std::byte*>(p) + elems * esize;
}
std::byte* at(void* p, std::size_t elems, std::size_t esize) {
  return static_cast<std::byte*>(p) + elems * esize;
}

}  // namespace

Algorithm Communicator::Impl::choose(std::size_t bytes) const {
  if (algorithm == Algorithm::flat) return Algorithm::flat;
  if (num_nodes == 1) return Algorithm::automatic;  // pure shmring
  if (!balanced) return Algorithm::leaders;
  if (algorithm != Algorithm::automatic) return algorithm;
  // One rank per node: the node stages have nothing to move, and cost 7-21
  // us at 64 KiB-1 MiB on 2 fake nodes x 1 rank
  // (docs/performance/notes/2026-12-01-intel-slices-mpi-calls.md); MPI alone
  // is the allreduce.
  if (num_nodes == size) return Algorithm::flat;
  return bytes >= shards_bytes ? Algorithm::shards : Algorithm::leaders;
}

void Communicator::Impl::allreduce(const void* send, void* recv, std::size_t count, DataType dtype,
                                   ReduceOp op) {
  if (count == 0) return;
  switch (choose(count * datatype_size(dtype))) {
    case Algorithm::flat:
      return allreduce_flat(send, recv, count, dtype, op);
    case Algorithm::leaders:
      return allreduce_leaders(send, recv, count, dtype, op);
    case Algorithm::shards: {
      const std::size_t pieces = pieces_for(count, dtype);
      if (pieces > 1) return allreduce_shards_pipelined(send, recv, count, dtype, op, pieces);
      return allreduce_shards(send, recv, count, dtype, op);
    }
    case Algorithm::automatic:
      return node_stage("allreduce in the node",
                        [&] { node_comm->allreduce(send, recv, count, dtype, op); });
  }
}

void Communicator::Impl::allreduce_leaders(const void* send, void* recv, std::size_t count,
                                           DataType dtype, ReduceOp op, bool poll_mpi) {
  // 1. The node's reduction lands in the leader's recv.
  const char* stage1 = "allreduce (leaders) 1/3: reduce to the leader";
  if (poll_mpi) {
    shmring::Request r;
    node_stage(stage1, [&] { r = node_comm->ireduce(send, recv, count, dtype, node_op(op), 0); });
    wait_node(r, stage1);
  } else {
    node_stage(stage1, [&] { node_comm->reduce(send, recv, count, dtype, node_op(op), 0); });
  }
  // 2. The leaders reduce their nodes' results.
  if (leaders != MPI_COMM_NULL)
    mpi_allreduce(recv, count, dtype, op, leaders,
                  "allreduce (leaders) 2/3: MPI_Allreduce among the leaders");
  // 3. Every rank of the node gets the leader's result.
  const char* stage3 = "allreduce (leaders) 3/3: broadcast from the leader";
  if (poll_mpi) {
    shmring::Request r;
    node_stage(stage3, [&] { r = node_comm->ibroadcast(recv, count, dtype, 0); });
    wait_node(r, stage3);
  } else {
    node_stage(stage3, [&] { node_comm->broadcast(recv, count, dtype, 0); });
  }
}

void Communicator::Impl::allreduce_shards(const void* send, void* recv, std::size_t count,
                                          DataType dtype, ReduceOp op) {
  const std::size_t esize = datatype_size(dtype);
  const auto L = static_cast<std::size_t>(local_size);
  const std::size_t chunk = count / L;
  const std::size_t remainder = count - chunk * L;
  std::byte* my_shard = at(recv, chunk * static_cast<std::size_t>(local_rank), esize);

  if (chunk > 0) {
    // 1. Shard j of the node's reduction, straight into its place in recv
    //    (shmring's in-place form when send == recv).
    node_stage("allreduce (shards) 1/4: reduce-scatter in the node",
               [&] { node_comm->reduce_scatter(send, my_shard, chunk, dtype, node_op(op)); });
    // 2. Every local rank reduces its shard across nodes, all at once.
    mpi_allreduce(my_shard, chunk, dtype, op, cross,
                  "allreduce (shards) 2/4: MPI_Allreduce of the shard across nodes");
  }
  if (remainder > 0) {
    // 3. The tail that does not divide by L, through the leaders (its waits
    //    keep MPI moving, as the allgather's below).
    allreduce_leaders(at(send, chunk * L, esize), at(recv, chunk * L, esize), remainder, dtype, op,
                      /*poll_mpi=*/true);
  }
  if (chunk > 0) {
    // 4. Every rank gets every shard (shmring's in-place allgather), while
    //    this thread keeps MPI moving (wait_node, allreduce_pipeline.cpp).
    const char* stage = "allreduce (shards) 4/4: allgather in the node";
    shmring::Request ag;
    node_stage(stage, [&] { ag = node_comm->iallgather(my_shard, recv, chunk, dtype); });
    wait_node(ag, stage);
  }
}

void Communicator::Impl::allreduce_flat(const void* send, void* recv, std::size_t count,
                                        DataType dtype, ReduceOp op) {
  if (send != recv) std::memcpy(recv, send, count * datatype_size(dtype));
  mpi_allreduce(recv, count, dtype, op, world, "allreduce (flat): MPI_Allreduce");
}

}  // namespace shmring::mpi
