// `shmrun --status`: what every rank of a running job is doing, read from
// its segment READ-ONLY. A running job's segment has no name any more (the
// name is unlinked once every rank attached: docs/design/segment.md), so
// the segments are found through the ranks' open descriptors
// (/proc/PID/fd/N -> "/dev/shm/shmring-<uid>-<job>-<host> (deleted)"), and
// those of jobs still starting by their names; both are opened O_RDONLY and mapped PROT_READ:
// nothing is written, locked or kept past the read (the job's memory goes when its last rank exits,
// as before; our brief mapping only delays the free of the pages).

#include "shmrun_status.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "core/ops.hpp"
#include "core/recorder.hpp"
#include "transport/header_check.hpp"
#include "transport/recorder_read.hpp"
#include "transport/segment.hpp"

namespace shmring::tools {

namespace {

namespace d = shmring::detail;

struct Found {
  std::string proc_path;  // /proc/PID/fd/N, or /dev/shm/<name> for a job still starting
  std::string name;       // shmring-<uid>-<job>-<host>
};

// Every segment of `prefix` some process of ours has open, once each.
std::vector<Found> find_segments(const std::string& prefix) {
  std::vector<Found> out;
  std::set<std::pair<dev_t, ino_t>> seen;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  const pid_t self = getpid();
  while (dirent* p = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(p->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == self) continue;
    const std::string fd_dir = fmt::format("/proc/{}/fd", pid);
    DIR* fds = opendir(fd_dir.c_str());
    if (fds == nullptr) continue;  // another user's, or gone
    while (dirent* f = readdir(fds)) {
      if (f->d_name[0] == '.') continue;
      const std::string path = fd_dir + "/" + f->d_name;
      char target[512];
      const ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      std::string t(target);
      const std::string shm = "/dev/shm/";
      if (t.rfind(shm + prefix, 0) != 0) continue;
      t = t.substr(shm.size());
      if (auto sp = t.find(' '); sp != std::string::npos) t.resize(sp);  // " (deleted)"
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 || !seen.insert({st.st_dev, st.st_ino}).second) continue;
      out.push_back({path, t});
    }
    closedir(fds);
  }
  closedir(proc);
  // A job still starting (some rank not attached yet) has its name in
  // /dev/shm, and its creator's descriptor reads "/dev/shm/#<inode>
  // (deleted)" (made with O_TMPFILE, then named): found by the name.
  if (DIR* shm = opendir("/dev/shm")) {
    while (dirent* e = readdir(shm)) {
      const std::string name = e->d_name;
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string path = "/dev/shm/" + name;
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 || !seen.insert({st.st_dev, st.st_ino}).second) continue;
      out.push_back({path, name});
    }
    closedir(shm);
  }
  return out;
}

bool pid_alive(int pid) {
  return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
}

std::string call_text(const d::RecordedCall& c) {
  return fmt::format("{} #{}", to_string(static_cast<CollectiveKind>(c.kind)), c.seq);
}

std::string rate(double v, const char* unit) {
  if (v >= 1e9) return fmt::format("{:.1f} G{}", v / 1e9, unit);
  if (v >= 1e6) return fmt::format("{:.1f} M{}", v / 1e6, unit);
  if (v >= 1e3) return fmt::format("{:.1f} k{}", v / 1e3, unit);
  return fmt::format("{:.1f} {}", v, unit);
}

