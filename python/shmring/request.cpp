// Non-blocking collectives (async_op=True): the Request keeps the views (so
// the buffer protocol export or DLPack tensor, hence the memory) alive until
// the collective is complete, then releases them with the GIL held.

#include <cmath>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "bindings.hpp"

namespace shmring::python {

PyRequest::PyRequest(Request request, Held held, py::object result)
    : request_(std::move(request)), held_(std::move(held)), result_(std::move(result)) {}

PyRequest::~PyRequest() {
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

bool PyRequest::wait(std::optional<double> timeout) {
  // Refused here, before the request's own error handling below (which
  // would let go of the buffers of a request still running).
  if (timeout && std::isnan(*timeout))
    throw InvalidArgumentError(
        "Request.wait: timeout=nan, expected a number of seconds (None: no limit)");
  bool done = true;
  try {
    // Ctrl-C (or any signal handler that raises) aborts the job, as in a
    // blocking call: the wait then ends with the handler's exception.
    run_interruptible([&] {
      if (timeout)
        done = request_.wait_for_seconds(*timeout);
      else
        request_.wait();
    });
  } catch (...) {
    error_raised_ = true;
    release_buffers();
    throw;
  }
  if (done) release_buffers();
  // The collective had finished before the abort reached it: the handler's
  // exception still ends the wait.
  if (PyErr_Occurred() != nullptr) {
    error_raised_ = true;
    throw py::error_already_set();
  }
  return done;
}

bool PyRequest::is_completed() {
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

// The warning of a Request dropped with an error nobody saw, named by its
// Python class; where warnings are errors, Python's "Exception ignored"
// report instead. Keeps an exception being raised meanwhile (the drop may
// happen while one unwinds).
void PyRequest::warn_dropped(std::exception_ptr error) {
  std::string what;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    // A started collective's request fails with InvalidArgumentError only
    // in a forked child, for its parent's request: nothing failed there.
    if (e.code() == ErrorCode::invalid_argument) return;
    py::handle cls = error_class(e.code());
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

void bind_request(py::module_& m) {
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
running then (the request stays pending); a negative timeout polls, as
threading.Event.wait does; nan raises InvalidArgumentError. A signal handler
that raises meanwhile (Ctrl-C: KeyboardInterrupt) aborts the job, as it does
in a blocking call: wait() raises the handler's exception (within about
10 ms), the peers AbortedError naming it.
)doc")
      .def("is_completed", &PyRequest::is_completed,
           "True when complete (raises the collective's error if it failed); never blocks.")
      .def_property_readonly("result", &PyRequest::result,
                             "The buffer that holds (or will hold) the result, as the blocking "
                             "form returns it; read it only after wait().");
}

}  // namespace shmring::python
