// Hierarchical reduce-scatter (balanced nodes): each rank's block crosses
// the network once, reduced inside its node first. Terms as in impl.hpp;
// B = recv_count elements, the block of one rank.
//
//   1. order: copy `send` into scratch in (local rank, node) order: chunk j
//      holds, in node order, the blocks of the M ranks with local rank j.
//                                                  S bytes copied per rank
//   2. reduce-scatter of that scratch in the node (shmring): local rank j
//      gets chunk j (M blocks) reduced over its node.
//                                                  ~ S(L-1)/L per rank
//   3. MPI_Reduce_scatter_block of chunk j over cross j (ranked by node):
//      the rank of node k gets block k, the block of global rank
//      node_ranks[k][j], which is itself.          ~ (M-1)/M * S/L per rank
//
// The network carries S/L per rank rather than the whole buffer (the
// fallback, an allreduce of everything into scratch, moves 2 S). avg sums
// in both stages and divides once by size(); 16-bit floats cross as float32
// (mpi_reduce.cpp). Nodes of different sizes, one node, or blocks past MPI's
// int counts take the fallback (collectives.cpp).

#include <cstring>

#include "impl.hpp"

namespace shmring::mpi {

void Communicator::Impl::reduce_scatter_hier(const void* send, void* recv, std::size_t recv_count,
                                             DataType dtype, ReduceOp op) {
  const std::size_t esize = datatype_size(dtype);
  const std::size_t block = recv_count * esize;
  const auto L = static_cast<std::size_t>(local_size);
  const auto M = static_cast<std::size_t>(num_nodes);

  // 1. Blocks in (local rank, node) order.
  std::byte* ordered = scratch_bytes(scratch2, L * M * block);
  for (std::size_t j = 0; j < L; ++j)
    for (std::size_t k = 0; k < M; ++k)
      std::memcpy(
          ordered + (j * M + k) * block,
          static_cast<const std::byte*>(send) + static_cast<std::size_t>(node_ranks[k][j]) * block,
          block);

  // 2. Chunk j of the node's reduction, in place.
  std::byte* chunk = ordered + static_cast<std::size_t>(local_rank) * M * block;
  const ReduceOp in_node = op == ReduceOp::avg ? ReduceOp::sum : op;
  node_stage("reduce_scatter 2/3: reduce-scatter in the node",
             [&] { node_comm->reduce_scatter(ordered, chunk, M * recv_count, dtype, in_node); });

  // 3. Block k of chunk j to the rank of node k, reduced over the nodes.
  mpi_reduce_scatter_block(chunk, recv, recv_count, dtype, op, cross,
                           "reduce_scatter 3/3: MPI_Reduce_scatter_block across nodes");
}

}  // namespace shmring::mpi
