// The collectives of ProcessGroupShmring on one host (process_group.hpp):
// each checks its arguments under refusing(), stages its tensors and starts
// one of the communicator's i-collectives through launch(). A group across
// hosts hands each to its CrossNode (multi_node.hpp).
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

c10::intrusive_ptr<Work> ProcessGroupShmring::allreduce(std::vector<at::Tensor>& tensors,
                                                        const ::c10d::AllreduceOptions& opts) {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    return refusing("allreduce", [&] { return cross_->allreduce(tensors, opts); });
  }
#endif
  static constexpr const char* kOp = "allreduce";
  return refusing(kOp, [&] {
    const at::Tensor& tensor = single_tensor(tensors, kOp, "input");
    const DataType dtype = to_datatype(tensor.scalar_type(), kOp);
    const ReduceOp op = to_reduce_op(opts.reduceOp, kOp);
    Staged s = stage(tensor);
    void* data = s.buffer.data_ptr();
    const auto count = static_cast<std::size_t>(s.buffer.numel());
    return launch(::c10d::OpType::ALLREDUCE, "shmring:all_reduce", tensors, {s.buffer},
                  copy_back({s}, kOp),
                  [=](Communicator& c) { return c.iallreduce(data, data, count, dtype, op); });
  });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    return refusing("allreduce_coalesced",
                    [&] { return cross_->allreduce_coalesced(tensors, opts); });
  }
#endif
  static constexpr const char* kOp = "allreduce_coalesced";
  return refusing(kOp, [&] {
    TORCH_CHECK(!tensors.empty(), "shmring backend: ", kOp, " got an empty tensor list");
    for (const auto& t : tensors) {
      check_tensor(t, kOp, "input");
      check_written(t, kOp, "an input");
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "shmring backend: ", kOp,
                  ": tensors must share one dtype, got ", dtype_name(tensors[0].scalar_type()),
                  " and ", dtype_name(t.scalar_type()));
    }
    const DataType dtype = to_datatype(tensors[0].scalar_type(), kOp);
    const ReduceOp op = to_reduce_op(opts.reduceOp, kOp);
    // One flat buffer, one collective; the epilogue scatters it back.
    std::vector<at::Tensor> flat_views;
    for (const auto& t : tensors) flat_views.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_views);
    void* data = flat.data_ptr();
    const auto count = static_cast<std::size_t>(flat.numel());
    auto epilogue = [flat, tensors] {
      std::int64_t offset = 0;
      for (const auto& t : tensors) {
        t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    };
    return launch(::c10d::OpType::ALLREDUCE_COALESCED, "shmring:allreduce_coalesced", tensors,
                  {flat}, epilogue,
                  [=](Communicator& c) { return c.iallreduce(data, data, count, dtype, op); });
  });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::broadcast(std::vector<at::Tensor>& tensors,
                                                        const ::c10d::BroadcastOptions& opts) {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    return refusing("broadcast", [&] { return cross_->broadcast(tensors, opts); });
  }
#endif
  static constexpr const char* kOp = "broadcast";
  return refusing(kOp, [&] {
    const at::Tensor& tensor = single_tensor(tensors, kOp, "input");
    check_root(static_cast<int>(opts.rootRank), opts.rootTensor, size_, kOp);
    const int root = static_cast<int>(opts.rootRank);
    agree_on_moved_dtype(tensor, kOp);
    Staged s = stage(tensor);
    const Raw raw = raw_of(s.buffer, kOp);
    // The root's tensor is only read: it may be one whose elements share
    // memory (expand()), and nothing is copied back into it.
    return launch(::c10d::OpType::BROADCAST, "shmring:broadcast", tensors, {s.buffer},
                  rank_ == root ? nullptr : copy_back({s}, kOp), [=](Communicator& c) {
                    return c.ibroadcast(raw.data, raw.count, raw.dtype, root);
                  });
  });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::reduce(std::vector<at::Tensor>& tensors,
                                                     const ::c10d::ReduceOptions& opts) {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    return refusing("reduce", [&] { return cross_->reduce(tensors, opts); });
  }
