#include "core/request.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "base/log.hpp"
#include "shmring/error.hpp"
#include "transport/wait.hpp"

namespace shmring {
namespace detail {

RequestState::RequestState(std::int64_t spin, std::int64_t yield)
    : fork_gen(fork_generation()), spin_ns(spin), yield_ns(yield) {}

namespace {
// on_complete's promise (request.hpp): whatever `fn` throws is logged, never
// passed on, on the progress thread and on the caller's alike.
void run_callback(const std::function<void(std::exception_ptr)>& fn, std::exception_ptr e) {
  try {
    fn(e);
  } catch (const std::exception& x) {
    SHMRING_LOG(err, "a Request's on_complete callback threw (ignored): {}", x.what());
  } catch (...) {
    SHMRING_LOG(err, "a Request's on_complete callback threw (ignored)");
  }
}
}  // namespace

void RequestState::complete(std::exception_ptr e) {
  std::function<void(std::exception_ptr)> cb;
  {
    std::lock_guard lock(mutex);
    done = true;
    error = e;
    done_flag.store(true, std::memory_order_release);
    cb = std::move(callback);
    callback = nullptr;
    if (cb) seen.store(true, std::memory_order_relaxed);  // the callback gets the error
  }
  cv.notify_all();
  if (cb) run_callback(cb, e);
}

namespace {
// How often a waiting thread runs its wait check, as the waits on a peer do
// (transport/wait.hpp, WaitPolicy::sleep_slice_us).
constexpr std::chrono::milliseconds kCheckPeriod{10};

[[noreturn]] void throw_inherited() {
  throw InvalidArgumentError(fmt::format(
      "process {}: this Request was started by the parent process before fork(); a forked child "
      "cannot wait for it (the progress thread that runs it stayed in the parent)",
      getpid()));
}
}  // namespace

bool RequestState::wait_until_done(double timeout_s, bool mark) {
  if (fork_gen != fork_generation()) throw_inherited();
  if (timeout_s < 0 && help && !done_flag.load(std::memory_order_acquire)) help();
  // Poll first (bounded by the policy and by the timeout).
  const auto start = Clock::now();
  std::int64_t budget = spin_ns + yield_ns;
  if (timeout_s >= 0)
    budget = std::min<std::int64_t>(budget, static_cast<std::int64_t>(timeout_s * 1e9));
  for (std::int64_t spent = 0; spent < budget && !done_flag.load(std::memory_order_acquire);
       spent = (Clock::now() - start).count()) {
    if (spent < spin_ns) {
      for (int i = 0; i < 64; ++i) cpu_relax();
    } else {
      sched_yield();
    }
  }
  std::unique_lock lock(mutex);
  // Capped so that the conversion to the clock's ticks cannot overflow.
  const auto deadline = timeout_s < 0
                            ? Clock::time_point::max()
                            : start + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(std::min(timeout_s, 1e7)));
  WaitCheck check = t_helper_thread || !abort ? nullptr : thread_wait_check();
  while (!done && Clock::now() < deadline) {
    if (check == nullptr) {
      if (timeout_s < 0)
        cv.wait(lock, [&] { return done; });
      else
        cv.wait_until(lock, deadline, [&] { return done; });
      break;
    }
    cv.wait_until(lock, std::min(deadline, Clock::now() + kCheckPeriod), [&] { return done; });
    if (done) break;
    // The check may take the GIL: never under the mutex, which a thread
    // holding the GIL may wait for (Request.is_completed).
    lock.unlock();
    const std::string why = check();
    lock.lock();
    if (!why.empty()) {
      // Under the mutex, a request not yet done keeps its engine (and the
      // communicator) alive: complete() cannot return before we let go.
      // The collective then fails with the abort.
      if (!done) abort(why);
      check = nullptr;
    }
  }
  if (!done) return false;
  if (mark) seen.store(true, std::memory_order_relaxed);
  if (error) std::rethrow_exception(error);
  return true;
}

bool RequestState::done_or_throw() {
  if (fork_gen != fork_generation()) throw_inherited();
  std::lock_guard lock(mutex);
  if (!done) return false;
  seen.store(true, std::memory_order_relaxed);
  if (error) std::rethrow_exception(error);
  return true;
}

}  // namespace detail

Request::Request() noexcept = default;

Request::Request(std::shared_ptr<detail::RequestState> state) noexcept : state_(std::move(state)) {}

namespace {
// Waits for `state`, as destroying a pending Request does. A destructor
// cannot throw, so an error no wait or test returned is logged (the
// communicator keeps it too: its next call throws AbortedError quoting it).
// In a forked child the parent's request is never waited for (it would never
// complete here) and its state is left alone: its mutex may have been held
// by a thread the child does not have.
void settle(std::shared_ptr<detail::RequestState>& state) noexcept {
  if (!state) return;
  if (state->fork_gen != detail::fork_generation()) {
    new std::shared_ptr<detail::RequestState>(std::move(state));  // leaked on purpose
    return;
  }
  try {
    state->wait_until_done(-1, /*mark=*/false);
  } catch (const std::exception& e) {
    // `seen` is written under the mutex before (or by a waiter after) done.
    if (!state->seen.load(std::memory_order_relaxed))
      SHMRING_LOG(warn, "a Request was destroyed before wait() and its collective failed: {}",
                  e.what());
  } catch (...) {
  }
  state.reset();
}
}  // namespace

Request::~Request() {
  settle(state_);
}

Request::Request(Request&& other) noexcept = default;

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    settle(state_);
    state_ = std::move(other.state_);
  }
  return *this;
}

void Request::wait() {
  if (state_) state_->wait_until_done(-1);
}

bool Request::test() {
  return !state_ || state_->done_or_throw();
}

bool Request::wait_for_seconds(double timeout_s) {
  if (std::isnan(timeout_s))
    throw InvalidArgumentError(
        "Request::wait_for: timeout is nan, expected a number of seconds (negative: as 0)");
  if (!state_) return true;
  return state_->wait_until_done(timeout_s < 0 ? 0 : timeout_s);
}

void Request::on_complete(std::function<void(std::exception_ptr)> fn) {
  if (!fn) return;
  if (state_) {
    std::unique_lock lock(state_->mutex);
    if (!state_->done) {
      state_->callback = std::move(fn);
      return;
    }
  }
  std::exception_ptr e = nullptr;
  if (state_) {
    e = state_->error;
    state_->seen.store(true, std::memory_order_relaxed);
  }
  detail::run_callback(fn, e);
}

}  // namespace shmring
