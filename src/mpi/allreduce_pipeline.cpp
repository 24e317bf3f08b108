// The shards allreduce, pipelined: the buffer goes in pieces, and the three
// stages of different pieces overlap, so that the node-local time (shmring)
// and the network time (MPI) add up less than in the blocking script
// (allreduce.cpp). Terms as in impl.hpp; P = pieces.
//
// Piece p is a run of L * s_p elements of the buffer (s_p ~ chunk / P, where
// chunk = count / L); local rank j owns shard j of each piece, s_p elements
// at element L * a_p + j * s_p (a_p = s_0 + ... + s_{p-1}). Per piece, the
// blocking script's stages:
//   RS_p   reduce-scatter of piece p in the node          (shmring, queued)
//   MPI_p  MPI_Iallreduce of shard j of piece p over cross j (MPI)
//   AG_p   allgather of piece p in the node               (shmring, queued)
//
// Who runs what: at the start this thread queues RS_0 .. RS_{P-1} on the
// node communicator; its progress thread runs them one after another. This
// thread then drives MPI (Open MPI makes progress only inside MPI calls):
// as soon as RS_p is done it starts MPI_p; as soon as MPI_p is done (in
// piece order) it queues AG_p, which runs on the progress thread after the
// RS's. So while piece p crosses the network, piece p+1 is being reduced in
// the node and piece p-1 gathered:
//
//   progress thread  RS_0 RS_1 RS_2 RS_3 ........ AG_0 AG_1 AG_2 AG_3
//   this thread           MPI_0 MPI_1 MPI_2 MPI_3
//
// Time ~ t_rs(S)/P + max(t_rs(S), t_mpi(S/L)) + t_ag(S)/P (+ per piece costs),
// against t_rs(S) + t_mpi(S/L) + t_ag(S) for the blocking script.
//
// The order of shmring calls (all RS, then AG in piece order, then the
// remainder's stages) is the same on every rank whatever the timing, as the
// node communicator's call-order contract needs. MPI is called from this
// thread only (MPI_THREAD_FUNNELED is enough).
//
// The remainder (count % L elements) goes through the leaders after the
// pieces, as in the blocking script.
//
// A rank never waits in shmring without calling into MPI after its own MPI
// stage (wait_node): Open MPI may complete an MPI_Iallreduce at this rank
// while a fragment of it for the partner on another node still sits in its
// TCP send queue (an eager send completes once copied), and moves that
// queue only inside MPI calls. Were this rank then to wait, in shmring, for
// a local peer that waits in MPI for a rank of that other node, which in
// turn waits in shmring for the partner, which waits for the fragment, no
// one would move until SHMRING_TIMEOUT. The leaders path has no such cycle:
// only leaders call MPI there, and no leader's shmring wait depends on
// another rank's MPI call.

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>

#include "impl.hpp"

