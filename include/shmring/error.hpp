#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "shmring/export.hpp"

namespace shmring {

/// What went wrong, independent of the message. Values are stable: the C API
/// returns them and Python maps them to exception classes.
enum class ErrorCode : int {
  ok = 0,
  invalid_argument = 1,      ///< A bad value from the caller or the environment.
  mismatch = 2,              ///< Ranks called different collectives, counts, types, ops or roots.
  timeout = 3,               ///< A wait passed its deadline (SHMRING_TIMEOUT).
  peer_failure = 4,          ///< A peer process died or left mid-collective.
  aborted = 5,               ///< The job was aborted (by a rank's error or an explicit abort()).
  system_error = 6,          ///< A system call failed; errno() holds the cause.
  out_of_shared_memory = 7,  ///< /dev/shm cannot hold the segment.
  internal = 8,              ///< A bug in shmring.
};

SHMRING_API std::string_view to_string(ErrorCode code);

/// Base of every exception shmring throws. what() names the rank, the
/// collective and the values involved.
class SHMRING_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, int sys_errno = 0)
      : std::runtime_error(message), code_(code), errno_(sys_errno) {}
  ErrorCode code() const noexcept { return code_; }
  /// errno of the failed system call for system_error, else 0.
  int sys_errno() const noexcept { return errno_; }

 private:
  ErrorCode code_;
  int errno_;
};

#define SHMRING_DEFINE_ERROR(Name, Code)                         \
  class SHMRING_API Name : public Error {                        \
   public:                                                       \
    explicit Name(const std::string& message, int sys_errno = 0) \
        : Error(ErrorCode::Code, message, sys_errno) {}          \
  }

SHMRING_DEFINE_ERROR(InvalidArgumentError, invalid_argument);
SHMRING_DEFINE_ERROR(MismatchError, mismatch);
SHMRING_DEFINE_ERROR(TimeoutError, timeout);
SHMRING_DEFINE_ERROR(PeerFailureError, peer_failure);
SHMRING_DEFINE_ERROR(AbortedError, aborted);
SHMRING_DEFINE_ERROR(SystemError, system_error);
SHMRING_DEFINE_ERROR(OutOfSharedMemoryError, out_of_shared_memory);
SHMRING_DEFINE_ERROR(InternalError, internal);

#undef SHMRING_DEFINE_ERROR

/// Throws the Error subclass that matches `code` (used when an error raised on
/// one rank is re-raised on another through the segment's abort word).
[[noreturn]] SHMRING_API void throw_error(ErrorCode code, const std::string& message,
                                          int sys_errno = 0);

}  // namespace shmring
