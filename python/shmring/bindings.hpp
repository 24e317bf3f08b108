#pragma once

// What the files of the `_shmring` extension module share (private to
// python/shmring/; the module itself is _shmring.cpp):
//   buffer.cpp            BufferView: numpy/buffer protocol and DLPack memory
//   errors.cpp            shmring.Error and its subclasses, the translator
//   request.cpp           shmring.Request (async_op=True)
//   communicator.cpp      shmring.Communicator: entry points, methods, docs
//   collectives.cpp       allreduce, reduce_scatter, allgather, broadcast, reduce
//   block_collectives.cpp alltoall(v), gather, scatter, allgatherv,
//                         reduce_scatter_v (per-rank blocks)
//   p2p.cpp               send, recv
//   signal_reason.hpp     the abort reason of a wait a signal handler ended
//                         (shared with the torch backend)
//
// Buffers are never copied. A collective works on the memory of the object it
// is given, reached in one of two ways:
//   - the buffer protocol (numpy arrays, bytearray, memoryview, array.array),
//     which says whether the memory is writable and gives format and strides;
//   - DLPack (`__dlpack__`), for torch tensors: torch has no buffer protocol
//     and a bfloat16 tensor has no numpy form at all.
// Anything the ring cannot use as-is (non-contiguous, read-only, an unknown
// element type, memory that is not on the CPU) is an InvalidArgumentError,
// which is also a ValueError; a silent copy would break "reduced in place".
//
// The GIL is released while a collective runs, so other Python threads (data
// loading, logging) keep going while this rank waits for its peers.

#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shmring/shmring.hpp"

namespace py = pybind11;

namespace shmring::python {

struct DlManagedTensor;  // DLPack's, declared in buffer.cpp

// ---------------------------------------------------------------------------
// A borrowed view of the memory of one Python object, kept alive (buffer
// released, DLPack deleter called) until the view is destroyed.

class BufferView {
 public:
  BufferView() = default;
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  ~BufferView();

  /// `what` names the argument in error messages; `writable` is required for
  /// the buffers a collective writes.
  void acquire(py::handle obj, const char* what, bool writable);

  void* data() const { return data_; }
  std::size_t count() const { return count_; }
  DataType dtype() const { return dtype_; }

 private:
  void acquire_buffer(py::handle obj, const char* what, bool writable);
  void acquire_dlpack(py::handle obj, const char* what);

  Py_buffer py_buffer_{};
  bool has_py_buffer_ = false;
  DlManagedTensor* managed_ = nullptr;
  void* data_ = nullptr;
  std::size_t count_ = 0;
  DataType dtype_ = DataType::float32;
};

/// The Python type name of `obj`, for error messages.
std::string type_name(py::handle obj);

/// The Python class of an error code (shmring.Error for one without its own).
py::handle error_class(ErrorCode code);
void register_exceptions(py::module_& m);

// ---------------------------------------------------------------------------
// The Python Communicator: the C++ one, plus an explicit close() and a guard
// against use from two threads at once (the C++ object allows one thread at a
// time, and the GIL is released while a collective runs).

class PyCommunicator {
 public:
  explicit PyCommunicator(const Options& options)
      : comm_(std::make_unique<Communicator>(options)), rank_(comm_->rank()) {}
  explicit PyCommunicator(Communicator&& comm)
      : comm_(std::make_unique<Communicator>(std::move(comm))), rank_(comm_->rank()) {}

  Communicator& get() {
    if (!comm_)
      throw InvalidArgumentError(
          fmt::format("rank {}: this Communicator was closed; create a new one", rank_));
    return *comm_;
  }
  /// The rank it had, also once closed (for messages).
  int rank() const { return rank_; }
  bool closed() const { return !comm_; }

  void close() {
    if (busy_.load())
      throw InvalidArgumentError(fmt::format(
          "rank {}: close(): a collective is running on this Communicator in another thread",
          rank_));
    std::unique_ptr<Communicator> c = std::move(comm_);
    py::gil_scoped_release release;
    c.reset();
  }

  /// Marks the communicator in use for one collective.
  class Busy {
   public:
    explicit Busy(PyCommunicator& c, const char* what) : c_(c) {
      if (c_.busy_.exchange(true))
        throw InvalidArgumentError(fmt::format(
            "rank {}: {}: this Communicator is already running a collective in another thread; "
            "one Communicator serves one thread at a time",
            c_.rank(), what));
    }
    ~Busy() { c_.busy_.store(false); }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    PyCommunicator& c_;
  };

 private:
  std::unique_ptr<Communicator> comm_;
  int rank_;
  std::atomic<bool> busy_{false};
};

// ---------------------------------------------------------------------------
// Non-blocking collectives (async_op=True): the Request keeps the views (so
// the buffer protocol export or DLPack tensor, hence the memory) alive until
// the collective is complete, then releases them with the GIL held.

/// The buffers one collective borrows, released together.
struct Held {
  std::vector<std::unique_ptr<BufferView>> views;
  BufferView& add() {
    views.push_back(std::make_unique<BufferView>());
    return *views.back();
  }
};

class PyRequest {
 public:
  PyRequest(Request request, Held held, py::object result);
  PyRequest(const PyRequest&) = delete;
  PyRequest& operator=(const PyRequest&) = delete;
  // Waits for a pending request (GIL released) before its buffers go.
  ~PyRequest();

