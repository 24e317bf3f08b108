#pragma once

// CrossNode: a ProcessGroupShmring whose ranks span several hosts
// (docs/guide/torch-multi-node.md). The ranks of each host form a shmring
// communicator of their own; between hosts the group runs torch's
// ProcessGroupGloo, made here from the group's store under prefixes of its
// own:
//   - leaders: local rank 0 of every node (small allreduces, broadcast,
//     barrier);
//   - shard j: local rank j of every node, made only when every node has
//     the same number of ranks (large allreduces: each local rank's shard
//     crosses the network in parallel);
//   - world: every rank (alltoall, gather, scatter, send/recv).
//
// Order: collectives run one at a time, in call order, on the group's
// executor thread; each is a sequence of blocking stages (a shmring request
// waited for, then a gloo Work waited for, ...). Works complete on their own.
//
// Faults: the first stage that fails breaks the group on this rank: the
// error is published in the store, the node's communicator is aborted with it
// and the gloo groups are closed, so that the peers of this node (through
// shmring) and of the other nodes (through gloo's closed connections) fail at
// once too, with the first error's message read back from the store.

#include <ATen/ATen.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "node_layout.hpp"
#include "shim.hpp"
#include "shmring/communicator.hpp"
#include "work.hpp"

namespace shmring::torch_backend {

/// Work of a cross-node collective: completed by the executor (wait()
/// returns then); its future is completed on a completion thread.
class WorkTask : public Work {
 public:
  WorkTask(int rank, ::c10d::OpType type, const char* title, std::vector<at::Tensor> result);
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  /// Marks the Work complete (wakes wait()).
  void finish_work(std::exception_ptr error) { finish(error); }
  /// Completes the future with result() or `error`.
  void finish_future(std::exception_ptr error);
  const char* title() const { return title_; }

 private:
  const char* title_;
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// What every rank's call of a collective must agree on across the group,
/// compared before its stages when torch's debug level is DETAIL
/// (TORCH_DISTRIBUTED_DEBUG=DETAIL; docs/guide/torch-multi-node.md). -1: a
/// field the operation does not have, or whose value may differ by rank.
struct CallPrint {
  explicit CallPrint(::c10d::OpType op_, std::int64_t dtype_ = -1, std::int64_t numel_ = -1,
                     std::int64_t root_ = -1, std::int64_t reduce_op_ = -1)
      : op(op_), dtype(dtype_), numel(numel_), root(root_), reduce_op(reduce_op_) {}
  ::c10d::OpType op;
  std::int64_t dtype;      // at::ScalarType
  std::int64_t numel;      // elements every rank passes alike
  std::int64_t root;       // global rank
  std::int64_t reduce_op;  // ::c10d::ReduceOp::RedOpType
  /// all_to_all: the bytes this rank sends to and receives from each rank
  /// (recv_bytes[j] here must equal send_bytes[this rank] on rank j).
  std::vector<std::int64_t> send_bytes, recv_bytes;
  /// The element counts of a list every rank passes alike (all_gather's
  /// outputs, reduce_scatter's inputs, allreduce_coalesced's tensors):
  /// compared as a hash, so that a permutation with the same total differs.
  std::vector<std::int64_t> list_numels;
  /// Sets list_numels from `list`, and numel to their total.
  void set_list(const std::vector<at::Tensor>& list) {
    numel = 0;
    for (const auto& t : list) {
      list_numels.push_back(t.numel());
      numel += t.numel();
    }
  }
};

/// The error of a call whose ranks disagree (CallPrint): raised by every
/// rank alike before anything moved, so the group stays usable.
class CallMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class CrossNode {
 public:
  /// Collective over the group: makes the gloo groups (under `prefix` in
  /// `store`) and owns `local`, the communicator of this rank's node.
  CrossNode(const c10::intrusive_ptr<::c10d::Store>& store, const std::string& prefix, int rank,
            int size, std::chrono::milliseconds timeout, NodeLayout layout,
            std::unique_ptr<Communicator> local);
  ~CrossNode();

