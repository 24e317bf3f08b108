#pragma once

// The engine: runs the collectives the front (communicator.cpp) has checked,
// in call order, on the caller's thread or on the communicator's progress
// thread (docs/design/layers.md).
//
// Ownership of the protocol state (Communicator::Impl's counters, current
// collective, broken): exactly one thread runs collectives at a time. Before
// the first non-blocking call there is no Engine and the caller runs
// everything. Afterwards `running_` (under `mutex_`) says who runs: a
// blocking call with an empty queue and nobody running takes it and runs
// inline; otherwise calls are queued and the progress thread takes them one
// by one. The mutex hand-off orders one runner's writes before the next's.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "core/comm.hpp"
#include "core/request.hpp"

namespace shmring::detail {

/// Parses SHMRING_PROGRESS_CPU (unset or empty: -1). Throws
/// InvalidArgumentError naming the value unless it is a CPU in this
/// process's affinity mask.
int progress_cpu_from_env(int rank);

class Engine {
 public:
  explicit Engine(Communicator::Impl& c);
  /// Lets the progress thread finish every queued collective, then joins it.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void execute(const Op& op);
  Request submit(const Op& op);
  [[noreturn]] void reject(const InvalidArgumentError& e);

  /// True in a child forked after this Engine was made: its thread, queue
  /// and mutex state belong to the parent.
  bool inherited() const { return fork_gen_ != fork_generation(); }

 private:
  struct Item {
    Op op;
    std::shared_ptr<RequestState> state;  // null for a rejected call's marker
  };
  class InlineTurn;
  void check_owner() const;
  void enqueue(Item item);
  void loop();
  /// Returns when a request is queued or after the wait policy's spin and
  /// yield phases, whichever comes first.
  void poll_for_work();
  std::shared_ptr<RequestState> new_state();
  /// Runs queued collectives on the calling thread until `st` is done or
  /// the progress thread runs one (RequestState::help).
  void help(RequestState& st);
  /// Pops and runs the queue's first item with `running_` held; `lock` is
  /// held on entry and on return.
  void run_front(std::unique_lock<std::mutex>& lock);
  /// Runs op on this thread; an error that did not already break the
  /// communicator breaks it (every later call must fail as this one did).
  void run_one(const Op& op);

  Communicator::Impl& c_;
  std::mutex mutex_;
  std::condition_variable cv_;  // the progress thread sleeps here when idle
  std::deque<Item> queue_;
  std::atomic<std::size_t> pending_{0};  // queue_.size(), for polling without the mutex
  bool running_ = false;                 // a collective is running (inline or on the thread)
  // Calls handed to Impl::run (inline turns and popped items) since the
  // engine began, when the communicator had run `base_` calls: a queued
  // call's sequence number is base_ + issued_ + its place in the queue
  // (every run, a rejected call's marker too, ends one collective).
  std::uint64_t issued_ = 0;
  std::uint64_t base_ = 0;
  /// Records `op` as queued in the flight recorder, at the back of the
  /// queue (under `mutex_`, before it is pushed).
  void record_queued(const Op& op);
  bool stop_ = false;
  const unsigned fork_gen_;
  std::thread thread_;
};

}  // namespace shmring::detail
