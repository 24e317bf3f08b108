// CrossNode's reductions (multi_node.hpp): the stages a collective is made
// of (a shmring request, a gloo Work), the hierarchical allreduce (through
// the node leaders, or sharded across every local rank), broadcast and
// barrier, and the operations built on them: allreduce, reduce, broadcast,
// reduce_scatter, barrier.
#include "multi_node.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "convert.hpp"
#include "multi_node_args.hpp"

namespace shmring::torch_backend {

using namespace cross_detail;

namespace {

// Elements per rank of the sharded allreduce: `count` split over `parts`.
std::vector<std::size_t> shard_counts(std::size_t count, int parts) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(parts), count / parts);
  for (std::size_t j = 0; j < count % parts; ++j) ++counts[j];
  return counts;
}

std::vector<std::size_t> displs_of(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> d(counts.size());
  std::size_t off = 0;
  for (std::size_t j = 0; j < counts.size(); ++j) {
    d[j] = off;
    off += counts[j];
  }
  return d;
}

}  // namespace

void CrossNode::local_wait(Request request) {
  request.wait();
}

void CrossNode::gloo_wait(const c10::intrusive_ptr<Work>& work) {
  work->wait();
}

void CrossNode::gloo_allreduce(BackendBase& group, const at::Tensor& buf,
                               const ::c10d::ReduceOp& op) {
  ::c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  const auto kind = reduce_op_kind(op);
  const bool ordered = (kind == ::c10d::ReduceOp::MIN || kind == ::c10d::ReduceOp::MAX) &&
                       (buf.scalar_type() == at::kFloat || buf.scalar_type() == at::kDouble);
  std::vector<at::Tensor> one{buf};
  if (!ordered) {
    gloo_wait(group.allreduce(one, opts));
    return;
  }
  // The IEEE bits of a float, read as a signed integer, order the
  // non-negative floats; flipping every bit but the sign of the negative
  // ones orders those too, below the others, with -0 (-1) just below +0
  // (0). The map is its own inverse.
  const bool f32 = buf.scalar_type() == at::kFloat;
  const at::Tensor nan = buf.isnan();
  at::Tensor key = buf.view(f32 ? at::kInt : at::kLong);
  const std::int64_t low_bits = f32 ? 0x7fffffff : std::numeric_limits<std::int64_t>::max();
  const auto flip = [&] { key.copy_(at::where(key.lt(0), key.bitwise_xor(low_bits), key)); };
  flip();
  const bool max = kind == ::c10d::ReduceOp::MAX;
  key.masked_fill_(nan, max ? (f32 ? std::numeric_limits<std::int32_t>::max() : low_bits)
                            : (f32 ? std::numeric_limits<std::int32_t>::min()
                                   : std::numeric_limits<std::int64_t>::min()));
  std::vector<at::Tensor> keys{key};
  gloo_wait(group.allreduce(keys, opts));
  flip();
  buf.masked_fill_(buf.isnan(), std::numeric_limits<double>::quiet_NaN());
}

// A contiguous tensor of `tensor`'s values that the reduction stages work
// on: for 16-bit floats a float32 copy in the group's scratch buffer
// (partials cross the network unrounded and the result rounds once when the
// caller copies it back), else the tensor itself or a contiguous copy.
at::Tensor CrossNode::widened(const at::Tensor& tensor) {
  if (!is_16bit(tensor.scalar_type())) return tensor.contiguous();
  const std::int64_t n = tensor.numel();
  // Grow-only and reused: a fresh large buffer costs a page fault per page
  // at every call (on the fake-node VM, 0.45 s for 64 MiB, more than the
  // allreduce itself).
  if (!scratch_.defined() || scratch_.numel() < n)
    scratch_ = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
  at::Tensor buf = scratch_.narrow(0, 0, n).view(tensor.sizes());
  buf.copy_(tensor);
  return buf;
}

