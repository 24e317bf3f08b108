// Python bindings: the `shmring` extension module (its enums, exceptions and
// helper functions here; the classes and calls in the files bindings.hpp
// lists, which also says how buffers reach the collectives).

#include "bindings.hpp"

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

  bind_request(m);
  bind_communicator(m);
}
