// Python bindings: the `shmring` extension module.
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
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shmring/shmring.hpp"

namespace py = pybind11;

namespace shmring::python {
namespace {

// ---------------------------------------------------------------------------
// DLPack: the consumer side of the exchange, declared from the published ABI
// (a plain C struct layout shared by every framework that speaks DLPack).

enum DlDeviceType : std::int32_t { kDlCpu = 1 };
enum DlTypeCode : std::uint8_t { kDlInt = 0, kDlUInt = 1, kDlFloat = 2, kDlBfloat = 4 };

struct DlDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DlDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DlTensor {
  void* data;
  DlDevice device;
  std::int32_t ndim;
  DlDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // In elements; null means compact row-major.
  std::uint64_t byte_offset;
};
struct DlManagedTensor {
  DlTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DlManagedTensor* self);
};

// Capsule names fixed by the protocol: the producer names it "dltensor"; a
// consumer that takes ownership renames it so the capsule's own destructor
// does not free the tensor a second time.
constexpr const char* kDlCapsule = "dltensor";
constexpr const char* kDlUsedCapsule = "used_dltensor";

// ---------------------------------------------------------------------------
// A borrowed view of the memory of one Python object, kept alive (buffer
// released, DLPack deleter called) until the view is destroyed.

class BufferView {
 public:
  BufferView() = default;
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  ~BufferView() {
    if (has_py_buffer_) PyBuffer_Release(&py_buffer_);
    if (managed_ && managed_->deleter) managed_->deleter(managed_);
  }

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

std::string type_name(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__qualname__")).cast<std::string>();
}

// The element type of a buffer-protocol format string ("f", "<e", "=q", ...).
std::optional<DataType> datatype_of_format(const char* format, Py_ssize_t itemsize) {
  std::string f = format ? format : "B";
  // Native or explicit little-endian only: the kernels work on native values.
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.erase(0, 1);
  if (f.size() != 1) return std::nullopt;
  switch (f[0]) {
    case 'f':
      return itemsize == 4 ? std::optional(DataType::float32) : std::nullopt;
    case 'd':
      return itemsize == 8 ? std::optional(DataType::float64) : std::nullopt;
    case 'e':
      return itemsize == 2 ? std::optional(DataType::float16) : std::nullopt;
    case 'B':
      return itemsize == 1 ? std::optional(DataType::uint8) : std::nullopt;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'n':
      // Signed integers: the C name's width varies by platform, the size not.
      switch (itemsize) {
        case 1:
          return DataType::int8;
        case 4:
          return DataType::int32;
        case 8:
          return DataType::int64;
      }
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<DataType> datatype_of_dlpack(const DlDataType& t) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDlFloat:
      if (t.bits == 32) return DataType::float32;
      if (t.bits == 64) return DataType::float64;
      if (t.bits == 16) return DataType::float16;
      return std::nullopt;
    case kDlBfloat:
      return t.bits == 16 ? std::optional(DataType::bfloat16) : std::nullopt;
    case kDlInt:
      if (t.bits == 8) return DataType::int8;
      if (t.bits == 32) return DataType::int32;
      if (t.bits == 64) return DataType::int64;
      return std::nullopt;
    case kDlUInt:
      return t.bits == 8 ? std::optional(DataType::uint8) : std::nullopt;
  }
  return std::nullopt;
}

constexpr const char* kSupportedTypes =
    "float32, float64, float16, bfloat16, int8, uint8, int32 or int64";

void BufferView::acquire(py::handle obj, const char* what, bool writable) {
  // The buffer protocol first: it is the only one that reports read-only
  // memory (numpy refuses to export such an array through DLPack anyway).
  if (PyObject_CheckBuffer(obj.ptr())) {
    acquire_buffer(obj, what, writable);
  } else if (py::hasattr(obj, "__dlpack__")) {
    acquire_dlpack(obj, what);
  } else {
    throw InvalidArgumentError(fmt::format(
        "{}: a {} has neither the buffer protocol nor __dlpack__; expected a numpy array, a "
        "torch CPU tensor or another contiguous buffer",
        what, type_name(obj)));
  }
}

void BufferView::acquire_buffer(py::handle obj, const char* what, bool writable) {
  // Ask for strides and format without demanding contiguity or writability,
  // so that we can say which of the two is missing.
  if (PyObject_GetBuffer(obj.ptr(), &py_buffer_, PyBUF_STRIDES | PyBUF_FORMAT) != 0)
    throw py::error_already_set();
  has_py_buffer_ = true;
  const Py_buffer& b = py_buffer_;
  if (writable && b.readonly)
    throw InvalidArgumentError(
        fmt::format("{}: the {} is read-only; a collective writes its result into this buffer "
                    "(for numpy, pass a writable array, e.g. a copy)",
                    what, type_name(obj)));
  if (!PyBuffer_IsContiguous(&b, 'C'))
    throw InvalidArgumentError(
        fmt::format("{}: the {} is not C-contiguous; shmring reduces in place and never copies "
                    "(pass a contiguous array, e.g. numpy.ascontiguousarray)",
                    what, type_name(obj)));
  auto dtype = datatype_of_format(b.format, b.itemsize);
  if (!dtype)
    throw InvalidArgumentError(
        fmt::format("{}: the {} has element format '{}' ({} bytes); expected {}", what,
                    type_name(obj), b.format ? b.format : "B", b.itemsize, kSupportedTypes));
  dtype_ = *dtype;
  data_ = b.buf;
  count_ = static_cast<std::size_t>(b.len / b.itemsize);
}

void BufferView::acquire_dlpack(py::handle obj, const char* what) {
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    // torch refuses tensors that require grad, bool tensors, conjugate views...
    std::string why = py::str(e.value()).cast<std::string>();
    throw InvalidArgumentError(
        fmt::format("{}: the {} cannot be shared through DLPack: {}: {}", what, type_name(obj),
                    py::str(e.type().attr("__name__")).cast<std::string>(), why));
  }
  auto* managed = static_cast<DlManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kDlCapsule));
  if (managed == nullptr) throw py::error_already_set();  // Wrong or already used capsule.
  // Ownership moves to us: rename so the capsule's destructor leaves it alone.
  if (PyCapsule_SetName(capsule.ptr(), kDlUsedCapsule) != 0) throw py::error_already_set();
  managed_ = managed;

  const DlTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDlCpu)
    throw InvalidArgumentError(fmt::format(
        "{}: the {} lives on DLPack device type {} (id {}); shmring reduces CPU memory only "
        "(device type {})",
        what, type_name(obj), t.device.device_type, t.device.device_id, int{kDlCpu}));
  auto dtype = datatype_of_dlpack(t.dtype);
  if (!dtype)
    throw InvalidArgumentError(
        fmt::format("{}: the {} has DLPack dtype (code {}, bits {}, lanes {}); expected {}", what,
                    type_name(obj), t.dtype.code, t.dtype.bits, t.dtype.lanes, kSupportedTypes));
  std::size_t count = 1;
  for (std::int32_t i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0)
      throw InvalidArgumentError(
          fmt::format("{}: DLPack shape[{}] is {}, negative", what, i, t.shape[i]));
    count *= static_cast<std::size_t>(t.shape[i]);
  }
  if (t.strides != nullptr && count > 0) {
    // Row-major compact: each stride is the product of the extents after it.
    // An extent of 1 may carry any stride (torch gives such dims odd ones).
    std::int64_t expected = 1;
    for (std::int32_t i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expected)
        throw InvalidArgumentError(fmt::format(
            "{}: the {} is not contiguous (dimension {} has stride {}, expected {}); shmring "
            "reduces in place and never copies (call .contiguous() first)",
            what, type_name(obj), i, t.strides[i], expected));
      expected *= t.shape[i];
    }
  }
  dtype_ = *dtype;
  data_ = static_cast<std::byte*>(t.data) + t.byte_offset;
  count_ = count;
}

