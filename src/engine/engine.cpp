#include "engine/engine.hpp"

#include "algorithms/algorithms.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/log.hpp"
#include "base/settings.hpp"

namespace shmring {

// ---------------------------------------------------------------------------
// Running one collective: begin, the algorithm, end. Shared by blocking and
// non-blocking calls; the front has checked the arguments and chosen the
// algorithm.

void Communicator::Impl::run(const Op& o) {
  const CollectiveDesc& d = o.desc;
  if (d.kind == CollectiveKind::invalid) {
    publish_rejected(o.refusal ? *o.refusal : std::string());
    return;
  }
  current_bytes = o.bytes;
  call_queued_ns = o.queued_ns;
  begin(d);
  const bool direct = d.algorithm == Algorithm::direct;
  // World size 1: the result is the input; in-place calls have nothing to do.
  const bool copy_only = size == 1 && o.bytes > 0 && o.send != o.recv;
  switch (d.kind) {
    case CollectiveKind::allreduce:
      if (size == 1) {
        if (copy_only) copy(o.recv, o.send, o.bytes);
      } else if (d.algorithm == Algorithm::low_latency) {
        algo::allreduce_low_latency(*this, o.send, o.recv, d.count, d.dtype, d.op);
      } else if (direct) {
        algo::allreduce_direct(*this, o.send, o.recv, d.count, d.dtype, d.op);
      } else if (d.algorithm == Algorithm::two_shot) {
        if (o.bytes <= seg->direct_bytes())
          algo::allreduce_two_shot(*this, o.send, o.recv, d.count, d.dtype, d.op);
        else
          algo::allreduce_two_shot_rounds(*this, o.send, o.recv, d.count, d.dtype, d.op);
      } else {
        algo::allreduce_ring(*this, o.send, o.recv, d.count, d.dtype, d.op);
      }
      break;
    case CollectiveKind::reduce_scatter:
      if (size == 1) {
        if (copy_only) copy(o.recv, o.send, o.bytes);
      } else if (direct) {
        algo::reduce_scatter_direct(*this, o.send, o.recv, d.count, d.dtype, d.op);
      } else if (d.algorithm == Algorithm::staged) {
        // Equal blocks through reduce_scatter_v's rounds (16-bit types at
        // N > 2: no float64 partial leaves the registers).
        VectorArgs equal;
        equal.recv_counts.assign(static_cast<std::size_t>(size), d.count);
        algo::reduce_scatter_v_staged(*this, o.send, o.recv, equal, d.dtype, d.op);
      } else {
        algo::reduce_scatter_ring(*this, o.send, o.recv, d.count, d.dtype, d.op);
      }
      break;
    case CollectiveKind::allgather:
      if (size == 1) {
        if (copy_only) copy(o.recv, o.send, o.bytes);
      } else if (d.algorithm == Algorithm::low_latency) {
        algo::allgather_low_latency(*this, o.send, o.recv, d.count, d.dtype);
      } else if (direct) {
        algo::allgather_direct(*this, o.send, o.recv, d.count, d.dtype);
      } else if (d.algorithm == Algorithm::staged) {
        algo::allgather_staged(*this, o.send, o.recv, d.count, d.dtype);
      } else {
        algo::allgather_ring(*this, o.send, o.recv, d.count, d.dtype);
      }
      break;
    case CollectiveKind::broadcast:
      if (size > 1) {
        if (direct)
          algo::broadcast_direct(*this, o.recv, d.count, d.dtype, d.root);
        else
          algo::broadcast_chain(*this, o.recv, d.count, d.dtype, d.root);
      }
      break;
    case CollectiveKind::reduce:
      if (size == 1) {
        if (copy_only) copy(o.recv, o.send, o.bytes);
      } else if (direct) {
        algo::reduce_direct(*this, o.send, o.recv, d.count, d.dtype, d.op, d.root);
      } else if (d.algorithm == Algorithm::staged) {
        algo::reduce_staged(*this, o.send, o.recv, d.count, d.dtype, d.op, d.root);
      } else {
        algo::reduce_chain(*this, o.send, o.recv, d.count, d.dtype, d.op, d.root);
      }
      break;
    case CollectiveKind::barrier:
      if (size > 1) algo::barrier_low_latency(*this);
      break;
    // The staged collectives (staged.cpp; they handle world size 1 too).
    case CollectiveKind::alltoall:
      if (d.algorithm == Algorithm::low_latency)
        algo::alltoall_low_latency(*this, o.send, o.recv, d.count, d.dtype);
      else
        algo::alltoall_staged(*this, o.send, o.recv, d.count, d.dtype);
      break;
    case CollectiveKind::alltoallv:
      if (d.algorithm == Algorithm::low_latency)
        algo::alltoallv_low_latency(*this, o.send, o.recv, *o.v, d.dtype);
      else
        algo::alltoallv_staged(*this, o.send, o.recv, *o.v, d.dtype);
      break;
    case CollectiveKind::gather:
      algo::gather_staged(*this, o.send, o.recv, d.count, d.dtype, d.root);
      break;
    case CollectiveKind::scatter:
      algo::scatter_staged(*this, o.send, o.recv, d.count, d.dtype, d.root);
      break;
    case CollectiveKind::allgatherv:
      if (d.algorithm == Algorithm::low_latency)
        algo::allgatherv_low_latency(*this, o.send, o.recv, *o.v, d.dtype);
      else if (d.algorithm == Algorithm::ring)
        algo::allgatherv_ring(*this, o.send, o.recv, *o.v, d.dtype);
      else
        algo::allgatherv_staged(*this, o.send, o.recv, *o.v, d.dtype);
      break;
    case CollectiveKind::reduce_scatter_v:
      algo::reduce_scatter_v_staged(*this, o.send, o.recv, *o.v, d.dtype, d.op);
      break;
    case CollectiveKind::invalid:
      break;
  }
  // stats(), after end() has published `done` (the peers need not wait for
  // the bookkeeping), from the clock reading that ended the call.
  const std::uint64_t now = end();
  const auto k = static_cast<std::size_t>(d.kind);
  if (k < kind_stats.size()) {
    auto& s = kind_stats[k];
    s.calls.store(s.calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    s.bytes.store(s.bytes.load(std::memory_order_relaxed) + current_bytes,
                  std::memory_order_relaxed);
    s.time_ns.store(s.time_ns.load(std::memory_order_relaxed) + (now - call_start_ns),
                    std::memory_order_relaxed);
    s.wait_ns.store(s.wait_ns.load(std::memory_order_relaxed) + call_wait_ns,
                    std::memory_order_relaxed);
  }
}

void Communicator::Impl::execute(const Op& op) {
  if (engine) {
    engine->execute(op);
  } else {
    run(op);  // no request was ever started: the caller is the only runner
  }
}

Request Communicator::Impl::submit(const Op& op) {
  if (!engine) engine = std::make_unique<detail::Engine>(*this);
  return engine->submit(op);
}

void Communicator::Impl::reject(const InvalidArgumentError& e) {
  if (engine) engine->reject(e);
  reject_call(e);
}

Communicator::Impl::~Impl() {
  if (engine && engine->inherited()) {
    // A forked child: the thread is the parent's, and the mutex may be held
    // by it. Touch nothing; the memory goes with the process.
    (void)engine.release();
  }
  engine.reset();  // drains and joins while the segment is still mapped
  settle_refusal_at_exit();
}

namespace detail {

int progress_cpu_from_env(int rank) {
  const auto raw = settings::text("SHMRING_PROGRESS_CPU");
  if (!raw) return -1;
  const std::string& v = *raw;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const bool have_mask = sched_getaffinity(0, sizeof(mask), &mask) == 0;
  auto allowed = [&] {
    std::string s;
    if (!have_mask) return std::string("unknown");
    for (int i = 0; i < CPU_SETSIZE; ++i)
      if (CPU_ISSET(i, &mask)) s += fmt::format("{}{}", s.empty() ? "" : ",", i);
    return s;
  };
  long long cpu = -1;
  try {
    const settings::Setting& s = settings::Name("SHMRING_PROGRESS_CPU").setting();
    cpu = settings::parse_integer(
        s.name, v, s.lo, s.hi, 0,
        fmt::format("a CPU number (one of this process's CPUs: {}) or nothing", allowed()), {});
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(fmt::format("rank {}: {}", rank, e.what()));
  }
  if (have_mask && !CPU_ISSET(static_cast<int>(cpu), &mask))
    throw InvalidArgumentError(
        fmt::format("rank {}: SHMRING_PROGRESS_CPU={}: CPU {} is not in this process's affinity "
                    "mask (CPUs {})",
                    rank, v, cpu, allowed()));
  return static_cast<int>(cpu);
}

Engine::Engine(Communicator::Impl& c) : c_(c), fork_gen_(fork_generation()) {
  base_ = c.collectives;  // made by the calling thread, with no run in flight
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    // Destroyed from an on_complete callback, which the Request docs forbid:
    // joining would deadlock and going on would run on freed memory.
    std::fprintf(stderr,
                 "shmring: fatal: a communicator was destroyed on its own progress thread (from "
                 "a Request's on_complete callback, which must not call into shmring)\n");
    std::abort();
  }
  thread_.join();
}

void Engine::check_owner() const {
  if (inherited())
    throw InvalidArgumentError(fmt::format(
        "rank {}: this communicator started non-blocking collectives in its parent process; a "
        "forked child (pid {}) cannot use it",
        c_.rank, getpid()));
}

void Engine::run_one(const Op& op) {
  try {
    c_.run(op);
  } catch (const std::exception& e) {
    if (!c_.broken) c_.broken = e.what();
    throw;
  }
}

// The caller's turn to run a collective itself: holds `running_` from
// construction (under the caller's lock, which it releases) to destruction.
class Engine::InlineTurn {
 public:
  InlineTurn(Engine& e, std::unique_lock<std::mutex>& lock) : e_(e) {
    e_.running_ = true;
    ++e_.issued_;
    lock.unlock();
  }
  ~InlineTurn() {
    bool queued;
    {
      std::lock_guard l(e_.mutex_);
      e_.running_ = false;
      queued = !e_.queue_.empty();
    }
    // A call queued meanwhile (by another thread) may run now. Otherwise the
    // idle progress thread is left asleep: no wake-up per blocking call.
    if (queued) e_.cv_.notify_all();
  }
  InlineTurn(const InlineTurn&) = delete;
  InlineTurn& operator=(const InlineTurn&) = delete;

 private:
  Engine& e_;
};

void Engine::execute(const Op& op) {
  check_owner();
  std::unique_lock lock(mutex_);
  if (!running_ && queue_.empty()) {
    // Nothing pending: run on the caller, as before the engine existed.
    InlineTurn turn(*this, lock);
    run_one(op);
    return;
  }
  auto state = new_state();
  record_queued(op);
  queue_.push_back({op, state});
  if (c_.trace) queue_.back().op.queued_ns = detail::mono_ns();
  pending_.store(queue_.size(), std::memory_order_release);
  lock.unlock();
  cv_.notify_all();
  state->wait_until_done(-1);
}

Request Engine::submit(const Op& op) {
  check_owner();
  auto state = new_state();
  enqueue({op, state});
  return Request(std::move(state));
}

void Engine::record_queued(const Op& op) {
  // Only entries of calls behind the running one, and fewer than the
  // recorder holds: the runner never writes the same entry at the same time.
  const std::uint64_t ahead = queue_.size() + (running_ ? 1 : 0);
  if (c_.rec_n == 0 || ahead + 1 >= c_.rec_n || op.desc.kind == CollectiveKind::invalid) return;
  const std::uint64_t seq = base_ + issued_ + queue_.size();
  detail::recorder_write_call(c_.rec_entry(seq), seq, op.desc, op.bytes, kCallQueued,
                              detail::mono_ns());
}

void Engine::enqueue(Item item) {
  {
    std::lock_guard lock(mutex_);
    record_queued(item.op);
    if (c_.trace) item.op.queued_ns = detail::mono_ns();
    queue_.push_back(std::move(item));
    pending_.store(queue_.size(), std::memory_order_release);
  }
  cv_.notify_all();
}

void Engine::reject(const InvalidArgumentError& e) {
  check_owner();
  std::unique_lock lock(mutex_);
  if (!running_ && queue_.empty()) {
    InlineTurn turn(*this, lock);
    c_.reject_call(e);  // publishes inline; throws
  }
  // Behind pending requests: the marker publishes "invalid call" when its
  // turn comes, so the peers fail fast in the same order; the caller learns
  // of its mistake now.
  Op marker;
  marker.desc = {CollectiveKind::invalid, 0, DataType::uint8, ReduceOp::sum, -1, Algorithm::ring};
  marker.refusal = std::make_shared<const std::string>(e.what());
  queue_.push_back({marker, nullptr});
  pending_.store(queue_.size(), std::memory_order_release);
  lock.unlock();
  cv_.notify_all();
  throw e;
}

std::shared_ptr<RequestState> Engine::new_state() {
  const WaitPolicy w = c_.base_policy();
  auto st = std::make_shared<RequestState>(w.spin_ns, w.yield_ns);
  // The engine outlives every request it has not completed (~Engine drains
  // the queue), and help() is only reached for a request not yet done.
  st->help = [this, raw = st.get()] { help(*raw); };
  st->abort = [this](const std::string& reason) { c_.abort_job(reason); };
  return st;
}

void Engine::run_front(std::unique_lock<std::mutex>& lock) {
  Item item = std::move(queue_.front());
  queue_.pop_front();
  pending_.store(queue_.size(), std::memory_order_release);
  running_ = true;
  ++issued_;
  lock.unlock();
  std::exception_ptr error;
  try {
    run_one(item.op);
  } catch (...) {
    error = std::current_exception();
    if (!item.state) SHMRING_LOG(debug, "a rejected call's marker failed (ignored)");
  }
  lock.lock();
  running_ = false;
  if (item.state) {
    // Completed without the engine's lock: the callback may take its own.
    lock.unlock();
    item.state->complete(error);
    lock.lock();
  }
}

void Engine::help(RequestState& st) {
  if (inherited()) return;
  std::unique_lock lock(mutex_);
  bool ran = false;
  while (!st.done_flag.load(std::memory_order_acquire) && !running_ && !queue_.empty()) {
    run_front(lock);
    ran = true;
  }
  const bool queued = !queue_.empty();
  lock.unlock();
  // The progress thread waits for `running_` to drop before it takes more.
  if (ran && queued) cv_.notify_all();
}

void Engine::poll_for_work() {
  const auto start = Clock::now();
  const WaitPolicy w = c_.base_policy();
  const std::int64_t spin = w.spin_ns, total = spin + std::min(w.yield_ns, kHelperMaxYieldNs);
  for (std::int64_t spent = 0; spent < total; spent = (Clock::now() - start).count()) {
    if (pending_.load(std::memory_order_acquire) != 0) return;
    if (spent < spin) {
      for (int i = 0; i < 64; ++i) cpu_relax();
    } else {
      sched_yield();
    }
  }
}

void Engine::loop() {
  pthread_setname_np(pthread_self(), "shmring-progress");
  t_helper_thread = true;
  if (c_.progress_cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(c_.progress_cpu, &set);
    if (int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); rc != 0)
      SHMRING_LOG(warn, "SHMRING_PROGRESS_CPU={}: pinning the progress thread failed: {}",
                  c_.progress_cpu, std::strerror(rc));
  }
  SHMRING_LOG(debug, "progress thread started (cpu {})", c_.progress_cpu);
  std::unique_lock lock(mutex_);
  for (;;) {
    if (queue_.empty() && !stop_) {
      // Idle: poll briefly (the communicator's spin and yield phases, as any
      // wait), so that back-to-back requests (DDP's buckets) start without a
      // futex wake-up; then sleep until there is work.
      lock.unlock();
      poll_for_work();
      lock.lock();
    }
    cv_.wait(lock, [&] { return (!queue_.empty() && !running_) || (stop_ && queue_.empty()); });
    if (queue_.empty()) return;  // stop_, all done
    run_front(lock);
  }
}

}  // namespace detail
}  // namespace shmring
