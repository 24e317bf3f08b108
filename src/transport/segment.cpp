#include "transport/segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "base/config.hpp"
#include "base/fork.hpp"
#include "base/log.hpp"
#include "shmring/error.hpp"
#include "transport/segment_parts.hpp"
#include "transport/wait.hpp"

namespace shmring::detail {

namespace {

// Liveness locks live far past the end of the data, one byte per rank: fcntl
// locks need no backing bytes, and a lock is released by the kernel when its
// holder exits (even while it is a zombie).
constexpr off_t kLockBase = off_t{1} << 40;

}  // namespace

bool try_lock_rank(int fd, int r) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = kLockBase + r;
  fl.l_len = 1;
  return fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

bool lock_held(int fd, int r) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = kLockBase + r;
  fl.l_len = 1;
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;  // cannot tell: assume alive
  return fl.l_type != F_UNLCK;
}

std::uint64_t file_size(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_size);
}

void sleep_backoff(int& iteration) {
  // 0.1 ms, doubling up to 10 ms: quick when peers start together, cheap when not.
  long us = std::min(10'000L, 100L << std::min(iteration, 7));
  std::this_thread::sleep_for(std::chrono::microseconds(us));
  ++iteration;
}

bool raise_abort(Segment& seg, int world_size, std::uint32_t code, int rank,
                 const std::string& reason) {
  Header& h = seg.header();
  std::uint32_t expected = kAbortNone;
  bool won =
      h.abort_code.compare_exchange_strong(expected, kAbortClaimed, std::memory_order_acq_rel);
  if (won) {
    h.abort_rank.store(rank, std::memory_order_relaxed);
    std::size_t n = std::min(reason.size(), kReasonBytes - 1);
    std::memcpy(h.abort_reason, reason.data(), n);
    h.abort_reason[n] = '\0';
    h.abort_code.store(code, std::memory_order_release);
  }
  // Wake every sleeper so that it sees the abort now, not at its next slice.
  for (int r = 0; r < world_size; ++r) {
    wake(seg.rank_area(r).produced);
    wake(seg.rank_area(r).consumed);
    wake(seg.rank_area(r).announced);  // a progress thread may sleep on these too
    wake(seg.rank_area(r).done);
    wake(seg.rank_area(r).reduced);
    wake(seg.rank_area(r).posted);
    wake(seg.rank_area(r).taken);
  }
  return won;
}

// How long a reader waits for a claimed abort record to be completed.
constexpr std::chrono::milliseconds kAbortRecordWait{2000};

std::optional<AbortInfo> read_abort(const Header& h) {
  std::uint32_t code = h.abort_code.load(std::memory_order_acquire);
  if (code == kAbortNone) return std::nullopt;
  // The winner is writing its reason: a few hundred bytes, so the wait is
  // short unless the winner was descheduled, or killed between its claim and
  // its code (then no one would ever finish the record). Bounded, so that a
  // dead writer cannot hang every rank that reads the record. A process
  // that gave up on a record does not wait for it again (the header may be
  // mapped read-only here, so nothing is written to it).
  static std::atomic<const Header*> given_up_on{nullptr};
  const auto give_up = std::chrono::steady_clock::now() + kAbortRecordWait;
  for (int i = 0; code == kAbortClaimed; ++i) {
    if (i < 1024) {
      cpu_relax();
    } else if (given_up_on.load(std::memory_order_relaxed) == &h ||
               std::chrono::steady_clock::now() >= give_up) {
      given_up_on.store(&h, std::memory_order_relaxed);
      return AbortInfo{static_cast<std::uint32_t>(ErrorCode::peer_failure), -1,
                       fmt::format("a rank began to record the job's error but did not finish "
                                   "within {} s (it may have died while recording it)",
                                   std::chrono::duration<double>(kAbortRecordWait).count())};
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    code = h.abort_code.load(std::memory_order_acquire);
  }
  AbortInfo a;
  a.code = code;
  a.rank = h.abort_rank.load(std::memory_order_relaxed);
  a.reason.assign(h.abort_reason, strnlen(h.abort_reason, kReasonBytes));
  return a;
}

// Writes `msg` as the job's abort reason if none is recorded yet, so that the
// ranks already attached fail now rather than at their timeout. Only for a
// header whose magic and version we checked (the abort fields' offsets).
// Returns the job's first error (ours if we won).
AbortInfo record_abort(Header& h, ErrorCode code, int rank, const std::string& msg) {
  std::uint32_t expected = kAbortNone;
  if (h.abort_code.compare_exchange_strong(expected, kAbortClaimed)) {
    std::size_t n = std::min(msg.size(), kReasonBytes - 1);
    std::memcpy(h.abort_reason, msg.data(), n);
    h.abort_reason[n] = '\0';
    h.abort_rank.store(rank);
    h.abort_code.store(static_cast<std::uint32_t>(code), std::memory_order_release);
    // Wake a creator asleep on the attach count (it polls, but cheaply).
    h.attach_gen.fetch_add(1, std::memory_order_release);
  }
  auto a = read_abort(h);
  return a ? *a : AbortInfo{static_cast<std::uint32_t>(code), rank, msg};
}

// ---- Fork without exec. ----
// A child forked from a rank inherits its descriptor, and with it the
// open-file-description lock that says "rank r is alive": the rank would
// look alive for as long as the child lives. The child therefore closes every
// segment descriptor right after fork (track_fd, base/fork.hpp; the parent
// still holds the open file description, so its lock stays), does not
// inherit the mapping at all (MADV_DONTFORK: a mapping also pins the open
// file description), and every communicator checks the fork generation
// before it touches anything.
Segment::~Segment() {
  if (forked_away()) {
    // A forked child: the descriptor was closed at fork and the mapping was
    // never inherited. It must not speak for the rank ("finalized"), and the
    // descriptor number may name another file by now: touch nothing.
    map_->fd = -1;
    map_->addr = nullptr;
    return;
  }
  // Only a rank that registered speaks for its slot: one that lost a
  // duplicate-rank race must not mark the holder's slot "finalized".
  if (registered_ && header_ != nullptr && base_ != nullptr) {
    rank_area(rank_).info.state.store(kRankFinalized, std::memory_order_release);
  }
  if (map_ && map_->fd >= 0) untrack_fd(map_->fd);
  // Unmapping and closing (in ~Mapping) release the liveness lock.
}

bool Segment::rank_alive(int r) const {
  // F_OFD_GETLK reports only locks that would conflict with ours, and a lock
  // held through our own open file description never does: asked of its own
  // rank, it would always answer "dead". The caller is that rank, alive.
  if (r == rank_) return true;
  return lock_held(fd_, r);
}

void Segment::unlink_name() {
  if (unlinked_) return;
  unlinked_ = true;
  // Only while the name is still ours: after an abort, another job (or a
  // fresh attempt of this one) may have its own segment under the name by
  // now, and removing it would leave its ranks waiting for the timeout.
  unlink_if_same(name_, fd_);
}

bool Segment::all_asymmetric_fence() {
  for (int r = 0; r < world_size_; ++r)
    if (rank_area(r).info.asymmetric_fence.load(std::memory_order_relaxed) == 0) return false;
  return true;
}

int Segment::oversubscribed_request() {
  bool all_no = true;
  for (int r = 0; r < world_size_; ++r) {
    const std::int32_t v = rank_area(r).info.oversubscribed.load(std::memory_order_relaxed);
    if (v == 1) return 1;
    all_no = all_no && v == 0;
  }
  return all_no ? 0 : -1;
}

int Segment::job_cpus() {
  std::uint64_t all[kCpuMaskWords] = {};
  for (int r = 0; r < world_size_; ++r)
    for (std::size_t w = 0; w < kCpuMaskWords; ++w)
      all[w] |= rank_area(r).info.cpus[w].load(std::memory_order_relaxed);
  int n = 0;
  for (std::uint64_t word : all) n += __builtin_popcountll(word);
  return n;
}

void Segment::wait_all_attached(std::chrono::steady_clock::time_point deadline) {
  Header& h = header();
  int it = 0;
  const auto n = static_cast<std::uint32_t>(world_size_);
  while (h.attached.load(std::memory_order_acquire) < n) {
    if (auto a = read_abort(h)) {
      // A rank that refused to start (a bad setting of its own) never
      // registered: it keeps the name until the ranks still starting have
      // found it, and removes it then. Otherwise nobody else will.
      // It holds its rank's lock without a registration (a clashing
      // process of another job holds neither: then the name goes now).
      const bool refused =
          a->rank >= 0 && a->rank < world_size_ && a->rank != rank_ &&
          rank_area(a->rank).info.state.load(std::memory_order_acquire) == kRankAbsent &&
          rank_alive(a->rank);
      if (!refused) unlink_name();
      throw_error(static_cast<ErrorCode>(a->code), a->reason);
    }
    // A rank that registered (its lock taken before its state) and lost its
    // lock has died or given up: nobody can complete the set any more.
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      RankInfo& info = rank_area(r).info;
      if (info.state.load(std::memory_order_acquire) == kRankAbsent || rank_alive(r)) continue;
      if (h.attached.load(std::memory_order_acquire) >= n) break;  // all in after all
      std::string msg = fmt::format(
          "rank {}: rank {} (pid {}) {} before every rank attached to segment '{}'", rank_, r,
          info.pid.load(),
          info.state.load(std::memory_order_acquire) == kRankFinalized ? "left" : "died", name_);
      raise_abort(*this, world_size_, static_cast<std::uint32_t>(ErrorCode::peer_failure), rank_,
                  msg);
      unlink_name();
      auto a = read_abort(h);
      throw_error(a ? static_cast<ErrorCode>(a->code) : ErrorCode::peer_failure,
                  a ? a->reason : msg);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string missing;
      for (int r = 0; r < world_size_; ++r)
        if (rank_area(r).info.state.load(std::memory_order_acquire) == kRankAbsent)
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      std::string msg = fmt::format(
          "rank {}: timed out waiting for every rank to attach to segment '{}': {} of {} "
          "attached, missing rank(s) {} (SHMRING_TIMEOUT sets the limit)",
          rank_, name_, h.attached.load(), world_size_, missing);
      // Recorded, so that the ranks already in hear the same diagnosis rather
      // than "rank 0 left".
      raise_abort(*this, world_size_, static_cast<std::uint32_t>(ErrorCode::timeout), rank_, msg);
      unlink_name();
      auto a = read_abort(h);
      throw_error(a ? static_cast<ErrorCode>(a->code) : ErrorCode::timeout, a ? a->reason : msg);
    }
    sleep_backoff(it);
  }
  // Complete, but perhaps only because a refusing rank counted itself: it
  // never registers. An abort recorded by a registered rank comes from a
  // collective that the ranks done attaching already started (a rank that
  // refused its arguments in collective #0): that collective reports it.
  if (auto a = read_abort(h);
      a && a->rank >= 0 && a->rank < world_size_ &&
      rank_area(a->rank).info.state.load(std::memory_order_acquire) == kRankAbsent) {
    unlink_name();
    throw_error(static_cast<ErrorCode>(a->code), a->reason);
  }
  // The last rank to attach unlinks the name, but a SIGKILL between its
  // increment of `attached` and its unlink would leave the file behind with
  // every other rank past this wait (tests/faults/test_leaks saw it once in
  // 200 jobs). So every rank removes the name here if it still names this
  // segment (unlink_if_same: a fresh segment of another job under the name
  // survives).
  unlink_name();
}

std::vector<SegmentInfo> list_segments() {
  std::vector<SegmentInfo> out;
  std::string prefix = fmt::format("shmring-{}-", static_cast<unsigned>(getuid()));
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    SegmentInfo info;
    info.name = name;
    int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) continue;
    info.bytes = file_size(fd);
    info.creator_alive = lock_held(fd, 0);
    {
      HeaderView hv(fd, false);
      if (hv.get() != nullptr)
        info.creator_pid = read_field<std::int32_t>(hv.bytes(), offsetof(Header, creator_pid));
    }
    ::close(fd);
    out.push_back(info);
  }
  closedir(d);
  return out;
}

}  // namespace shmring::detail
