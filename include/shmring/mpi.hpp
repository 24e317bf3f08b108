#pragma once

// shmring over several machines: hierarchical collectives that run shmring
// inside each node and MPI between nodes (libshmring_mpi; link with
// `pkg-config --libs shmring-mpi`). Include <mpi.h>'s implementation of your
// choice before or through this header (Open MPI from Debian is what it is
// built and tested with).

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "shmring/communicator.hpp"
#include "shmring/error.hpp"
#include "shmring/types.hpp"

#if defined(SHMRING_MPI_BUILDING_LIBRARY)
#define SHMRING_MPI_API __attribute__((visibility("default")))
#else
#define SHMRING_MPI_API
#endif

namespace shmring::mpi {

/// Which allreduce runs (`SHMRING_MPI_ALGO`, or Options::algorithm).
///  - automatic: `leaders` below SHMRING_MPI_SHARDS_BYTES or when nodes hold
///    different numbers of ranks, `shards` from there on; one node alone is
///    pure shmring; one rank per node is `flat` (nothing to do in a node).
///  - leaders: reduce to each node's leader over shmring, MPI allreduce among
///    the leaders, broadcast inside each node over shmring.
///  - shards: reduce-scatter inside each node over shmring, every local rank
///    allreduces its shard across nodes over MPI (all local ranks at once),
///    allgather inside each node; needs the same number of ranks on every
///    node (else it runs `leaders`). Messages of more than one piece
///    (Options::piece_bytes) are pipelined: the pieces' stages overlap.
///  - flat: one MPI_Allreduce over the whole MPI communicator (for
///    comparison; shmring is not used).
enum class Algorithm : std::uint8_t { automatic, leaders, shards, flat };

/// Explicit settings; fields left at their defaults come from the
/// environment, then the built-in defaults.
struct Options {
  /// Settings of the intra-node shmring communicator (slots, slot_bytes,
  /// threads, timeout_s). rank, world_size, local_rank, local_world_size and
  /// job_id are ignored: the layer sets them from the node groups.
  shmring::Options node;
  /// Empty: SHMRING_MPI_ALGO (auto, leaders, shards or flat), else auto.
  std::string algorithm;
  /// Allreduce messages of at least this many bytes take the shards path
  /// (auto only). 0: SHMRING_MPI_SHARDS_BYTES, else the built-in default:
  /// 64 KiB, or 4 MiB where some machine runs more ranks than it has CPUs
  /// (there the leaders' path, with fewer busy ranks, measured faster).
  std::size_t shards_bytes = 0;
  /// The shards path cuts a message into pieces of about this many bytes
  /// (at most 16) and overlaps their stages: one piece's MPI allreduce
  /// across nodes runs while the next is reduce-scattered inside the node
  /// (on the node communicator's progress thread) and the one before is
  /// allgathered. 0: SHMRING_MPI_PIECE_BYTES (0 there: no pipelining; a
  /// size; unset or `auto`: automatic), SIZE_MAX: no pipelining. Automatic:
  /// 256 KiB pieces where every machine has at least two CPUs (in its ranks'
  /// affinity masks) per rank on it, one piece elsewhere: the pipeline keeps
  /// two threads per rank busy, and where they must share CPUs its extra
  /// synchronisations cost more than the overlap gains (docs/performance/notes).
  /// Ranks count as one machine when they share a kernel (boot id), so fake
  /// nodes and containers on one host are counted together.
  std::size_t piece_bytes = 0;
  /// An MPI stage (allreduce, reduce, broadcast among nodes) moves at most
  /// this many bytes per MPI call; a larger one goes in several calls, one
  /// after another. 0: SHMRING_MPI_CALL_BYTES (0 there: one call), else
  /// 2 MiB; SIZE_MAX: one call; anything else must be at least 4096
  /// (InvalidArgumentError). Over TCP loopback Open MPI 4.1's allreduce
  /// between two ranks took 3.7 ms for 8 MiB in one call and 2.0 ms in
  /// 2 MiB calls, 24 ms against 8.3 ms at 32 MiB, whatever its algorithm
  /// (docs/performance/notes/2026-12-01-intel-slices-mpi-calls.md). A network whose MPI moves large
  /// messages well may prefer 0: measure with mpi_hier_perf.
  std::size_t call_bytes = 0;
  /// What a failure inside a node does (a rank dead, a timeout, a
  /// mismatch, a failed MPI call). true (the default; SHMRING_MPI_ON_ERROR=
  /// abort): print the error, naming the rank, node and stage, to stderr
  /// and MPI_Abort the job, so no rank on another node waits forever in an
  /// MPI call. false (SHMRING_MPI_ON_ERROR=throw): throw the shmring::Error;
  /// the caller must then end the job itself (MPI_Abort), since ranks on
  /// other nodes may be blocked in MPI, and this rank's non-blocking MPI
  /// calls of a pipelined allreduce may still be pending on its buffers.
  int abort_on_error = -1;  ///< -1: from the environment; 0: throw; 1: abort.
};

/// A group of MPI processes, spread over one or more machines, running
/// collectives hierarchically: shmring inside each machine ("node"), MPI
/// between them. Ranks are numbered as in the MPI communicator it was made
/// from; the collectives and their rules are those of shmring::Communicator
/// (same arguments, same in-place forms, every datatype and operator).
///
/// Nodes are the groups of ranks with the same shmring::host_identity()
/// (hostname + boot id), gathered over MPI: launcher variables and
/// MPI_COMM_TYPE_SHARED are not consulted, since in containers they can
/// disagree with which processes really share /dev/shm.
///
/// avg is a sum divided once by size(). float16 and bfloat16 cross the
/// network as float32 (each rank converts its shard, MPI sums in float32,
/// one rounding back to 16 bits), because MPI has no 16-bit floating types.
/// min and max keep shmring's IEEE 754-2019 minimum / maximum across nodes
/// (-0 < +0; any NaN gives the default quiet NaN).
///
/// Collective-call rules: every rank calls the same collectives in the same
/// order with the same arguments. A disagreement between the ranks of one
/// node is detected (MismatchError); between nodes it is not (MPI's rules).
///
/// Thread safety: one Communicator is used by one thread at a time, and MPI
/// must be initialised (MPI_THREAD_FUNNELED at least) before it is made and
/// finalised after it is destroyed.
class SHMRING_MPI_API Communicator {
 public:
  /// Collective over `comm` (duplicated; the caller keeps ownership of
  /// `comm`). Gathers every rank's host identity, builds one shmring
  /// communicator per node (its job id from a nonce rank 0 broadcasts, so
  /// two jobs or two communicators never share a segment), the per-local-
  /// rank ("cross") MPI communicators and the leaders' one.
  /// Throws InvalidArgumentError (bad options or environment), or the
  /// node communicator's error (see Options::abort_on_error).
  explicit Communicator(MPI_Comm comm, const Options& options = {});
  ~Communicator();
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const noexcept;        ///< Rank in the MPI communicator.
  int size() const noexcept;        ///< Size of the MPI communicator.
  int node() const noexcept;        ///< This rank's node, 0..num_nodes()-1 (by lowest rank).
  int num_nodes() const noexcept;   ///< Number of distinct host identities.
  int local_rank() const noexcept;  ///< Rank among the ranks of this node (by MPI rank).
  int local_size() const noexcept;  ///< Ranks on this node.
  /// True when every node holds the same number of ranks.
  bool balanced() const noexcept;
  Algorithm algorithm() const noexcept;  ///< As configured (automatic unless forced).
  std::size_t shards_bytes() const noexcept;
  /// Bytes per piece of the pipelined shards path (0: not pipelined), as
  /// set or as decided at construction (Options::piece_bytes).
  std::size_t piece_bytes() const noexcept;
  /// Most bytes one blocking MPI call of a stage moves (0: no limit), as
  /// set or by default (Options::call_bytes).
  std::size_t call_bytes() const noexcept;
  /// The intra-node shmring communicator (ranks = local ranks).
  shmring::Communicator& node_communicator() noexcept;
  /// This layer's duplicate of the MPI communicator.
  MPI_Comm mpi_comm() const noexcept;