bool CrossNode::allreduce_flat(const at::Tensor& buf, const ::c10d::ReduceOp& op,
                               const at::Tensor& narrow_out, int divisor) {
  const auto count = static_cast<std::size_t>(buf.numel());
  if (count == 0) return false;
  const DataType dtype = to_datatype(buf.scalar_type(), "allreduce");
  const ReduceOp sop = to_reduce_op(op, "allreduce");
  const int local_size = static_cast<int>(layout_.nodes[static_cast<std::size_t>(node_)].size());
  const std::size_t bytes = count * static_cast<std::size_t>(buf.element_size());
  void* data = buf.data_ptr();
  if (shard_ && bytes >= shard_bytes_ && count >= static_cast<std::size_t>(local_size)) {
    // Reduce-scatter in the node, each shard across the nodes (every local
    // rank at once, over its own connections), allgather in the node.
    const auto counts = shard_counts(count, local_size);
    const auto displs = displs_of(counts);
    const auto shard_count = static_cast<std::int64_t>(counts[static_cast<std::size_t>(local_)]);
    const std::int64_t shard_bytes = shard_count * buf.element_size();
    // Reused, as widened()'s buffer is: a fresh one faults in every page.
    if (!shard_scratch_.defined() || shard_scratch_.numel() < shard_bytes)
      shard_scratch_ = at::empty({shard_bytes}, at::TensorOptions().dtype(at::kByte));
    at::Tensor shard = at::from_blob(shard_scratch_.data_ptr(), {shard_count}, buf.options());
    local_wait(comm_->ireduce_scatter_v(data, shard.data_ptr(), counts, dtype, sop));
    gloo_allreduce(*shard_, shard, op);
    if (narrow_out.defined()) {
      // The one rounding, shard by shard: the same values as rounding the
      // whole float32 result, with half the bytes in the allgather and no
      // full-size copy back.
      if (divisor != 0) shard.div_(divisor);
      const std::int64_t narrow_bytes = shard_count * narrow_out.element_size();
      if (!narrow_scratch_.defined() || narrow_scratch_.numel() < narrow_bytes)
        narrow_scratch_ = at::empty({narrow_bytes}, at::TensorOptions().dtype(at::kByte));
      at::Tensor narrow =
          at::from_blob(narrow_scratch_.data_ptr(), {shard_count}, narrow_out.options());
      round_into(narrow, shard);
      local_wait(comm_->iallgatherv(narrow.data_ptr(), narrow.numel(), narrow_out.data_ptr(),
                                    counts, displs,
                                    to_datatype(narrow_out.scalar_type(), "allreduce")));
      return true;
    }
    local_wait(comm_->iallgatherv(shard.data_ptr(), shard.numel(), data, counts, displs, dtype));
    return false;
  }
  // Reduce to the node's leader, allreduce among the leaders, broadcast in
  // the node.
  local_wait(comm_->ireduce(data, data, count, dtype, sop, 0));
  if (leaders_) gloo_allreduce(*leaders_, buf, op);
  local_wait(comm_->ibroadcast(data, count, dtype, 0));
  return false;
}

void CrossNode::broadcast_bytes(void* data, std::size_t bytes, int root) {
  if (bytes == 0) return;
  const int root_node = layout_.node_of[static_cast<std::size_t>(root)];
  const int root_local = layout_.local_of[static_cast<std::size_t>(root)];
  if (node_ == root_node) local_wait(comm_->ibroadcast(data, bytes, DataType::uint8, root_local));
  if (leaders_) {
    at::Tensor view = at::from_blob(data, {static_cast<std::int64_t>(bytes)},
                                    at::TensorOptions().dtype(at::kByte));
    std::vector<at::Tensor> one{view};
    ::c10d::BroadcastOptions opts;
    opts.rootRank = root_node;
    gloo_wait(leaders_->broadcast(one, opts));
  }
  if (node_ != root_node) local_wait(comm_->ibroadcast(data, bytes, DataType::uint8, 0));
}

void CrossNode::barrier_stages() {
  local_wait(comm_->ibarrier());
  if (leaders_) gloo_wait(leaders_->barrier(::c10d::BarrierOptions()));
  local_wait(comm_->ibarrier());
}

// ------------------------------------------------------------- operations

