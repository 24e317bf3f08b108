// CrossNode's data movement (multi_node.hpp): allgather (through the node
// leaders, or as a byte sum through the hierarchical allreduce), and
// gather, scatter, alltoall and point-to-point over the world gloo group.
#include "multi_node.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "convert.hpp"
#include "multi_node_args.hpp"

namespace shmring::torch_backend {

using namespace cross_detail;

namespace {

// Bytes per peer of one side of all_to_all_single (dim 0 split evenly, or
// by the split sizes).
std::vector<int64_t> split_bytes(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                                 const char* what) {
  static constexpr const char* kOp = "all_to_all_single";
  TORCH_CHECK(t.dim() >= 1, "shmring backend: ", kOp, ": the ", what,
              " tensor is 0-dimensional; its dim 0 is split over the group");
  const std::int64_t rows = t.size(0);
  const std::int64_t row = rows > 0 ? t.numel() / rows * t.element_size() : 0;
  std::vector<int64_t> out(static_cast<std::size_t>(size));
  if (splits.empty()) {
    TORCH_CHECK(rows % size == 0, "shmring backend: ", kOp, ": the ", what, " tensor has ", rows,
                " rows (dim 0), not a multiple of the group size ", size,
                "; give split sizes for uneven splits");
    std::fill(out.begin(), out.end(), rows / size * row);
    return out;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == size, "shmring backend: ", kOp, ": ", what,
              " split sizes have ", splits.size(), " entries, expected the group size ", size);
  std::int64_t sum = 0;
  for (std::size_t j = 0; j < splits.size(); ++j) {
    TORCH_CHECK(splits[j] >= 0, "shmring backend: ", kOp, ": ", what, " split size ", j, " is ",
                splits[j], ", expected >= 0");
    sum += splits[j];
    out[j] = splits[j] * row;
  }
  TORCH_CHECK(sum == rows, "shmring backend: ", kOp, ": ", what, " split sizes sum to ", sum,
              " but the ", what, " tensor has ", rows, " rows (dim 0)");
  return out;
}

}  // namespace

at::Tensor CrossNode::allgather_blocks(const at::Tensor& input) {
  const at::Tensor in = input.contiguous().reshape({-1});
  at::Tensor result = at::empty({size_ * in.numel()}, in.options());
  const std::int64_t s = in.numel() * in.element_size();
  if (s == 0) return result;
  const auto L = static_cast<std::int64_t>(layout_.nodes[0].size());
  const auto N = static_cast<std::int64_t>(layout_.nodes.size());
  const auto bytes = at::TensorOptions().dtype(at::kByte);
  at::Tensor node_block = at::empty({L * s}, bytes);
  local_wait(comm_->iallgather(in.data_ptr(), node_block.data_ptr(), static_cast<std::size_t>(s),
                               DataType::uint8));
  at::Tensor all = at::empty({N * L * s}, bytes);
  if (leaders_) {
    std::vector<std::vector<at::Tensor>> outs(1);
    for (std::int64_t k = 0; k < N; ++k) outs[0].push_back(all.narrow(0, k * L * s, L * s));
    std::vector<at::Tensor> ins{node_block};
    gloo_wait(leaders_->allgather(outs, ins, ::c10d::AllgatherOptions()));
  }
  local_wait(
      comm_->ibroadcast(all.data_ptr(), static_cast<std::size_t>(N * L * s), DataType::uint8, 0));
  // Node-major order to rank order (a node's ranks need not be consecutive).
  at::Tensor out = bytes_of(result);
  for (std::int64_t k = 0; k < N; ++k)
    for (std::int64_t j = 0; j < L; ++j) {
      const int g = layout_.nodes[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)];
      out.narrow(0, g * s, s).copy_(all.narrow(0, (k * L + j) * s, s));
    }
  return result;
}

