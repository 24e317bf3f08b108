#pragma once

// shmring's environment variables, read as the library reads them: for the
// layers built over the public API (the MPI layer, the torch backend) and
// for programs that want a SHMRING_* value with the library's checks.
// Every variable is declared once in the library's table, with its type,
// default and allowed values; `shmrun --info` prints it and
// docs/reference/environment.md is generated from it.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "shmring/export.hpp"

namespace shmring::settings {

/// The value of the declared variable `name` (for example
/// "SHMRING_TORCH_JOB_TAG"), or nullopt when it is unset or empty.
/// Throws std::invalid_argument when `name` is not in the table.
/// Thread safety: reads the environment; safe while no thread changes it.
SHMRING_API std::optional<std::string> text(std::string_view name);

/// One of the table's choices for `name` (a choice variable, such as
/// "SHMRING_MPI_ALGO"), as its canonical value (lower case unless the
/// variable is case-sensitive), or nullopt when unset or empty.
/// Throws InvalidArgumentError "NAME='value': expected ..." for any other
/// value, and std::invalid_argument when `name` is not a declared choice.
SHMRING_API std::optional<std::string> choice(std::string_view name);

/// A byte count (a bytes variable, such as "SHMRING_MPI_CALL_BYTES"): a
/// decimal integer >= 0 that fits in 64 bits, or nullopt when unset or
/// empty. Throws InvalidArgumentError "NAME='value': expected ..." for
/// anything else (a sign, a suffix, an overflow), and std::invalid_argument
/// when `name` is not a declared bytes variable.
SHMRING_API std::optional<std::uint64_t> bytes(std::string_view name);

}  // namespace shmring::settings
