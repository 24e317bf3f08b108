// Exceptions: one Python class per ErrorCode, under a common shmring.Error
// (a RuntimeError). Where a builtin says the same thing, the class derives
// from it too, so `except ValueError` / `except TimeoutError` work.

#include <iterator>

#include "bindings.hpp"

namespace shmring::python {

namespace {

struct ErrorClasses {
  py::handle base;
  py::handle by_code[9];  // Indexed by ErrorCode.
};
ErrorClasses g_errors;

}  // namespace

py::handle error_class(ErrorCode code) {
  auto index = static_cast<unsigned>(code);
  return index < std::size(g_errors.by_code) && g_errors.by_code[index] ? g_errors.by_code[index]
                                                                        : g_errors.base;
}

namespace {

py::handle new_exception(py::module_& m, const char* name, py::tuple bases, const char* doc) {
  std::string qualified = std::string("shmring.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  // The module keeps one reference; the translator borrows it for the life of
  // the interpreter (exception classes are never unloaded).
  m.add_object(name, py::handle(cls));
  return cls;
}

}  // namespace

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
      py::handle cls = error_class(e.code());
      // Build the instance ourselves to attach the code (and errno) to it.
      py::object exc = cls(py::str(e.what()));
      exc.attr("code") = py::cast(e.code());
      if (e.code() == ErrorCode::system_error) exc.attr("errno") = e.sys_errno();
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
}

}  // namespace shmring::python
