#pragma once

// ProcessGroupShmring: the torch.distributed backend "shmring", a c10d
// process group whose collectives are a shmring::Communicator's non-blocking
// collectives. One process group = one communicator of its own (own segment,
// own job id from the group's store), so dist.new_group(ranks) makes a
// separate communicator of exactly those ranks. A group whose ranks are on
// several hosts is one communicator per host with gloo between the hosts
// (multi_node.hpp); the rest of this comment is about one host.
//
// Order: collectives start on the communicator's progress thread in the
// order they are called, which must be the same on every rank (as for every
// c10d backend). Calls from several threads of one process are serialized
// here, but their order is still the caller's to make equal across ranks.
//
// Errors: argument errors (dtype, operator, CUDA tensor, several tensors per
// list, unsupported operation) throw at the call, a c10::Error (RuntimeError
// in Python) naming the operation; a refused collective is also told to the
// peers in call order, so a refusal on some ranks only is an error on every
// rank at once (MismatchError naming the refusing rank on the others) and
// the group is then broken; refused on every rank, it stays usable. Failures of the collective
// itself (peer death, timeout, mismatch between ranks) complete the Work and its future with
// shmring's error on every rank; the group then refuses every later operation with the first
// error's reason.
//
// Lifetime: torch's calls, not Python's references, end a group.
// destroy_process_group() calls shutdown() (python/shmring/torch.py), which
// releases the communicator, its segment and every thread at once, however
// many Python objects (a DDP model, a saved group handle) still refer to the
// group; operations on it afterwards raise RuntimeError.

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shim.hpp"
#include "shmring/communicator.hpp"
#include "work.hpp"

namespace shmring::torch_backend {

class CrossNode;

class ProcessGroupShmring : public BackendBase {
 public:
  /// Collective over the group's `size` ranks: every rank publishes its
  /// host identity in `store` (the group's own prefix store) and reads the
  /// others'; the ranks of one host form a node, whose lowest rank writes a
  /// fresh random job nonce that the node's ranks attach to, so two jobs (or
  /// two groups) never share a segment whatever their ports. On one host
  /// that communicator is the group; across hosts the group is a CrossNode
  /// (multi_node.hpp). `timeout` bounds every wait of a collective unless
  /// SHMRING_TIMEOUT is set. Blocks until every rank has attached.
  ProcessGroupShmring(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout);
  /// Completes (or, on a broken group, fails) the collectives still running,
  /// then stops the completion threads. Not collective.
  ~ProcessGroupShmring() override;

  /// How long shutdown() waits for the group's other ranks.
  static constexpr std::chrono::seconds kLeaveWait{10};

  /// Ends the group now (destroy_process_group): completes (or, on a broken
  /// group, fails) the collectives still pending, waits until every rank of
  /// the group has called shutdown() (at most kLeaveWait; then it aborts the
  /// group, so no peer waits for this rank again), releases the communicator
  /// (segment, progress and reduction threads) and joins the completion
  /// threads. Waiting for the peers means that no rank leaves
  /// destroy_process_group() while another still holds what torch released
  /// before this call (rank 0's TCPStore server, which the next
  /// init_process_group's env:// rendezvous would otherwise reach and lose).
  /// Later operations raise RuntimeError. Idempotent; the destructor does
  /// the same without waiting for the peers.
  void shutdown();

  const std::string getBackendName() const override { return "shmring"; }
  /// The shmring job id of this group ("torch-" and the nonce).
  const std::string& job_id() const { return job_id_; }

  c10::intrusive_ptr<Work> broadcast(std::vector<at::Tensor>& tensors,
                                     const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<Work> allreduce(std::vector<at::Tensor>& tensors,
                                     const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<Work> reduce(std::vector<at::Tensor>& tensors,
                                  const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<Work> allgather(std::vector<std::vector<at::Tensor>>& output_tensors,
                                     std::vector<at::Tensor>& input_tensors,
                                     const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> _allgather_base(at::Tensor& output_buffer, at::Tensor& input_buffer,
                                           const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                               std::vector<at::Tensor>& input_tensors,
                                               const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> gather(std::vector<std::vector<at::Tensor>>& output_tensors,
                                  std::vector<at::Tensor>& input_tensors,
                                  const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<Work> scatter(std::vector<at::Tensor>& output_tensors,
                                   std::vector<std::vector<at::Tensor>>& input_tensors,
                                   const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<Work> reduce_scatter(std::vector<at::Tensor>& output_tensors,
                                          std::vector<std::vector<at::Tensor>>& input_tensors,
                                          const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<Work> _reduce_scatter_base(at::Tensor& output_buffer, at::Tensor& input_buffer,
                                                const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<Work> alltoall_base(at::Tensor& output_buffer, at::Tensor& input_buffer,
                                         std::vector<int64_t>& output_split_sizes,
                                         std::vector<int64_t>& input_split_sizes,
                                         const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<Work> alltoall(std::vector<at::Tensor>& output_tensors,
                                    std::vector<at::Tensor>& input_tensors,
                                    const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<Work> barrier(const ::c10d::BarrierOptions& opts) override;

 private:
  using Start = std::function<Request(Communicator&)>;

  /// Makes the Work, starts the collective (`start` calls one i-collective)
  /// under the call lock, and hands its completion to the completion threads.
  c10::intrusive_ptr<Work> launch(::c10d::OpType type, const char* title,
                                  std::vector<at::Tensor> result,
                                  std::vector<at::Tensor> keep_alive,
                                  std::function<void()> epilogue, const Start& start);

  /// For a tensor whose dtype moves as bytes (move_type's as_bytes: bool,
  /// int16, complex, ...), compares every rank's dtype before anything
  /// moves: the communicator compares only the byte counts of such calls, so
  /// a bool tensor broadcast into a uint8 one, or complex128 gathered into
  /// complex64 of the same bytes, would pass as one call and deliver
  /// reinterpreted bytes. One blocking 8-byte allgather, on these dtypes only
  /// (shmring's own dtypes cost nothing: the communicator compares them).
  /// Throws c10::Error on every rank when the dtypes differ (the call is
  /// then refused on every rank and the group stays usable), or with the
  /// communicator's error when the peers made another call (a rank passing
  /// one of shmring's dtypes runs the collective itself, which then fails as
  /// a mismatch on every rank). Collectives only, under the call order.
  void agree_on_moved_dtype(const at::Tensor& tensor, const char* op);

  /// Tells the peers, in call order, that this rank refused a collective
  /// (Communicator::reject_call): their matching call fails at once naming
  /// this rank, `op` and `reason` (this rank's own error message) instead of
  /// waiting until the timeout. Never throws: the caller's own error is the
  /// one to raise here.
  void refuse(const char* op, const std::string& reason) noexcept;

  /// Runs a collective entry point's body, refusing the call (refuse()) when
  /// it throws before launch(); process_group_args.hpp.
  template <class Body>
  c10::intrusive_ptr<Work> refusing(const char* op, Body&& body);
  /// shutdown(), waiting for the peers first when `leave`.
  void release(bool leave);

  // Declared before comm_: destroyed after it, so the completions the
  // communicator's destructor delivers still find their threads.
  Completions completions_;
  std::unique_ptr<Communicator> comm_;  // null once shut down, and across hosts
  std::unique_ptr<CrossNode> cross_;    // a group across hosts (multi_node.hpp)
  std::string job_id_;
  std::mutex call_mutex_;  // one i-call at a time on comm_ (call order is the contract)
};

}  // namespace shmring::torch_backend