// Prints one job's table; false when the segment cannot be read (a job of
// another shmring build is only noted: it is not this shmrun's to read).
bool print_job(const Found& f, FILE* out) {
  const int fd = ::open(f.proc_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "shmrun: cannot open %s (%s): %s\n", f.name.c_str(), f.proc_path.c_str(),
                 std::strerror(errno));
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < d::kHeaderBytes) {
    ::close(fd);
    return false;
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (addr == MAP_FAILED) {
    std::fprintf(stderr, "shmrun: cannot map %s: %s\n", f.name.c_str(), std::strerror(errno));
    return false;
  }
  const auto* base = static_cast<const std::byte*>(addr);
  const auto* h = reinterpret_cast<const d::Header*>(base);
  bool ok = false;
  const int n = static_cast<int>(h->world_size);
  // The header's own world size and host: the rest is checked as an
  // attaching rank would (magic, version, sizes, offsets, file size).
  const d::HeaderCheck check = d::validate_header(base, d::kHeaderBytes, size, n, h->host_hash);
  if (!check) {
    std::fprintf(stderr, "shmrun: %s: not a segment this shmrun can read: %s\n", f.name.c_str(),
                 check.error.c_str());
    ok = h->magic == d::kMagic && h->layout_version != d::kLayoutVersion;
  } else {
    ok = true;
    const std::uint64_t now = d::mono_ns();
    const auto abort_code = h->abort_code.load(std::memory_order_acquire);
    int attached = 0;
    std::vector<int> absent;
    for (int r = 0; r < n; ++r) {
      if (d::read_rank_record(base, check.layout, r).rank_state != d::kRankAbsent)
        ++attached;
      else
        absent.push_back(r);
    }
    std::fprintf(out, "job segment %s: %d ranks%s%s\n", f.name.c_str(), n,
                 attached < n ? fmt::format(", starting ({} attached)", attached).c_str() : "",
                 abort_code == d::kAbortNone ? "" : ", failed (its abort word is set)");
    if (check.layout.recorder_entries == 0)
      std::fprintf(out, "  (no flight recorder: the job runs with SHMRING_RECORDER_ENTRIES=0)\n");
    std::fprintf(out, "%4s %8s  %-40s %5s %9s  %-14s %12s %12s\n", "rank", "pid", "call", "step",
                 "for", "waits for", "calls/s", "bytes/s");
    for (int r = 0; r < n; ++r) {
      const d::RankRecord rec = d::read_rank_record(base, check.layout, r);
      std::string call = "-", step = "-", since = "-", waits = "-", calls = "-", bytes = "-";
      if (rec.rank_state == d::kRankAbsent) {
        call = "not attached";
      } else if (rec.rank_state == d::kRankFinalized) {
        call = "finalized";
      } else if (!pid_alive(rec.pid)) {
        call = "dead";
      }
      if (rec.has_recorder && rec.rank_state == d::kRankAttached) {
        std::optional<d::RecordedCall> in;
        for (auto it = rec.history.rbegin(); it != rec.history.rend(); ++it) {
          if (it->state == d::kCallQueued) continue;
          if (it->state == d::kCallStarted || it->state == d::kCallFailed) in = *it;
          break;
        }
        const auto last = rec.last_completed();
        const bool dead = call == "dead";
        if (in) {
          call = call_text(*in) + (in->state == d::kCallFailed ? " (failed)" : "");
          if (dead) call += " (dead)";
          since = fmt::format("{:.1f} s", now > in->start_ns ? (now - in->start_ns) * 1e-9 : 0.0);
          step = std::to_string(rec.step);
          if (rec.wait_since_ns != 0)
            waits = rec.waiting_for >= 0 ? fmt::format("rank {}", rec.waiting_for)
                                         : std::string("several");
          if (waits != "-") waits = "waits for " + waits;
        } else if (rec.p2p && rec.p2p->end_ns == 0) {
          // Outside any collective, in a point-to-point call.
          call = d::describe_p2p(*rec.p2p);
          if (dead) call += " (dead)";
          since = fmt::format("{:.1f} s",
                              now > rec.p2p->start_ns ? (now - rec.p2p->start_ns) * 1e-9 : 0.0);
          waits = fmt::format("waits for rank {}", rec.p2p->peer);
        } else {
          call = last           ? fmt::format("idle (last {})", call_text(*last))
                 : attached < n ? std::string("starting: waits for every rank to attach")
                                : std::string("idle (no call yet)");
          if (!last && !absent.empty())
            waits = absent.size() == 1 ? fmt::format("waits for rank {}", absent.front())
                                       : fmt::format("waits for {} ranks", absent.size());
          if (dead) call += " (dead)";
          if (last)
            since = fmt::format("{:.1f} s", now > last->end_ns ? (now - last->end_ns) * 1e-9 : 0.0);
        }
        const double up = now > rec.start_ns ? (now - rec.start_ns) * 1e-9 : 0.0;
        if (up > 0) {
          calls = rate(static_cast<double>(rec.calls) / up, "");
          bytes = rate(static_cast<double>(rec.bytes) / up, "B");
        }
      }
      const std::string pid = rec.rank_state == d::kRankAbsent ? "-" : std::to_string(rec.pid);
      std::fprintf(out, "%4d %8s  %-40s %5s %9s  %-14s %12s %12s\n", r, pid.c_str(), call.c_str(),
                   step.c_str(), since.c_str(), waits.c_str(), calls.c_str(), bytes.c_str());
    }
  }
  ::munmap(addr, size);
  return ok;
}

}  // namespace

std::vector<int> ranks_not_attached(const std::string& job_id, std::uint64_t job_nonce) {
  std::vector<int> absent;
  const std::string prefix = fmt::format("shmring-{}-{}-", getuid(), job_id);
  std::string path;
  // A live creator's only: a segment left by an earlier job of this id (its
  // creator dead) is removed by the next rank 0 and says nothing of ours.
  for (const auto& seg : d::list_segments())
    if (seg.name.rfind(prefix, 0) == 0 && seg.name.find('-', prefix.size()) == std::string::npos &&
        seg.creator_alive) {
      path = "/dev/shm/" + seg.name;
      break;
    }
  if (path.empty()) return absent;  // not created yet, or every rank attached
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absent;
  struct stat st {};
  void* addr = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= d::kHeaderBytes)
    addr = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (addr == MAP_FAILED) return absent;
  const auto size = static_cast<std::size_t>(st.st_size);
  const auto* base = static_cast<const std::byte*>(addr);
  const auto* h = reinterpret_cast<const d::Header*>(base);
  const int n = static_cast<int>(h->world_size);
  const d::HeaderCheck check = d::validate_header(base, d::kHeaderBytes, size, n, h->host_hash);
  // Another job given the same id (its own nonce) says nothing of ours.
  if (check && h->job_nonce == job_nonce)
    for (int r = 0; r < n; ++r)
      if (d::read_rank_record(base, check.layout, r).rank_state == d::kRankAbsent)
        absent.push_back(r);
  ::munmap(addr, size);
  return absent;
}

int print_status(const std::string& job_id, FILE* out) {
  const std::string prefix = job_id.empty() ? fmt::format("shmring-{}-", getuid())
                                            : fmt::format("shmring-{}-{}-", getuid(), job_id);
  auto found = find_segments(prefix);
  if (!job_id.empty())
    std::erase_if(found, [&](const Found& f) {
      return f.name.find('-', prefix.size()) != std::string::npos;  // a longer job id
    });
  if (found.empty()) {
    std::fprintf(out, "shmrun: no running shmring job of user %u%s on this host\n", getuid(),
                 job_id.empty() ? "" : fmt::format(" with job id {}", job_id).c_str());
    return job_id.empty() ? 0 : 1;
  }
  int failed = 0;
  for (const auto& f : found) failed += print_job(f, out) ? 0 : 1;
  std::fflush(out);
  return failed ? 1 : 0;
}

}  // namespace shmring::tools
