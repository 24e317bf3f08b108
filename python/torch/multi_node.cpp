#include "multi_node.hpp"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
// The header declares ProcessGroupGloo only for a torch built with gloo
// (python3-torch is); meson checked that gloo's headers are there.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <utility>

#include "convert.hpp"
#include "shmring/error.hpp"

namespace shmring::torch_backend {
namespace {

std::string describe(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

// The interface gloo's connections use: GLOO_SOCKET_IFNAME (its first
// name), as torch's own gloo groups read it, else the host name's address.
std::shared_ptr<::gloo::transport::Device> gloo_device() {
  const char* names = std::getenv("GLOO_SOCKET_IFNAME");
  if (names != nullptr && *names != '\0') {
    std::string first(names);
    first = first.substr(0, first.find(','));
    return ::c10d::ProcessGroupGloo::createDeviceForInterface(first);
  }
  return ::c10d::ProcessGroupGloo::createDefaultDevice();
}

c10::intrusive_ptr<BackendBase> make_gloo(const c10::intrusive_ptr<::c10d::Store>& store,
                                          const std::string& prefix, int rank, int size,
                                          std::chrono::milliseconds timeout) {
  auto options = ::c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(gloo_device());
  options->threads = 2;
  auto prefixed = c10::make_intrusive<::c10d::PrefixStore>(prefix, store);
  return c10::make_intrusive<::c10d::ProcessGroupGloo>(prefixed, rank, size, options);
}

// False once `pid` has exited (gone, or a zombie its parent has not reaped).
bool process_alive(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return true;
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

bool is_16bit(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16;
}

// A uint8 tensor over the bytes of contiguous `t`, keeping `t` alive.
at::Tensor bytes_of(const at::Tensor& t) {
  const auto n = static_cast<std::int64_t>(t.numel() * t.element_size());
  return at::from_blob(
      t.data_ptr(), {n}, [keep = t](void*) {}, at::TensorOptions().dtype(at::kByte));
}

// Checks a reduction's dtype and operator; returns the operator the stages
// run (AVG is a sum, divided by the group size at the end).
::c10d::ReduceOp stage_op(const at::Tensor& t, const ::c10d::ReduceOp& op, const char* name) {
  to_datatype(t.scalar_type(), name);
  to_reduce_op(op, name);
  if (reduce_op_kind(op) == ::c10d::ReduceOp::AVG) {
    TORCH_CHECK(at::isFloatingType(t.scalar_type()), "shmring backend: ", name,
                ": AVG needs a floating dtype, got ", dtype_name(t.scalar_type()),
                "; use SUM and divide");
    return ::c10d::ReduceOp(::c10d::ReduceOp::SUM);
  }
  return op;
}

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

void check_root(int root, int size, const char* op) {
  TORCH_CHECK(root >= 0 && root < size, "shmring backend: ", op, ": root rank ", root,
              " is not in [0, ", size, ")");
}

// Copies consecutive pieces of flat `src` into `outputs`.
void unflatten(const at::Tensor& src, const std::vector<at::Tensor>& outputs) {
  std::int64_t offset = 0;
  for (const auto& o : outputs) {
    o.copy_(src.narrow(0, offset, o.numel()).view(o.sizes()));
    offset += o.numel();
  }
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> views;
  for (const auto& t : tensors) views.push_back(t.reshape({-1}));
  return at::cat(views);
}

}  // namespace

WorkTask::WorkTask(int rank, ::c10d::OpType type, const char* title, std::vector<at::Tensor> result)
    : Work(rank, type, title),
      title_(title),
      result_(std::move(result)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors())) {}

void WorkTask::finish_future(std::exception_ptr error) {
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(result_));
  }
}