// ---------------------------------------------------------------------------
// Exceptions: one Python class per ErrorCode, under a common shmring.Error
// (a RuntimeError). Where a builtin says the same thing, the class derives
// from it too, so `except ValueError` / `except TimeoutError` work.

struct ErrorClasses {
  py::handle base;
  py::handle by_code[9];  // Indexed by ErrorCode.
};
ErrorClasses g_errors;

py::handle new_exception(py::module_& m, const char* name, py::tuple bases, const char* doc) {
  std::string qualified = std::string("shmring.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  // The module keeps one reference; the translator borrows it for the life of
  // the interpreter (exception classes are never unloaded).
  m.add_object(name, py::handle(cls));
  return cls;
}

void register_exceptions(py::module_& m) {
  py::handle builtins_value_error = PyExc_ValueError;
  py::handle builtins_timeout = PyExc_TimeoutError;
  py::handle builtins_os_error = PyExc_OSError;
  py::handle builtins_memory = PyExc_MemoryError;
  py::handle builtins_connection = PyExc_ConnectionError;

  g_errors.base = new_exception(m, "Error", py::make_tuple(py::handle(PyExc_RuntimeError)),
                                "Base of every shmring error; .code is the ErrorCode.");
  auto sub = [&](const char* name, ErrorCode code, py::tuple bases, const char* doc) {
    g_errors.by_code[static_cast<int>(code)] = new_exception(m, name, bases, doc);
  };
  py::handle base = g_errors.base;
  sub("InvalidArgumentError", ErrorCode::invalid_argument,
      py::make_tuple(base, builtins_value_error),
      "A bad value from the caller or the environment (also a ValueError).");
  sub("MismatchError", ErrorCode::mismatch, py::make_tuple(base),
      "Ranks called different collectives, counts, datatypes, operators or roots.");
  sub("TimeoutError", ErrorCode::timeout, py::make_tuple(base, builtins_timeout),
      "A wait passed its deadline, SHMRING_TIMEOUT (also the builtin TimeoutError).");
  sub("PeerFailureError", ErrorCode::peer_failure, py::make_tuple(base, builtins_connection),
      "A peer process died or left mid-collective (also a ConnectionError).");
  sub("AbortedError", ErrorCode::aborted, py::make_tuple(base),
      "The job was aborted by a rank's error or an explicit abort().");
  sub("SystemError", ErrorCode::system_error, py::make_tuple(base, builtins_os_error),
      "A system call failed; .errno holds the cause (also an OSError).");
  sub("OutOfSharedMemoryError", ErrorCode::out_of_shared_memory,
      py::make_tuple(base, builtins_memory),
      "/dev/shm cannot hold the segment (also a MemoryError).");
  sub("InternalError", ErrorCode::internal, py::make_tuple(base), "A bug in shmring.");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      auto index = static_cast<unsigned>(e.code());
      py::handle cls = index < std::size(g_errors.by_code) && g_errors.by_code[index]
                           ? g_errors.by_code[index]
                           : g_errors.base;
      // Build the instance ourselves to attach the code (and errno) to it.
      py::object exc = cls(py::str(e.what()));
      exc.attr("code") = py::cast(e.code());
      if (e.code() == ErrorCode::system_error) exc.attr("errno") = e.sys_errno();
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
}

// ---------------------------------------------------------------------------
// The Python Communicator: the C++ one, plus an explicit close() and a guard
// against use from two threads at once (the C++ object allows one thread at a
// time, and the GIL is released while a collective runs).

class PyCommunicator {
 public:
  explicit PyCommunicator(const Options& options)
      : comm_(std::make_unique<Communicator>(options)) {}
  explicit PyCommunicator(Communicator&& comm)
      : comm_(std::make_unique<Communicator>(std::move(comm))) {}

  Communicator& get() {
    if (!comm_) throw InvalidArgumentError("this Communicator was closed; create a new one");
    return *comm_;
  }
  bool closed() const { return !comm_; }

  void close() {
    if (busy_.load())
      throw InvalidArgumentError(
          "close(): a collective is running on this Communicator in another thread");
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
            "{}: this Communicator is already running a collective in another thread; one "
            "Communicator serves one thread at a time",
            what));
    }
    ~Busy() { c_.busy_.store(false); }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    PyCommunicator& c_;
  };

 private:
  std::unique_ptr<Communicator> comm_;
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
  PyRequest(Request request, Held held, py::object result)
      : request_(std::move(request)), held_(std::move(held)), result_(std::move(result)) {}
  PyRequest(const PyRequest&) = delete;
  PyRequest& operator=(const PyRequest&) = delete;
  ~PyRequest() {
    // A pending request must finish before its buffers are released; wait
    // without the GIL so that other Python threads run meanwhile. A
    // destructor cannot raise, yet an error that wait()/is_completed() never
    // raised must not vanish: it becomes a RuntimeWarning (the communicator
    // keeps it too: its next call raises AbortedError quoting it).
    if (!request_.valid()) return;
    std::exception_ptr error;
    {
      py::gil_scoped_release release;
      try {
        request_.wait();
      } catch (...) {
        error = std::current_exception();
      }
      request_ = Request();
    }
    if (error && !error_raised_) warn_dropped(error);
  }

  bool wait(std::optional<double> timeout) {
    bool done = true;
    try {
      py::gil_scoped_release release;
      if (timeout)
        done = request_.wait_for_seconds(*timeout);
      else
        request_.wait();
    } catch (...) {
      error_raised_ = true;
      release_buffers();
      throw;
    }
    if (done) release_buffers();
    return done;
  }

  bool is_completed() {
    bool done = false;
    try {
      done = request_.test();
    } catch (...) {
      error_raised_ = true;
      release_buffers();
      throw;
    }
    if (done) release_buffers();
    return done;
  }

  py::object result() const { return result_; }

 private:
  void release_buffers() { held_.views.clear(); }

  // The warning of a Request dropped with an error nobody saw, named by its
  // Python class; where warnings are errors, Python's "Exception ignored"
  // report instead. Keeps an exception being raised meanwhile (the drop may
  // happen while one unwinds).
  static void warn_dropped(std::exception_ptr error) {
    std::string what;
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      // A started collective's request fails with InvalidArgumentError only
      // in a forked child, for its parent's request: nothing failed there.
      if (e.code() == ErrorCode::invalid_argument) return;
      auto index = static_cast<unsigned>(e.code());
      py::handle cls = index < std::size(g_errors.by_code) && g_errors.by_code[index]
                           ? g_errors.by_code[index]
                           : g_errors.base;
      what = fmt::format("{}: {}", py::str(cls.attr("__name__")).cast<std::string>(), e.what());
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      what = "an unknown error";
    }
    py::error_scope keep;
    const std::string text = fmt::format(
        "a shmring.Request was dropped before wait() and its collective failed: {}", what);
    if (PyErr_WarnEx(PyExc_RuntimeWarning, text.c_str(), 1) != 0) PyErr_WriteUnraisable(nullptr);
  }

  Request request_;
  Held held_;
  py::object result_;
  bool error_raised_ = false;  // wait() or is_completed() raised the error
};

