// SHMRING_TRACE: Chrome trace-event spans of every collective
// (docs/guide/tracing.md). The file format is the Trace Event Format that
// chrome://tracing and Perfetto read: "X" (complete) events with ts and dur
// in microseconds, "M" events naming each process and thread.

#include "core/trace.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "base/log.hpp"
#include "base/settings.hpp"

namespace shmring::detail {

namespace {

using nlohmann::json;

bool reduces(CollectiveKind k) {
  return k == CollectiveKind::allreduce || k == CollectiveKind::reduce ||
         k == CollectiveKind::reduce_scatter || k == CollectiveKind::reduce_scatter_v;
}
bool rooted(CollectiveKind k) {
  return k == CollectiveKind::broadcast || k == CollectiveKind::reduce ||
         k == CollectiveKind::gather || k == CollectiveKind::scatter;
}

double us(std::uint64_t ns) {
  return static_cast<double>(ns) / 1000.0;
}

struct Comm {
  std::string job;
  int rank, size;
  std::vector<TraceSpan> spans;
};

/// This process's traced communicators, alive and gone, until its part is
/// written. Leaked on purpose: a communicator destroyed by a static
/// destructor at exit may still need it.
struct Part {
  std::mutex m;
  std::string path;
  int live = 0;
  std::vector<Comm> comms;
};
Part& part() {
  static Part* p = new Part;
  return *p;
}

std::string host_name() {
  char h[256] = {};
  if (gethostname(h, sizeof h - 1) != 0) return "localhost";
  return h;
}

/// The track of this process: its rank in the largest communicator it held
/// (the world, for the usual job), and that communicator.
const Comm& largest(const std::vector<Comm>& comms) {
  return *std::max_element(comms.begin(), comms.end(),
                           [](const Comm& a, const Comm& b) { return a.size < b.size; });
}

json events_of(const std::vector<Comm>& comms, const std::string& host) {
  const int pid = largest(comms).rank;
  json ev = json::array();
  ev.push_back({{"name", "process_name"},
                {"ph", "M"},
                {"pid", pid},
                {"args", {{"name", fmt::format("rank {} (pid {}, {})", pid, getpid(), host)}}}});
  ev.push_back(
      {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  for (std::size_t k = 0; k < comms.size(); ++k) {
    const Comm& c = comms[k];
    const int tid = static_cast<int>(2 * k), queue_tid = tid + 1;
    ev.push_back(
        {{"name", "thread_name"},
         {"ph", "M"},
         {"pid", pid},
         {"tid", tid},
         {"args", {{"name", fmt::format("job {} (rank {} of {})", c.job, c.rank, c.size)}}}});
    bool queued = false;
    for (const TraceSpan& s : c.spans) {
      const CollectiveKind kind = s.desc.kind;
      json args = {{"job", c.job},
                   {"rank", c.rank},
                   {"size", c.size},
                   {"seq", s.seq},
                   {"count", s.desc.count},
                   {"dtype", std::string(to_string(s.desc.dtype))},
                   {"algorithm", to_string(s.desc.algorithm)},
                   {"bytes", s.bytes},
                   {"wait_us", us(s.wait_ns)},
                   {"state", s.failed ? "failed" : "completed"}};
      if (kind == CollectiveKind::barrier) {
        args.erase("count");
        args.erase("dtype");
        args.erase("bytes");
      }
      if (reduces(kind)) args["op"] = std::string(to_string(s.desc.op));
      if (rooted(kind)) args["root"] = s.desc.root;
      if (s.queued_ns != 0 && s.queued_ns < s.start_ns) {
        queued = true;
        ev.push_back({{"name", fmt::format("{} (queued)", to_string(kind))},
                      {"cat", "queue"},
                      {"ph", "X"},
                      {"pid", pid},
                      {"tid", queue_tid},
                      {"ts", us(s.queued_ns)},
                      {"dur", us(s.start_ns - s.queued_ns)},
                      {"args", {{"job", c.job}, {"seq", s.seq}}}});
      }
      // The core's own calls by what the user called: split()'s allgather
      // of (color, key), finalize()'s barrier. stats() counts them as their
      // kind (communicator.hpp).
      const char* name = s.desc.purpose == CallPurpose::split      ? "split"
                         : s.desc.purpose == CallPurpose::finalize ? "finalize"
                                                                   : to_string(kind);
      ev.push_back({{"name", name},
                    {"cat", "collective"},
                    {"ph", "X"},
                    {"pid", pid},
                    {"tid", tid},
                    {"ts", us(s.start_ns)},
                    {"dur", us(s.end_ns - s.start_ns)},
                    {"args", std::move(args)}});
    }
    if (queued)
      ev.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", pid},
                    {"tid", queue_tid},
                    {"args", {{"name", fmt::format("job {}: queued requests", c.job)}}}});
  }
  return ev;
}

bool write_file(const std::string& path, const json& j) {
  const std::string tmp = fmt::format("{}.{}.tmp", path, getpid());
  {
    std::ofstream f(tmp);
    f << j.dump() << '\n';
    if (!f.good()) {
      SHMRING_LOG(warn, "SHMRING_TRACE: cannot write {}: {}", tmp, std::strerror(errno));
      std::remove(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    SHMRING_LOG(warn, "SHMRING_TRACE: cannot rename {} to {}: {}", tmp, path, std::strerror(errno));
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

std::string part_name(const std::string& path, const std::string& host) {
  return fmt::format("{}.{}.{}.part", path, host, getpid());
}

/// Every part of `path` (any process's) that holds communicator `job`.
std::vector<std::filesystem::path> parts_of(const std::string& path, const std::string& job) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = p.filename().string() + ".";
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !name.ends_with(".part")) continue;
    std::ifstream f(entry.path());
    const json j = json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("shmring")) continue;
    for (const auto& c : j["shmring"]["comms"])
      if (c.value("job", "") == job) {
        out.push_back(entry.path());
        break;
      }
  }
  return out;
}

/// The last rank of communicator `c` to write its part merges every rank's
/// part into `path`; a lock file named after the job makes sure only one
/// of two ranks finishing together does. The parts are listed again under
/// the lock: a rank that saw them all but took the lock only after another
/// rank had merged them and let it go finds none left, and must not write
/// an empty trace over the merged one.
void merge_if_last(const std::string& path, const Comm& c) {
  if (static_cast<int>(parts_of(path, c.job).size()) < c.size) return;
  const std::string lock = fmt::format("{}.{}.lock", path, c.job);
  const int fd = ::open(lock.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd < 0) return;
  ::close(fd);
  const auto parts = parts_of(path, c.job);
  if (static_cast<int>(parts.size()) < c.size) {
    std::remove(lock.c_str());
    return;
  }
  json merged = {{"traceEvents", json::array()},
                 {"displayTimeUnit", "ns"},
                 {"otherData",
                  {{"writer", "shmring (SHMRING_TRACE)"},
                   {"clock", "CLOCK_MONOTONIC, microseconds"},
                   {"job", c.job},
                   {"ranks", c.size}}}};
  for (const auto& p : parts) {
    std::ifstream f(p);
    json j = json::parse(f, nullptr, false);
    if (j.is_discarded()) continue;
    for (auto& e : j["traceEvents"]) merged["traceEvents"].push_back(std::move(e));
  }
  if (write_file(path, merged))
    for (const auto& p : parts) std::filesystem::remove(p);
  std::remove(lock.c_str());
}

}  // namespace

std::unique_ptr<TraceLog> TraceLog::open(const std::string& job, int rank, int size) {
  const auto path = settings::text("SHMRING_TRACE");
  if (!path || path->empty()) return nullptr;
  return std::unique_ptr<TraceLog>(new TraceLog(*path, job, rank, size));
}

TraceLog::TraceLog(std::string path, const std::string& job, int rank, int size)
    : path_(std::move(path)) {
  Part& p = part();
  std::lock_guard lock(p.m);
  if (p.path.empty()) p.path = path_;
  ++p.live;
  index_ = p.comms.size();
  p.comms.push_back({job, rank, size, {}});
}

TraceLog::~TraceLog() {
  Part& p = part();
  std::lock_guard lock(p.m);
  p.comms[index_].spans = std::move(spans_);
  if (--p.live > 0) return;
  try {
    const std::string host = host_name();
    json j = {{"traceEvents", events_of(p.comms, host)}, {"shmring", {{"host", host}}}};
    j["shmring"]["pid"] = getpid();
    j["shmring"]["comms"] = json::array();
    for (const Comm& c : p.comms)
      j["shmring"]["comms"].push_back({{"job", c.job}, {"rank", c.rank}, {"size", c.size}});
    if (write_file(part_name(p.path, host), j)) merge_if_last(p.path, largest(p.comms));
  } catch (const std::exception& e) {
    SHMRING_LOG(warn, "SHMRING_TRACE={}: {}", p.path, e.what());
  }
}

}  // namespace shmring::detail
