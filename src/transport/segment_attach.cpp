// Segment::create_or_attach for ranks 1..N-1: open the file of the job's
// name, tell a stale one from a starting one, wait for its header, check
// it, then map it and register this rank (rank 0's steps: segment_open.cpp).

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/fork.hpp"
#include "base/log.hpp"
#include "transport/segment_parts.hpp"

namespace shmring::detail {

namespace {

// ctime of the file while it still has a name: set when it was created,
// truncated or reserved, all of which only its creator does. Unlinking also
// sets it, and a new rank 0 unlinks a stale file that a rank may hold open:
// an unlinked file reads as 0 ("not changed"), from the same fstat, so that
// the unlink's stamp is never taken for a change by the creator.
std::int64_t linked_ctime_ns(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_nlink == 0) return 0;
  return std::int64_t{st.st_ctim.tv_sec} * 1'000'000'000 + st.st_ctim.tv_nsec;
}

}  // namespace

// ---- Ranks 1..N-1: open, validate, register. ----
// A file of our name without its creator's lock is stale: left by an
// earlier job (a new rank 0 will replace it) or by this job's rank 0, dead
// during startup. It is the latter for sure when the file changed after we
// began looking (ctime > a fine-grained clock read when we began: a file
// timestamp never runs ahead of that clock, whether the kernel stamps files
// with the coarse or the fine clock, while the coarse clock can lag a file
// stamped finely just before we began) and has a size
// (rank 0 locks before it names or reserves, so a sized file had a live
// creator), or when we saw its creator alive before: then fail now and
// remove it, rather than wait for the timeout and leave it behind.
// "Began" is when this process started where that is earlier (a file made
// since then is no earlier job's leftover): a rank that was slow to reach
// attach() (a loaded machine, qemu) while its rank 0 created the file and
// died would otherwise take that file for an earlier job's and wait out its
// timeout. A job that reuses the id of one that failed in this same
// process's lifetime may then get "rank 0 died" for that job's file, an
// error at once instead of a wait.
std::unique_ptr<Segment> Segment::Opening::attach() {
  began_ns = realtime_ns();
  if (const std::int64_t started = process_start_realtime_ns(); started >= 0)
    began_ns = std::min(began_ns, started);
  began = Clock::now();
  it = 0;
  for (;;) {
    if (auto why = path_problem(req.name); !why.empty()) throw not_ours(why);
    m.fd = ::shm_open(req.name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (m.fd < 0) {
      if (errno != ENOENT)
        throw SystemError(fmt::format("rank {}: cannot open shared memory segment '{}': {}",
                                      req.rank, req.name, std::strerror(errno)),
                          errno);
      if (Clock::now() >= req.deadline) throw timed_out("the creation");
      say_refusal_if_slow();
      sleep_backoff(it);
      continue;
    }
    const int fd = m.fd;
    if (auto why = fd_problem(fd); !why.empty()) throw not_ours(why);
    if (!lock_held(fd, 0)) {
      check_unlocked(fd);
      close_fd();
      sleep_backoff(it);
      continue;
    }
    // The creator is alive: wait for its header (ready at once unless its
    // creator had no O_TMPFILE), watching its lock.
    std::optional<HeaderView> hv;
    Header* h = wait_for_header(fd, hv);
    const HeaderCheck check = check_header(fd, h);
    if (check.slots != req.slots || check.slot_bytes != req.slot_bytes)
      SHMRING_LOG(info, "using rank 0's slots={} slot_bytes={} (this rank asked for {} x {})",
                  check.slots, check.slot_bytes, req.slots, req.slot_bytes);
    seg->layout_ = check.layout;
    seg->slots_ = check.slots;
    seg->slot_bytes_ = check.slot_bytes;
    seg->direct_bytes_ = check.direct_bytes;
    seg->fd_ = fd;
    break;
  }
  return register_rank();
}

TimeoutError Segment::Opening::timed_out(const std::string& what, const std::string& extra) const {
  return TimeoutError(fmt::format(
      "rank {}: timed out after {:.1f} s waiting for {} of segment '{}'{} (is rank 0 running "
      "with the same SHMRING_JOB_ID, world size and host? A job that already ran without this "
      "process removed its segment: then this is a late or duplicate rank. SHMRING_TIMEOUT sets "
      "the limit)",
      req.rank, std::chrono::duration<double>(Clock::now() - began).count(), what, req.name,
      extra));
}

Error Segment::Opening::rank0_died(int pid, int fd) const {
  // A rank 0 that recorded why it gave up (another job, a duplicate rank)
  // left that reason behind: it is the diagnosis, not its exit.
  if (HeaderView hv(fd, false); hv.get() != nullptr && hv.get()->magic == kMagic &&
                                hv.get()->layout_version == kLayoutVersion)
    if (auto a = read_abort(*hv.get())) return Error(static_cast<ErrorCode>(a->code), a->reason);
  unlink_if_same(req.name, fd);
  return Error(ErrorCode::peer_failure,
               fmt::format("rank {}: rank 0 ({}) died while creating segment '{}', before every "
                           "rank attached",
                           req.rank, pid_text(pid), req.name));
}

void Segment::Opening::close_fd() {
  if (m.fd >= 0) ::close(m.fd);
  m.fd = -1;
}

// A file of our name without its creator's lock (see attach()): throws what
// a refusing rank left behind, that rank 0 died, or the timeout; returns
// when the file may yet be replaced by a live rank 0.
void Segment::Opening::check_unlocked(int fd) {
  const int pid = creator_pid_of(fd);
  // Rank 0 left a job that a rank refused to start: that rank keeps the
  // name (and its rank's lock) until every rank has read why.
  if (file_size(fd) >= kHeaderBytes) {
    HeaderView hv(fd, true);
    Header* h = hv.get();
    if (h != nullptr && h->magic == kMagic && h->layout_version == kLayoutVersion &&
        classify(*h, me) != Collision::other_job)
      if (auto a = read_abort(*h);
          a && a->rank > 0 && a->rank < req.world_size && lock_held(fd, a->rank)) {
        if (h->attached.fetch_add(1, std::memory_order_acq_rel) + 1 >=
            static_cast<std::uint32_t>(req.world_size))
          unlink_if_same(req.name, fd);
        if (refusing) throw InvalidArgumentError(req.refusal);
        throw_error(static_cast<ErrorCode>(a->code), a->reason);
      }
  }
  if (file_size(fd) >= kHeaderBytes && linked_ctime_ns(fd) > began_ns && !lock_held(fd, 0))
    rethrow(rank0_died(pid, fd));
  if (Clock::now() >= req.deadline) {
    bool removed = !lock_held(fd, 0) && unlink_if_same(req.name, fd);
    throw timed_out("a live rank 0",
                    fmt::format("; a stale segment of that name (creator {}, dead) was "
                                "there all along{}",
                                pid_text(pid), removed ? " and has been removed" : ""));
  }
}

// The creator is alive: wait for its header (ready at once unless its
// creator had no O_TMPFILE), watching its lock.
Header* Segment::Opening::wait_for_header(int fd, std::optional<HeaderView>& hv) {
  Header* h = nullptr;
  for (;;) {
    if (h == nullptr && file_size(fd) >= kHeaderBytes) {
      hv.emplace(fd, true);
      h = hv->get();
    }
    if (h != nullptr && h->status.load(std::memory_order_acquire) != kStatusInit) break;
    if (!lock_held(fd, 0)) rethrow(rank0_died(h ? h->creator_pid : 0, fd));
    if (Clock::now() >= req.deadline) throw timed_out("the header");
    sleep_backoff(it);
  }
  return h;
}

// The header of a live creator: refuses a file not ours, another job's or
// one that does not fit, fails with a reason the job recorded already, and
// records a refusing rank's reason for the others. Returns the checked
// layout.
HeaderCheck Segment::Opening::check_header(int fd, Header* h) {
  if (auto why = mode_problem(fd); !why.empty()) throw not_ours(why);
  const bool ours = h->magic == kMagic && h->layout_version == kLayoutVersion;
  if (ours && h->status.load(std::memory_order_acquire) == kStatusFailed) {
    h->attached.fetch_add(1, std::memory_order_acq_rel);
    auto a = read_abort(*h);
    if (a) throw_error(static_cast<ErrorCode>(a->code), a->reason);
    throw InternalError(fmt::format("rank {}: segment failed without a reason", req.rank));
  }
  // A job that failed already (a collision found by another process, a
  // rank that refused to start): its reason is ours too. Counted in
  // `attached`, so that a rank keeping the name for the late ranks (a
  // refusing one) sees everyone has come.
  if (ours)
    if (auto a = read_abort(*h)) {
      if (h->attached.fetch_add(1, std::memory_order_acq_rel) + 1 >=
          static_cast<std::uint32_t>(req.world_size))
        unlink_if_same(req.name, fd);
      if (refusing) throw InvalidArgumentError(req.refusal);
      throw_error(static_cast<ErrorCode>(a->code), a->reason);
    }
  // Another job's segment under our job id: both jobs must fail.
  if (ours && classify(*h, me) == Collision::other_job)
    rethrow(collide(h, two_jobs_message(me, req.name, h->creator_pid)));
  HeaderCheck check =
      validate_header(h, kHeaderBytes, file_size(fd), req.world_size, req.host_hash);
  if (!check) {
    std::string msg =
        fmt::format("rank {}: segment '{}' refused: {}", req.rank, req.name, check.error);
    if (ours) rethrow(collide(h, msg));
    throw InvalidArgumentError(msg);
  }
  if (refusing) {
    // Recorded in the header, where the ranks in wait_all_attached and
    // those still to come read it; then kept until every rank has come
    // (each counts itself) or the deadline passed: rank 0 leaves as soon
    // as it has read it, and a rank still starting must find the name.
    (void)try_lock_rank(fd, req.rank);  // "alive": the name is kept for the late ranks
    record_abort(*h, ErrorCode::invalid_argument, req.rank, req.refusal);
    h->attached.fetch_add(1, std::memory_order_acq_rel);
    while (h->attached.load(std::memory_order_acquire) <
               static_cast<std::uint32_t>(req.world_size) &&
           Clock::now() < req.deadline) {
      say_refusal_if_slow();
      sleep_backoff(it);
    }
    unlink_if_same(req.name, fd);
    throw InvalidArgumentError(req.refusal);
  }
  return check;
}

// Maps the checked segment, takes this rank's lock and publishes it.
std::unique_ptr<Segment> Segment::Opening::register_rank() {
  void* addr = ::mmap(nullptr, seg->layout_.total_bytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_POPULATE, seg->fd_, 0);
  if (addr == MAP_FAILED) {
    int e = errno;
    throw SystemError(fmt::format("rank {}: cannot map shared memory segment '{}' ({} bytes): {}",
                                  req.rank, req.name, seg->layout_.total_bytes, std::strerror(e)),
                      e);
  }
  m.addr = addr;
  m.len = seg->layout_.total_bytes;
  ::madvise(addr, m.len, MADV_DONTFORK);
  seg->base_ = static_cast<std::byte*>(addr);
  seg->header_ = reinterpret_cast<Header*>(seg->base_);
  RankArea& mine = seg->rank_area(req.rank);
  // The rank's lock, then its state: a second claimant of the rank finds the
  // lock held (by a live process), or the state set by one that has left.
  // Either way both are told, and so is the rest of the job.
  if (!try_lock_rank(seg->fd_, req.rank) ||
      mine.info.state.load(std::memory_order_acquire) != kRankAbsent) {
    const Collision kind = classify(*seg->header_, me);
    rethrow(
        collide(seg->header_, duplicate_rank_message(me, req.name, mine.info.pid.load(), kind)));
  }
  publish_cpus(mine.info, req);
  mine.info.pid.store(getpid(), std::memory_order_relaxed);
  mine.info.host_hash.store(req.host_hash, std::memory_order_relaxed);
  mine.info.probe_addr.store(reinterpret_cast<std::uint64_t>(&mine.info.probe_addr),
                             std::memory_order_relaxed);
  mine.info.state.store(kRankAttached, std::memory_order_release);
  seg->registered_ = true;
  track_fd(seg->fd_);
  std::uint32_t now_attached = seg->header_->attached.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (now_attached == static_cast<std::uint32_t>(req.world_size)) seg->unlink_name();
  return std::move(seg);
}

}  // namespace shmring::detail