// False while a collective's Python entry point (ranked()) runs the bindings'
// own checks; dispatch() sets it when the call goes on to the core (which
// tells the peers of its own refusals). An error raised before is refused
// through Communicator::reject_call, so the peers fail fast too.
thread_local bool t_core_reached = false;

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
  {
    py::gil_scoped_release release;
    blocking(comm);
  }
  return result;
}

py::object allreduce(PyCommunicator& self, py::object buffer, ReduceOp op, py::object out,
                     bool async_op) {
  Held held;
  BufferView& send = held.add();
  BufferView& recv_storage = held.add();
  const BufferView* recv = &send;
  if (out.is_none()) {
    send.acquire(buffer, "allreduce: buffer", /*writable=*/true);
  } else {
    send.acquire(buffer, "allreduce: buffer", /*writable=*/false);
    recv_storage.acquire(out, "allreduce: out", /*writable=*/true);
    recv = &recv_storage;
    if (recv->dtype() != send.dtype() || recv->count() != send.count())
      throw InvalidArgumentError(fmt::format(
          "allreduce: buffer holds {} {} elements but out holds {} {} elements; they must match",
          send.count(), to_string(send.dtype()), recv->count(), to_string(recv->dtype())));
  }
  return dispatch(
      self, "allreduce", async_op, held, out.is_none() ? buffer : out,
      [&](Communicator& c) {
        c.allreduce(send.data(), recv->data(), send.count(), send.dtype(), op);
      },
      [&](Communicator& c) {
        return c.iallreduce(send.data(), recv->data(), send.count(), send.dtype(), op);
      });
}

void check_same_type(const char* what, const BufferView& a, const char* a_name, const BufferView& b,
                     const char* b_name) {
  if (a.dtype() != b.dtype())
    throw InvalidArgumentError(fmt::format("{}: {} is {} but {} is {}; they must match", what,
                                           a_name, to_string(a.dtype()), b_name,
                                           to_string(b.dtype())));
}

// A Python argument of a collective, converted inside ranked() rather than
// by pybind11 before the call, so that a wrong type (op="sum", root=None)
// is refused in call order too. TypeError naming the value.
template <class T>
const char* expected_type() {
  if constexpr (std::is_same_v<T, ReduceOp>) return "a shmring.ReduceOp";
  if constexpr (std::is_same_v<T, bool>) return "a bool";
  return "an int";
}

template <class T>
T from_py(py::object obj, const char* what) {
  if constexpr (std::is_same_v<T, py::object>) {
    return obj;
  } else {
    try {
      return obj.cast<T>();
    } catch (const py::cast_error&) {
      throw py::type_error(fmt::format("{}: an argument is {} {}, expected {}", what,
                                       type_name(obj), py::repr(obj).cast<std::string>(),
                                       expected_type<T>()));
    }
  }
}

template <class T>
using PyArg = py::object;

// A collective's Python entry point. The bindings' own argument errors
// (buffer conversions, shapes) happen before the core sees the call: they
// are told to the peers in call order (Communicator::reject_call), so the
// peers' matching call fails at once with MismatchError naming this rank
// instead of waiting until SHMRING_TIMEOUT; here they raise
// InvalidArgumentError starting with the rank, like the core's. A Python
// error raised by the buffer's own export (BufferError...) or by an
// argument's conversion (TypeError: every argument arrives as an object and
// is converted here) is told to the peers the same way and raised as it was.
// Collectives only: a point-to-point call (send/recv) is not in the
// collective order, and publishing its refusal would shift this rank's.
template <class... A>
auto ranked(const char* what, py::object (*f)(PyCommunicator&, A...)) {
  return [what, f](PyCommunicator& self, PyArg<A>... args) -> py::object {
    t_core_reached = false;
    try {
      return f(self, from_py<A>(std::move(args), what)...);
    } catch (const InvalidArgumentError& e) {
      std::string m = e.what();
      if (!t_core_reached && !self.closed()) {
        const std::string prefix = std::string(what) + ": ";
        if (m.rfind(prefix, 0) == 0) m.erase(0, prefix.size());
        self.get().reject_call(what, m);
      }
      if (m.rfind("rank ", 0) == 0 || self.closed()) throw;
      throw InvalidArgumentError(fmt::format("rank {}: {}", self.get().rank(), m));
    } catch (...) {
      if (t_core_reached || self.closed()) throw;
      std::string why = "refused by the Python bindings";
      try {
        throw;
      } catch (py::error_already_set& e) {
        why = e.what();
      } catch (const std::exception& e) {
        why = e.what();
      } catch (...) {
      }
      try {
        self.get().reject_call(what, why);
      } catch (const Error&) {
        // Published (or the communicator is broken and the peers know):
        // the caller gets the original error, which says most.
      }
      throw;
    }
  };
}

