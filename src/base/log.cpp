#include "base/log.hpp"
#include "base/settings.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <mutex>
#include <string>

namespace shmring::detail {

namespace {

spdlog::level::level_enum level_from_env() {
  const auto v = settings::text("SHMRING_DEBUG");
  if (!v) return spdlog::level::warn;
  std::string s = *v;
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (s == "TRACE") return spdlog::level::trace;
  if (s == "DEBUG") return spdlog::level::debug;
  if (s == "INFO") return spdlog::level::info;
  if (s == "WARN" || s == "WARNING") return spdlog::level::warn;
  if (s == "ERROR") return spdlog::level::err;
  if (s == "OFF" || s == "NONE") return spdlog::level::off;
  return spdlog::level::info;  // any other value (e.g. "1") turns logging on
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto l = std::make_shared<spdlog::logger>("shmring", sink);
  l->set_level(level_from_env());
  l->set_pattern("[shmring] %l: %v");
  return l;
}

}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> l = make_logger();
  return *l;
}

void set_log_rank(int rank) {
  logger().set_pattern("[shmring rank " + std::to_string(rank) + "] %l: %v");
}

}  // namespace shmring::detail