namespace shmring::mpi {

namespace {

ReduceOp node_op(ReduceOp op) {
  return op == ReduceOp::avg ? ReduceOp::sum : op;
}

std::byte* at(void* p, std::size_t elems, std::size_t esize) {
  return static_cast<std::byte*>(p) + elems * esize;
}
const std::byte* at(const void* p, std::size_t elems, std::size_t esize) {
  return static_cast<const std::byte*>(p) + elems * esize;
}

}  // namespace

std::size_t Communicator::Impl::pieces_for(std::size_t count, DataType dtype) const {
  const std::size_t bytes = count * datatype_size(dtype);
  const std::size_t chunk = count / static_cast<std::size_t>(local_size);
  if (piece_bytes == 0 || chunk == 0) return 1;
  std::size_t p = std::clamp<std::size_t>(bytes / piece_bytes, 1, kMaxPieces);
  // MPI counts are int: no shard of a piece may pass kMaxMpiCount elements.
  p = std::max(p, (chunk + kMaxMpiCount - 1) / kMaxMpiCount);
  return std::min(p, chunk);  // at least one element per shard
}

void Communicator::Impl::allreduce_shards_pipelined(const void* send, void* recv, std::size_t count,
                                                    DataType dtype, ReduceOp op,
                                                    std::size_t pieces) {
  const std::size_t esize = datatype_size(dtype);
  const auto L = static_cast<std::size_t>(local_size);
  const auto j = static_cast<std::size_t>(local_rank);
  const std::size_t chunk = count / L;
  const std::size_t remainder = count - chunk * L;
  const std::size_t P = pieces;

  struct Piece {
    std::size_t first = 0;  // a_p: elements per rank before this piece
    std::size_t shard = 0;  // s_p: elements of each rank's shard
    shmring::Request rs, ag;
    MpiStage mpi;
  };
  std::vector<Piece> piece(P);
  for (std::size_t p = 0, first = 0; p < P; ++p) {
    piece[p].first = first;
    piece[p].shard = chunk / P + (p < chunk % P ? 1 : 0);
    first += piece[p].shard;
  }
  auto whole = [&](const Piece& x) { return L * x.first; };  // first element of the piece
  auto mine = [&](const Piece& x) { return at(recv, whole(x) + j * x.shard, esize); };

  // 1. Every piece's reduce-scatter, queued in piece order.
  node_stage("allreduce (pipelined) 1/4: reduce-scatter in the node", [&] {
    for (auto& x : piece)
      x.rs = node_comm->ireduce_scatter(at(send, whole(x), esize), mine(x), x.shard, dtype,
                                        node_op(op));
  });

  // 2. This thread drives MPI: a piece crosses the nodes once its
  //    reduce-scatter is done; its allgather is queued once it has crossed.
  float* wide16 = nullptr;
  if (dtype == DataType::float16 || dtype == DataType::bfloat16)
    wide16 = reinterpret_cast<float*>(scratch_bytes(wide, chunk * sizeof(float)));
  std::size_t reduced = 0, crossed = 0;  // pieces past RS_p, past MPI_p
  while (crossed < P) {
    bool moved = false;
    if (reduced < P) {
      bool done = false;
      node_stage("allreduce (pipelined) 1/4: reduce-scatter in the node",
                 [&] { done = piece[reduced].rs.test(); });
      if (done) {
        Piece& x = piece[reduced++];
        x.mpi = mpi_iallreduce_start(mine(x), x.shard, dtype, op, cross,
                                     wide16 ? wide16 + x.first : nullptr,
                                     "allreduce (pipelined) 2/4: MPI_Iallreduce of a shard");
        moved = true;
      }
    }
    if (crossed < reduced &&
        mpi_iallreduce_test(piece[crossed].mpi,
                            "allreduce (pipelined) 2/4: MPI_Iallreduce of a shard")) {
      Piece& x = piece[crossed++];
      node_stage("allreduce (pipelined) 4/4: allgather in the node", [&] {
        x.ag = node_comm->iallgather(mine(x), at(recv, whole(x), esize), x.shard, dtype);
      });
      moved = true;
    }
    // Nothing to do this turn: let the progress thread (or a peer rank on
    // a machine with fewer cores than ranks) have the CPU.
    if (!moved) sched_yield();
  }

  // 3. The tail that does not divide by L, through the leaders (its shmring
  //    stages queue behind the allgathers; its waits keep MPI moving).
  if (remainder > 0)
    allreduce_leaders(at(send, chunk * L, esize), at(recv, chunk * L, esize), remainder, dtype, op,
                      /*poll_mpi=*/true);

  // 4. The allgathers, run by the progress thread while this one keeps MPI
  //    moving.
  for (auto& x : piece) wait_node(x.ag, "allreduce (pipelined) 4/4: allgather in the node");
}

void Communicator::Impl::wait_node(shmring::Request& request, const char* stage) {
  node_stage(stage, [&] {
    while (!request.test()) {
      int flag = 0;  // MPI_Iprobe: a call that runs Open MPI's progress engine
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, world, &flag, MPI_STATUS_IGNORE);
      sched_yield();
    }
  });
}

}  // namespace shmring::mpi