#endif
  static constexpr const char* kOp = "reduce";
  return refusing(kOp, [&] {
    const at::Tensor& tensor = single_tensor(tensors, kOp, "input");
    check_root(static_cast<int>(opts.rootRank), opts.rootTensor, size_, kOp);
    const int root = static_cast<int>(opts.rootRank);
    const DataType dtype = to_datatype(tensor.scalar_type(), kOp);
    const ReduceOp op = to_reduce_op(opts.reduceOp, kOp);
    Staged s = stage(tensor);
    void* data = s.buffer.data_ptr();
    const auto count = static_cast<std::size_t>(s.buffer.numel());
    // Only the root's tensor changes; elsewhere the input is left as it was.
    return launch(::c10d::OpType::REDUCE, "shmring:reduce", tensors, {s.buffer},
                  rank_ == root ? copy_back({s}, kOp) : nullptr,
                  [=](Communicator& c) { return c.ireduce(data, data, count, dtype, op, root); });
  });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::allgather(
    std::vector<std::vector<at::Tensor>>& output_tensors, std::vector<at::Tensor>& input_tensors,
    const ::c10d::AllgatherOptions& /*opts*/) {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    return refusing("allgather", [&] { return cross_->allgather(output_tensors, input_tensors); });
  }
#endif
  static constexpr const char* kOp = "allgather";
  return refusing(kOp, [&] {
    const at::Tensor& input = single_tensor(input_tensors, kOp, "input");
    TORCH_CHECK(output_tensors.size() == 1, "shmring backend: ", kOp,
                " takes one output list per process, got ", output_tensors.size());
    std::vector<at::Tensor>& outputs = output_tensors[0];
    check_list(outputs, size_, input, kOp, "output");
    TORCH_CHECK(outputs[static_cast<std::size_t>(rank_)].numel() == input.numel(),
                "shmring backend: ", kOp, ": output tensor ", rank_, " (this rank's) has ",
                outputs[static_cast<std::size_t>(rank_)].numel(), " elements, but the input has ",
                input.numel());
    agree_on_moved_dtype(input, kOp);
    // Gathered into one flat buffer, then copied out to the list's tensors.
    // Every rank holds the same list of output sizes, so all take the same
    // path: allgather when the sizes are equal, allgatherv when not.
    Staged in = stage(input);
    const MoveType m = move_type(input, kOp);
    Layout layout;
    layout.recv_counts = numels(outputs, m.per_element);
    std::int64_t total = 0;
    for (const auto& o : outputs) total += o.numel();
    at::Tensor flat = at::empty({total}, input.options());
    const Raw send = raw_of(in.buffer, kOp);
    void* recv = flat.data_ptr();
    if (all_equal(layout.recv_counts)) {
      return launch(::c10d::OpType::ALLGATHER, "shmring:all_gather", outputs, {in.buffer, flat},
                    unflatten_into(flat, outputs, kOp), [=](Communicator& c) {
                      return c.iallgather(send.data, recv, send.count, send.dtype);
                    });
    }
    layout.recv_displs = packed_displs(layout.recv_counts);
    return launch(::c10d::OpType::ALLGATHER, "shmring:all_gather", outputs, {in.buffer, flat},
                  unflatten_into(flat, outputs, kOp), [=](Communicator& c) {
                    return c.iallgatherv(send.data, send.count, recv, layout.recv_counts,
                                         layout.recv_displs, send.dtype);
                  });
  });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::_allgather_base(
    at::Tensor& output_buffer, at::Tensor& input_buffer, const ::c10d::AllgatherOptions& /*opts*/) {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    return refusing("_allgather_base",
                    [&] { return cross_->allgather_base(output_buffer, input_buffer); });
  }
#endif
  static constexpr const char* kOp = "_allgather_base";
  return refusing(kOp, [&] {
    check_tensor(input_buffer, kOp, "input");
    check_tensor(output_buffer, kOp, "output");
    check_same(input_buffer, output_buffer, kOp, "the output", size_ * input_buffer.numel());
    agree_on_moved_dtype(input_buffer, kOp);
    Staged in = stage(input_buffer);
    Staged out = stage_output(output_buffer);
    const Raw send = raw_of(in.buffer, kOp);
    void* recv = out.buffer.data_ptr();
    return launch(::c10d::OpType::_ALLGATHER_BASE, "shmring:_all_gather_base", {output_buffer},
                  {in.buffer, out.buffer}, copy_back({out}, kOp), [=](Communicator& c) {
                    return c.iallgather(send.data, recv, send.count, send.dtype);
                  });
  });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::reduce_scatter(
    std::vector<at::Tensor>& output_tensors, std::vector<std::vector<at::Tensor>>& input_tensors,
    const ::c10d::ReduceScatterOptions& opts) {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    return refusing("reduce_scatter",
                    [&] { return cross_->reduce_scatter(output_tensors, input_tensors, opts); });
  }