c10::intrusive_ptr<Work> CrossNode::allreduce(std::vector<at::Tensor>& tensors,
                                              const ::c10d::AllreduceOptions& opts) {
  static constexpr const char* kOp = "allreduce";
  const at::Tensor tensor = single_tensor(tensors, kOp, "input");
  check_written(tensor, kOp, "input");
  const ::c10d::ReduceOp op = stage_op(tensor, opts.reduceOp, kOp);
  const bool avg = reduce_op_kind(opts.reduceOp) == ::c10d::ReduceOp::AVG;
  const int size = size_;
  CallPrint print{::c10d::OpType::ALLREDUCE, static_cast<std::int64_t>(tensor.scalar_type()),
                  tensor.numel(), -1, reduce_op_kind(opts.reduceOp)};
  return submit("shmring:all_reduce", tensors, std::move(print), [=, this] {
    at::Tensor buf = widened(tensor);
    const bool narrow = !buf.is_same(tensor) && tensor.is_contiguous();
    if (allreduce_flat(buf, op, narrow ? tensor : at::Tensor(), avg ? size : 0)) return;
    if (avg) buf.div_(size);
    if (!buf.is_same(tensor)) round_into(tensor, buf);  // 16-bit: the one rounding
  });
}

c10::intrusive_ptr<Work> CrossNode::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  static constexpr const char* kOp = "allreduce_coalesced";
  TORCH_CHECK(!tensors.empty(), "shmring backend: ", kOp, " got an empty tensor list");
  for (const auto& t : tensors) {
    check_tensor(t, kOp, "input");
    check_written(t, kOp, "input");
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "shmring backend: ", kOp,
                ": tensors must share one dtype, got ", dtype_name(tensors[0].scalar_type()),
                " and ", dtype_name(t.scalar_type()));
  }
  const ::c10d::ReduceOp op = stage_op(tensors[0], opts.reduceOp, kOp);
  const bool avg = reduce_op_kind(opts.reduceOp) == ::c10d::ReduceOp::AVG;
  const int size = size_;
  std::vector<at::Tensor> ts = tensors;
  CallPrint print{::c10d::OpType::ALLREDUCE_COALESCED,
                  static_cast<std::int64_t>(tensors[0].scalar_type()), -1, -1,
                  reduce_op_kind(opts.reduceOp)};
  print.set_list(ts);
  return submit("shmring:allreduce_coalesced", tensors, std::move(print), [=, this] {
    at::Tensor buf = widened(flatten(ts));
    allreduce_flat(buf, op);
    if (avg) buf.div_(size);
    unflatten(buf, ts);
  });
}

c10::intrusive_ptr<Work> CrossNode::reduce(std::vector<at::Tensor>& tensors,
                                           const ::c10d::ReduceOptions& opts) {
  static constexpr const char* kOp = "reduce";
  const at::Tensor tensor = single_tensor(tensors, kOp, "input");
  const int root = static_cast<int>(opts.rootRank);
  check_root(root, size_, kOp);
  TORCH_CHECK(opts.rootTensor == 0, "shmring backend: ", kOp, ": root tensor index ",
              opts.rootTensor, " given, but there is one tensor per process (index 0)");
  const ::c10d::ReduceOp op = stage_op(tensor, opts.reduceOp, kOp);
  const bool avg = reduce_op_kind(opts.reduceOp) == ::c10d::ReduceOp::AVG;
  const int size = size_;
  const bool mine = root == rank_;
  if (mine) check_written(tensor, kOp, "input");
  // An allreduce of which only the root keeps the result.
  CallPrint print{::c10d::OpType::REDUCE, static_cast<std::int64_t>(tensor.scalar_type()),
                  tensor.numel(), root, reduce_op_kind(opts.reduceOp)};
  return submit("shmring:reduce", tensors, std::move(print), [=, this] {
    at::Tensor buf = is_16bit(tensor.scalar_type()) ? widened(tensor) : tensor.contiguous().clone();
    allreduce_flat(buf, op);
    if (avg) buf.div_(size);
    if (mine) round_into(tensor, buf);
  });
}

c10::intrusive_ptr<Work> CrossNode::broadcast(std::vector<at::Tensor>& tensors,
                                              const ::c10d::BroadcastOptions& opts) {
  static constexpr const char* kOp = "broadcast";
  const at::Tensor tensor = single_tensor(tensors, kOp, "input");
  const int root = static_cast<int>(opts.rootRank);
  check_root(root, size_, kOp);
  if (root != rank_) check_written(tensor, kOp, "input");
  TORCH_CHECK(opts.rootTensor == 0, "shmring backend: ", kOp, ": root tensor index ",
              opts.rootTensor, " given, but there is one tensor per process (index 0)");
  CallPrint print{::c10d::OpType::BROADCAST, static_cast<std::int64_t>(tensor.scalar_type()),
                  tensor.numel(), root};
  return submit("shmring:broadcast", tensors, std::move(print), [=, this] {
    at::Tensor buf = tensor.contiguous();
    broadcast_bytes(buf.data_ptr(), static_cast<std::size_t>(buf.numel() * buf.element_size()),
                    root);
    if (root != rank_ && !buf.is_same(tensor)) tensor.copy_(buf);  // the root's is unchanged
  });
}

