#pragma once

// The inside of shmring::mpi::Communicator: the node groups and the
// communicators built once at setup (topology.cpp), the stages the
// collectives are scripts of (allreduce.cpp, collectives.cpp), the MPI side
// of a reduction (mpi_reduce.cpp) and the error policy (communicator.cpp).
//
// Terms, reflected in the names below:
//   node      the ranks with one host identity; numbered by their lowest rank.
//   local     a rank's place inside its node (by MPI rank); L = local size.
//   leader    local rank 0 of a node.
//   node comm the shmring communicator of one node (ranks = local ranks).
//   cross     the MPI communicator of the ranks with the same local rank,
//             one per local rank, ranked by node (balanced nodes only).
//   leaders   the MPI communicator of the leaders, ranked by node.
//   shard     the 1/L share of an allreduce buffer a local rank owns after
//             the intra-node reduce-scatter.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shmring/mpi.hpp"

namespace shmring::mpi {

/// One non-blocking MPI allreduce of a shard, in place (the pipelined
/// shards allreduce): what its completion still has to do (avg's division,
/// 16-bit narrowing from `wide`).
struct MpiStage {
  MPI_Request request = MPI_REQUEST_NULL;
  void* buf = nullptr;
  float* wide = nullptr;  // the float32 copy MPI reduces, 16-bit types only
  std::size_t count = 0;
  DataType dtype = DataType::float32;
  ReduceOp op = ReduceOp::sum;
};

struct Communicator::Impl {
  // --- Topology (identical on every rank) ---------------------------------
  MPI_Comm world = MPI_COMM_NULL;    // our duplicate of the user's communicator
  MPI_Comm cross = MPI_COMM_NULL;    // same local rank, one rank per node
  MPI_Comm leaders = MPI_COMM_NULL;  // local rank 0 of every node (else NULL)
  int rank = 0, size = 1;
  int node = 0, num_nodes = 1;
  int local_rank = 0, local_size = 1;
  bool balanced = true;
  std::vector<int> node_of;                  // global rank -> node
  std::vector<int> local_of;                 // global rank -> local rank
  std::vector<std::vector<int>> node_ranks;  // node -> global ranks, local order
  std::string job_id;                        // of every node comm of this communicator
  std::optional<shmring::Communicator> node_comm;
  /// Per global rank, gathered at setup: its machine (a hash of the boot
  /// id: fake nodes and containers share one) and affinity mask (1024 CPUs).
  struct CpuInfo {
    std::uint64_t machine = 0;
    std::array<std::uint64_t, 16> mask{};
  };
  std::vector<CpuInfo> cpu_info;

  // --- Settings -------------------------------------------------------------
  Algorithm algorithm = Algorithm::automatic;
  std::size_t shards_bytes = 0;
  std::size_t piece_bytes = 0;  // pipelined shards: bytes per piece; 0: not pipelined
  std::size_t call_bytes = 0;   // most bytes per blocking MPI call of a stage; 0: no limit
  bool abort_on_error = true;

  // --- MPI operators that propagate NaN (min, max on float/double) ----------
  MPI_Op nan_min = MPI_OP_NULL, nan_max = MPI_OP_NULL;

  // --- State ----------------------------------------------------------------
  std::string broken;  // the first error, once one happened (throw mode)
  std::vector<std::byte> scratch, scratch2, wide;  // grown on demand, never shrunk

  // topology.cpp
  void setup(MPI_Comm comm, const Options& options);
  /// True when every machine has at least two CPUs (in its ranks' affinity
  /// masks) per rank of this communicator on it: the pipelined shards path
  /// needs two busy threads per rank (SHMRING_MPI_PIECE_BYTES unset or auto).
  bool spare_cpus_everywhere() const;
  /// Whether this rank's machine (or `machine`, a boot id hash of cpu_info)
  /// runs more ranks, of all nodes, than the CPUs their affinity masks cover
  /// together; any_...: whether some machine does (after setup gathered
  /// cpu_info; the same on every rank).
  bool machine_oversubscribed() const;
  bool machine_oversubscribed(std::uint64_t machine) const;
  bool any_machine_oversubscribed() const;
  void teardown() noexcept;

  // communicator.cpp: the error policy. Every shmring call of a stage runs
  // through node_stage(); every MPI return code through check_mpi().
  [[noreturn]] void fail(const char* stage, ErrorCode code, const std::string& what);
  template <class F>
  void node_stage(const char* stage, F&& f) {
    try {
      f();
    } catch (const Error& e) {
      // shmring's message numbers the ranks of the node: say so.
      fail(stage, e.code(), std::string("[shmring, local ranks] ") + e.what());
    }
  }
  void check_mpi(int rc, const char* stage);
  // Waits for a node stage that comes after this rank's MPI stage, calling
  // into MPI while it waits (allreduce_pipeline.cpp explains why).
  void wait_node(shmring::Request& request, const char* stage);
  void check_usable(const char* what) const;

  // communicator.cpp: the front. Every collective checks its arguments here
  // before any stage, on every rank alike; a refusal goes through refuse().
  [[noreturn]] void refuse(const char* what, const std::string& why);
  void check_dtype(const char* what, DataType dtype);
  void check_op(const char* what, DataType dtype, ReduceOp op);
  void check_root(const char* what, int root);
  /// `name` may be null only when it holds no element.
  void check_buffer(const char* what, const char* name, const void* p, std::size_t count);
  /// A node stage that is the whole call (one node): the node's own front
  /// may refuse the arguments, which leaves the communicator usable, as
  /// refuse() does; any other error goes to fail().
  template <class F>
  void node_call(const char* stage, F&& f) {
    try {
      f();
    } catch (const InvalidArgumentError&) {
      throw;  // told to the node's ranks by shmring's front (reject_call)
    } catch (const Error& e) {
      fail(stage, e.code(), std::string("[shmring, local ranks] ") + e.what());
    }
  }