// Allgather: of equal blocks on equal nodes, allgather_blocks. Otherwise
// (any sizes, any dtype) each rank writes its bytes at its offset of a
// zeroed buffer and the buffer is summed as uint8 (x + 0 = x, exactly),
// through the hierarchical allreduce.
c10::intrusive_ptr<Work> CrossNode::allgather(std::vector<std::vector<at::Tensor>>& output_tensors,
                                              std::vector<at::Tensor>& input_tensors) {
  static constexpr const char* kOp = "allgather";
  const at::Tensor input = single_tensor(input_tensors, kOp, "input");
  TORCH_CHECK(output_tensors.size() == 1, "shmring backend: ", kOp,
              " takes one output list per process, got ", output_tensors.size());
  std::vector<at::Tensor> outputs = output_tensors[0];
  check_list(outputs, size_, input, kOp, "output");
  for (const auto& o : outputs) check_written(o, kOp, "an output");
  TORCH_CHECK(outputs[static_cast<std::size_t>(rank_)].numel() == input.numel(),
              "shmring backend: ", kOp, ": output tensor ", rank_, " (this rank's) has ",
              outputs[static_cast<std::size_t>(rank_)].numel(), " elements, but the input has ",
              input.numel());
  const int rank = rank_;
  const bool blocks = layout_.equal() && std::all_of(outputs.begin(), outputs.end(), [&](auto& o) {
                        return o.numel() == input.numel();
                      });
  CallPrint print{::c10d::OpType::ALLGATHER, static_cast<std::int64_t>(input.scalar_type())};
  print.set_list(outputs);
  return submit("shmring:all_gather", outputs, std::move(print), [=, this] {
    if (blocks) {
      unflatten(allgather_blocks(input), outputs);
      return;
    }
    std::int64_t total = 0, offset = 0;
    for (std::size_t r = 0; r < outputs.size(); ++r) {
      if (static_cast<int>(r) == rank) offset = total;
      total += outputs[r].numel();
    }
    at::Tensor flat = at::zeros({total}, input.options());
    flat.narrow(0, offset, input.numel()).copy_(input.reshape({-1}));
    allreduce_flat(bytes_of(flat), ::c10d::ReduceOp(::c10d::ReduceOp::SUM));
    unflatten(flat, outputs);
  });
}

c10::intrusive_ptr<Work> CrossNode::allgather_base(at::Tensor& output, at::Tensor& input) {
  static constexpr const char* kOp = "_allgather_base";
  check_tensor(input, kOp, "input");
  check_tensor(output, kOp, "output");
  check_written(output, kOp, "output");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "shmring backend: ", kOp,
              ": the output has dtype ", dtype_name(output.scalar_type()), ", expected ",
              dtype_name(input.scalar_type()));
  TORCH_CHECK(output.numel() == size_ * input.numel(), "shmring backend: ", kOp,
              ": the output has ", output.numel(), " elements, expected ", size_ * input.numel());
  const int rank = rank_;
  at::Tensor out = output, in = input;
  const bool blocks = layout_.equal();
  CallPrint print{::c10d::OpType::_ALLGATHER_BASE, static_cast<std::int64_t>(input.scalar_type()),
                  input.numel()};
  return submit("shmring:_all_gather_base", {output}, std::move(print), [=, this] {
    if (blocks) {
      out.copy_(allgather_blocks(in).view(out.sizes()));
      return;
    }
    at::Tensor flat = at::zeros({out.numel()}, in.options());
    flat.narrow(0, rank * in.numel(), in.numel()).copy_(in.reshape({-1}));
    allreduce_flat(bytes_of(flat), ::c10d::ReduceOp(::c10d::ReduceOp::SUM));
    out.copy_(flat.view(out.sizes()));
  });
}

// The operations below run over the world gloo group, on bytes.

