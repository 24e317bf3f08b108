#include "process_group.hpp"

#include <Python.h>
#include <pybind11/pybind11.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>

#include "convert.hpp"

namespace shmring::torch_backend {
namespace {

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

// Hostname plus boot id: two containers or two boots with one name differ.
std::string host_identity() {
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return host_name() + "/" + boot_id;
}

std::string random_nonce() {
  std::random_device device;
  const std::uint64_t value = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 0; i < 16; ++i) out[i] = kHex[(value >> (4 * i)) & 0xf];
  return out;
}

// The job id of this group, agreed through its store. Each creation of a
// group on one store is a generation (several init/destroy cycles may share
// a store): every rank counts itself in, and the ranks of generation g read
// the nonce rank 0 wrote for g. Generations cannot interleave, since a
// creation returns only once every rank of it has attached.
Options rendezvous(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout) {
  TORCH_CHECK(store, "shmring backend: no store given to the process group");
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "shmring backend: rank ", rank,
              " is not in [0, ", size, ")");
  const std::int64_t arrival = store->add("shmring/arrivals", 1);
  const std::int64_t generation = (arrival - 1) / size;
  const std::string key = "shmring/nonce/" + std::to_string(generation);
  const std::string host = host_identity();
  std::string nonce;
  if (rank == 0) {
    nonce = random_nonce();
    const std::string value = nonce + " " + host;
    store->set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
  } else {
    const std::vector<std::uint8_t> bytes = store->get(key);
    const std::string value(bytes.begin(), bytes.end());
    const auto space = value.find(' ');
    TORCH_CHECK(space != std::string::npos, "shmring backend: store key ", key, " holds '", value,
                "', not a shmring nonce");
    nonce = value.substr(0, space);
    const std::string root_host = value.substr(space + 1);
    TORCH_CHECK(root_host == host, "shmring backend: rank ", rank, " runs on host ", host,
                " but rank 0 on ", root_host,
                "; every rank of a shmring group must be on one host (use gloo across hosts)");
  }
  Options options;
  options.rank = rank;
  options.world_size = size;
  options.job_id = "torch-" + nonce;
  // A group lives on one host by construction: all its ranks are local.
  options.local_rank = rank;
  options.local_world_size = size;
  if (std::getenv("SHMRING_TIMEOUT") == nullptr && timeout.count() > 0) {
    options.timeout_s = static_cast<double>(timeout.count()) / 1000.0;
  }
  return options;
}

// A tensor's memory as the collective sees it: the tensor itself when it is
// contiguous, else a contiguous copy that the epilogue copies back.
struct Staged {
  at::Tensor user;
  at::Tensor buffer;
  bool copied() const { return !user.is_same(buffer); }
};

Staged stage(const at::Tensor& tensor) {
  if (tensor.is_contiguous()) return {tensor, tensor};
  return {tensor, tensor.contiguous()};
}

// Staged for an output only: the copy need not hold the old values.
Staged stage_output(const at::Tensor& tensor) {
  if (tensor.is_contiguous()) return {tensor, tensor};
  return {tensor, at::empty(tensor.sizes(), tensor.options())};
}

std::function<void()> copy_back(std::vector<Staged> staged) {
  std::erase_if(staged, [](const Staged& s) { return !s.copied(); });
  if (staged.empty()) return nullptr;
  return [staged = std::move(staged)] {
    for (const auto& s : staged) s.user.copy_(s.buffer);
  };
}

// Data movement (broadcast, allgather) does not look at the values: a dtype
// shmring cannot reduce (bool, int16, complex...) moves as bytes.
struct Raw {
  void* data;
  std::size_t count;
  DataType dtype;
};

Raw raw_of(const at::Tensor& contiguous, const char* op) {
  switch (contiguous.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong:
      return {contiguous.data_ptr(), static_cast<std::size_t>(contiguous.numel()),
              to_datatype(contiguous.scalar_type(), op)};
    default:
      return {contiguous.data_ptr(), static_cast<std::size_t>(contiguous.nbytes()),
              DataType::uint8};
  }
}