CrossNode::CrossNode(const c10::intrusive_ptr<::c10d::Store>& store, const std::string& prefix,
                     int rank, int size, std::chrono::milliseconds timeout, NodeLayout layout,
                     std::unique_ptr<Communicator> local)
    : rank_(rank),
      size_(size),
      layout_(std::move(layout)),
      node_(layout_.node_of[static_cast<std::size_t>(rank)]),
      local_(layout_.local_of[static_cast<std::size_t>(rank)]),
      shard_bytes_(kShardBytes),
      timeout_(timeout.count() > 0 ? timeout : store->getTimeout()),
      store_(store),
      prefix_(prefix),
      job_id_(local->config().job_id),
      comm_(std::move(local)) {
  if (const char* v = std::getenv("SHMRING_TORCH_SHARD_BYTES")) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    TORCH_CHECK(end != v && *end == '\0', "shmring backend: SHMRING_TORCH_SHARD_BYTES='", v,
                "': expected a number of bytes");
    shard_bytes_ = static_cast<std::size_t>(n);
  }
  const int nnodes = static_cast<int>(layout_.nodes.size());
  // Every rank makes the groups it belongs to in the same order: world,
  // leaders, shard (gloo's connection setup is collective per group).
  world_ = make_gloo(store, prefix_ + "gloo/world/", rank_, size_, timeout_);
  if (local_ == 0)
    make_gloo(store, prefix_ + "gloo/leaders/", node_, nnodes, timeout_).swap(leaders_);
  if (layout_.equal() && layout_.nodes[0].size() > 1 &&
      shard_bytes_ != std::numeric_limits<std::size_t>::max())
    shard_ = make_gloo(store, prefix_ + "gloo/shard/" + std::to_string(local_) + "/", node_, nnodes,
                       timeout_);
  executor_ = std::thread([this] { run(); });
}

CrossNode::~CrossNode() {
  shutdown(std::chrono::milliseconds(0));
}

void CrossNode::shutdown(std::chrono::milliseconds wait) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (released_) return;
    released_ = true;
  }
  // The peers' last collectives may still need this rank: a barrier queued
  // behind them, bounded by `wait`.
  if (wait.count() > 0) {
    c10::intrusive_ptr<Work> last;
    try {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (broken_.empty()) {
          auto work = c10::make_intrusive<WorkTask>(rank_, ::c10d::OpType::BARRIER, "shmring:leave",
                                                    std::vector<at::Tensor>{});
          queue_.emplace_back(work, [this, wait] {
            ::c10d::BarrierOptions opts;
            opts.timeout = wait;
            std::lock_guard<std::mutex> g(gloo_mutex_);
            if (world_) gloo_wait(world_->barrier(opts));
          });
          last = work;
        }
      }
      cv_.notify_all();
      if (last) last->wait();
    } catch (...) {
      // A broken group, or peers that never came: nothing more to wait for.
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (executor_.joinable()) executor_.join();
  {
    std::lock_guard<std::mutex> g(gloo_mutex_);
    leaders_.reset();
    shard_.reset();
    world_.reset();
  }
  comm_.reset();
  completions_.stop();
}

c10::intrusive_ptr<Work> CrossNode::submit(::c10d::OpType type, const char* title,
                                           std::vector<at::Tensor> result, Body body) {
  auto work = c10::make_intrusive<WorkTask>(rank_, type, title, std::move(result));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!released_, "shmring backend: ", title,
                ": the process group was destroyed (destroy_process_group)");
    TORCH_CHECK(broken_.empty(), "shmring backend: ", title,
                ": the process group is unusable after an earlier error: ", broken_);
    queue_.emplace_back(work, std::move(body));
  }
  cv_.notify_all();
  return work;
}