#endif
  static constexpr const char* kOp = "reduce_scatter";
  return refusing(kOp, [&] {
    const at::Tensor& output = single_tensor(output_tensors, kOp, "output");
    TORCH_CHECK(input_tensors.size() == 1, "shmring backend: ", kOp,
                " takes one input list per process, got ", input_tensors.size());
    const std::vector<at::Tensor>& inputs = input_tensors[0];
    check_list(inputs, size_, output, kOp, "input");
    TORCH_CHECK(inputs[static_cast<std::size_t>(rank_)].numel() == output.numel(),
                "shmring backend: ", kOp, ": input tensor ", rank_, " (this rank's block) has ",
                inputs[static_cast<std::size_t>(rank_)].numel(), " elements, but the output has ",
                output.numel());
    const DataType dtype = to_datatype(output.scalar_type(), kOp);
    const ReduceOp op = to_reduce_op(opts.reduceOp, kOp);
    at::Tensor flat = flatten(inputs);
    Staged out = stage_output(output);
    const void* send = flat.data_ptr();
    void* recv = out.buffer.data_ptr();
    const auto count = static_cast<std::size_t>(output.numel());
    // Every rank holds the same list of input sizes: equal sizes take
    // reduce_scatter on every rank, uneven ones reduce_scatter_v.
    Layout layout;
    layout.recv_counts = numels(inputs, 1);
    if (all_equal(layout.recv_counts)) {
      return launch(::c10d::OpType::REDUCE_SCATTER, "shmring:reduce_scatter", output_tensors,
                    {flat, out.buffer}, copy_back({out}, kOp), [=](Communicator& c) {
                      return c.ireduce_scatter(send, recv, count, dtype, op);
                    });
    }
    return launch(::c10d::OpType::REDUCE_SCATTER, "shmring:reduce_scatter", output_tensors,
                  {flat, out.buffer}, copy_back({out}, kOp), [=](Communicator& c) {
                    return c.ireduce_scatter_v(send, recv, layout.recv_counts, dtype, op);
                  });
  });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::_reduce_scatter_base(
    at::Tensor& output_buffer, at::Tensor& input_buffer, const ::c10d::ReduceScatterOptions& opts) {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    return refusing("_reduce_scatter_base",
                    [&] { return cross_->reduce_scatter_base(output_buffer, input_buffer, opts); });
  }
