#pragma once

// Helpers for the fault tests: a shared anonymous page where ranks record when
// a fault happened and when they noticed it, and checks for leftovers.

#include <dirent.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "harness.hpp"

namespace shmring::test {

/// The longest a survivor may take to hear of one fault, measured from the
/// fault to its error. Detection is one slow-path check of the dead rank's
/// liveness lock (every 10 ms of a wait), so 10-15 ms is usual; but on the
/// loaded 2-core CI VM one detection in ~700 took up to 1.3 s, where the
/// kernel ran a 10 ms futex sleep for 280 ms, or released a dead rank's lock
/// 230 ms after its parent had reaped it. The bound stays far below the
/// timeouts these tests set (20-60 s), so a detection that waits for the
/// timeout, or for anything else slow, still fails. Tests with many deaths
/// also check that the median stays within kMedianDetectionBoundS.
inline constexpr double kDetectionBoundS = 5.0;
inline constexpr double kMedianDetectionBoundS = 1.0;

/// The median of a test case's detection latencies (seconds), printed; the
/// caller checks it against kMedianDetectionBoundS. Requires samples.
inline double median_detection(std::vector<double> latencies) {
  if (latencies.empty()) return 1e9;  // no detection at all: fails the bound
  std::sort(latencies.begin(), latencies.end());
  const double median = latencies[latencies.size() / 2];
  std::printf("median detection %.2f ms over %zu survivors\n", median * 1e3, latencies.size());
  return median;
}

/// True when `s` contains `needle` (error messages, status tables).
inline bool contains(const std::string& s, std::string_view needle) {
  return s.find(needle) != std::string::npos;
}

inline std::int64_t mono_ns() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

/// What the ranks of one faulty job tell the parent (MAP_SHARED, so it
/// survives fork and is seen by every process).
struct FaultBoard {
  static constexpr int kMaxRanks = 8;
  std::atomic<std::int64_t> fault_ns;  // when the fault was injected (0 = not yet)
  std::atomic<std::int64_t> noticed_ns[kMaxRanks];
  char message[kMaxRanks][1024];

  static FaultBoard* create() {
    void* p = mmap(nullptr, sizeof(FaultBoard), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED) return nullptr;
    std::memset(p, 0, sizeof(FaultBoard));
    return static_cast<FaultBoard*>(p);
  }
  static void destroy(FaultBoard* b) { munmap(b, sizeof(FaultBoard)); }

  void note(int rank, const char* what) {
    noticed_ns[rank].store(mono_ns());
    std::snprintf(message[rank], sizeof message[rank], "%s", what);
  }
  /// Seconds from the fault to rank's error, or -1.
  double latency_s(int rank) const {
    auto f = fault_ns.load(), n = noticed_ns[rank].load();
    return f == 0 || n == 0 ? -1.0 : static_cast<double>(n - f) * 1e-9;
  }
};

/// `pages` messages of up to 4095 characters that forked ranks write and
/// the parent reads (MAP_SHARED); unmapped when the board goes.
class MessageBoard {
 public:
  static constexpr std::size_t kPage = 4096;
  explicit MessageBoard(int pages) : bytes_(static_cast<std::size_t>(pages) * kPage) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("MessageBoard: mmap");
      std::abort();
    }
    std::memset(p, 0, bytes_);
    pages_ = static_cast<char*>(p);
  }
  MessageBoard(const MessageBoard&) = delete;
  MessageBoard& operator=(const MessageBoard&) = delete;
  ~MessageBoard() { munmap(pages_, bytes_); }

  void put(int page, const std::string& text) {
    std::snprintf(pages_ + static_cast<std::size_t>(page) * kPage, kPage, "%s", text.c_str());
  }
  std::string operator[](int page) const { return pages_ + static_cast<std::size_t>(page) * kPage; }

 private:
  std::size_t bytes_;
  char* pages_ = nullptr;
};

/// A new directory /tmp/PREFIX-XXXXXX (mkdtemp), removed with what it holds
/// when the TempDir goes; path() is "" when it could not be made.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) : path_("/tmp/" + prefix + "-XXXXXX") {
    if (mkdtemp(path_.data()) == nullptr) path_.clear();
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Files in /dev/shm whose name contains `needle`.
inline std::vector<std::string> shm_files_with(const std::string& needle) {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).find(needle) != std::string::npos) out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

/// Processes whose parent is this process (zombies included).
inline std::vector<int> children_of_self() {
  std::vector<int> out;
  const std::string me = std::to_string(getpid());
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      std::string path = std::string("/proc/") + e->d_name + "/stat";
      FILE* f = std::fopen(path.c_str(), "r");
      if (!f) continue;
      char buf[512] = {};
      std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
      std::fclose(f);
      std::string s(buf, n);
      auto rp = s.rfind(')');  // comm may hold spaces; fields follow the last ')'
      if (rp == std::string::npos) continue;
      int ppid = 0;
      char state = 0;
      if (std::sscanf(s.c_str() + rp + 1, " %c %d", &state, &ppid) == 2 &&
          std::to_string(ppid) == me)
        out.push_back(std::atoi(e->d_name));
    }
    closedir(d);
  }
  return out;
}

}  // namespace shmring::test