c10::intrusive_ptr<Work> CrossNode::gather(std::vector<std::vector<at::Tensor>>& output_tensors,
                                           std::vector<at::Tensor>& input_tensors,
                                           const ::c10d::GatherOptions& opts) {
  static constexpr const char* kOp = "gather";
  const at::Tensor input = single_tensor(input_tensors, kOp, "input");
  const int root = static_cast<int>(opts.rootRank);
  check_root(root, size_, kOp);
  std::vector<at::Tensor> outputs;
  if (rank_ != root) {
    TORCH_CHECK(output_tensors.empty(), "shmring backend: ", kOp, ": rank ", rank_,
                " is not the root (", root, ") but was given an output list");
  } else {
    TORCH_CHECK(output_tensors.size() == 1, "shmring backend: ", kOp,
                " takes one output list at the root, got ", output_tensors.size());
    outputs = output_tensors[0];
    check_list(outputs, size_, input, kOp, "output");
    for (const auto& o : outputs) check_written(o, kOp, "an output");
    for (const auto& o : outputs)
      TORCH_CHECK(o.numel() == input.numel(), "shmring backend: ", kOp, ": an output tensor has ",
                  o.numel(), " elements, expected the input's ", input.numel());
  }
  const int size = size_;
  const bool mine = rank_ == root;
  CallPrint print{::c10d::OpType::GATHER, static_cast<std::int64_t>(input.scalar_type()),
                  input.numel(), root};
  return submit("shmring:gather", outputs, std::move(print), [=, this] {
    at::Tensor in = input.contiguous();
    std::vector<at::Tensor> ins{bytes_of(in)};
    std::vector<std::vector<at::Tensor>> outs;
    at::Tensor flat;
    if (mine) {
      flat = at::empty({size * input.numel()}, input.options());
      at::Tensor fb = bytes_of(flat);
      const std::int64_t each = in.numel() * in.element_size();
      outs.emplace_back();
      for (int r = 0; r < size; ++r) outs[0].push_back(fb.narrow(0, r * each, each));
    }
    ::c10d::GatherOptions g;
    g.rootRank = root;
    gloo_wait(world_->gather(outs, ins, g));
    if (mine) unflatten(flat, outputs);
  });
}

c10::intrusive_ptr<Work> CrossNode::scatter(std::vector<at::Tensor>& output_tensors,
                                            std::vector<std::vector<at::Tensor>>& input_tensors,
                                            const ::c10d::ScatterOptions& opts) {
  static constexpr const char* kOp = "scatter";
  const at::Tensor output = single_tensor(output_tensors, kOp, "output");
  check_written(output, kOp, "output");
  const int root = static_cast<int>(opts.rootRank);
  check_root(root, size_, kOp);
  std::vector<at::Tensor> inputs;
  if (rank_ != root) {
    TORCH_CHECK(input_tensors.empty(), "shmring backend: ", kOp, ": rank ", rank_,
                " is not the root (", root, ") but was given an input list");
  } else {
    TORCH_CHECK(input_tensors.size() == 1, "shmring backend: ", kOp,
                " takes one input list at the root, got ", input_tensors.size());
    inputs = input_tensors[0];
    check_list(inputs, size_, output, kOp, "input");
    for (const auto& t : inputs)
      TORCH_CHECK(t.numel() == output.numel(), "shmring backend: ", kOp, ": an input tensor has ",
                  t.numel(), " elements, expected the output's ", output.numel());
  }
  const bool mine = rank_ == root;
  CallPrint print{::c10d::OpType::SCATTER, static_cast<std::int64_t>(output.scalar_type()),
                  output.numel(), root};
  return submit("shmring:scatter", output_tensors, std::move(print), [=, this] {
    at::Tensor out = output.contiguous();
    std::vector<at::Tensor> outs{bytes_of(out)};
    std::vector<std::vector<at::Tensor>> ins;
    if (mine) {
      ins.emplace_back();
      for (const auto& t : inputs) ins[0].push_back(bytes_of(t.contiguous()));
    }
    ::c10d::ScatterOptions s;
    s.rootRank = root;
    gloo_wait(world_->scatter(outs, ins, s));
    if (!out.is_same(output)) output.copy_(out);
  });
}

