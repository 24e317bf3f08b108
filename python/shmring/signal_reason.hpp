#pragma once

// The abort reason of a wait interrupted by a Python signal handler that
// raised, shared by this module's waits and the torch backend's
// (python/torch/work.cpp), so that the peers read the same words whichever
// layer the interrupted rank was in.

#include <Python.h>

#include <string>

namespace shmring::python {

/// Call with the GIL held, right after PyErr_CheckSignals() returned -1:
/// "interrupted by a signal (<exception type>) while waiting in a collective".
inline std::string signal_reason() {
  PyObject* type = PyErr_Occurred();
  return std::string("interrupted by a signal (") +
         (type != nullptr ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "?") +
         ") while waiting in a collective";
}

}  // namespace shmring::python
