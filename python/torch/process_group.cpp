#include "process_group.hpp"

#include <Python.h>
#include <pybind11/pybind11.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>

#include "convert.hpp"
#include "node_layout.hpp"
#if SHMRING_TORCH_GLOO
#include "multi_node.hpp"
#else
namespace shmring::torch_backend {
class CrossNode {};  // groups across hosts need gloo
}  // namespace shmring::torch_backend
#endif

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

// SHMRING_TORCH_JOB_TAG ("tag-" in every job id): lets a launcher
// (tools/fake-nodes) find the shared memory of its own run.
std::string job_tag() {
  const char* tag = std::getenv("SHMRING_TORCH_JOB_TAG");
  if (tag == nullptr || *tag == '\0') return "";
  const std::string t(tag);
  const bool ok = t.size() <= 32 && std::all_of(t.begin(), t.end(), [](char c) {
                    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_';
                  });
  TORCH_CHECK(ok, "shmring backend: SHMRING_TORCH_JOB_TAG='", t,
              "': expected 1 to 32 characters from [A-Za-z0-9._]");
  return t + "-";
}

std::string random_nonce() {
  std::random_device device;
  const std::uint64_t value = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 0; i < 16; ++i) out[i] = kHex[(value >> (4 * i)) & 0xf];
  return out;
}

// Where a group's ranks are, agreed through its store. Each creation of a
// group on one store is a generation (several init/destroy cycles may share
// a store): every rank counts itself in, and the keys of generation g are
// under "shmring/g/". Generations cannot interleave, since a creation
// returns only once every rank of it has attached.
//
// Every rank publishes its host identity (hostname + boot id) and reads
// every other rank's: the ranks of one host form a node, nodes ordered by
// their lowest rank. The lowest rank of each node writes a fresh nonce for
// its node's communicator. A rank that never comes fails every rank, each at
// its own wait, with the same message naming the missing ranks.
struct Placement {
  Options local;       // the communicator of this rank's node
  NodeLayout layout;   // every rank's node
  std::string prefix;  // "shmring/<generation>/"
};

Placement rendezvous(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout) {
  TORCH_CHECK(store, "shmring backend: no store given to the process group");
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "shmring backend: rank ", rank,
              " is not in [0, ", size, ")");
  const std::int64_t arrival = store->add("shmring/arrivals", 1);
  const std::int64_t generation = (arrival - 1) / size;
  const std::string prefix = "shmring/" + std::to_string(generation) + "/";
  auto host_key = [&](int r) { return prefix + "host/" + std::to_string(r); };
  const std::string host = host_identity();
  // "pid host": the pid lets the ranks of a node tell which one died.
  const std::string entry = std::to_string(getpid()) + " " + host;
  store->set(host_key(rank), std::vector<std::uint8_t>(entry.begin(), entry.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(host_key(r));
  const std::chrono::milliseconds wait_ms = timeout.count() > 0 ? timeout : store->getTimeout();
  try {
    store->wait(keys, wait_ms);
  } catch (const std::exception&) {
    std::string missing;
    for (int r = 0; r < size; ++r)
      if (!store->check({host_key(r)}))
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    TORCH_CHECK(false, "shmring backend: rank ", rank, " gave up after ", wait_ms.count(),
                " ms waiting for rank(s) ", missing.empty() ? "?" : missing,
                " to join the group (generation ", generation, " of its store)");
  }
  Placement p;
  p.prefix = prefix;
  NodeLayout& layout = p.layout;
  layout.node_of.resize(static_cast<std::size_t>(size));
  layout.local_of.resize(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    const std::vector<std::uint8_t> bytes = store->get(host_key(r));
    const std::string value(bytes.begin(), bytes.end());
    const auto space = value.find(' ');
    TORCH_CHECK(space != std::string::npos, "shmring backend: store key ", host_key(r), " holds '",
                value, "', not a shmring host entry");
    const std::string theirs = value.substr(space + 1);
    layout.pids.push_back(std::atoi(value.substr(0, space).c_str()));
    auto it = std::find(layout.hosts.begin(), layout.hosts.end(), theirs);
    if (it == layout.hosts.end()) {
      layout.hosts.push_back(theirs);
      layout.nodes.emplace_back();
      it = layout.hosts.end() - 1;
    }
    const auto node = static_cast<std::size_t>(it - layout.hosts.begin());
    layout.node_of[static_cast<std::size_t>(r)] = static_cast<int>(node);
    layout.local_of[static_cast<std::size_t>(r)] = static_cast<int>(layout.nodes[node].size());
    layout.nodes[node].push_back(r);
  }
  const auto node = static_cast<std::size_t>(layout.node_of[static_cast<std::size_t>(rank)]);
  const std::vector<int>& mine = layout.nodes[node];
  const std::string key = prefix + "nonce/" + std::to_string(node);
  std::string nonce;
  if (mine[0] == rank) {
    nonce = random_nonce();
    store->set(key, std::vector<std::uint8_t>(nonce.begin(), nonce.end()));
  } else {
    const std::vector<std::uint8_t> bytes = store->get(key);
    nonce.assign(bytes.begin(), bytes.end());
  }
  Options& options = p.local;
  options.rank = layout.local_of[static_cast<std::size_t>(rank)];
  options.world_size = static_cast<int>(mine.size());
  options.job_id = "torch-" + job_tag() + nonce;
  // The communicator spans one host by construction: all its ranks are local.
  options.local_rank = options.rank;
  options.local_world_size = options.world_size;
  if (std::getenv("SHMRING_TIMEOUT") == nullptr && timeout.count() > 0) {
    options.timeout_s = static_cast<double>(timeout.count()) / 1000.0;
  }
  return p;
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

// The datatype a tensor's elements move as, and how many of its elements
// one tensor element is (1, or the element size when it moves as bytes).
struct MoveType {
  DataType dtype;
  std::size_t per_element;
};

MoveType move_type(const at::Tensor& tensor, const char* op) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong:
      return {to_datatype(tensor.scalar_type(), op), 1};
    default:
      return {DataType::uint8, static_cast<std::size_t>(tensor.element_size())};
  }
}