// A point-to-point call's Python entry point: errors start with the rank
// like the core's, and nothing is published (send/recv are not in the
// collective order, so a refusal there concerns this rank and its peer only).
template <class... A>
auto ranked_p2p(py::object (*f)(PyCommunicator&, A...)) {
  return [f](PyCommunicator& self, A... args) -> py::object {
    try {
      return f(self, std::move(args)...);
    } catch (const InvalidArgumentError& e) {
      std::string m = e.what();
      if (m.rfind("rank ", 0) == 0 || self.closed()) throw;
      throw InvalidArgumentError(fmt::format("rank {}: {}", self.get().rank(), m));
    }
  };
}

// Runs one collective with the GIL released, holding the one-thread guard.
template <class F>
void run_collective(PyCommunicator& self, const char* what, F&& f) {
  Communicator& comm = self.get();
  PyCommunicator::Busy busy(self, what);
  py::gil_scoped_release release;
  f(comm);
}

py::object reduce_scatter(PyCommunicator& self, py::object send_obj, py::object out_obj,
                          ReduceOp op, bool async_op) {
  const int size = self.get().size();
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "reduce_scatter: send", /*writable=*/false);
  out.acquire(out_obj, "reduce_scatter: out", /*writable=*/true);
  check_same_type("reduce_scatter", send, "send", out, "out");
  if (send.count() != out.count() * static_cast<std::size_t>(size))
    throw InvalidArgumentError(
        fmt::format("reduce_scatter: send holds {} elements, expected size() x out = {} x {} = {}",
                    send.count(), size, out.count(), out.count() * static_cast<std::size_t>(size)));
  return dispatch(
      self, "reduce_scatter", async_op, held, out_obj,
      [&](Communicator& c) {
        c.reduce_scatter(send.data(), out.data(), out.count(), out.dtype(), op);
      },
      [&](Communicator& c) {
        return c.ireduce_scatter(send.data(), out.data(), out.count(), out.dtype(), op);
      });
}

py::object allgather(PyCommunicator& self, py::object send_obj, py::object out_obj, bool async_op) {
  const int size = self.get().size();
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "allgather: send", /*writable=*/false);
  out.acquire(out_obj, "allgather: out", /*writable=*/true);
  check_same_type("allgather", send, "send", out, "out");
  if (out.count() != send.count() * static_cast<std::size_t>(size))
    throw InvalidArgumentError(fmt::format(
        "allgather: out holds {} elements, expected size() x send = {} x {} = {}", out.count(),
        size, send.count(), send.count() * static_cast<std::size_t>(size)));
  return dispatch(
      self, "allgather", async_op, held, out_obj,
      [&](Communicator& c) { c.allgather(send.data(), out.data(), send.count(), send.dtype()); },
      [&](Communicator& c) {
        return c.iallgather(send.data(), out.data(), send.count(), send.dtype());
      });
}

py::object broadcast(PyCommunicator& self, py::object buffer, int root, bool async_op) {
  // The root only reads its buffer; the others write into theirs.
  Held held;
  BufferView& view = held.add();
  view.acquire(buffer, "broadcast: buffer", /*writable=*/self.get().rank() != root);
  return dispatch(
      self, "broadcast", async_op, held, buffer,
      [&](Communicator& c) { c.broadcast(view.data(), view.count(), view.dtype(), root); },
      [&](Communicator& c) { return c.ibroadcast(view.data(), view.count(), view.dtype(), root); });
}

py::object reduce(PyCommunicator& self, py::object buffer, ReduceOp op, int root, py::object out,
                  bool async_op) {
  const bool at_root = self.get().rank() == root;
  Held held;
  BufferView &send = held.add(), &out_storage = held.add();
  const BufferView* recv = &send;
  send.acquire(buffer, "reduce: buffer", /*writable=*/at_root && out.is_none());
  if (!out.is_none()) {
    out_storage.acquire(out, "reduce: out", /*writable=*/true);
    check_same_type("reduce", send, "buffer", out_storage, "out");
    if (out_storage.count() != send.count())
      throw InvalidArgumentError(
          fmt::format("reduce: buffer holds {} elements but out holds {}; they must match",
                      send.count(), out_storage.count()));
    recv = &out_storage;
  }
  void* recv_data = at_root ? recv->data() : nullptr;
  return dispatch(
      self, "reduce", async_op, held, out.is_none() ? buffer : out,
      [&](Communicator& c) {
        c.reduce(send.data(), recv_data, send.count(), send.dtype(), op, root);
      },
      [&](Communicator& c) {
        return c.ireduce(send.data(), recv_data, send.count(), send.dtype(), op, root);
      });
}

// ---- Issue 14's collectives. Counts and displacements come as Python
// sequences of ints (elements, not bytes); displacements default to the
// blocks packed in rank order. The bindings check every block against the
// buffer it lives in (the core sees only pointers).

std::vector<std::size_t> counts_from(const py::handle& seq, const char* what, const char* name,
                                     int size) {
  if (!py::isinstance<py::sequence>(seq) || py::isinstance<py::str>(seq))
    throw InvalidArgumentError(
        fmt::format("{}: {} must be a sequence of {} ints, got {}", what, name, size,
                    py::str(py::type::handle_of(seq).attr("__name__")).cast<std::string>()));
  auto s = py::reinterpret_borrow<py::sequence>(seq);
  if (s.size() != static_cast<std::size_t>(size))
    throw InvalidArgumentError(
        fmt::format("{}: {} has {} entries, expected size = {}", what, name, s.size(), size));
  std::vector<std::size_t> out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    py::object x = s[i];
    // Any integer with __index__ (Python int, numpy integer scalars, e.g.
    // np.bincount's output); not bool, not float.
    if (py::isinstance<py::bool_>(x) || !PyIndex_Check(x.ptr()))
      throw InvalidArgumentError(fmt::format("{}: {}[{}] must be an integer, got {} {}", what, name,
                                             i, type_name(x), py::repr(x).cast<std::string>()));
    long long v = py::reinterpret_steal<py::int_>(PyNumber_Index(x.ptr())).cast<long long>();
    if (v < 0)
      throw InvalidArgumentError(fmt::format("{}: {}[{}]={} must be >= 0", what, name, i, v));
    out.push_back(static_cast<std::size_t>(v));
  }
  return out;
}

std::vector<std::size_t> displs_from(const py::object& seq, const std::vector<std::size_t>& counts,
                                     const char* what, const char* name, int size) {
  if (!seq.is_none()) return counts_from(seq, what, name, size);
  std::vector<std::size_t> d(counts.size(), 0);
  for (std::size_t j = 1; j < counts.size(); ++j) d[j] = d[j - 1] + counts[j - 1];
  return d;
}

