// Point-to-point operations of ProcessGroupShmring (process_group.hpp).
#include "process_group_args.hpp"

#include <c10/util/Exception.h>

#include <cstdint>
#include <vector>

#include "convert.hpp"
#if SHMRING_TORCH_GLOO
#include "multi_node.hpp"
#endif

namespace shmring::torch_backend {

using namespace pg_detail;

// Point-to-point: shmring's isend/irecv, which progress on their own (not in
// the collectives' call order), so batch_isend_irecv's isend-then-irecv on
// every rank completes. A dtype shmring has no name for moves as bytes on
// both sides alike.
c10::intrusive_ptr<Work> ProcessGroupShmring::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                   int tag) {
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->send(tensors, dst_rank, tag);
#endif
  static constexpr const char* kOp = "send";
  const at::Tensor& tensor = single_tensor(tensors, kOp, "input");
  Staged s = stage(tensor);
  const Raw raw = raw_of(s.buffer, kOp);
  return launch(
      ::c10d::OpType::SEND, "shmring:send", tensors, {s.buffer}, nullptr,
      [=](Communicator& c) { return c.isend(raw.data, raw.count, raw.dtype, dst_rank, tag); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::recv(std::vector<at::Tensor>& tensors, int src_rank,
                                                   int tag) {
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->recv(tensors, src_rank, tag);
#endif
  static constexpr const char* kOp = "recv";
  const at::Tensor& tensor = single_tensor(tensors, kOp, "output");
  Staged s = stage_output(tensor);
  const Raw raw = raw_of(s.buffer, kOp);
  return launch(
      ::c10d::OpType::RECV, "shmring:recv", tensors, {s.buffer}, copy_back({s}, kOp),
      [=](Communicator& c) { return c.irecv(raw.data, raw.count, raw.dtype, src_rank, tag); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::recvAnysource(std::vector<at::Tensor>&, int) {
  unsupported("recv from any source (recvAnysource)");
}

}  // namespace shmring::torch_backend
