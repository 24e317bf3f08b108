// The collectives other than allreduce, each a short script of stages:
// shmring inside the node, MPI among the leaders. With one node each is the
// node's shmring collective alone (local ranks are then the MPI ranks).
//
//   reduce_scatter  balanced nodes: reduce_scatter.cpp (reduce-scatter in
//                   the node, then MPI_Reduce_scatter_block across nodes).
//                   Otherwise (or SHMRING_MPI_ALGO=flat) an allreduce of the
//                   whole buffer (allreduce.cpp) into scratch, of which each
//                   rank keeps its block: 2 S across nodes instead of S/L.
//   allgather       1. allgather in the node into scratch (local order);
//                   2. MPI_Allgatherv of the node blocks among the leaders;
//                   3. the leader puts blocks in rank order into recv;
//                   4. broadcast from the leader in the node.
//   broadcast       1. in the root's node, broadcast from the root (so the
//                      leader has it); 2. MPI_Bcast among the leaders from the
//                   root's node; 3. in the other nodes, broadcast from the leader.
//   reduce          1. reduce to the leader in every node; 2. MPI_Reduce among
//                   the leaders to the root's node; 3. when the root is not
//                   its node's leader, the leader sends it over MPI.
//   barrier         node barrier, leaders' MPI_Barrier, node barrier.

#include <fmt/format.h>

#include <climits>
#include <cstring>

#include "impl.hpp"

namespace shmring::mpi {

namespace {

ReduceOp node_op(ReduceOp op) {
  return op == ReduceOp::avg ? ReduceOp::sum : op;
}

constexpr int kReduceTag = 0x5352;  // "SR": reduce's leader -> root hop

}  // namespace

std::byte* Communicator::Impl::scratch_bytes(std::vector<std::byte>& v, std::size_t bytes) {
  if (v.size() < bytes) {
    v.clear();
    v.shrink_to_fit();
    v.resize(bytes);
  }
  return v.data();
}

void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                  DataType dtype, ReduceOp op) {
  Impl& c = *impl_;
  c.check_usable("reduce_scatter");
  // Validated here, on every rank alike, before anything moves.
  c.check_op("reduce_scatter", dtype, op);
  c.check_buffer("reduce_scatter", "send", send, recv_count);
  c.check_buffer("reduce_scatter", "recv", recv, recv_count);
  if (c.num_nodes == 1 && c.algorithm != Algorithm::flat)
    return c.node_call("reduce_scatter in the node",
                       [&] { c.node_comm->reduce_scatter(send, recv, recv_count, dtype, op); });
  if (recv_count == 0) return;
  if (c.balanced && c.algorithm != Algorithm::flat && recv_count <= kMaxMpiCount)
    return c.reduce_scatter_hier(send, recv, recv_count, dtype, op);
  const std::size_t esize = datatype_size(dtype);
  const std::size_t total = recv_count * static_cast<std::size_t>(c.size);
  std::byte* all = c.scratch_bytes(c.scratch2, total * esize);
  c.allreduce(send, all, total, dtype, op);
  std::memcpy(recv, all + static_cast<std::size_t>(c.rank) * recv_count * esize,
              recv_count * esize);
}

void Communicator::allgather(const void* send, void* recv, std::size_t send_count, DataType dtype) {
  Impl& c = *impl_;
  c.check_usable("allgather");
  c.check_dtype("allgather", dtype);
  c.check_buffer("allgather", "send", send, send_count);
  c.check_buffer("allgather", "recv", recv, send_count);
  if (c.num_nodes == 1)
    return c.node_call("allgather in the node",
                       [&] { c.node_comm->allgather(send, recv, send_count, dtype); });
  const std::size_t esize = datatype_size(dtype);
  const std::size_t block = send_count * esize;
  if (block > static_cast<std::size_t>(INT_MAX))
    c.refuse("allgather",
             fmt::format("{} bytes per rank; at most {} across nodes (MPI's int)", block, INT_MAX));
  if (send_count == 0) return;

  // 1. The node's blocks, in local order.
  std::byte* node_blocks =
      c.scratch_bytes(c.scratch, block * static_cast<std::size_t>(c.local_size));
  c.node_stage("allgather 1/4: allgather in the node",
               [&] { c.node_comm->allgather(send, node_blocks, send_count, dtype); });

  if (c.leaders != MPI_COMM_NULL) {
    // 2. Every node's blocks, in node order, at every leader.
    std::byte* all = c.scratch_bytes(c.scratch2, block * static_cast<std::size_t>(c.size));
    std::vector<int> counts(static_cast<std::size_t>(c.num_nodes)), displs(counts.size());
    int first = 0;
    for (int k = 0; k < c.num_nodes; ++k) {
      counts[k] = static_cast<int>(c.node_ranks[k].size());
      displs[k] = first;
      first += counts[k];
    }
    MPI_Datatype block_type;
    c.check_mpi(MPI_Type_contiguous(static_cast<int>(block), MPI_BYTE, &block_type),
                "allgather: MPI_Type_contiguous");
    MPI_Type_commit(&block_type);
    const int rc = MPI_Allgatherv(node_blocks, c.local_size, block_type, all, counts.data(),
                                  displs.data(), block_type, c.leaders);
    MPI_Type_free(&block_type);
    c.check_mpi(rc, "allgather 2/4: MPI_Allgatherv among the leaders");
    // 3. Node order -> rank order.
    for (int k = 0; k < c.num_nodes; ++k)
      for (std::size_t j = 0; j < c.node_ranks[k].size(); ++j)
        std::memcpy(
            static_cast<std::byte*>(recv) + static_cast<std::size_t>(c.node_ranks[k][j]) * block,
            all + (static_cast<std::size_t>(displs[k]) + j) * block, block);
  }
  // 4. Every rank of the node gets the leader's recv.
  c.node_stage("allgather 4/4: broadcast from the leader", [&] {
    c.node_comm->broadcast(recv, send_count * static_cast<std::size_t>(c.size), dtype, 0);
  });
}