// Every block (displs[j], counts[j]) must lie inside `buffer`.
void check_blocks_inside(const char* what, const char* name, const BufferView& buffer,
                         const std::vector<std::size_t>& counts,
                         const std::vector<std::size_t>& displs) {
  for (std::size_t j = 0; j < counts.size(); ++j)
    if (counts[j] > 0 && (displs[j] > buffer.count() || counts[j] > buffer.count() - displs[j]))
      throw InvalidArgumentError(
          fmt::format("{}: block {} of {} (elements [{}, {})) lies outside its {} elements", what,
                      j, name, displs[j], displs[j] + counts[j], buffer.count()));
}

py::object alltoall(PyCommunicator& self, py::object send_obj, py::object out_obj, bool async_op) {
  const auto size = static_cast<std::size_t>(self.get().size());
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "alltoall: send", /*writable=*/false);
  out.acquire(out_obj, "alltoall: out", /*writable=*/true);
  check_same_type("alltoall", send, "send", out, "out");
  if (send.count() != out.count() || send.count() % size != 0)
    throw InvalidArgumentError(
        fmt::format("alltoall: send and out hold {} and {} elements; expected the same number, a "
                    "multiple of size = {}",
                    send.count(), out.count(), size));
  const std::size_t k = send.count() / size;
  return dispatch(
      self, "alltoall", async_op, held, out_obj,
      [&](Communicator& c) { c.alltoall(send.data(), out.data(), k, send.dtype()); },
      [&](Communicator& c) { return c.ialltoall(send.data(), out.data(), k, send.dtype()); });
}

py::object alltoallv(PyCommunicator& self, py::object send_obj, py::object send_counts_obj,
                     py::object out_obj, py::object recv_counts_obj, py::object send_displs_obj,
                     py::object recv_displs_obj, bool async_op) {
  const char* what = "alltoallv";
  const int size = self.get().size();
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "alltoallv: send", /*writable=*/false);
  out.acquire(out_obj, "alltoallv: out", /*writable=*/true);
  check_same_type(what, send, "send", out, "out");
  auto sc = counts_from(send_counts_obj, what, "send_counts", size);
  auto rc = counts_from(recv_counts_obj, what, "recv_counts", size);
  auto sd = displs_from(send_displs_obj, sc, what, "send_displs", size);
  auto rd = displs_from(recv_displs_obj, rc, what, "recv_displs", size);
  check_blocks_inside(what, "send", send, sc, sd);
  check_blocks_inside(what, "out", out, rc, rd);
  return dispatch(
      self, what, async_op, held, out_obj,
      [&](Communicator& c) { c.alltoallv(send.data(), sc, sd, out.data(), rc, rd, send.dtype()); },
      [&](Communicator& c) {
        return c.ialltoallv(send.data(), sc, sd, out.data(), rc, rd, send.dtype());
      });
}

py::object gather(PyCommunicator& self, py::object send_obj, py::object out_obj, int root,
                  bool async_op) {
  const int size = self.get().size();
  const bool at_root = self.get().rank() == root;
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "gather: send", /*writable=*/false);
  void* recv = nullptr;
  if (at_root) {
    if (out_obj.is_none())
      throw InvalidArgumentError("gather: the root needs `out` (size x len(send) elements)");
    out.acquire(out_obj, "gather: out", /*writable=*/true);
    check_same_type("gather", send, "send", out, "out");
    if (out.count() != send.count() * static_cast<std::size_t>(size))
      throw InvalidArgumentError(fmt::format(
          "gather: out holds {} elements, expected size x send = {} x {} = {}", out.count(), size,
          send.count(), send.count() * static_cast<std::size_t>(size)));
    recv = out.data();
  }
  return dispatch(
      self, "gather", async_op, held, at_root ? out_obj : py::none(),
      [&](Communicator& c) { c.gather(send.data(), recv, send.count(), send.dtype(), root); },
      [&](Communicator& c) {
        return c.igather(send.data(), recv, send.count(), send.dtype(), root);
      });
}

py::object scatter(PyCommunicator& self, py::object send_obj, py::object out_obj, int root,
                   bool async_op) {
  const int size = self.get().size();
  const bool at_root = self.get().rank() == root;
  Held held;
  BufferView &send = held.add(), &out = held.add();
  out.acquire(out_obj, "scatter: out", /*writable=*/true);
  const void* send_data = nullptr;
  if (at_root) {
    if (send_obj.is_none())
      throw InvalidArgumentError("scatter: the root needs `send` (size x len(out) elements)");
    send.acquire(send_obj, "scatter: send", /*writable=*/false);
    check_same_type("scatter", send, "send", out, "out");
    if (send.count() != out.count() * static_cast<std::size_t>(size))
      throw InvalidArgumentError(fmt::format(
          "scatter: send holds {} elements, expected size x out = {} x {} = {}", send.count(), size,
          out.count(), out.count() * static_cast<std::size_t>(size)));
    send_data = send.data();
  }
  return dispatch(
      self, "scatter", async_op, held, out_obj,
      [&](Communicator& c) { c.scatter(send_data, out.data(), out.count(), out.dtype(), root); },
      [&](Communicator& c) {
        return c.iscatter(send_data, out.data(), out.count(), out.dtype(), root);
      });
}

py::object allgatherv(PyCommunicator& self, py::object send_obj, py::object out_obj,
                      py::object recv_counts_obj, py::object displs_obj, bool async_op) {
  const char* what = "allgatherv";
  const int size = self.get().size();
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "allgatherv: send", /*writable=*/false);
  out.acquire(out_obj, "allgatherv: out", /*writable=*/true);
  check_same_type(what, send, "send", out, "out");
  auto rc = counts_from(recv_counts_obj, what, "recv_counts", size);
  auto d = displs_from(displs_obj, rc, what, "displs", size);
  check_blocks_inside(what, "out", out, rc, d);
  return dispatch(
      self, what, async_op, held, out_obj,
      [&](Communicator& c) {
        c.allgatherv(send.data(), send.count(), out.data(), rc, d, send.dtype());
      },
      [&](Communicator& c) {
        return c.iallgatherv(send.data(), send.count(), out.data(), rc, d, send.dtype());
      });
}

py::object reduce_scatter_v(PyCommunicator& self, py::object send_obj, py::object out_obj,
                            py::object recv_counts_obj, ReduceOp op, bool async_op) {
  const char* what = "reduce_scatter_v";
  const int size = self.get().size();
  const int rank = self.get().rank();
  Held held;
  BufferView &send = held.add(), &out = held.add();
  send.acquire(send_obj, "reduce_scatter_v: send", /*writable=*/false);
  out.acquire(out_obj, "reduce_scatter_v: out", /*writable=*/true);
  check_same_type(what, send, "send", out, "out");
  auto rc = counts_from(recv_counts_obj, what, "recv_counts", size);
  std::size_t total = 0;
  for (auto x : rc) total += x;
  if (send.count() != total)
    throw InvalidArgumentError(
        fmt::format("reduce_scatter_v: send holds {} elements, expected sum(recv_counts) = {}",
                    send.count(), total));
  if (out.count() != rc[rank])
    throw InvalidArgumentError(
        fmt::format("reduce_scatter_v: out holds {} elements, expected recv_counts[{}] = {}",
                    out.count(), rank, rc[rank]));
  return dispatch(
      self, what, async_op, held, out_obj,
      [&](Communicator& c) { c.reduce_scatter_v(send.data(), out.data(), rc, send.dtype(), op); },
      [&](Communicator& c) {
        return c.ireduce_scatter_v(send.data(), out.data(), rc, send.dtype(), op);
      });
}

