#pragma once

// Sizes on the command line of the bench tools: "64K", "1M", "2G", "100".

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdlib>
#include <string>

namespace shmring::bench {

/// "64K", "1M", "2G" (also KiB, MiB, GiB), "100" -> bytes. Throws
/// CLI::ValidationError naming the value for anything else.
inline std::size_t parse_bytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0)
    throw CLI::ValidationError(fmt::format("size '{}': expected bytes like 8, 64K, 1M, 1G", s));
  std::string unit(end);
  double mul = 1;
  if (unit == "K" || unit == "k" || unit == "KiB")
    mul = 1024.0;
  else if (unit == "M" || unit == "m" || unit == "MiB")
    mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "g" || unit == "GiB")
    mul = 1024.0 * 1024 * 1024;
  else if (!unit.empty())
    throw CLI::ValidationError(
        fmt::format("size '{}': unknown unit '{}' (use K, M or G)", s, unit));
  return static_cast<std::size_t>(v * mul);
}

}  // namespace shmring::bench