void CrossNode::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto [work, body] = std::move(queue_.front());
    queue_.pop_front();
    const bool broken = !broken_.empty();
    const std::string reason = broken_;
    lock.unlock();
    std::exception_ptr error;
    if (broken) {
      error = std::make_exception_ptr(
          std::runtime_error("shmring backend: the process group is unusable after an earlier "
                             "error: " +
                             reason));
    } else {
      try {
        body();
      } catch (...) {
        error = fail(work->title(), std::current_exception());
      }
    }
    work->finish_work(error);
    // The future (whose callbacks may issue and wait for collectives) and
    // the last references to the body's tensors go to a completion thread.
    completions_.push([work = std::move(work), body = std::move(body), error]() mutable {
      work->finish_future(error);
      body = nullptr;
      work.reset();
    });
    lock.lock();
  }
}

std::exception_ptr CrossNode::fail(const std::string& op, std::exception_ptr error) {
  const std::string mine = describe(std::move(error));
  const std::string here = "shmring backend: rank " + std::to_string(rank_) + ": " + op + ": ";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_.empty()) broken_ = here + mine;
  }
  // First tell everyone: the node's ranks through the communicator, the
  // other nodes through gloo's closed connections (now, not at their
  // timeout). Every rank that fails does the same, so the failure spreads
  // across every node in a few hops.
  try {
    comm_->abort(here + mine);
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> g(gloo_mutex_);
    leaders_.reset();
    shard_.reset();
    world_.reset();
  }
  // Then say why. A closed connection or an abort does not say which rank
  // died; the ranks of the dead one's node can see it (its process is gone
  // or a zombie) and publish it in the store for the others. A rank alone
  // on its node has no one to see it: every failing rank reports in, and
  // one that has not within kDeathNotice is named instead.
  try {
    store_->set(prefix_ + "reported/" + std::to_string(rank_), std::vector<std::uint8_t>{1});
  } catch (...) {
  }
  const std::string dead_key = prefix_ + "dead";
  std::string dead;
  for (int r : layout_.nodes[static_cast<std::size_t>(node_)]) {
    const int pid = layout_.pids[static_cast<std::size_t>(r)];
    if (r == rank_ || process_alive(pid)) continue;
    dead += std::string(dead.empty() ? "" : "; ") + "rank " + std::to_string(r) + " (pid " +
            std::to_string(pid) + " on host " + layout_.hosts[static_cast<std::size_t>(node_)] +
            ") died";
  }
  try {
    if (!dead.empty()) {
      store_->set(dead_key, std::vector<std::uint8_t>(dead.begin(), dead.end()));
    } else {
      store_->wait({dead_key}, kDeathNotice);
      const auto bytes = store_->get(dead_key);
      dead.assign(bytes.begin(), bytes.end());
    }
  } catch (...) {
    // No rank of a node with peers died (a timeout, a mismatch, or a rank
    // alone on its node), or the store is gone with it.
  }
  if (dead.empty()) {
    try {
      for (int r = 0; r < size_; ++r) {
        if (store_->check({prefix_ + "reported/" + std::to_string(r)})) continue;
        const auto node = static_cast<std::size_t>(layout_.node_of[static_cast<std::size_t>(r)]);
        dead += std::string(dead.empty() ? "" : "; ") + "rank " + std::to_string(r) + " (pid " +
                std::to_string(layout_.pids[static_cast<std::size_t>(r)]) + " on host " +
                layout_.hosts[node] + ") died or hangs: it did not report within " +
                std::to_string(kDeathNotice.count()) + " ms of the failure";
      }
    } catch (...) {
    }
  }
  const std::string message =
      dead.empty() ? here + mine : here + dead + " (this rank saw: " + mine + ")";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    broken_ = message;
  }
  return std::make_exception_ptr(std::runtime_error(message));
}

void CrossNode::local_wait(Request request) {
  request.wait();
}