// Point-to-point: `buffer` is sent as it is (read only) or received into
// (written), zero copy.
py::object send(PyCommunicator& self, py::object buffer, int peer, int tag, bool async_op) {
  Held held;
  BufferView& view = held.add();
  view.acquire(buffer, "send: buffer", /*writable=*/false);
  return dispatch(
      self, "send", async_op, held, py::none(),
      [&](Communicator& c) { c.send(view.data(), view.count(), view.dtype(), peer, tag); },
      [&](Communicator& c) { return c.isend(view.data(), view.count(), view.dtype(), peer, tag); });
}

py::object recv(PyCommunicator& self, py::object buffer, int peer, int tag, bool async_op) {
  Held held;
  BufferView& view = held.add();
  view.acquire(buffer, "recv: buffer", /*writable=*/true);
  return dispatch(
      self, "recv", async_op, held, buffer,
      [&](Communicator& c) { c.recv(view.data(), view.count(), view.dtype(), peer, tag); },
      [&](Communicator& c) { return c.irecv(view.data(), view.count(), view.dtype(), peer, tag); });
}

py::dict config_dict(const Config& c) {
  py::dict d;
  d["rank"] = c.rank;
  d["world_size"] = c.world_size;
  d["local_rank"] = c.local_rank;
  d["local_world_size"] = c.local_world_size;
  d["job_id"] = c.job_id;
  d["slots"] = c.slots;
  d["slot_bytes"] = c.slot_bytes;
  d["slice_bytes"] = c.slice_bytes;
  d["threads"] = c.threads;
  d["timeout_s"] = c.timeout_s;
  d["spin_us"] = c.spin_us;
  d["yield_us"] = c.yield_us;
  d["direct_bytes"] = c.direct_bytes;
  d["algorithm"] = c.algorithm;
  d["nt_stores"] = c.nt_stores == NtStores::automatic ? "auto"
                   : c.nt_stores == NtStores::always  ? "1"
                                                      : "0";
  d["job_cpus"] = c.job_cpus;
  d["oversubscribed"] = c.oversubscribed;
  d["asymmetric_fence"] = c.asymmetric_fence;
  d["segment_name"] = c.segment_name;
  d["segment_bytes"] = c.segment_bytes;
  d["progress_cpu"] = c.progress_cpu;
  return d;
}

}  // namespace
}  // namespace shmring::python

