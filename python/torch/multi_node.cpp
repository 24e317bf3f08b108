// CrossNode's setup and executor (multi_node.hpp): the gloo groups between
// hosts, WorkTask, shutdown, and the queue that runs each collective's
// stages in call order. Failure handling is in multi_node_fail.cpp, the
// reductions and their hierarchical stages in multi_node_reduce.cpp, the
// data movement and point-to-point in multi_node_move.cpp.
#include "multi_node.hpp"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/debug.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
// The header declares ProcessGroupGloo only for a torch built with gloo
// (python3-torch is); meson checked that gloo's headers are there.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <utility>

#include "convert.hpp"
#include "shmring/error.hpp"
#include "shmring/settings.hpp"

namespace shmring::torch_backend {
namespace {

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

}  // namespace

WorkTask::WorkTask(int rank, ::c10d::OpType type, const char* title, std::vector<at::Tensor> result)
    : Work(rank, type, title, result),  // torch.profiler shapes (work.cpp)
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
      check_calls_(::c10d::debug_level() == ::c10d::DebugLevel::Detail),
      layout_(std::move(layout)),
      node_(layout_.node_of[static_cast<std::size_t>(rank)]),
      local_(layout_.local_of[static_cast<std::size_t>(rank)]),
      shard_bytes_(kShardBytes),
      timeout_(timeout.count() > 0 ? timeout : store->getTimeout()),
      store_(store),
      prefix_(prefix),
      job_id_(local->config().job_id),
      comm_(std::move(local)) {
  // The library's one table and parser (shmring/settings.hpp).
  if (const auto v = settings::bytes("SHMRING_TORCH_SHARD_BYTES"))
    shard_bytes_ = static_cast<std::size_t>(*v);
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
    ++submitted_;
    queue_.emplace_back(work, std::move(body));
  }
  cv_.notify_all();
  return work;
}

void CrossNode::run() {
  pthread_setname_np(pthread_self(), "shmring-xnode");
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
      } catch (const CallMismatch&) {
        error = std::current_exception();  // every rank's, before anything moved
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

}  // namespace shmring::torch_backend