Raw raw_of(const at::Tensor& contiguous, const char* op) {
  const MoveType m = move_type(contiguous, op);
  return {contiguous.data_ptr(), static_cast<std::size_t>(contiguous.numel()) * m.per_element,
          m.dtype};
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

// Set when launch() hands a call to shmring (whose own refusals reach the
// peers by themselves); a Refusal sees whether an error came before that.
thread_local bool t_launched = false;
// Counts and displacements (in elements of the move type) of a
// v-collective; the Start lambda holds a copy (the i-calls copy the spans).
struct Layout {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
};

std::vector<std::size_t> packed_displs(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> displs(counts.size());
  std::size_t offset = 0;
  for (std::size_t j = 0; j < counts.size(); ++j) {
    displs[j] = offset;
    offset += counts[j];
  }
  return displs;
}

bool all_equal(const std::vector<std::size_t>& v) {
  return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<>()) == v.end();
}

std::vector<std::size_t> numels(const std::vector<at::Tensor>& tensors, std::size_t per_element) {
  std::vector<std::size_t> out;
  for (const auto& t : tensors) out.push_back(static_cast<std::size_t>(t.numel()) * per_element);
  return out;
}

// The tensors of a list, in order, as one contiguous 1-D tensor (a copy).
at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> views;
  for (const auto& t : tensors) views.push_back(t.reshape({-1}));
  return at::cat(views);
}

// Copies consecutive pieces of `flat` into `outputs`, in order.
std::function<void()> unflatten_into(at::Tensor flat, std::vector<at::Tensor> outputs) {
  return [flat = std::move(flat), outputs = std::move(outputs)] {
    std::int64_t offset = 0;
    for (const auto& o : outputs) {
      o.copy_(flat.narrow(0, offset, o.numel()).view(o.sizes()));
      offset += o.numel();
    }
  };
}

// A list of `size` tensors of one dtype (`like`'s), each checked.
void check_list(const std::vector<at::Tensor>& list, int size, const at::Tensor& like,
                const char* op, const char* what) {
  TORCH_CHECK(static_cast<int>(list.size()) == size, "shmring backend: ", op, ": the ", what,
              " list has ", list.size(), " tensors, expected the group size ", size);
  for (const auto& t : list) {
    check_tensor(t, op, what);
    TORCH_CHECK(t.scalar_type() == like.scalar_type(), "shmring backend: ", op, ": an ", what,
                " tensor has dtype ", dtype_name(t.scalar_type()), ", expected ",
                dtype_name(like.scalar_type()));
  }
}