PYBIND11_MODULE(_shmring, m) {
  using namespace shmring;
  using namespace shmring::python;
  m.doc() =
      "Collectives between the processes of one machine over POSIX shared memory.\n\n"
      "Buffers (numpy arrays, torch CPU tensors, any contiguous buffer) are reduced in\n"
      "place with no copy; the GIL is released while a collective runs.";
  m.attr("__version__") = SHMRING_VERSION_STRING;

  py::enum_<DataType>(m, "DataType", "Element type of a collective's buffers.")
      .value("FLOAT32", DataType::float32)
      .value("FLOAT64", DataType::float64)
      .value("FLOAT16", DataType::float16)
      .value("BFLOAT16", DataType::bfloat16)
      .value("INT8", DataType::int8)
      .value("UINT8", DataType::uint8)
      .value("INT32", DataType::int32)
      .value("INT64", DataType::int64);

  py::enum_<ReduceOp>(m, "ReduceOp",
                      "Reduction operator. Integer SUM and PROD wrap around; AVG is SUM divided "
                      "by the world size, floating types only.")
      .value("SUM", ReduceOp::sum)
      .value("PROD", ReduceOp::prod)
      .value("MIN", ReduceOp::min)
      .value("MAX", ReduceOp::max)
      .value("AVG", ReduceOp::avg);

  py::enum_<ErrorCode>(m, "ErrorCode", "What went wrong; the .code of every shmring.Error.")
      .value("OK", ErrorCode::ok)
      .value("INVALID_ARGUMENT", ErrorCode::invalid_argument)
      .value("MISMATCH", ErrorCode::mismatch)
      .value("TIMEOUT", ErrorCode::timeout)
      .value("PEER_FAILURE", ErrorCode::peer_failure)
      .value("ABORTED", ErrorCode::aborted)
      .value("SYSTEM_ERROR", ErrorCode::system_error)
      .value("OUT_OF_SHARED_MEMORY", ErrorCode::out_of_shared_memory)
      .value("INTERNAL", ErrorCode::internal);

  register_exceptions(m);

  m.def(
      "datatype_of",
      [](py::handle obj) {
        BufferView view;
        view.acquire(obj, "datatype_of", /*writable=*/false);
        return view.dtype();
      },
      py::arg("buffer"),
      "The DataType shmring sees in `buffer` (numpy array, torch tensor, ...). Raises "
      "InvalidArgumentError for one it cannot use.");

  m.def(
      "datatype_size", [](DataType t) { return datatype_size(t); }, py::arg("dtype"),
      "Bytes per element of `dtype`.");

  py::class_<PyRequest>(m, "Request", R"doc(
A non-blocking collective started with async_op=True. It keeps the buffers
alive until complete; do not touch them before. Errors of the collective
(MismatchError, PeerFailureError, TimeoutError, AbortedError) are raised by
wait() and is_completed(). Dropping a pending Request waits for it (GIL
released); an error neither raised is then a RuntimeWarning, and the
communicator's next call raises AbortedError quoting it.
)doc")
      .def("wait", &PyRequest::wait, py::arg("timeout") = py::none(), R"doc(
Blocks (GIL released) until the collective is complete and returns True, or
raises its error. With `timeout` (seconds), returns False if it is still
running then (the request stays pending).
)doc")
      .def("is_completed", &PyRequest::is_completed,
           "True when complete (raises the collective's error if it failed); never blocks.")
      .def_property_readonly("result", &PyRequest::result,
                             "The buffer that holds (or will hold) the result, as the blocking "
                             "form returns it; read it only after wait().");

  py::class_<PyCommunicator>(m, "Communicator", R"doc(
A group of world-size processes on this host running collectives over one
shared-memory segment.

Communicator() takes rank, world size and job id from the environment
(shmrun's SHMRING_*, torchrun's RANK/WORLD_SIZE, Open MPI, MPICH, Slurm).
Keyword arguments override single settings: rank=, world_size= (alias size=),
job_id=, local_rank=, local_world_size= (alias local_size=), slots=,
slot_bytes=, threads=, timeout= (seconds). Construction blocks until every rank has
attached (or the timeout passes).

Collective-call rules: every rank calls the same collectives in the same
order with the same count, datatype and operator; a disagreement raises
MismatchError on every rank. After any error the communicator is broken and
every later call raises AbortedError. One thread at a time per Communicator.
A collective refused by one rank's argument checks (a buffer of the wrong
dtype, size or layout) raises InvalidArgumentError there and, at once,
MismatchError naming that rank on the others, never a wait until the
timeout; refused alike on every rank, the communicator stays usable.
)doc")
      .def(py::init([](std::optional<int> rank, std::optional<int> size,
                       std::optional<std::string> job_id, std::optional<int> local_rank,
                       std::optional<int> local_size, std::optional<std::size_t> slots,
                       std::optional<std::size_t> slot_bytes, std::optional<int> threads,
                       std::optional<double> timeout, std::optional<int> world_size,
                       std::optional<int> local_world_size) {
             // world_size= is C++'s name (Options::world_size, WORLD_SIZE);
             // size= stays as its alias, like local_size= for local_world_size=.
             auto one_of = [](const char* a, std::optional<int> x, const char* b,
                              std::optional<int> y) {
               if (x && y && *x != *y)
                 throw InvalidArgumentError(
                     fmt::format("{}={} and {}={}: the same setting twice, with different values; "
                                 "give one",
                                 a, *x, b, *y));
               return x ? x : y;
             };
             size = one_of("world_size", world_size, "size", size);
             local_size = one_of("local_world_size", local_world_size, "local_size", local_size);
             Options o;
             o.rank = rank.value_or(-1);
             o.world_size = size.value_or(-1);
             o.job_id = job_id.value_or("");
             o.local_rank = local_rank.value_or(-1);
             o.local_world_size = local_size.value_or(-1);
             o.slots = slots.value_or(0);
             o.slot_bytes = slot_bytes.value_or(0);
             o.threads = threads.value_or(0);
             o.timeout_s = timeout.value_or(0);
             // Attaching waits for every rank: let other threads run meanwhile
             // (only around the C++ constructor; pybind11 registers the new
             // instance with the GIL held).
             std::unique_ptr<PyCommunicator> comm;
             {
               py::gil_scoped_release release;
               comm = std::make_unique<PyCommunicator>(o);
             }
             return comm;
           }),
           py::kw_only(), py::arg("rank") = py::none(), py::arg("size") = py::none(),
           py::arg("job_id") = py::none(), py::arg("local_rank") = py::none(),
           py::arg("local_size") = py::none(), py::arg("slots") = py::none(),
           py::arg("slot_bytes") = py::none(), py::arg("threads") = py::none(),
           py::arg("timeout") = py::none(), py::arg("world_size") = py::none(),
           py::arg("local_world_size") = py::none())
      .def_property_readonly("rank", [](PyCommunicator& c) { return c.get().rank(); })
      .def_property_readonly("size", [](PyCommunicator& c) { return c.get().size(); })
      .def_property_readonly(
          "world_size", [](PyCommunicator& c) { return c.get().size(); },
          "Number of ranks (the same as size).")
      .def_property_readonly(
          "local_world_size", [](PyCommunicator& c) { return c.get().local_size(); },
          "Ranks of this job on this host (the same as local_size).")
      .def_property_readonly("local_rank", [](PyCommunicator& c) { return c.get().local_rank(); })
      .def_property_readonly("local_size", [](PyCommunicator& c) { return c.get().local_size(); })
      .def_property_readonly(
          "config", [](PyCommunicator& c) { return config_dict(c.get().config()); },
          "Settings in force (explicit, environment, defaults) as a dict.")
      .def_property_readonly(
          "collective_count", [](PyCommunicator& c) { return c.get().collective_count(); },
          "Collectives issued so far by this rank.")
      .def_property_readonly("closed", &PyCommunicator::closed)
      .def("allreduce", ranked("allreduce", &allreduce), py::arg("buffer"),
           py::arg("op") = ReduceOp::sum, py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, R"doc(
Allreduce: every rank ends with op over all ranks of `buffer`, element-wise.

buffer: a C-contiguous numpy array, torch CPU tensor (through __dlpack__) or
other buffer of float32, float64, float16, bfloat16, int8, uint8, int32 or
int64. Without `out` it is reduced in place and must be writable; with `out`
(same datatype and element count, writable) the result goes there and
`buffer` is only read. No copy is ever made: a non-contiguous or read-only
buffer raises InvalidArgumentError (a ValueError). Returns the buffer that
holds the result. Releases the GIL while it runs.
Raises InvalidArgumentError, MismatchError, TimeoutError, PeerFailureError,
AbortedError.

async_op=True (every collective has it): starts the collective on the
communicator's progress thread and returns a shmring.Request at once;
argument errors still raise here, the others from Request.wait(). Until the
request is complete, do not read or write the buffers (they are kept alive
by the request).
)doc")
      .def("reduce_scatter", ranked("reduce_scatter", &reduce_scatter), py::arg("send"),
           py::arg("out"), py::arg("op") = ReduceOp::sum, py::kw_only(),
           py::arg("async_op") = false, R"doc(
Reduce-scatter: rank r's `out` (k elements) receives op over ranks of
send[r*k:(r+1)*k]; `send` holds size*k elements. In place when `out` is that
slice of `send` (e.g. out = send[rank*k:(rank+1)*k]). Returns `out`.
)doc")
      .def("allgather", ranked("allgather", &allgather), py::arg("send"), py::arg("out"),
           py::kw_only(), py::arg("async_op") = false, R"doc(
Allgather: `out` (size*k elements) receives every rank's `send` (k elements)
in rank order. In place when `send` is out[rank*k:(rank+1)*k]. Returns `out`.
)doc")
      .def("broadcast", ranked("broadcast", &broadcast), py::arg("buffer"), py::arg("root") = 0,
           py::kw_only(), py::arg("async_op") = false, R"doc(
Broadcast: every rank's `buffer` receives root's, in place (the root's may be
read-only). Returns `buffer`.
)doc")
      .def("reduce", ranked("reduce", &reduce), py::arg("buffer"), py::arg("op") = ReduceOp::sum,
           py::arg("root") = 0, py::kw_only(), py::arg("out") = py::none(),
           py::arg("async_op") = false, R"doc(
Reduce: the root receives op over ranks of `buffer`, in place (or into `out`,
used at the root only); the other ranks' buffers are only read. Returns the
buffer that holds the result at the root.
)doc")
      .def("alltoall", ranked("alltoall", &alltoall), py::arg("send"), py::arg("out"),
           py::kw_only(), py::arg("async_op") = false, R"doc(
Alltoall: block j of this rank's `send` goes to block rank of rank j's `out`.
`send` and `out` hold size*k elements each (same datatype) and must not
overlap (no in-place form). Returns `out`.
)doc")
      .def("alltoallv", ranked("alltoallv", &alltoallv), py::arg("send"), py::arg("send_counts"),
           py::arg("out"), py::arg("recv_counts"), py::kw_only(),
           py::arg("send_displs") = py::none(), py::arg("recv_displs") = py::none(),
           py::arg("async_op") = false, R"doc(
Alltoallv (MPI_Alltoallv): send_counts[j] elements of `send` starting at
send_displs[j] go to rank j, which receives them in its `out` at
recv_displs[rank]. Counts and displacements are sequences of `size` ints, in
elements; displacements default to the blocks packed in rank order. Rank i's
recv_counts[j] must equal rank j's send_counts[i] (else MismatchError on
every rank). Receive blocks must not overlap each other nor `send`; a block
outside its buffer raises InvalidArgumentError. Returns `out`.
)doc")
      .def("gather", ranked("gather", &gather), py::arg("send"), py::arg("out") = py::none(),
           py::arg("root") = 0, py::kw_only(), py::arg("async_op") = false, R"doc(
Gather: the root's `out` (size*k elements) receives every rank's `send`
(k elements) in rank order; `out` is needed at the root only (ignored
elsewhere). In place at the root when `send` is out[root*k:(root+1)*k].
Returns `out` at the root, None elsewhere.
)doc")
      .def("scatter", ranked("scatter", &scatter), py::arg("send"), py::arg("out"),
           py::arg("root") = 0, py::kw_only(), py::arg("async_op") = false, R"doc(
Scatter: block r of the root's `send` (size*k elements; ignored, may be None,
elsewhere) goes to rank r's `out` (k elements). In place at the root when
`out` is send[root*k:(root+1)*k]. Returns `out`.
)doc")
      .def("allgatherv", ranked("allgatherv", &allgatherv), py::arg("send"), py::arg("out"),
           py::arg("recv_counts"), py::kw_only(), py::arg("displs") = py::none(),
           py::arg("async_op") = false, R"doc(
Allgatherv (MPI_Allgatherv): rank r's `send` (recv_counts[r] elements) lands
in every rank's `out` at displs[r]. recv_counts (the same on every rank, else
MismatchError everywhere) and displs are sequences of `size` ints, in
elements; displs default to the blocks packed in rank order. In place when
`send` is out[displs[rank]:displs[rank]+recv_counts[rank]]. Returns `out`.
)doc")
      .def("reduce_scatter_v", ranked("reduce_scatter_v", &reduce_scatter_v), py::arg("send"),
           py::arg("out"), py::arg("recv_counts"), py::arg("op") = ReduceOp::sum, py::kw_only(),
           py::arg("async_op") = false, R"doc(
Reduce-scatter with uneven blocks: `send` holds sum(recv_counts) elements,
block r after the blocks before it; rank r's `out` (recv_counts[r] elements)
receives op over ranks of block r, reduced in rank order (float16 and
bfloat16 round once). recv_counts: a sequence of `size` ints, the same on
every rank (else MismatchError everywhere). In place when `out` is the
rank's block of `send`. Returns `out`.
)doc")
      .def("send", ranked_p2p(&send), py::arg("buffer"), py::arg("peer"), py::arg("tag") = 0,
           py::kw_only(), py::arg("async_op") = false, R"doc(
Sends `buffer` (read only, zero copy) to rank `peer` (!= rank) with `tag`
(>= 0). Only the two ranks take part; messages of one (sender, receiver,
tag) arrive in order. Messages up to 16 KiB are buffered while the
sender's outbox in the segment has room: send returns at once; larger ones
return when the receiver has taken them.
Raises InvalidArgumentError (bad peer or tag), MismatchError (the matching
recv has another element count or datatype: raised on both ranks; for a
buffered message, by the next send to that peer), PeerFailureError,
TimeoutError. async_op=True returns a shmring.Request (isend); unlike
collectives, these progress on their own, in any order on the two ranks.
)doc")
      .def("recv", ranked_p2p(&recv), py::arg("buffer"), py::arg("peer"), py::arg("tag") = 0,
           py::kw_only(), py::arg("async_op") = false, R"doc(
Receives into `buffer` (writable, zero copy; its element count and datatype
must equal the sender's) the next message from rank `peer` with `tag`.
Returns `buffer`. Errors as send(); async_op=True returns a shmring.Request
(irecv) whose .result is `buffer`.
)doc")
      .def(
          "barrier",
          [](PyCommunicator& self, bool async_op) {
            Held held;
            return dispatch(
                self, "barrier", async_op, held, py::none(), [](Communicator& c) { c.barrier(); },
                [](Communicator& c) { return c.ibarrier(); });
          },
          py::kw_only(), py::arg("async_op") = false,
          "Returns once every rank has entered the barrier. Releases the GIL. With "
          "async_op=True returns a shmring.Request at once.")
      .def(
          "split",
          [](PyCommunicator& self, int color, int key) {
            std::unique_ptr<PyCommunicator> result;
            run_collective(self, "split", [&](Communicator& c) {
              result = std::make_unique<PyCommunicator>(c.split(color, key));
            });
            return result;
          },
          py::arg("color"), py::arg("key") = 0, R"doc(
MPI_Comm_split: a new Communicator of the ranks that pass the same color
(>= 0), ranked by (key, rank here), with its own segment. Collective over this
communicator.
)doc")
      .def(
          "abort", [](PyCommunicator& c, const std::string& reason) { c.get().abort(reason); },
          py::arg("reason"),
          "Marks the job aborted: every rank's pending and later collectives raise AbortedError "
          "carrying `reason`. Safe from any thread.")
      .def("close", &PyCommunicator::close,
           "Detaches from the segment now (also done when the object is collected). Later calls "
           "raise InvalidArgumentError.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyCommunicator& c, py::handle, py::handle, py::handle) {
             c.close();
             return false;
           })
      .def("__repr__", [](PyCommunicator& c) {
        if (c.closed()) return std::string("<shmring.Communicator (closed)>");
        const Config& cfg = c.get().config();
        return fmt::format("<shmring.Communicator rank={} size={} job_id='{}'>", cfg.rank,
                           cfg.world_size, cfg.job_id);
      });
}