  const std::string& job_id() const { return job_id_; }
  /// Waits for the queued collectives, then for every rank (at most
  /// `wait`), then releases the communicator and the gloo groups.
  void shutdown(std::chrono::milliseconds wait);

  c10::intrusive_ptr<Work> broadcast(std::vector<at::Tensor>& tensors,
                                     const ::c10d::BroadcastOptions& opts);
  c10::intrusive_ptr<Work> allreduce(std::vector<at::Tensor>& tensors,
                                     const ::c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                               const ::c10d::AllreduceCoalescedOptions& opts);
  c10::intrusive_ptr<Work> reduce(std::vector<at::Tensor>& tensors,
                                  const ::c10d::ReduceOptions& opts);
  c10::intrusive_ptr<Work> allgather(std::vector<std::vector<at::Tensor>>& output_tensors,
                                     std::vector<at::Tensor>& input_tensors);
  c10::intrusive_ptr<Work> allgather_base(at::Tensor& output, at::Tensor& input);
  c10::intrusive_ptr<Work> gather(std::vector<std::vector<at::Tensor>>& output_tensors,
                                  std::vector<at::Tensor>& input_tensors,
                                  const ::c10d::GatherOptions& opts);
  c10::intrusive_ptr<Work> scatter(std::vector<at::Tensor>& output_tensors,
                                   std::vector<std::vector<at::Tensor>>& input_tensors,
                                   const ::c10d::ScatterOptions& opts);
  c10::intrusive_ptr<Work> reduce_scatter(std::vector<at::Tensor>& output_tensors,
                                          std::vector<std::vector<at::Tensor>>& input_tensors,
                                          const ::c10d::ReduceScatterOptions& opts);
  c10::intrusive_ptr<Work> reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                               const ::c10d::ReduceScatterOptions& opts);
  c10::intrusive_ptr<Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                         std::vector<int64_t>& output_split_sizes,
                                         std::vector<int64_t>& input_split_sizes);
  c10::intrusive_ptr<Work> alltoall(std::vector<at::Tensor>& output_tensors,
                                    std::vector<at::Tensor>& input_tensors);
  c10::intrusive_ptr<Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag);
  c10::intrusive_ptr<Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag);
  c10::intrusive_ptr<Work> barrier();
  /// This rank refused `op` (its arguments failed a check; the caller is
  /// about to raise why): queues, in call order, a step that fails the
  /// group on every rank of every node, naming this rank and `reason` (this
  /// rank's error message), instead of
  /// leaving the peers to wait in `op` until the timeout. When every rank
  /// refused the same call (each one's step finds all the others' marks in
  /// the store within kRefusalAgreement), nothing ran anywhere and the group
  /// stays usable, as on one host. Thread safety: the calling thread of the
  /// operation, as the operations themselves.
  void refuse(const char* op, const std::string& reason) noexcept;

  /// Allreduces of at least this many bytes take the sharded path (when the
  /// nodes are equal): SHMRING_TORCH_SHARD_BYTES, else kShardBytes. On the
  /// fake-node rig (2 nodes x 2 ranks, one CPU per node, loopback) the
  /// leaders' path was faster up to 1 MiB (2.1 against 3.7 ms) and the
  /// sharded one from 4 MiB (8.3 against 14.4 ms; 132 against 151 ms at
  /// 64 MiB): bench/torch_multinode_perf.py --paths,
  /// docs/guide/torch-multi-node.md. A value of 2^64 - 1 turns it off (and
  /// makes no shard groups).
  static constexpr std::size_t kShardBytes = 4u << 20;
  /// How long a failing rank waits for the dead rank's node to name it.
  static constexpr std::chrono::milliseconds kDeathNotice{2000};
  /// How long a refusing rank waits to learn whether every rank refused the
  /// same call (then the group stays usable). A refusal on some ranks only
  /// reaches the others this much later.
  static constexpr std::chrono::milliseconds kRefusalAgreement{1000};

 private:
  using Body = std::function<void()>;
  /// Queues `body` (run on the executor, after every earlier one) and
  /// returns its Work. Throws at once when the group is broken or shut down.
  c10::intrusive_ptr<Work> submit(::c10d::OpType type, const char* title,
                                  std::vector<at::Tensor> result, Body body);
  /// As above, for a collective: with DETAIL checks on, its first stage
  /// compares `print` across the group (check_print).
  c10::intrusive_ptr<Work> submit(const char* title, std::vector<at::Tensor> result,
                                  CallPrint print, Body body);
  /// Allgathers every rank's CallPrint over the world group and throws
  /// CallMismatch, on every rank alike, when any differs from rank 0's (or
  /// an all_to_all's sizes disagree between a sender and its receiver).
  void check_print(const CallPrint& print);
  void run();
  /// First failure: publish, abort the node, close the gloo groups. Returns
  /// the error every Work of the group fails with from now on.
  std::exception_ptr fail(const std::string& op, std::exception_ptr error);

  // Stages, run on the executor thread.
  void local_wait(Request request);
  static void gloo_wait(const c10::intrusive_ptr<Work>& work);
  /// gloo's allreduce of contiguous `buf` over `group`, in place. gloo's
  /// MIN and MAX compare with `<`, so whether a NaN wins depends on the
  /// operands' order and -0 ties with +0; shmring's are IEEE 754-2019
  /// minimum and maximum (docs/guide/datatypes-and-accuracy.md). Floating
  /// data therefore crosses gloo's MIN and MAX as integers that order as
  /// the floats do (-0 below +0), every NaN as the integer that wins, and
  /// comes back with any NaN the default quiet NaN.
  static void gloo_allreduce(BackendBase& group, const at::Tensor& buf, const ::c10d::ReduceOp& op);
  /// In-place allreduce of a contiguous tensor of a dtype both shmring and
  /// gloo reduce (16-bit floats are widened by the callers).
  /// With `narrow_out` (the caller's contiguous 16-bit tensor, `buf` its
  /// float32 copy) on the sharded path: divides each shard by `divisor`
  /// (AVG; 0: no division), rounds it once to 16 bits and allgathers the
  /// 16-bit shards straight into `narrow_out`, moving half the bytes in
  /// the node; returns true then. Otherwise the result is in `buf`.
  bool allreduce_flat(const at::Tensor& buf, const ::c10d::ReduceOp& op,
                      const at::Tensor& narrow_out = {}, int divisor = 0);
  /// Broadcast of `bytes` bytes at `data` from global rank `root`.
  void broadcast_bytes(void* data, std::size_t bytes, int root);
  void barrier_stages();
  at::Tensor widened(const at::Tensor& tensor);
  /// Every rank's `input` (equal sizes, equal nodes), in rank order:
  /// allgather in the node, allgather of the node blocks among the leaders,
  /// broadcast in the node.
  at::Tensor allgather_blocks(const at::Tensor& input);

  int rank_;
  int size_;
  bool check_calls_;  // torch's debug level was DETAIL when the group was made
  NodeLayout layout_;
  int node_;
  int local_;
  std::size_t shard_bytes_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<::c10d::Store> store_;
  std::string prefix_;
  std::string job_id_;
  std::unique_ptr<Communicator> comm_;  // this node's ranks
  c10::intrusive_ptr<BackendBase> leaders_;
  c10::intrusive_ptr<BackendBase> shard_;
  c10::intrusive_ptr<BackendBase> world_;
  std::mutex gloo_mutex_;      // guards closing the gloo groups against send/recv
  at::Tensor scratch_;         // float32, for 16-bit reductions (executor only)
  at::Tensor shard_scratch_;   // bytes, the sharded allreduce's shard (executor only)
  at::Tensor narrow_scratch_;  // bytes, that shard rounded to 16 bits (executor only)

  Completions completions_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<c10::intrusive_ptr<WorkTask>, Body>> queue_;
  bool stop_ = false;
  std::uint64_t submitted_ = 0;  // operations queued so far (the same sequence on every rank)
  std::string broken_;           // the first error's message, once broken
  bool released_ = false;
  std::thread executor_;
};

}  // namespace shmring::torch_backend