void check_root(int root, std::int64_t root_tensor, int size, const char* op) {
  TORCH_CHECK(root >= 0 && root < size, "shmring backend: ", op, ": root rank ", root,
              " is not in [0, ", size, ")");
  TORCH_CHECK(root_tensor == 0, "shmring backend: ", op, ": root tensor index ", root_tensor,
              " given, but there is one tensor per process (index 0)");
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what,
                std::int64_t expected_numel) {
  TORCH_CHECK(b.scalar_type() == a.scalar_type(), "shmring backend: ", op, ": ", what,
              " has dtype ", dtype_name(b.scalar_type()), ", expected ",
              dtype_name(a.scalar_type()));
  TORCH_CHECK(b.numel() == expected_numel, "shmring backend: ", op, ": ", what, " has ", b.numel(),
              " elements, expected ", expected_numel);
}

}  // namespace

ProcessGroupShmring::ProcessGroupShmring(const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                         int size, std::chrono::milliseconds timeout)
    : BackendBase(rank, size),
      comm_(std::make_unique<Communicator>(rendezvous(store, rank, size, timeout))) {}

ProcessGroupShmring::~ProcessGroupShmring() {
  // Completing what is still queued, and dropping the last reference to a
  // Work's tensors, may need the GIL on a completion thread (Python future
  // callbacks; tensors with a Python object); Python may be dropping the
  // last reference to this group with the GIL held.
  std::optional<pybind11::gil_scoped_release> no_gil;
  if (Py_IsInitialized() && PyGILState_Check()) no_gil.emplace();
  comm_.reset();        // completes or fails every request: their Works reach the completions
  completions_.stop();  // completes those, then joins the threads
}

c10::intrusive_ptr<Work> ProcessGroupShmring::launch(::c10d::OpType type, const char* title,
                                                     std::vector<at::Tensor> result,
                                                     std::vector<at::Tensor> keep_alive,
                                                     std::function<void()> epilogue,
                                                     const Start& start) {
  auto work = c10::make_intrusive<WorkShmring>(rank_, type, title, std::move(result));
  work->prepare(std::move(keep_alive), std::move(epilogue));
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    try {
      work->set_request(start(*comm_));
    } catch (const Error& e) {
      TORCH_CHECK(false, e.what());  // argument errors, or a broken group refusing
    }
  }
  // The callback runs on the progress thread (or here, if already complete):
  // it only hands the Work over, moving its reference out so the Work (and
  // its Request) is never destroyed on the progress thread.
  // A Work that a thread already wait()s for is completed by that thread
  // (a blocking dist.all_reduce): waking a completion thread for it would
  // cost a context switch per call on a busy core.
  work->request().on_complete([this, w = work](std::exception_ptr error) mutable {
    if (w->waited()) return;
    completions_.push(std::move(w), error);
  });
  return work;
}