// Elements (of the move type) per peer of one side of all_to_all_single:
// dim 0 split evenly over the group when `splits` is empty, else by the
// split sizes (rows of dim 0), as torch defines them.
std::vector<std::size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits,
                                      int size, std::size_t per_element, const char* op,
                                      const char* what) {
  TORCH_CHECK(t.dim() >= 1, "shmring backend: ", op, ": the ", what,
              " tensor is 0-dimensional; its dim 0 is split over the group");
  const std::int64_t rows = t.size(0);
  const std::size_t row = rows > 0 ? static_cast<std::size_t>(t.numel() / rows) * per_element : 0;
  std::vector<std::size_t> counts(static_cast<std::size_t>(size));
  if (splits.empty()) {
    TORCH_CHECK(rows % size == 0, "shmring backend: ", op, ": the ", what, " tensor has ", rows,
                " rows (dim 0), not a multiple of the group size ", size,
                "; give split sizes for uneven splits");
    std::fill(counts.begin(), counts.end(), static_cast<std::size_t>(rows / size) * row);
    return counts;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == size, "shmring backend: ", op, ": ", what,
              " split sizes have ", splits.size(), " entries, expected the group size ", size);
  std::int64_t sum = 0;
  for (std::size_t j = 0; j < splits.size(); ++j) {
    TORCH_CHECK(splits[j] >= 0, "shmring backend: ", op, ": ", what, " split size ", j, " is ",
                splits[j], ", expected >= 0");
    sum += splits[j];
    counts[j] = static_cast<std::size_t>(splits[j]) * row;
  }
  TORCH_CHECK(sum == rows, "shmring backend: ", op, ": ", what, " split sizes sum to ", sum,
              " but the ", what, " tensor has ", rows, " rows (dim 0)");
  return counts;
}

}  // namespace

// Guards one collective entry point: an exception leaving it before launch()
// reached shmring (a TORCH_CHECK refusal, an allocation failure) is told to
// the peers as this rank's refusal of the call. A guard rather than a
// try/catch around each body: the refusal must not depend on which check
// threw, and the exception itself goes on unchanged. Collectives only:
// send/recv are not in the collective order, so their refusals stay local.
class Refusal {
 public:
  Refusal(ProcessGroupShmring& pg, const char* op)
      : pg_(pg), op_(op), unwinding_(std::uncaught_exceptions()) {
    t_launched = false;
  }
  ~Refusal() {
    if (std::uncaught_exceptions() > unwinding_ && !t_launched) pg_.refuse(op_);
  }
  Refusal(const Refusal&) = delete;
  Refusal& operator=(const Refusal&) = delete;

 private:
  ProcessGroupShmring& pg_;
  const char* op_;
  const int unwinding_;
};

void ProcessGroupShmring::refuse(const char* op) noexcept {
  try {
    std::lock_guard<std::mutex> lock(call_mutex_);
    if (!comm_) return;  // shut down: no peer is waiting for this call
    comm_->reject_call(op, "refused by the torch backend (this rank's RuntimeError says why)");
  } catch (...) {
    // Published (reject_call always throws), or the group is already broken
    // and its peers know: either way the caller's error is the one to raise.
  }
}

ProcessGroupShmring::ProcessGroupShmring(const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                         int size, std::chrono::milliseconds timeout)
    : BackendBase(rank, size) {
  Placement p = rendezvous(store, rank, size, timeout);
  if (p.layout.nodes.size() == 1) {
    // One host: one communicator, no gloo.
    comm_ = std::make_unique<Communicator>(p.local);
    job_id_ = comm_->config().job_id;
    return;
  }
#if SHMRING_TORCH_GLOO
  cross_ = std::make_unique<CrossNode>(store, p.prefix, rank, size, timeout, std::move(p.layout),
                                       std::make_unique<Communicator>(p.local));
  job_id_ = cross_->job_id();
#else
  const int other = p.layout.nodes[1][0];
  TORCH_CHECK(false, "shmring backend: rank ", other, " runs on host ", p.layout.hosts[1],
              " but rank 0 on ", p.layout.hosts[0],
              "; this build of the backend has no gloo (libgloo-dev) for groups across hosts, so "
              "every rank of a shmring group must be on one host");
#endif
}

ProcessGroupShmring::~ProcessGroupShmring() {
  release(false);
}

void ProcessGroupShmring::shutdown() {
  release(true);
}

