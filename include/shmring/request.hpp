#pragma once

#if !defined(__cplusplus) || __cplusplus < 202002L
#error "shmring's C++ API needs C++20 (compile with -std=c++20); C code uses <shmring/shmring.h>"
#endif

#include <chrono>
#include <exception>
#include <functional>
#include <memory>

#include "shmring/export.hpp"

namespace shmring {

namespace detail {
struct RequestState;
}

/// The handle of one non-blocking collective (Communicator::iallreduce and
/// the other i-forms), as MPI_Request: the collective runs on the
/// communicator's progress thread, in call order, while the caller goes on.
///
/// Buffers: from the i-call until the request is complete, the collective
/// owns its buffers: the caller must not write its send buffer nor read or
/// write its recv buffer, and must keep both alive. (Destroying a pending
/// Request waits for it, so a Request that goes out of scope never leaves the
/// engine writing into freed memory.)
///
/// Errors: a failed collective stores its shmring::Error; wait() and test()
/// rethrow it (every time they are called). After an error the communicator
/// is broken: every later request fails too, with AbortedError quoting the
/// first error, on every rank.
///
/// Moves only. A default-constructed (or moved-from) Request is empty:
/// valid() is false, and wait()/test() return at once as if complete.
///
/// Thread safety: wait(), test() and wait_for() may be called from any thread,
/// also from several at once on one Request; moving or destroying a Request
/// while another thread uses it is a data race, as for any object.
class SHMRING_API Request {
 public:
  Request() noexcept;
  /// Waits for a pending request. Cannot throw: an error no wait()/test()
  /// has thrown is logged (WARN); the communicator is broken by it anyway, so
  /// its next call throws AbortedError quoting it.
  ~Request();
  Request(Request&&) noexcept;
  /// Waits for the request this one held (as the destructor), then takes
  /// `other`'s.
  Request& operator=(Request&&) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  /// True when this Request refers to a collective (complete or not).
  bool valid() const noexcept { return state_ != nullptr; }

  /// Blocks until the collective is complete; rethrows its shmring::Error
  /// (MismatchError, TimeoutError, PeerFailureError, AbortedError, ...).
  /// Each wait inside the collective is bounded by SHMRING_TIMEOUT, so this
  /// returns or throws within the timeout of a stuck peer.
  void wait();

  /// Non-blocking: true when complete (rethrows its error if it failed),
  /// false while it is still running or queued.
  bool test();

  /// Blocks at most `timeout`: true when complete (rethrows its error if it
  /// failed), false when the time passed first (the request stays pending).
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) {
    return wait_for_seconds(std::chrono::duration<double>(timeout).count());
  }
  /// wait_for() with the timeout in seconds (negative: as 0, a poll; NaN:
  /// InvalidArgumentError).
  bool wait_for_seconds(double timeout_s);

  /// Registers `fn`, called exactly once when the collective completes, with
  /// nullptr on success or the exception_ptr of its shmring::Error. It runs on
  /// the communicator's progress thread (or at once on the calling thread
  /// when the request is already complete or empty), after wait() would
  /// return. It must be quick and must not call into shmring (no collective,
  /// no wait on a request of the same communicator, no destruction of it):
  /// the progress thread runs the next collective only after it returns.
  /// Hand real work to a thread of your own. One callback per Request; a
  /// second call replaces a callback not yet run. Exceptions thrown by `fn`
  /// are swallowed (logged).
  void on_complete(std::function<void(std::exception_ptr)> fn);

  /// Internal: made by Communicator's i-calls.
  explicit Request(std::shared_ptr<detail::RequestState> state) noexcept;

 private:
  std::shared_ptr<detail::RequestState> state_;
};

}  // namespace shmring
