#include "work.hpp"

#include <Python.h>
#include <pythread.h>

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <atomic>
#include <string>
#include <system_error>

#include "../shmring/signal_reason.hpp"
#include "shmring/communicator.hpp"
#include "shmring/error.hpp"

namespace shmring::torch_backend {

namespace {
std::atomic<unsigned long> g_python_main{0};

bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;  // public from 3.13, which drops the underscore form
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// The wait check (shmring::set_wait_check) of waits on Python's main thread:
// runs the pending signal handlers (with the GIL, which torch's binding
// released). One that raised gives the abort's reason; its exception is
// cleared, since the wait's error, naming it, is what torch raises.
std::string python_signals_raised() {
  if (!Py_IsInitialized() || python_finalizing()) return {};
  const PyGILState_STATE gil = PyGILState_Ensure();
  std::string why;
  if (PyErr_CheckSignals() != 0) {
    why = python::signal_reason();
    PyErr_Clear();
  }
  PyGILState_Release(gil);
  return why;
}

// Installs python_signals_raised for the scope, on Python's main thread only
// (elsewhere PyErr_CheckSignals runs no handler, and taking the GIL every
// 10 ms from autograd's threads would only cost).
struct InterruptibleWait {
  InterruptibleWait() {
    const unsigned long main = g_python_main.load(std::memory_order_relaxed);
    if (main != 0 && PyThread_get_thread_ident() == main) {
      before = set_wait_check(&python_signals_raised);
      installed = true;
    }
  }
  ~InterruptibleWait() {
    if (installed) set_wait_check(before);
  }
  InterruptibleWait(const InterruptibleWait&) = delete;
  InterruptibleWait& operator=(const InterruptibleWait&) = delete;
  WaitCheck before = nullptr;
  bool installed = false;
};
}  // namespace

void set_python_main_thread(unsigned long ident) {
  g_python_main.store(ident, std::memory_order_relaxed);
}

WorkShmring::WorkShmring(int rank, ::c10d::OpType type, const char* profiling_title,
                         std::vector<at::Tensor> result)
    // The result tensors go to torch.profiler as the event's inputs: its
    // shapes and datatypes, as ProcessGroupGloo's events show theirs.
    : Work(rank, type, profiling_title, result),
      title_(profiling_title),
      result_(std::move(result)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors())) {}

// The request's destructor would wait for a collective still running; a
// Work is only destroyed after completion (the progress thread's callback
// holds a reference until then), so nothing waits here.
WorkShmring::~WorkShmring() = default;

void WorkShmring::prepare(std::vector<at::Tensor> keep_alive, std::function<void()> epilogue) {
  keep_alive_ = std::move(keep_alive);
  epilogue_ = std::move(epilogue);
}

void WorkShmring::complete(std::exception_ptr error) {
  // Dropped last, after finish(): releasing a tensor that had a Python
  // object may take the GIL, which a thread in wait() may hold.
  std::vector<at::Tensor> release;
  {
    std::lock_guard<std::mutex> lock(complete_mutex_);
    if (completing_) return;
    completing_ = true;
    if (!error && epilogue_) {
      try {
        epilogue_();
      } catch (...) {
        error = std::current_exception();
      }
    }
    epilogue_ = nullptr;
    release.swap(keep_alive_);
  }
  finish(error);  // completed_, exception_, profiling end, wakes Work::wait
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(result_));
  }
}

bool WorkShmring::wait(std::chrono::milliseconds timeout) {
  // Wait on the request here rather than for a completion thread: a
  // blocking call then costs one hand-off (progress thread -> caller), not two.
  std::exception_ptr error;
  // Only an untimed wait promises to complete the Work itself (a timed one
  // may give up and leave it to the completion threads).
  if (timeout == kNoTimeout) waited_.store(true, std::memory_order_release);
  try {
    InterruptibleWait interruptible;
    if (timeout == kNoTimeout) {
      request_.wait();
    } else if (!request_.wait_for(timeout)) {
      TORCH_CHECK(false, "shmring backend: ", title_, " did not complete within ", timeout.count(),
                  " ms (it keeps running; wait again or destroy the group)");
    }
  } catch (const c10::Error&) {
    throw;  // our timeout: the collective is still pending, nothing to complete
  } catch (...) {
    error = std::current_exception();
  }
  complete(error);
  std::unique_lock<std::mutex> lock(mutex_);
  // complete() may be finishing on a completion thread: wait for its finish().
  cv_.wait(lock, [this] { return completed_; });
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

std::vector<at::Tensor> WorkShmring::result() {
  return result_;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkShmring::getFuture() {
  return future_;
}

Completions::~Completions() {
  stop();
}

void Completions::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void Completions::push(c10::intrusive_ptr<WorkShmring> work, std::exception_ptr error) {
  push([work = std::move(work), error]() mutable {
    work->complete(error);
    work.reset();  // the last reference may go here
  });
}

void Completions::push(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.push_back(std::move(job));
  if (queue_.size() > idle_ && threads_.size() < kMaxThreads) {
    try {
      threads_.emplace_back([this] { run(); });
      return;
    } catch (const std::system_error&) {
      // No new thread: the ones there are will get to it.
    }
  }
  cv_.notify_one();
}

void Completions::run() {
  // Named as shmring's other threads are, so that a thread listing
  // (/proc/PID/task/*/comm, top -H, gdb) tells them from torch's.
  pthread_setname_np(pthread_self(), "shmring-done");
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    while (queue_.empty() && !stop_) {
      ++idle_;
      cv_.wait(lock);
      --idle_;
    }
    if (queue_.empty()) return;  // stopping, and drained
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    job();
    job = nullptr;  // its captures (last references) are dropped unlocked
    lock.lock();
  }
}

}  // namespace shmring::torch_backend
