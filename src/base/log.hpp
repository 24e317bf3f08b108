#pragma once

// Logging through spdlog, gated by SHMRING_DEBUG=TRACE|DEBUG|INFO|WARN|ERROR|OFF
// (WARN by default). Lines carry the rank: "[shmring rank 3] ...".

#include <spdlog/spdlog.h>

#include <memory>

namespace shmring::detail {

/// The library's logger (stderr). Created on first use; thread-safe.
spdlog::logger& logger();
/// Sets the "rank N" prefix of later lines (called when the rank is known).
void set_log_rank(int rank);

}  // namespace shmring::detail

#define SHMRING_LOG(lvl, ...) ::shmring::detail::logger().log(spdlog::level::lvl, __VA_ARGS__)