  /// recv[i] = op over all ranks of send[i], i < count; send == recv: in
  /// place, otherwise they must not overlap. Same result bits on every rank.
  /// Throws InvalidArgumentError (bad enum, avg on an integer type).
  void allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op);
  /// Rank r receives block r (recv_count elements) of the reduction of
  /// `send` (size() x recv_count elements). In place when
  /// recv == send + rank()*recv_count.
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                      ReduceOp op);
  /// recv (size() x send_count elements) receives every rank's send, in
  /// rank order. In place when send == recv + rank()*send_count. A rank's
  /// block may hold at most 2^31-1 bytes (MPI's int counts).
  void allgather(const void* send, void* recv, std::size_t send_count, DataType dtype);
  /// Every rank's buffer receives root's. Throws InvalidArgumentError for a
  /// root outside [0, size()).
  void broadcast(void* buffer, std::size_t count, DataType dtype, int root);
  /// root's recv receives the reduction of every rank's send; recv is
  /// ignored (may be null) elsewhere; recv == send at root: in place.
  void reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
              int root);
  /// Returns once every rank has entered.
  void barrier();

  /// Refuses a collective this rank cannot make (its arguments are wrong),
  /// as every collective above does with its own: the node's other ranks
  /// are told in their call order, so one that made the call validly fails
  /// at once with a MismatchError naming this rank and `reason`; when every
  /// rank refuses alike nothing moved and the communicator stays usable.
  /// Ranks on other nodes are not told (they may wait in MPI: refuse alike
  /// on every rank, or end the job). Always throws: InvalidArgumentError
  /// "rank R: collective: reason", or AbortedError on a broken communicator.
  [[noreturn]] void reject_call(const std::string& collective, const std::string& reason);

  template <class T>
  void allreduce(std::span<T> buffer, ReduceOp op) {
    allreduce(buffer.data(), buffer.data(), buffer.size(), datatype_of_v<std::remove_cv_t<T>>, op);
  }
  template <class T>
  void allreduce(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    if (send.size() != recv.size())
      reject_call("allreduce", "send has " + std::to_string(send.size()) +
                                   " elements but recv has " + std::to_string(recv.size()));
    allreduce(send.data(), recv.data(), send.size(), datatype_of_v<std::remove_cv_t<T>>, op);
  }
  template <class T>
  void broadcast(std::span<T> buffer, int root) {
    broadcast(buffer.data(), buffer.size(), datatype_of_v<std::remove_cv_t<T>>, root);
  }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// "auto", "leaders", "shards", "flat".
SHMRING_MPI_API const char* to_string(Algorithm algorithm) noexcept;

}  // namespace shmring::mpi