void Communicator::broadcast(void* buffer, std::size_t count, DataType dtype, int root) {
  Impl& c = *impl_;
  c.check_usable("broadcast");
  c.check_root("broadcast", root);
  c.check_dtype("broadcast", dtype);
  c.check_buffer("broadcast", "buffer", buffer, count);
  if (c.num_nodes == 1)
    return c.node_call("broadcast in the node",
                       [&] { c.node_comm->broadcast(buffer, count, dtype, root); });
  const std::size_t bytes = count * datatype_size(dtype);
  if (count == 0) return;
  const int root_node = c.node_of[root], root_local = c.local_of[root];
  const bool in_root_node = c.node == root_node;

  // 1. The root's node: the leader gets it (and so does everyone there).
  if (in_root_node && root_local != 0)
    c.node_stage("broadcast 1/3: broadcast from the root in its node",
                 [&] { c.node_comm->broadcast(buffer, count, dtype, root_local); });
  // 2. Leader to leaders (leaders' ranks are node numbers).
  if (c.leaders != MPI_COMM_NULL)
    c.mpi_bcast(buffer, bytes, root_node, c.leaders, "broadcast 2/3: MPI_Bcast among the leaders");
  // 3. The other nodes (and the root's node when the root is its leader).
  if (!in_root_node || root_local == 0)
    c.node_stage("broadcast 3/3: broadcast from the leader",
                 [&] { c.node_comm->broadcast(buffer, count, dtype, 0); });
}

void Communicator::reduce(const void* send, void* recv, std::size_t count, DataType dtype,
                          ReduceOp op, int root) {
  Impl& c = *impl_;
  c.check_usable("reduce");
  c.check_root("reduce", root);
  c.check_op("reduce", dtype, op);
  c.check_buffer("reduce", "send", send, count);
  if (c.rank == root) c.check_buffer("reduce", "recv (at the root)", recv, count);
  if (c.num_nodes == 1)
    return c.node_call("reduce in the node",
                       [&] { c.node_comm->reduce(send, recv, count, dtype, op, root); });
  if (count == 0) return;
  const std::size_t bytes = count * datatype_size(dtype);
  const int root_node = c.node_of[root], root_local = c.local_of[root];
  const bool am_root = c.rank == root;
  const bool leader = c.local_rank == 0;
  // The leader reduces into recv when it is the root, else into scratch.
  void* node_result =
      leader && am_root ? recv : (leader ? c.scratch_bytes(c.scratch, bytes) : nullptr);

  // 1. Each node's reduction at its leader.
  c.node_stage("reduce 1/3: reduce to the leader",
               [&] { c.node_comm->reduce(send, node_result, count, dtype, node_op(op), 0); });
  // 2. The leaders reduce to the root's node (avg divides there).
  if (c.leaders != MPI_COMM_NULL)
    c.mpi_reduce(node_result, count, dtype, op, root_node, c.leaders,
                 "reduce 2/3: MPI_Reduce among the leaders");
  // 3. The root's leader hands the result to the root.
  if (c.node == root_node && root_local != 0) {
    for (std::size_t off = 0; off < bytes; off += kMaxMpiCount) {
      const int n = static_cast<int>(std::min(kMaxMpiCount, bytes - off));
      if (leader)
        c.check_mpi(MPI_Send(static_cast<std::byte*>(node_result) + off, n, MPI_BYTE, root,
                             kReduceTag, c.world),
                    "reduce 3/3: MPI_Send to the root");
      else if (am_root)
        c.check_mpi(MPI_Recv(static_cast<std::byte*>(recv) + off, n, MPI_BYTE,
                             c.node_ranks[root_node][0], kReduceTag, c.world, MPI_STATUS_IGNORE),
                    "reduce 3/3: MPI_Recv from the leader");
    }
  }
}

void Communicator::barrier() {
  Impl& c = *impl_;
  c.check_usable("barrier");
  c.node_stage("barrier 1/3: in the node", [&] { c.node_comm->barrier(); });
  if (c.leaders != MPI_COMM_NULL)
    c.check_mpi(MPI_Barrier(c.leaders), "barrier 2/3: MPI_Barrier among the leaders");
  if (c.num_nodes > 1) c.node_stage("barrier 3/3: in the node", [&] { c.node_comm->barrier(); });
}

}  // namespace shmring::mpi