c10::intrusive_ptr<Work> CrossNode::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                  std::vector<int64_t>& output_split_sizes,
                                                  std::vector<int64_t>& input_split_sizes) {
  static constexpr const char* kOp = "all_to_all_single";
  check_tensor(input, kOp, "input");
  check_tensor(output, kOp, "output");
  check_written(output, kOp, "output");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "shmring backend: ", kOp,
              ": the output has dtype ", dtype_name(output.scalar_type()), ", expected ",
              dtype_name(input.scalar_type()));
  if (input_split_sizes.empty() && output_split_sizes.empty())
    TORCH_CHECK(output.numel() == input.numel(), "shmring backend: ", kOp, ": the output has ",
                output.numel(), " elements but the input ", input.numel(),
                "; without split sizes they must be equal");
  std::vector<int64_t> send = split_bytes(input, input_split_sizes, size_, "input");
  std::vector<int64_t> recv = split_bytes(output, output_split_sizes, size_, "output");
  at::Tensor out = output, in = input;
  CallPrint print{::c10d::OpType::ALLTOALL_BASE, static_cast<std::int64_t>(input.scalar_type())};
  print.send_bytes = send;
  print.recv_bytes = recv;
  return submit("shmring:all_to_all_single", {output}, std::move(print), [=, this]() mutable {
    at::Tensor i = in.contiguous();
    at::Tensor o = out.contiguous();
    at::Tensor ib = bytes_of(i), ob = bytes_of(o);
    gloo_wait(world_->alltoall_base(ob, ib, recv, send, ::c10d::AllToAllOptions()));
    if (!o.is_same(out)) out.copy_(o);
  });
}

c10::intrusive_ptr<Work> CrossNode::alltoall(std::vector<at::Tensor>& output_tensors,
                                             std::vector<at::Tensor>& input_tensors) {
  static constexpr const char* kOp = "all_to_all";
  TORCH_CHECK(static_cast<int>(input_tensors.size()) == size_, "shmring backend: ", kOp,
              ": the input list has ", input_tensors.size(), " tensors, expected the group size ",
              size_);
  const at::Tensor like = input_tensors[0];
  check_list(input_tensors, size_, like, kOp, "input");
  check_list(output_tensors, size_, like, kOp, "output");
  for (const auto& o : output_tensors) check_written(o, kOp, "an output");
  const std::vector<at::Tensor> ins = input_tensors, outs = output_tensors;
  CallPrint print{::c10d::OpType::ALLTOALL, static_cast<std::int64_t>(like.scalar_type())};
  for (const auto& t : ins) print.send_bytes.push_back(t.numel() * t.element_size());
  for (const auto& t : outs) print.recv_bytes.push_back(t.numel() * t.element_size());
  return submit("shmring:all_to_all", output_tensors, std::move(print), [=, this] {
    std::vector<int64_t> send, recv;
    std::int64_t total = 0;
    for (const auto& t : ins) send.push_back(t.numel() * t.element_size());
    for (const auto& t : outs) {
      recv.push_back(t.numel() * t.element_size());
      total += t.numel();
    }
    at::Tensor flat_in = flatten(ins).contiguous();
    at::Tensor flat_out = at::empty({total}, like.options());
    at::Tensor ib = bytes_of(flat_in), ob = bytes_of(flat_out);
    gloo_wait(world_->alltoall_base(ob, ib, recv, send, ::c10d::AllToAllOptions()));
    unflatten(flat_out, outs);
  });
}

// Point-to-point: gloo's own Works, started at the call (not in the
// collectives' order), so an isend and an irecv posted in either order on
// two ranks complete. A non-contiguous tensor is refused.
c10::intrusive_ptr<Work> CrossNode::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  static constexpr const char* kOp = "send";
  const at::Tensor& tensor = single_tensor(tensors, kOp, "input");
  check_root(dst_rank, size_, kOp);
  at::Tensor buf = tensor.contiguous();
  std::vector<at::Tensor> one{bytes_of(buf)};
  std::lock_guard<std::mutex> g(gloo_mutex_);
  TORCH_CHECK(world_, "shmring backend: send: the process group is unusable or destroyed");
  return world_->send(one, dst_rank, tag);
}

c10::intrusive_ptr<Work> CrossNode::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  static constexpr const char* kOp = "recv";
  const at::Tensor& tensor = single_tensor(tensors, kOp, "output");
  check_root(src_rank, size_, kOp);
  TORCH_CHECK(tensor.is_contiguous(),
              "shmring backend: recv: a group across nodes receives "
              "into contiguous tensors only");
  std::vector<at::Tensor> one{bytes_of(tensor)};
  std::lock_guard<std::mutex> g(gloo_mutex_);
  TORCH_CHECK(world_, "shmring backend: recv: the process group is unusable or destroyed");
  return world_->recv(one, src_rank, tag);
}

}  // namespace shmring::torch_backend