#endif
  static constexpr const char* kOp = "_reduce_scatter_base";
  return refusing(kOp, [&] {
    check_tensor(input_buffer, kOp, "input");
    check_tensor(output_buffer, kOp, "output");
    check_same(output_buffer, input_buffer, kOp, "the input", size_ * output_buffer.numel());
    const DataType dtype = to_datatype(output_buffer.scalar_type(), kOp);
    const ReduceOp op = to_reduce_op(opts.reduceOp, kOp);
    Staged in = stage(input_buffer);
    Staged out = stage_output(output_buffer);
    const void* send = in.buffer.data_ptr();
    void* recv = out.buffer.data_ptr();
    const auto count = static_cast<std::size_t>(output_buffer.numel());
    return launch(::c10d::OpType::_REDUCE_SCATTER_BASE, "shmring:_reduce_scatter_base",
                  {output_buffer}, {in.buffer, out.buffer}, copy_back({out}, kOp),
                  [=](Communicator& c) { return c.ireduce_scatter(send, recv, count, dtype, op); });
  });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::barrier(const ::c10d::BarrierOptions& /*opts*/) {
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->barrier();
#endif
  return launch(::c10d::OpType::BARRIER, "shmring:barrier", {}, {}, nullptr,
                [](Communicator& c) { return c.ibarrier(); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
    const ::c10d::AllgatherOptions&) {
  return refusing("allgather_coalesced",
                  []() -> c10::intrusive_ptr<Work> { unsupported("allgather_coalesced"); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::gather(
    std::vector<std::vector<at::Tensor>>& output_tensors, std::vector<at::Tensor>& input_tensors,
    const ::c10d::GatherOptions& opts) {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    return refusing("gather", [&] { return cross_->gather(output_tensors, input_tensors, opts); });
  }
#endif
  return refusing("gather", [&] {
    static constexpr const char* kOp = "gather";
    const at::Tensor& input = single_tensor(input_tensors, kOp, "input");
    const int root = static_cast<int>(opts.rootRank);
    check_root(root, 0, size_, kOp);
    agree_on_moved_dtype(input, kOp);
    Staged in = stage(input);
    const Raw send = raw_of(in.buffer, kOp);
    if (rank_ != root) {
      TORCH_CHECK(output_tensors.empty(), "shmring backend: ", kOp, ": rank ", rank_,
                  " is not the root (", root, ") but was given an output list");
      return launch(::c10d::OpType::GATHER, "shmring:gather", {}, {in.buffer}, nullptr,
                    [=](Communicator& c) {
                      return c.igather(send.data, nullptr, send.count, send.dtype, root);
                    });
    }
    TORCH_CHECK(output_tensors.size() == 1, "shmring backend: ", kOp,
                " takes one output list at the root, got ", output_tensors.size());
    std::vector<at::Tensor>& outputs = output_tensors[0];
    check_list(outputs, size_, input, kOp, "output");
    for (const auto& o : outputs)
      TORCH_CHECK(o.numel() == input.numel(), "shmring backend: ", kOp, ": an output tensor has ",
                  o.numel(), " elements, expected the input's ", input.numel());
    at::Tensor flat = at::empty({size_ * input.numel()}, input.options());
    void* recv = flat.data_ptr();
    return launch(::c10d::OpType::GATHER, "shmring:gather", outputs, {in.buffer, flat},
                  unflatten_into(flat, outputs, kOp), [=](Communicator& c) {
                    return c.igather(send.data, recv, send.count, send.dtype, root);
                  });
  });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::scatter(
    std::vector<at::Tensor>& output_tensors, std::vector<std::vector<at::Tensor>>& input_tensors,
    const ::c10d::ScatterOptions& opts) {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    return refusing("scatter",
                    [&] { return cross_->scatter(output_tensors, input_tensors, opts); });
  }
#endif
  return refusing("scatter", [&] {
    static constexpr const char* kOp = "scatter";
    const at::Tensor& output = single_tensor(output_tensors, kOp, "output");
    const int root = static_cast<int>(opts.rootRank);
    check_root(root, 0, size_, kOp);
    agree_on_moved_dtype(output, kOp);
    Staged out = stage_output(output);
    const MoveType m = move_type(output, kOp);
    void* recv = out.buffer.data_ptr();
    const std::size_t count = static_cast<std::size_t>(output.numel()) * m.per_element;
    const DataType dtype = m.dtype;
    if (rank_ != root) {
      TORCH_CHECK(input_tensors.empty(), "shmring backend: ", kOp, ": rank ", rank_,
                  " is not the root (", root, ") but was given an input list");
      return launch(::c10d::OpType::SCATTER, "shmring:scatter", output_tensors, {out.buffer},
                    copy_back({out}, kOp),
                    [=](Communicator& c) { return c.iscatter(nullptr, recv, count, dtype, root); });
    }
    TORCH_CHECK(input_tensors.size() == 1, "shmring backend: ", kOp,
                " takes one input list at the root, got ", input_tensors.size());
    const std::vector<at::Tensor>& inputs = input_tensors[0];
    check_list(inputs, size_, output, kOp, "input");
    for (const auto& t : inputs)
      TORCH_CHECK(t.numel() == output.numel(), "shmring backend: ", kOp, ": an input tensor has ",
                  t.numel(), " elements, expected the output's ", output.numel());
    at::Tensor flat = flatten(inputs);
    const void* send = flat.data_ptr();
    return launch(::c10d::OpType::SCATTER, "shmring:scatter", output_tensors, {flat, out.buffer},
                  copy_back({out}, kOp),
                  [=](Communicator& c) { return c.iscatter(send, recv, count, dtype, root); });
  });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::alltoall_base(
    at::Tensor& output_buffer, at::Tensor& input_buffer, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const ::c10d::AllToAllOptions& /*opts*/) {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    return refusing("all_to_all_single", [&] {
      return cross_->alltoall_base(output_buffer, input_buffer, output_split_sizes,
                                   input_split_sizes);
    });
  }
#endif
  return refusing("alltoall_base", [&] {
    static constexpr const char* kOp = "all_to_all_single";
    check_tensor(input_buffer, kOp, "input");
    check_tensor(output_buffer, kOp, "output");
    TORCH_CHECK(output_buffer.scalar_type() == input_buffer.scalar_type(), "shmring backend: ", kOp,
                ": the output has dtype ", dtype_name(output_buffer.scalar_type()), ", expected ",
                dtype_name(input_buffer.scalar_type()));
    agree_on_moved_dtype(input_buffer, kOp);
    const MoveType m = move_type(input_buffer, kOp);
    Layout layout;
    layout.send_counts =
        split_counts(input_buffer, input_split_sizes, size_, m.per_element, kOp, "input");
    layout.recv_counts =
        split_counts(output_buffer, output_split_sizes, size_, m.per_element, kOp, "output");
    Staged in = stage(input_buffer);
    Staged out = stage_output(output_buffer);
    const void* send = in.buffer.data_ptr();
    void* recv = out.buffer.data_ptr();
    const DataType dtype = m.dtype;
    // Always alltoallv, with empty split sizes read as equal ones
    // (split_counts): torch treats the two as the same call, so ranks may mix
    // them, and no rule a rank can apply alone picks alltoall on every rank at
    // once: even "all my counts are equal" is its own view (a peer may send it
    // equal blocks and others uneven ones).
    if (input_split_sizes.empty() && output_split_sizes.empty())
      TORCH_CHECK(output_buffer.numel() == input_buffer.numel(), "shmring backend: ", kOp,
                  ": the output has ", output_buffer.numel(), " elements but the input ",
                  input_buffer.numel(), "; without split sizes they must be equal");
    layout.send_displs = packed_displs(layout.send_counts);
    layout.recv_displs = packed_displs(layout.recv_counts);
    return launch(::c10d::OpType::ALLTOALL_BASE, "shmring:all_to_all_single", {output_buffer},
                  {in.buffer, out.buffer}, copy_back({out}, kOp), [=](Communicator& c) {
                    return c.ialltoallv(send, layout.send_counts, layout.send_displs, recv,
                                        layout.recv_counts, layout.recv_displs, dtype);
                  });
  });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::alltoall(std::vector<at::Tensor>& output_tensors,
                                                       std::vector<at::Tensor>& input_tensors,
                                                       const ::c10d::AllToAllOptions& /*opts*/) {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    return refusing("all_to_all", [&] { return cross_->alltoall(output_tensors, input_tensors); });
  }
#endif
  return refusing("alltoall", [&] {
    static constexpr const char* kOp = "all_to_all";
    TORCH_CHECK(static_cast<int>(input_tensors.size()) == size_, "shmring backend: ", kOp,
                ": the input list has ", input_tensors.size(), " tensors, expected the group size ",
                size_);
    const at::Tensor& like = input_tensors[0];
    check_list(input_tensors, size_, like, kOp, "input");
    check_list(output_tensors, size_, like, kOp, "output");
    agree_on_moved_dtype(like, kOp);
    // Always alltoallv: tensor j of the lists goes to and comes from rank j,
    // and whether all of a rank's sizes are equal is its own view only.
    const MoveType m = move_type(like, kOp);
    Layout layout;
    layout.send_counts = numels(input_tensors, m.per_element);
    layout.recv_counts = numels(output_tensors, m.per_element);
    layout.send_displs = packed_displs(layout.send_counts);
    layout.recv_displs = packed_displs(layout.recv_counts);
    at::Tensor flat_in = flatten(input_tensors);
    std::int64_t total = 0;
    for (const auto& o : output_tensors) total += o.numel();
    at::Tensor flat_out = at::empty({total}, like.options());
    const void* send = flat_in.data_ptr();
    void* recv = flat_out.data_ptr();
    const DataType dtype = m.dtype;
    return launch(::c10d::OpType::ALLTOALL, "shmring:all_to_all", output_tensors,
                  {flat_in, flat_out}, unflatten_into(flat_out, output_tensors, kOp),
                  [=](Communicator& c) {
                    return c.ialltoallv(send, layout.send_counts, layout.send_displs, recv,
                                        layout.recv_counts, layout.recv_displs, dtype);
                  });
  });
}

}  // namespace shmring::torch_backend