  bool wait(std::optional<double> timeout);
  bool is_completed();
  py::object result() const { return result_; }

 private:
  void release_buffers() { held_.views.clear(); }
  static void warn_dropped(std::exception_ptr error);

  Request request_;
  Held held_;
  py::object result_;
  bool error_raised_ = false;  // wait() or is_completed() raised the error
};

// False while a collective's Python entry point (ranked()) runs the bindings'
// own checks; dispatch() sets it when the call goes on to the core (which
// tells the peers of its own refusals). An error raised before is refused
// through Communicator::reject_call, so the peers fail fast too.
extern thread_local bool t_core_reached;

// The wait check (shmring::set_wait_check) of the blocking calls: Python
// runs its signal handlers only when the waiting thread returns to it, so
// without it Ctrl-C (KeyboardInterrupt) would wait for the peer or for
// SHMRING_TIMEOUT. A handler that raises (PyErr_CheckSignals) aborts the
// job; its exception stays set for run_interruptible. Takes the GIL.
std::string python_signals_raised();

// Runs `f` (a blocking call) with the GIL released and python_signals_raised
// as this thread's wait check. A Python exception that a signal handler
// raised meanwhile is the one the caller gets, not the AbortedError it
// caused (the peers get that one, naming the signal).
template <class F>
void run_interruptible(F&& f) {
  struct Checked {
    WaitCheck before = set_wait_check(&python_signals_raised);
    ~Checked() { set_wait_check(before); }
  } checked;
  try {
    py::gil_scoped_release release;
    f();
  } catch (const Error&) {
    if (PyErr_Occurred() != nullptr) throw py::error_already_set();
    throw;
  }
}

// Runs one collective: blocking (GIL released, one-thread guard), or started
// with async_op, giving a shmring.Request that holds `held` until complete.
template <class Blocking, class Start>
py::object dispatch(PyCommunicator& self, const char* what, bool async_op, Held& held,
                    py::object result, Blocking&& blocking, Start&& start) {
  // From here on an error is not a refused argument: the one-thread guard
  // (another thread is mid-collective, so this one must not publish), a
  // closed communicator, or the core's own error.
  t_core_reached = true;
  Communicator& comm = self.get();
  PyCommunicator::Busy busy(self, what);
  if (async_op) {
    Request r = start(comm);
    return py::cast(std::make_unique<PyRequest>(std::move(r), std::move(held), std::move(result)));
  }
  run_interruptible([&] { blocking(comm); });
  return result;
}

void check_same_type(const char* what, const BufferView& a, const char* a_name, const BufferView& b,
                     const char* b_name);

// The collectives and point-to-point calls behind the Communicator's methods
// (collectives.cpp, block_collectives.cpp, p2p.cpp); every argument arrives
// converted, buffers as the Python objects they are.
py::object allreduce(PyCommunicator& self, py::object buffer, ReduceOp op, py::object out,
                     bool async_op);
py::object reduce_scatter(PyCommunicator& self, py::object send_obj, py::object out_obj,
                          ReduceOp op, bool async_op);
py::object allgather(PyCommunicator& self, py::object send_obj, py::object out_obj, bool async_op);
py::object broadcast(PyCommunicator& self, py::object buffer, int root, bool async_op);
py::object reduce(PyCommunicator& self, py::object buffer, ReduceOp op, int root, py::object out,
                  bool async_op);
py::object alltoall(PyCommunicator& self, py::object send_obj, py::object out_obj, bool async_op);
py::object alltoallv(PyCommunicator& self, py::object send_obj, py::object send_counts_obj,
                     py::object out_obj, py::object recv_counts_obj, py::object send_displs_obj,
                     py::object recv_displs_obj, bool async_op);
py::object gather(PyCommunicator& self, py::object send_obj, py::object out_obj, int root,
                  bool async_op);
py::object scatter(PyCommunicator& self, py::object send_obj, py::object out_obj, int root,
                   bool async_op);
py::object allgatherv(PyCommunicator& self, py::object send_obj, py::object out_obj,
                      py::object recv_counts_obj, py::object displs_obj, bool async_op);
py::object reduce_scatter_v(PyCommunicator& self, py::object send_obj, py::object out_obj,
                            py::object recv_counts_obj, ReduceOp op, bool async_op);
py::object send(PyCommunicator& self, py::object buffer, int peer, int tag, bool async_op);
py::object recv(PyCommunicator& self, py::object buffer, int peer, int tag, bool async_op);

/// The classes of the module (request.cpp, communicator.cpp).
void bind_request(py::module_& m);
void bind_communicator(py::module_& m);

}  // namespace shmring::python
