#pragma once

// The shared state behind a shmring::Request: completed once by the thread
// that ran the collective (the progress thread), waited on by any thread.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

#include "base/fork.hpp"
#include "shmring/communicator.hpp"
#include "shmring/request.hpp"

namespace shmring::detail {

struct RequestState {
  /// A waiter polls `done_flag` for `spin_ns` (pause) then `yield_ns`
  /// (sched_yield) before it sleeps on `cv`: a short collective completes
  /// without a futex wake-up on either side (the communicator's wait policy).
  explicit RequestState(std::int64_t spin_ns = 0, std::int64_t yield_ns = 0);

  /// Marks the request complete with `error` (null: success), wakes the
  /// waiters, then runs the on_complete callback on this thread.
  void complete(std::exception_ptr error);

  /// Waits until complete or until `timeout_s` seconds passed (negative:
  /// forever); true when complete. Throws InvalidArgumentError in a forked
  /// child for a request still pending in its parent. `mark`: set `seen`
  /// when complete (not for the destructor's own wait). Once past its
  /// polling phases, a wait on a thread with a wait check
  /// (set_wait_check) runs it about every 10 ms; a reason goes to `abort`,
  /// and the wait goes on until the aborted collective completes (with
  /// AbortedError unless it had finished already).
  bool wait_until_done(double timeout_s, bool mark = true);
  /// True once complete; rethrows the error then.
  bool done_or_throw();

  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;                   // under `mutex`
  std::atomic<bool> done_flag{false};  // the same, for polling without the mutex
  std::exception_ptr error;
  /// Set once a wait or test has returned the completion (or thrown its
  /// error) to a caller, or an on_complete callback was given it: destroying
  /// the Request then has nothing to report.
  std::atomic<bool> seen{false};
  std::function<void(std::exception_ptr)> callback;
  const unsigned fork_gen;  // fork_generation() at creation
  const std::int64_t spin_ns, yield_ns;
  /// Set by the engine: runs queued collectives on the waiting thread, in
  /// call order, while the progress thread is not running one, until this
  /// request is done (so that a wait right after the call saves the hand-off
  /// to the progress thread and back). Called by untimed waits only.
  std::function<void()> help;
  /// Set by the engine: aborts the job with the reason a wait check gave,
  /// as Communicator::abort does.
  std::function<void(const std::string&)> abort;
};

/// The calling thread's wait check (set_wait_check), or nullptr.
WaitCheck thread_wait_check() noexcept;

}  // namespace shmring::detail