void CrossNode::gloo_wait(const c10::intrusive_ptr<Work>& work) {
  work->wait();
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

void CrossNode::allreduce_flat(const at::Tensor& buf, const ::c10d::ReduceOp& op) {
  const auto count = static_cast<std::size_t>(buf.numel());
  if (count == 0) return;
  const DataType dtype = to_datatype(buf.scalar_type(), "allreduce");
  const ReduceOp sop = to_reduce_op(op, "allreduce");
  const int local_size = static_cast<int>(layout_.nodes[static_cast<std::size_t>(node_)].size());
  const std::size_t bytes = count * static_cast<std::size_t>(buf.element_size());
  void* data = buf.data_ptr();
  ::c10d::AllreduceOptions gopts;
  gopts.reduceOp = op;
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
    std::vector<at::Tensor> one{shard};
    gloo_wait(shard_->allreduce(one, gopts));
    local_wait(comm_->iallgatherv(shard.data_ptr(), shard.numel(), data, counts, displs, dtype));
    return;
  }
  // Reduce to the node's leader, allreduce among the leaders, broadcast in
  // the node.
  local_wait(comm_->ireduce(data, data, count, dtype, sop, 0));
  if (leaders_) {
    std::vector<at::Tensor> one{buf};
    gloo_wait(leaders_->allreduce(one, gopts));
  }
  local_wait(comm_->ibroadcast(data, count, dtype, 0));
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
  const ::c10d::ReduceOp op = stage_op(tensor, opts.reduceOp, kOp);
  const bool avg = reduce_op_kind(opts.reduceOp) == ::c10d::ReduceOp::AVG;
  const int size = size_;
  return submit(::c10d::OpType::ALLREDUCE, "shmring:all_reduce", tensors, [=, this] {
    at::Tensor buf = widened(tensor);
    allreduce_flat(buf, op);
    if (avg) buf.div_(size);
    if (!buf.is_same(tensor)) tensor.copy_(buf);  // 16-bit: the one rounding
  });
}

