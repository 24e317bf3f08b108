#pragma once

// WorkShmring: the c10d Work of one collective. It owns the shmring Request,
// the tensors the collective reads and writes until it is complete, and an
// epilogue (copying a staged result back into the caller's tensors). The
// epilogue runs once, on whichever thread sees the request complete first:
// the caller in wait(), or one of the process group's completion threads.

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <atomic>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "shim.hpp"
#include "shmring/request.hpp"

namespace shmring::torch_backend {

/// Records Python's main thread (threading.main_thread().ident), the one
/// whose waits run Python's signal handlers (called once, at import).
/// torch's Work.wait() binding releases the GIL, so without this Ctrl-C
/// would wait for the peer or the timeout.
void set_python_main_thread(unsigned long ident);

class WorkShmring : public Work {
 public:
  /// `result` is what result() and the future's value give: the output
  /// tensors of the collective (the caller's, not staging copies).
  WorkShmring(int rank, ::c10d::OpType type, const char* profiling_title,
              std::vector<at::Tensor> result);
  ~WorkShmring() override;

  /// Blocks until the collective is complete and the result is in the
  /// caller's tensors; rethrows the collective's error (a shmring::Error,
  /// RuntimeError in Python). A non-zero timeout that passes first throws
  /// (the collective keeps running). On Python's main thread, a signal
  /// handler that raises meanwhile (Ctrl-C) aborts the job within about
  /// 10 ms: the wait throws the abort, naming the handler's exception, and
  /// the peers' collectives fail with it (shmring::set_wait_check).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  std::vector<at::Tensor> result() override;
  /// Completed with result() (a list of tensors) or the collective's error.
  /// Callbacks run on a completion thread or the thread that wait()s,
  /// never on the communicator's progress thread.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  /// Setup, before the request starts: tensors to keep alive until
  /// completion (inputs, staging buffers) and the epilogue run on success.
  void prepare(std::vector<at::Tensor> keep_alive, std::function<void()> epilogue);
  /// Takes the started collective's request.
  void set_request(Request request) { request_ = std::move(request); }
  Request& request() { return request_; }
  /// True once a thread is in wait(): that thread completes this Work
  /// itself, so the completion threads need not be woken for it.
  bool waited() const { return waited_.load(std::memory_order_acquire); }

  /// Runs the epilogue (once), releases the staging buffers, marks this Work
  /// and its future complete, with `error` when the collective failed.
  /// Idempotent: later calls return once the first has run the epilogue.
  void complete(std::exception_ptr error);

 private:
  const char* title_;
  Request request_;
  std::vector<at::Tensor> result_;
  std::vector<at::Tensor> keep_alive_;
  std::function<void()> epilogue_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::mutex complete_mutex_;
  bool completing_ = false;
  std::atomic<bool> waited_{false};
};

/// The process group's completion threads: they complete the Works the
/// communicator's progress thread hands over, so that future callbacks (DDP
/// comm hooks, which issue collectives) never run on the progress thread.
///
/// One thread serves while callbacks are quick. A callback may also block on
/// another collective's future (PowerSGD's hook waits inside a callback for
/// an allreduce it just issued), and that future is completed here too: so
/// whenever more Works are queued than threads are idle, another thread
/// starts (up to kMaxThreads), and a blocked callback never holds up the
/// completion it waits for. Threads stay, asleep, until the group goes.
class Completions {
 public:
  static constexpr std::size_t kMaxThreads = 8;

  Completions() = default;
  /// stop().
  ~Completions();
  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;

  /// Queues `work` for completion with `error` (null on success). Quick and
  /// lock-protected: safe from the progress thread.
  void push(c10::intrusive_ptr<WorkShmring> work, std::exception_ptr error);
  /// Queues any completion job (a cross-node Work's future): the job is
  /// run, then destroyed, on a completion thread.
  void push(std::function<void()> job);

  /// Completes everything queued, then joins the threads. Completing may
  /// need the GIL (Python callbacks, tensors with a Python object), so a
  /// caller holding it must release it first. Idempotent.
  void stop();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::size_t idle_ = 0;  // threads asleep in cv_.wait
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace shmring::torch_backend