void ProcessGroupShmring::release(bool leave) {
  // Completing what is still queued, and dropping the last reference to a
  // Work's tensors, may need the GIL on a completion thread (Python future
  // callbacks; tensors with a Python object); Python may be dropping the
  // last reference to this group with the GIL held.
  std::optional<pybind11::gil_scoped_release> no_gil;
  if (Py_IsInitialized() && PyGILState_Check()) no_gil.emplace();
#if SHMRING_TORCH_GLOO
  if (cross_) {
    cross_->shutdown(leave ? std::chrono::milliseconds(kLeaveWait) : std::chrono::milliseconds(0));
    return;
  }
#endif
  std::unique_ptr<Communicator> comm;
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    if (comm_ && leave) {
      // Queued behind the pending collectives: they complete first.
      try {
        Request left = comm_->ibarrier();
        if (!left.wait_for(kLeaveWait))
          comm_->abort("rank " + std::to_string(rank_) + " destroyed the process group after " +
                       std::to_string(kLeaveWait.count()) + " s without its peers");
      } catch (...) {
        // A broken group: its peers know, and there is nothing to wait for.
      }
    }
    comm.swap(comm_);
  }
  comm.reset();         // completes or fails every request: their Works reach the completions
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
    TORCH_CHECK(comm_, "shmring backend: ", title,
                ": the process group was destroyed (destroy_process_group)");
    try {
      t_launched = true;
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
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->allreduce(tensors, opts);
#endif
  static constexpr const char* kOp = "allreduce";
  Refusal refusal(*this, kOp);
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
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->allreduce_coalesced(tensors, opts);
#endif
  static constexpr const char* kOp = "allreduce_coalesced";
  Refusal refusal(*this, kOp);
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
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->broadcast(tensors, opts);
#endif
  static constexpr const char* kOp = "broadcast";
  Refusal refusal(*this, kOp);
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
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->reduce(tensors, opts);
#endif
  static constexpr const char* kOp = "reduce";
  Refusal refusal(*this, kOp);
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
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->allgather(output_tensors, input_tensors);
#endif
  static constexpr const char* kOp = "allgather";
  Refusal refusal(*this, kOp);
  const at::Tensor& input = single_tensor(input_tensors, kOp, "input");
  TORCH_CHECK(output_tensors.size() == 1, "shmring backend: ", kOp,
              " takes one output list per process, got ", output_tensors.size());
  std::vector<at::Tensor>& outputs = output_tensors[0];
  check_list(outputs, size_, input, kOp, "output");
  TORCH_CHECK(outputs[static_cast<std::size_t>(rank_)].numel() == input.numel(),
              "shmring backend: ", kOp, ": output tensor ", rank_, " (this rank's) has ",
              outputs[static_cast<std::size_t>(rank_)].numel(), " elements, but the input has ",
              input.numel());
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
                  unflatten_into(flat, outputs), [=](Communicator& c) {
                    return c.iallgather(send.data, recv, send.count, send.dtype);
                  });
  }
  layout.recv_displs = packed_displs(layout.recv_counts);
  return launch(::c10d::OpType::ALLGATHER, "shmring:all_gather", outputs, {in.buffer, flat},
                unflatten_into(flat, outputs), [=](Communicator& c) {
                  return c.iallgatherv(send.data, send.count, recv, layout.recv_counts,
                                       layout.recv_displs, send.dtype);
                });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::_allgather_base(
    at::Tensor& output_buffer, at::Tensor& input_buffer, const ::c10d::AllgatherOptions& /*opts*/) {
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->allgather_base(output_buffer, input_buffer);
#endif
  static constexpr const char* kOp = "_allgather_base";
  Refusal refusal(*this, kOp);
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
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->reduce_scatter(output_tensors, input_tensors, opts);
#endif
  static constexpr const char* kOp = "reduce_scatter";
  Refusal refusal(*this, kOp);
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
                  {flat, out.buffer}, copy_back({out}),
                  [=](Communicator& c) { return c.ireduce_scatter(send, recv, count, dtype, op); });
  }
  return launch(::c10d::OpType::REDUCE_SCATTER, "shmring:reduce_scatter", output_tensors,
                {flat, out.buffer}, copy_back({out}), [=](Communicator& c) {
                  return c.ireduce_scatter_v(send, recv, layout.recv_counts, dtype, op);
                });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::_reduce_scatter_base(
    at::Tensor& output_buffer, at::Tensor& input_buffer, const ::c10d::ReduceScatterOptions& opts) {
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->reduce_scatter_base(output_buffer, input_buffer, opts);
#endif
  static constexpr const char* kOp = "_reduce_scatter_base";
  Refusal refusal(*this, kOp);
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
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->barrier();
#endif
  return launch(::c10d::OpType::BARRIER, "shmring:barrier", {}, {}, nullptr,
                [](Communicator& c) { return c.ibarrier(); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
    const ::c10d::AllgatherOptions&) {
  Refusal refusal(*this, "allgather_coalesced");
  unsupported("allgather_coalesced");
}

c10::intrusive_ptr<Work> ProcessGroupShmring::gather(
    std::vector<std::vector<at::Tensor>>& output_tensors, std::vector<at::Tensor>& input_tensors,
    const ::c10d::GatherOptions& opts) {
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->gather(output_tensors, input_tensors, opts);
#endif
  Refusal refusal(*this, "gather");
  static constexpr const char* kOp = "gather";
  const at::Tensor& input = single_tensor(input_tensors, kOp, "input");
  const int root = static_cast<int>(opts.rootRank);
  check_root(root, 0, size_, kOp);
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
                unflatten_into(flat, outputs), [=](Communicator& c) {
                  return c.igather(send.data, recv, send.count, send.dtype, root);
                });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::scatter(
    std::vector<at::Tensor>& output_tensors, std::vector<std::vector<at::Tensor>>& input_tensors,
    const ::c10d::ScatterOptions& opts) {
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->scatter(output_tensors, input_tensors, opts);
#endif
  Refusal refusal(*this, "scatter");
  static constexpr const char* kOp = "scatter";
  const at::Tensor& output = single_tensor(output_tensors, kOp, "output");
  const int root = static_cast<int>(opts.rootRank);
  check_root(root, 0, size_, kOp);
  Staged out = stage_output(output);
  const MoveType m = move_type(output, kOp);
  void* recv = out.buffer.data_ptr();
  const std::size_t count = static_cast<std::size_t>(output.numel()) * m.per_element;
  const DataType dtype = m.dtype;
  if (rank_ != root) {
    TORCH_CHECK(input_tensors.empty(), "shmring backend: ", kOp, ": rank ", rank_,
                " is not the root (", root, ") but was given an input list");
    return launch(::c10d::OpType::SCATTER, "shmring:scatter", output_tensors, {out.buffer},
                  copy_back({out}),
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
                copy_back({out}),
                [=](Communicator& c) { return c.iscatter(send, recv, count, dtype, root); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::alltoall_base(
    at::Tensor& output_buffer, at::Tensor& input_buffer, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const ::c10d::AllToAllOptions& /*opts*/) {
#if SHMRING_TORCH_GLOO
  if (cross_)
    return cross_->alltoall_base(output_buffer, input_buffer, output_split_sizes,
                                 input_split_sizes);
#endif
  Refusal refusal(*this, "alltoall_base");
  static constexpr const char* kOp = "all_to_all_single";
  check_tensor(input_buffer, kOp, "input");
  check_tensor(output_buffer, kOp, "output");
  TORCH_CHECK(output_buffer.scalar_type() == input_buffer.scalar_type(), "shmring backend: ", kOp,
              ": the output has dtype ", dtype_name(output_buffer.scalar_type()), ", expected ",
              dtype_name(input_buffer.scalar_type()));
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
                {in.buffer, out.buffer}, copy_back({out}), [=](Communicator& c) {
                  return c.ialltoallv(send, layout.send_counts, layout.send_displs, recv,
                                      layout.recv_counts, layout.recv_displs, dtype);
                });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::alltoall(std::vector<at::Tensor>& output_tensors,
                                                       std::vector<at::Tensor>& input_tensors,
                                                       const ::c10d::AllToAllOptions& /*opts*/) {
#if SHMRING_TORCH_GLOO
  if (cross_) return cross_->alltoall(output_tensors, input_tensors);
#endif
  Refusal refusal(*this, "alltoall");
  static constexpr const char* kOp = "all_to_all";
  TORCH_CHECK(static_cast<int>(input_tensors.size()) == size_, "shmring backend: ", kOp,
              ": the input list has ", input_tensors.size(), " tensors, expected the group size ",
              size_);
  const at::Tensor& like = input_tensors[0];
  check_list(input_tensors, size_, like, kOp, "input");
  check_list(output_tensors, size_, like, kOp, "output");
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
  return launch(::c10d::OpType::ALLTOALL, "shmring:all_to_all", output_tensors, {flat_in, flat_out},
                unflatten_into(flat_out, output_tensors), [=](Communicator& c) {
                  return c.ialltoallv(send, layout.send_counts, layout.send_displs, recv,
                                      layout.recv_counts, layout.recv_displs, dtype);
                });
}

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
      ::c10d::OpType::RECV, "shmring:recv", tensors, {s.buffer}, copy_back({s}),
      [=](Communicator& c) { return c.irecv(raw.data, raw.count, raw.dtype, src_rank, tag); });
}

c10::intrusive_ptr<Work> ProcessGroupShmring::recvAnysource(std::vector<at::Tensor>&, int) {
  unsupported("recv from any source (recvAnysource)");
}

}  // namespace shmring::torch_backend
