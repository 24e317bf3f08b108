#include <fmt/format.h>

#include "base/element.hpp"
#include "shmring/error.hpp"
#include "shmring/types.hpp"

namespace shmring {

std::size_t datatype_size(DataType dtype) {
  if (static_cast<unsigned>(dtype) < static_cast<unsigned>(kNumDataTypes))
    return detail::element_bytes(dtype);
  throw InvalidArgumentError(fmt::format("datatype {} is not a DataType (0..{})",
                                         static_cast<int>(dtype), kNumDataTypes - 1));
}

bool is_floating(DataType dtype) {
  return detail::floating(dtype);
}

std::string_view to_string(DataType dtype) {
  static constexpr std::string_view kNames[] = {"float32", "float64", "float16", "bfloat16",
                                                "int8",    "uint8",   "int32",   "int64"};
  auto i = static_cast<unsigned>(dtype);
  return i < std::size(kNames) ? kNames[i] : std::string_view("invalid");
}

std::string_view to_string(ReduceOp op) {
  static constexpr std::string_view kNames[] = {"sum", "prod", "min", "max", "avg"};
  auto i = static_cast<unsigned>(op);
  return i < std::size(kNames) ? kNames[i] : std::string_view("invalid");
}

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::ok:
      return "ok";
    case ErrorCode::invalid_argument:
      return "invalid argument";
    case ErrorCode::mismatch:
      return "collective mismatch";
    case ErrorCode::timeout:
      return "timeout";
    case ErrorCode::peer_failure:
      return "peer failure";
    case ErrorCode::aborted:
      return "aborted";
    case ErrorCode::system_error:
      return "system error";
    case ErrorCode::out_of_shared_memory:
      return "out of shared memory";
    case ErrorCode::internal:
      return "internal error";
  }
  return "unknown error";
}

void throw_error(ErrorCode code, const std::string& message, int sys_errno) {
  switch (code) {
    case ErrorCode::invalid_argument:
      throw InvalidArgumentError(message);
    case ErrorCode::mismatch:
      throw MismatchError(message);
    case ErrorCode::timeout:
      throw TimeoutError(message);
    case ErrorCode::peer_failure:
      throw PeerFailureError(message);
    case ErrorCode::aborted:
      throw AbortedError(message);
    case ErrorCode::system_error:
      throw SystemError(message, sys_errno);
    case ErrorCode::out_of_shared_memory:
      throw OutOfSharedMemoryError(message, sys_errno);
    default:
      throw InternalError(message);
  }
}

}  // namespace shmring