c10::intrusive_ptr<Work> ProcessGroupShmring::allreduce(std::vector<at::Tensor>& tensors,
                                                        const ::c10d::AllreduceOptions& opts) {
  static constexpr const char* kOp = "allreduce";
  const at::Tensor& tensor = single_tensor(tensors, kOp, "input");
  const DataType dtype = to_datatype(tensor.scalar_type(), kOp);
  const ReduceOp op = to_reduce_op(opts.reduceOp, kOp);
  Staged s = stage(tensor);
  void* data = s.buffer.data_ptr();
  const auto count = static_cast<std::size_t>(s.buffer.numel());
  return launch(::c10d::OpType::ALLREDUCE, "shmring:all_reduce", tensors, {s.buffer},
                copy_back({s}),
                [=](Communicator& c) { return c.iallreduce(data, data, count, dtype, op); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  static constexpr const char* kOp = "allreduce_coalesced";
  TORCH_CHECK(!tensors.empty(), "shmring backend: ", kOp, " got an empty tensor list");
  for (const auto& t : tensors) {
    check_tensor(t, kOp, "input");
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
  return launch(::c10d::OpType::ALLREDUCE_COALESCED, "shmring:allreduce_coalesced", tensors, {flat},
                epilogue,
                [=](Communicator& c) { return c.iallreduce(data, data, count, dtype, op); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::broadcast(std::vector<at::Tensor>& tensors,
                                                        const ::c10d::BroadcastOptions& opts) {
  static constexpr const char* kOp = "broadcast";
  const at::Tensor& tensor = single_tensor(tensors, kOp, "input");
  check_root(static_cast<int>(opts.rootRank), opts.rootTensor, size_, kOp);
  const int root = static_cast<int>(opts.rootRank);
  Staged s = stage(tensor);
  const Raw raw = raw_of(s.buffer, kOp);
  return launch(
      ::c10d::OpType::BROADCAST, "shmring:broadcast", tensors, {s.buffer}, copy_back({s}),
      [=](Communicator& c) { return c.ibroadcast(raw.data, raw.count, raw.dtype, root); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::reduce(std::vector<at::Tensor>& tensors,
                                                     const ::c10d::ReduceOptions& opts) {
  static constexpr const char* kOp = "reduce";
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
                rank_ == root ? copy_back({s}) : nullptr,
                [=](Communicator& c) { return c.ireduce(data, data, count, dtype, op, root); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::allgather(
    std::vector<std::vector<at::Tensor>>& output_tensors, std::vector<at::Tensor>& input_tensors,
    const ::c10d::AllgatherOptions& /*opts*/) {
  static constexpr const char* kOp = "allgather";
  const at::Tensor& input = single_tensor(input_tensors, kOp, "input");
  TORCH_CHECK(output_tensors.size() == 1, "shmring backend: ", kOp,
              " takes one output list per process, got ", output_tensors.size());
  std::vector<at::Tensor>& outputs = output_tensors[0];
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_, "shmring backend: ", kOp,
              ": the output list has ", outputs.size(), " tensors, expected the group size ",
              size_);
  for (const auto& o : outputs) {
    check_tensor(o, kOp, "output");
    check_same(input, o, kOp, "an output tensor", input.numel());
  }
  // Gathered into one flat buffer, then copied out to the list's tensors.
  Staged in = stage(input);
  at::Tensor flat = at::empty({size_ * input.numel()}, input.options());
  const Raw send = raw_of(in.buffer, kOp);
  void* recv = flat.data_ptr();
  const std::int64_t n = input.numel();
  auto epilogue = [flat, outputs, n] {
    for (std::size_t r = 0; r < outputs.size(); ++r) {
      outputs[r].copy_(
          flat.narrow(0, static_cast<std::int64_t>(r) * n, n).view(outputs[r].sizes()));
    }
  };
  return launch(
      ::c10d::OpType::ALLGATHER, "shmring:all_gather", outputs, {in.buffer, flat}, epilogue,
      [=](Communicator& c) { return c.iallgather(send.data, recv, send.count, send.dtype); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::_allgather_base(
    at::Tensor& output_buffer, at::Tensor& input_buffer, const ::c10d::AllgatherOptions& /*opts*/) {
  static constexpr const char* kOp = "_allgather_base";
  check_tensor(input_buffer, kOp, "input");
  check_tensor(output_buffer, kOp, "output");
  check_same(input_buffer, output_buffer, kOp, "the output", size_ * input_buffer.numel());
  Staged in = stage(input_buffer);
  Staged out = stage_output(output_buffer);
  const Raw send = raw_of(in.buffer, kOp);
  void* recv = out.buffer.data_ptr();
  return launch(::c10d::OpType::_ALLGATHER_BASE, "shmring:_all_gather_base", {output_buffer},
                {in.buffer, out.buffer}, copy_back({out}), [=](Communicator& c) {
                  return c.iallgather(send.data, recv, send.count, send.dtype);
                });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::reduce_scatter(
    std::vector<at::Tensor>& output_tensors, std::vector<std::vector<at::Tensor>>& input_tensors,
    const ::c10d::ReduceScatterOptions& opts) {
  static constexpr const char* kOp = "reduce_scatter";
  const at::Tensor& output = single_tensor(output_tensors, kOp, "output");
  TORCH_CHECK(input_tensors.size() == 1, "shmring backend: ", kOp,
              " takes one input list per process, got ", input_tensors.size());
  const std::vector<at::Tensor>& inputs = input_tensors[0];
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_, "shmring backend: ", kOp,
              ": the input list has ", inputs.size(), " tensors, expected the group size ", size_);
  for (const auto& t : inputs) {
    check_tensor(t, kOp, "input");
    check_same(output, t, kOp, "an input tensor", output.numel());
  }
  const DataType dtype = to_datatype(output.scalar_type(), kOp);
  const ReduceOp op = to_reduce_op(opts.reduceOp, kOp);
  std::vector<at::Tensor> flat_views;
  for (const auto& t : inputs) flat_views.push_back(t.reshape({-1}));
  at::Tensor flat = at::cat(flat_views);
  Staged out = stage_output(output);
  const void* send = flat.data_ptr();
  void* recv = out.buffer.data_ptr();
  const auto count = static_cast<std::size_t>(output.numel());
  return launch(::c10d::OpType::REDUCE_SCATTER, "shmring:reduce_scatter", output_tensors,
                {flat, out.buffer}, copy_back({out}),
                [=](Communicator& c) { return c.ireduce_scatter(send, recv, count, dtype, op); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::_reduce_scatter_base(
    at::Tensor& output_buffer, at::Tensor& input_buffer, const ::c10d::ReduceScatterOptions& opts) {
  static constexpr const char* kOp = "_reduce_scatter_base";
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
                {output_buffer}, {in.buffer, out.buffer}, copy_back({out}),
                [=](Communicator& c) { return c.ireduce_scatter(send, recv, count, dtype, op); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::barrier(const ::c10d::BarrierOptions& /*opts*/) {
  return launch(::c10d::OpType::BARRIER, "shmring:barrier", {}, {}, nullptr,
                [](Communicator& c) { return c.ibarrier(); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
    const ::c10d::AllgatherOptions&) {
  unsupported("allgather_coalesced");
}

c10::intrusive_ptr<Work> ProcessGroupShmring::gather(std::vector<std::vector<at::Tensor>>&,
                                                     std::vector<at::Tensor>&,
                                                     const ::c10d::GatherOptions&) {
  unsupported("gather");
}

c10::intrusive_ptr<Work> ProcessGroupShmring::scatter(std::vector<at::Tensor>&,
                                                      std::vector<std::vector<at::Tensor>>&,
                                                      const ::c10d::ScatterOptions&) {
  unsupported("scatter");
}

c10::intrusive_ptr<Work> ProcessGroupShmring::alltoall_base(at::Tensor&, at::Tensor&,
                                                            std::vector<int64_t>&,
                                                            std::vector<int64_t>&,
                                                            const ::c10d::AllToAllOptions&) {
  unsupported("all_to_all_single (alltoall_base)");
}

c10::intrusive_ptr<Work> ProcessGroupShmring::alltoall(std::vector<at::Tensor>&,
                                                       std::vector<at::Tensor>&,
                                                       const ::c10d::AllToAllOptions&) {
  unsupported("all_to_all (alltoall)");
}

// Point-to-point: shmring's isend/irecv, which progress on their own (not in
// the collectives' call order), so batch_isend_irecv's isend-then-irecv on
// every rank completes. A dtype shmring has no name for moves as bytes on
// both sides alike.
c10::intrusive_ptr<Work> ProcessGroupShmring::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                   int tag) {
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
  static constexpr const char* kOp = "recv";
  const at::Tensor& tensor = single_tensor(tensors, kOp, "output");
  Staged s = stage_output(tensor);
  const Raw raw = raw_of(s.buffer, kOp);
  return launch(
      ::c10d::OpType::RECV, "shmring:recv", tensors, {s.buffer}, copy_back({s}),
      [=](Communicator& c) { return c.irecv(raw.data, raw.count, raw.dtype, src_rank, tag); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::recvAnysource(std::vector<at::Tensor>&, int) {
  unsupported("recv from any source (recvAnysource)");
}

}  // namespace shmring::torch_backend