c10::intrusive_ptr<Work> CrossNode::reduce_scatter(
    std::vector<at::Tensor>& output_tensors, std::vector<std::vector<at::Tensor>>& input_tensors,
    const ::c10d::ReduceScatterOptions& opts) {
  static constexpr const char* kOp = "reduce_scatter";
  const at::Tensor output = single_tensor(output_tensors, kOp, "output");
  check_written(output, kOp, "output");
  TORCH_CHECK(input_tensors.size() == 1, "shmring backend: ", kOp,
              " takes one input list per process, got ", input_tensors.size());
  const std::vector<at::Tensor> inputs = input_tensors[0];
  check_list(inputs, size_, output, kOp, "input");
  TORCH_CHECK(inputs[static_cast<std::size_t>(rank_)].numel() == output.numel(),
              "shmring backend: ", kOp, ": input tensor ", rank_, " (this rank's block) has ",
              inputs[static_cast<std::size_t>(rank_)].numel(), " elements, but the output has ",
              output.numel());
  const ::c10d::ReduceOp op = stage_op(output, opts.reduceOp, kOp);
  const bool avg = reduce_op_kind(opts.reduceOp) == ::c10d::ReduceOp::AVG;
  const int size = size_;
  std::int64_t offset = 0;
  for (int r = 0; r < rank_; ++r) offset += inputs[static_cast<std::size_t>(r)].numel();
  CallPrint print{::c10d::OpType::REDUCE_SCATTER, static_cast<std::int64_t>(output.scalar_type()),
                  -1, -1, reduce_op_kind(opts.reduceOp)};
  print.set_list(inputs);
  // An allreduce of the whole list, of which each rank keeps its block.
  return submit("shmring:reduce_scatter", output_tensors, std::move(print), [=, this] {
    at::Tensor buf = widened(flatten(inputs));
    allreduce_flat(buf, op);
    if (avg) buf.div_(size);
    round_into(output, buf.narrow(0, offset, output.numel()).view(output.sizes()));
  });
}

c10::intrusive_ptr<Work> CrossNode::reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                        const ::c10d::ReduceScatterOptions& opts) {
  static constexpr const char* kOp = "_reduce_scatter_base";
  check_tensor(input, kOp, "input");
  check_tensor(output, kOp, "output");
  check_written(output, kOp, "output");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "shmring backend: ", kOp,
              ": the input has dtype ", dtype_name(input.scalar_type()), ", expected ",
              dtype_name(output.scalar_type()));
  TORCH_CHECK(input.numel() == size_ * output.numel(), "shmring backend: ", kOp, ": the input has ",
              input.numel(), " elements, expected ", size_ * output.numel());
  const ::c10d::ReduceOp op = stage_op(output, opts.reduceOp, kOp);
  const bool avg = reduce_op_kind(opts.reduceOp) == ::c10d::ReduceOp::AVG;
  const int size = size_;
  const std::int64_t offset = rank_ * output.numel();
  at::Tensor out = output, in = input;
  CallPrint print{::c10d::OpType::_REDUCE_SCATTER_BASE,
                  static_cast<std::int64_t>(input.scalar_type()), input.numel(), -1,
                  reduce_op_kind(opts.reduceOp)};
  return submit("shmring:_reduce_scatter_base", {output}, std::move(print), [=, this] {
    at::Tensor buf = is_16bit(in.scalar_type()) ? widened(in) : in.contiguous().clone();
    buf = buf.reshape({-1});
    allreduce_flat(buf, op);
    if (avg) buf.div_(size);
    round_into(out, buf.narrow(0, offset, out.numel()).view(out.sizes()));
  });
}

c10::intrusive_ptr<Work> CrossNode::barrier() {
  return submit("shmring:barrier", {}, CallPrint{::c10d::OpType::BARRIER},
                [this] { barrier_stages(); });
}

}  // namespace shmring::torch_backend