  std::byte* scratch_bytes(std::vector<std::byte>& v, std::size_t bytes);
  /// Elements of `esize` bytes one blocking MPI call of a stage carries:
  /// call_bytes' worth (at least one), never more than kMaxMpiCount.
  std::size_t per_call(std::size_t esize) const;

  // allreduce.cpp: choose, then run one script.
  Algorithm choose(std::size_t bytes) const;
  void allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op);
  // poll_mpi: wait for the node stages with wait_node (after an MPI stage
  // of the shards paths), else in shmring's blocking calls.
  void allreduce_leaders(const void* send, void* recv, std::size_t count, DataType dtype,
                         ReduceOp op, bool poll_mpi = false);
  void allreduce_shards(const void* send, void* recv, std::size_t count, DataType dtype,
                        ReduceOp op);
  // allreduce_pipeline.cpp: the shards script in pieces whose stages overlap.
  std::size_t pieces_for(std::size_t count, DataType dtype) const;
  void allreduce_shards_pipelined(const void* send, void* recv, std::size_t count, DataType dtype,
                                  ReduceOp op, std::size_t pieces);
  void allreduce_flat(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op);

  // reduce_scatter.cpp: balanced nodes, recv_count <= kMaxMpiCount.
  void reduce_scatter_hier(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                           ReduceOp op);

  // mpi_reduce.cpp: the reduction among nodes, in place, with shmring's
  // operator semantics (avg = sum, then one division by `size`; 16-bit
  // floats as float32; NaN-propagating min/max).
  void mpi_allreduce(void* buf, std::size_t count, DataType dtype, ReduceOp op, MPI_Comm comm,
                     const char* stage);
  // The same as a started request and its completion (count <= kMaxMpiCount;
  // `wide`: room for count floats when dtype is 16-bit, else null).
  MpiStage mpi_iallreduce_start(void* buf, std::size_t count, DataType dtype, ReduceOp op,
                                MPI_Comm comm, float* wide, const char* stage);
  bool mpi_iallreduce_test(MpiStage& s, const char* stage);
  // send: count x (size of comm) elements; recv: count (MPI_Reduce_scatter_block).
  void mpi_reduce_scatter_block(const void* send, void* recv, std::size_t count, DataType dtype,
                                ReduceOp op, MPI_Comm comm, const char* stage);
  void mpi_reduce(void* buf, std::size_t count, DataType dtype, ReduceOp op, int root,
                  MPI_Comm comm, const char* stage);
  void mpi_bcast(void* buf, std::size_t bytes, int root, MPI_Comm comm, const char* stage);
  void create_ops();
  void free_ops() noexcept;
};

/// Allreduce messages from this size on take the shards path (automatic).
/// Measured on 2 fake nodes x 2 ranks over TCP loopback on a loaded 2-core
/// machine (docs/performance/notes): shards as fast as leaders or faster by median
/// from 4 KiB, by both median and best round from 64 KiB.
inline constexpr std::size_t kDefaultShardsBytes = 64 * 1024;

/// The same where some machine runs more ranks than it has CPUs (its node
/// communicators are oversubscribed). 2 fake nodes x 2 ranks on 2 CPUs,
/// bench/compare --hier-algos auto,leaders --repeat 9 (docs/performance/notes,
/// eleventh session), median us, shards / leaders: 256 KiB 184 / 168, 512
/// KiB 308 / 265, 1 MiB 611 / 552, 2 MiB 1296 / 1160, 4 MiB 2768 / 2837;
/// in three shorter runs leaders was ahead at 64-512 KiB in all of them, at
/// 2 MiB in all, at 1 MiB in two of four.
inline constexpr std::size_t kCrowdedShardsBytes = 4 * 1024 * 1024;

/// The pipelined shards allreduce cuts messages into pieces of about this
/// many bytes (SHMRING_MPI_PIECE_BYTES; 0 there: no pipelining), at most
/// kMaxPieces of them; by default only where every rank has two CPUs
/// (spare_cpus_everywhere). On 2 fake nodes x 2 ranks sharing 2 CPUs
/// (docs/performance/notes) one piece was faster; the cost model predicts the gain
/// where cores are spare.
inline constexpr std::size_t kDefaultPieceBytes = 256 * 1024;
inline constexpr std::size_t kMaxPieces = 16;

/// Elements MPI moves per call: MPI counts are int; larger buffers go in pieces.
inline constexpr std::size_t kMaxMpiCount = std::size_t{1} << 30;

/// Most bytes a blocking MPI call of a stage moves (Options::call_bytes,
/// SHMRING_MPI_CALL_BYTES). Open MPI 4.1 between two ranks over TCP
/// loopback (2-CPU VM, docs/performance/notes/2026-12-01-intel-slices-mpi-calls.md), MPI_Allreduce
/// in calls of 8 MiB / 4 / 2 / 1 MiB / 512 KiB: 8 MiB in 3724 / 3199 / 1965
/// / 2786 / 2955 us, 32 MiB in 23876 / 12773 / 8274 / 11385 / 11766. On 2
/// fake nodes x 2 ranks the hierarchical allreduce was 1.25-1.56x faster at
/// 8-64 MiB with 2 MiB calls than with one, and unchanged below 8 MiB.
inline constexpr std::size_t kDefaultCallBytes = 2 * 1024 * 1024;
/// The smallest call size a setting may ask for (smaller ones make a large
/// stage a call per few elements: 2 MiB in 1-byte calls ran for minutes).
inline constexpr std::size_t kMinCallBytes = 4096;

}  // namespace shmring::mpi