c10::intrusive_ptr<Work> CrossNode::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  static constexpr const char* kOp = "allreduce_coalesced";
  TORCH_CHECK(!tensors.empty(), "shmring backend: ", kOp, " got an empty tensor list");
  for (const auto& t : tensors) {
    check_tensor(t, kOp, "input");
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "shmring backend: ", kOp,
                ": tensors must share one dtype, got ", dtype_name(tensors[0].scalar_type()),
                " and ", dtype_name(t.scalar_type()));
  }
  const ::c10d::ReduceOp op = stage_op(tensors[0], opts.reduceOp, kOp);
  const bool avg = reduce_op_kind(opts.reduceOp) == ::c10d::ReduceOp::AVG;
  const int size = size_;
  std::vector<at::Tensor> ts = tensors;
  return submit(::c10d::OpType::ALLREDUCE_COALESCED, "shmring:allreduce_coalesced", tensors,
                [=, this] {
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
  // An allreduce of which only the root keeps the result.
  return submit(::c10d::OpType::REDUCE, "shmring:reduce", tensors, [=, this] {
    at::Tensor buf = is_16bit(tensor.scalar_type()) ? widened(tensor) : tensor.contiguous().clone();
    allreduce_flat(buf, op);
    if (avg) buf.div_(size);
    if (mine) tensor.copy_(buf);
  });
}

c10::intrusive_ptr<Work> CrossNode::broadcast(std::vector<at::Tensor>& tensors,
                                              const ::c10d::BroadcastOptions& opts) {
  static constexpr const char* kOp = "broadcast";
  const at::Tensor tensor = single_tensor(tensors, kOp, "input");
  const int root = static_cast<int>(opts.rootRank);
  check_root(root, size_, kOp);
  TORCH_CHECK(opts.rootTensor == 0, "shmring backend: ", kOp, ": root tensor index ",
              opts.rootTensor, " given, but there is one tensor per process (index 0)");
  return submit(::c10d::OpType::BROADCAST, "shmring:broadcast", tensors, [=, this] {
    at::Tensor buf = tensor.contiguous();
    broadcast_bytes(buf.data_ptr(), static_cast<std::size_t>(buf.numel() * buf.element_size()),
                    root);
    if (!buf.is_same(tensor)) tensor.copy_(buf);
  });
}

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
  TORCH_CHECK(outputs[static_cast<std::size_t>(rank_)].numel() == input.numel(),
              "shmring backend: ", kOp, ": output tensor ", rank_, " (this rank's) has ",
              outputs[static_cast<std::size_t>(rank_)].numel(), " elements, but the input has ",
              input.numel());
  const int rank = rank_;
  const bool blocks = layout_.equal() && std::all_of(outputs.begin(), outputs.end(), [&](auto& o) {
                        return o.numel() == input.numel();
                      });
  return submit(::c10d::OpType::ALLGATHER, "shmring:all_gather", outputs, [=, this] {
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
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "shmring backend: ", kOp,
              ": the output has dtype ", dtype_name(output.scalar_type()), ", expected ",
              dtype_name(input.scalar_type()));
  TORCH_CHECK(output.numel() == size_ * input.numel(), "shmring backend: ", kOp,
              ": the output has ", output.numel(), " elements, expected ", size_ * input.numel());
  const int rank = rank_;
  at::Tensor out = output, in = input;
  const bool blocks = layout_.equal();
  return submit(::c10d::OpType::_ALLGATHER_BASE, "shmring:_all_gather_base", {output}, [=, this] {
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

c10::intrusive_ptr<Work> CrossNode::reduce_scatter(
    std::vector<at::Tensor>& output_tensors, std::vector<std::vector<at::Tensor>>& input_tensors,
    const ::c10d::ReduceScatterOptions& opts) {
  static constexpr const char* kOp = "reduce_scatter";
  const at::Tensor output = single_tensor(output_tensors, kOp, "output");
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
  // An allreduce of the whole list, of which each rank keeps its block.
  return submit(::c10d::OpType::REDUCE_SCATTER, "shmring:reduce_scatter", output_tensors,
                [=, this] {
                  at::Tensor buf = widened(flatten(inputs));
                  allreduce_flat(buf, op);
                  if (avg) buf.div_(size);
                  output.copy_(buf.narrow(0, offset, output.numel()).view(output.sizes()));
                });
}

c10::intrusive_ptr<Work> CrossNode::reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                        const ::c10d::ReduceScatterOptions& opts) {
  static constexpr const char* kOp = "_reduce_scatter_base";
  check_tensor(input, kOp, "input");
  check_tensor(output, kOp, "output");
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
  return submit(
      ::c10d::OpType::_REDUCE_SCATTER_BASE, "shmring:_reduce_scatter_base", {output}, [=, this] {
        at::Tensor buf = is_16bit(in.scalar_type()) ? widened(in) : in.contiguous().clone();
        buf = buf.reshape({-1});
        allreduce_flat(buf, op);
        if (avg) buf.div_(size);
        out.copy_(buf.narrow(0, offset, out.numel()).view(out.sizes()));
      });
}

c10::intrusive_ptr<Work> CrossNode::barrier() {
  return submit(::c10d::OpType::BARRIER, "shmring:barrier", {}, [this] { barrier_stages(); });
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
    for (const auto& o : outputs)
      TORCH_CHECK(o.numel() == input.numel(), "shmring backend: ", kOp, ": an output tensor has ",
                  o.numel(), " elements, expected the input's ", input.numel());
  }
  const int size = size_;
  const bool mine = rank_ == root;
  return submit(::c10d::OpType::GATHER, "shmring:gather", outputs, [=, this] {
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
  return submit(::c10d::OpType::SCATTER, "shmring:scatter", output_tensors, [=, this] {
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
  return submit(::c10d::OpType::ALLTOALL_BASE, "shmring:all_to_all_single", {output},
                [=, this]() mutable {
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
  const std::vector<at::Tensor> ins = input_tensors, outs = output_tensors;
  return submit(::c10d::OpType::ALLTOALL, "shmring:all_to_all", output_tensors, [=, this] {
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
