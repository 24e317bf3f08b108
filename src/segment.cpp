#include "segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <optional>
#include <thread>

#include "config.hpp"
#include "log.hpp"
#include "shmring/error.hpp"
#include "wait.hpp"

namespace bip = boost::interprocess;

namespace shmring::detail {

struct Segment::Mapping {
  bip::shared_memory_object shm;
  bip::mapped_region region;
};

namespace {

// Liveness locks live far past the end of the data, one byte per rank: fcntl
// locks need no backing bytes, and a lock is released by the kernel when its
// holder exits (even while it is a zombie).
constexpr off_t kLockBase = off_t{1} << 40;

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

int handle_of(const bip::shared_memory_object& shm) {
  return static_cast<int>(shm.get_mapping_handle().handle);
}

std::uint64_t file_size(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_size);
}

std::string shm_dir_free() {
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) != 0) return "unknown";
  return fmt::format("{} bytes", static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize);
}

void sleep_backoff(int& iteration) {
  // 0.1 ms, doubling up to 10 ms: quick when peers start together, cheap when not.
  long us = std::min(10'000L, 100L << std::min(iteration, 7));
  std::this_thread::sleep_for(std::chrono::microseconds(us));
  ++iteration;
}

[[noreturn]] void throw_from_header(const Header& h, int rank) {
  auto a = read_abort(h);
  if (a) throw_error(static_cast<ErrorCode>(a->code), a->reason);
  throw InternalError(fmt::format("rank {}: segment failed without a reason", rank));
}

}  // namespace

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
  }
  return won;
}

std::optional<AbortInfo> read_abort(const Header& h) {
  std::uint32_t code = h.abort_code.load(std::memory_order_acquire);
  if (code == kAbortNone) return std::nullopt;
  while (code == kAbortClaimed) {  // the winner is writing its reason
    cpu_relax();
    code = h.abort_code.load(std::memory_order_acquire);
  }
  AbortInfo a;
  a.code = code;
  a.rank = h.abort_rank.load(std::memory_order_relaxed);
  a.reason.assign(h.abort_reason, strnlen(h.abort_reason, kReasonBytes));
  return a;
}

Segment::~Segment() {
  if (fd_ >= 0 && header_ != nullptr && rank_ >= 0 && rank_ < world_size_ && base_ != nullptr &&
      layout_.total_bytes > kHeaderBytes) {
    rank_area(rank_).info.state.store(kRankFinalized, std::memory_order_release);
  }
  // Unmapping and closing (in ~Mapping) release the liveness lock.
}

void Segment::unlink_name() {
  if (unlinked_) return;
  unlinked_ = true;
  bip::shared_memory_object::remove(name_.c_str());
}

bool Segment::rank_alive(int r) const {
  return lock_held(fd_, r);
}

namespace {

// Ownership rule for a file of our name: ours (effective uid). Root's shm_open would open anyone's
// file, so it is checked explicitly rather than left to the permission bits.
std::string owner_problem(const struct stat& st) {
  if (!S_ISREG(st.st_mode)) return "it is not a regular file";
  if (st.st_uid != geteuid())
    return fmt::format("it belongs to uid {}, not to this process's uid {}", st.st_uid, geteuid());
  return {};
}

// A live segment must also be closed to other users (rank 0 makes it 0600).
std::string mode_problem(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return fmt::format("fstat failed: {}", std::strerror(errno));
  if ((st.st_mode & 077) != 0)
    return fmt::format("its mode is {:o}, expected 600", st.st_mode & 0777);
  return {};
}

std::string shm_path(const std::string& name) {
  return "/dev/shm/" + name;
}

// Before opening: refuse a file of our name that is not ours.
std::string path_problem(const std::string& name) {
  struct stat st {};
  if (lstat(shm_path(name).c_str(), &st) != 0) return {};  // absent: nothing to refuse yet
  return owner_problem(st);
}

// After opening (the name may have been replaced between lstat and open).
std::string fd_problem(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return fmt::format("fstat failed: {}", std::strerror(errno));
  return owner_problem(st);
}

// Removes `name` only while it still names the file open on `fd`: another
// process may have replaced a stale segment meanwhile, and its fresh one must
// survive. (A narrow race remains between the two stats and the unlink; every
// caller only gets here for a segment whose creator is dead.)
bool unlink_if_same(const std::string& name, int fd) {
  struct stat a {
  }, b{};
  if (fstat(fd, &a) != 0 || lstat(shm_path(name).c_str(), &b) != 0) return false;
  if (a.st_dev != b.st_dev || a.st_ino != b.st_ino) return false;
  return shm_unlink(name.c_str()) == 0;
}

std::int64_t realtime_ns(clockid_t clock = CLOCK_REALTIME) {
  struct timespec ts {};
  clock_gettime(clock, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

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

// This process's affinity mask into `info.cpus` (all CPUs if unreadable).
void publish_cpus(RankInfo& info) {
  info.cpu.store(-1, std::memory_order_relaxed);  // not known until its first wait
  cpu_set_t set;
  CPU_ZERO(&set);
  const bool known = sched_getaffinity(0, sizeof set, &set) == 0;
  for (std::size_t w = 0; w < kCpuMaskWords; ++w) {
    std::uint64_t bits = 0;
    for (std::size_t b = 0; b < 64; ++b) {
      const std::size_t cpu = 64 * w + b;
      if (cpu < CPU_SETSIZE &&
          (known ? CPU_ISSET(cpu, &set) : cpu < std::thread::hardware_concurrency()))
        bits |= std::uint64_t{1} << b;
    }
    info.cpus[w].store(bits, std::memory_order_relaxed);
  }
}

// The creator pid recorded in a segment's header; 0 when there is no header
// of ours to read it from (a file cut short or of another layout: its bytes
// at that offset would be noise, not a pid).
int creator_pid_of(const bip::shared_memory_object& shm, int fd) {
  if (file_size(fd) < kHeaderBytes) return 0;
  try {
    bip::mapped_region hr(shm, bip::read_only, 0, kHeaderBytes);
    const auto* base = static_cast<const std::byte*>(hr.get_address());
    if (read_field<std::uint64_t>(base, offsetof(Header, magic)) != kMagic) return 0;
    return read_field<std::int32_t>(base, offsetof(Header, creator_pid));
  } catch (const bip::interprocess_exception&) {
    return 0;
  }
}

std::string pid_text(int pid) {
  return pid > 0 ? fmt::format("pid {}", pid) : std::string("pid unknown");
}

// Writes `msg` as the job's abort reason if none is recorded yet, so that the
// ranks already attached fail now rather than at their timeout. Only for a
// header whose magic and version we checked (the abort fields' offsets).
void record_abort(Header& h, ErrorCode code, int rank, const std::string& msg) {
  std::uint32_t expected = kAbortNone;
  if (!h.abort_code.compare_exchange_strong(expected, kAbortClaimed)) return;
  std::size_t n = std::min(msg.size(), kReasonBytes - 1);
  std::memcpy(h.abort_reason, msg.data(), n);
  h.abort_reason[n] = '\0';
  h.abort_rank.store(rank);
  h.abort_code.store(static_cast<std::uint32_t>(code), std::memory_order_release);
}

}  // namespace

std::unique_ptr<Segment> Segment::create_or_attach(const SegmentRequest& req) {
  auto layout = compute_layout(req.world_size, req.slots, req.slot_bytes, req.direct_bytes);
  if (!layout)
    throw InvalidArgumentError(fmt::format("segment of {} ranks x {} slots x {} bytes overflows",
                                           req.world_size, req.slots, req.slot_bytes));
  std::unique_ptr<Segment> seg(new Segment());
  seg->name_ = req.name;
  seg->rank_ = req.rank;
  seg->world_size_ = req.world_size;
  seg->map_ = std::make_unique<Mapping>();
  auto& m = *seg->map_;
  auto not_ours = [&](const std::string& why) {
    return InvalidArgumentError(fmt::format(
        "rank {}: shared memory segment '{}' exists but is not this job's to use: {}; refusing to "
        "open or remove it (choose a different SHMRING_JOB_ID, or remove it as its owner)",
        req.rank, req.name, why));
  };

  if (req.rank == 0) {
    // ---- Create, exclusively, mode 0600. ----
    for (int attempt = 0;; ++attempt) {
      if (auto why = path_problem(req.name); !why.empty()) throw not_ours(why);
      try {
        m.shm = bip::shared_memory_object(bip::create_only, req.name.c_str(), bip::read_write,
                                          bip::permissions(0600));
        break;
      } catch (const bip::interprocess_exception& e) {
        if (e.get_error_code() != bip::already_exists_error || attempt >= 3)
          throw SystemError(fmt::format("rank 0: cannot create shared memory segment '{}': {}",
                                        req.name, e.what()),
                            e.get_native_error());
      }
      // The name exists: a stale segment of a dead job, or a live collision.
      try {
        bip::shared_memory_object old(bip::open_only, req.name.c_str(), bip::read_only);
        int ofd = handle_of(old);
        if (auto why = fd_problem(ofd); !why.empty()) throw not_ours(why);
        if (lock_held(ofd, 0))
          throw InvalidArgumentError(fmt::format(
              "rank 0: shared memory segment '{}' already exists and its creator ({}) is "
              "alive: another job is using the same job id on this host; choose a different "
              "SHMRING_JOB_ID",
              req.name, [pid = creator_pid_of(old, ofd)] {
                return pid > 0 ? fmt::format("pid {}", pid) : std::string("still starting up");
              }()));
        SHMRING_LOG(warn, "removing stale shared memory segment '{}' (its creator, {}, is dead)",
                    req.name, pid_text(creator_pid_of(old, ofd)));
        unlink_if_same(req.name, ofd);
      } catch (const bip::interprocess_exception& e) {
        // Vanished meanwhile: retry the create. Anything else is an error.
        if (e.get_error_code() != bip::not_found_error)
          throw SystemError(
              fmt::format("rank 0: cannot inspect existing segment '{}': {}", req.name, e.what()),
              e.get_native_error());
      }
    }
    seg->fd_ = handle_of(m.shm);
    fcntl(seg->fd_, F_SETFD, FD_CLOEXEC);
    if (!try_lock_rank(seg->fd_, 0)) {
      int e = errno;
      unlink_if_same(req.name, seg->fd_);
      throw SystemError(
          fmt::format("rank 0: cannot lock segment '{}': {}", req.name, std::strerror(e)), e);
    }
    // Reserve every page now: a full /dev/shm must be an error here, not a
    // SIGBUS on first touch later. The header page first, so that a failure
    // of the big reservation can still be told to the other ranks through it.
    int err = posix_fallocate(seg->fd_, 0, static_cast<off_t>(kHeaderBytes));
    const bool header_reserved = err == 0;
    if (header_reserved)
      err = posix_fallocate(seg->fd_, 0, static_cast<off_t>(layout->total_bytes));
    if (err != 0) {
      std::string reason = fmt::format(
          "rank 0: cannot reserve shared memory segment '{}': it needs {} bytes ({} ranks x ({} "
          "slots x {} bytes + 2 x {} direct bytes) + {} bytes of header and rank areas) and "
          "/dev/shm has {} "
          "free ({}); lower SHMRING_SLOTS or SHMRING_SLOT_BYTES, or enlarge /dev/shm",
          req.name, layout->total_bytes, req.world_size, req.slots, req.slot_bytes,
          req.direct_bytes, layout->slot_offset, shm_dir_free(), std::strerror(err));
      // Tell the other ranks through a header-only segment, then remove it.
      if (req.world_size > 1 && header_reserved && file_size(seg->fd_) >= kHeaderBytes) {
        try {
          bip::mapped_region hr(m.shm, bip::read_write, 0, kHeaderBytes);
          auto* h = static_cast<Header*>(hr.get_address());
          h->magic = kMagic;
          h->layout_version = kLayoutVersion;
          h->world_size = static_cast<std::uint32_t>(req.world_size);
          h->creator_pid = getpid();
          record_abort(*h, ErrorCode::out_of_shared_memory, 0, reason);
          h->attached.store(1, std::memory_order_relaxed);
          h->status.store(kStatusFailed, std::memory_order_release);
          int it = 0;
          while (h->attached.load(std::memory_order_acquire) <
                     static_cast<std::uint32_t>(req.world_size) &&
                 std::chrono::steady_clock::now() < req.deadline)
            sleep_backoff(it);
        } catch (const bip::interprocess_exception&) {
        }
      }
      unlink_if_same(req.name, seg->fd_);
      throw OutOfSharedMemoryError(reason, err);
    }
    m.region =
        bip::mapped_region(m.shm, bip::read_write, 0, layout->total_bytes, nullptr, MAP_POPULATE);
    seg->base_ = static_cast<std::byte*>(m.region.get_address());
    seg->header_ = reinterpret_cast<Header*>(seg->base_);
    seg->layout_ = *layout;
    seg->slots_ = req.slots;
    seg->slot_bytes_ = req.slot_bytes;
    seg->direct_bytes_ = req.direct_bytes;
    // Fresh tmpfs pages are zero: counters, descriptors and abort word start at 0.
    Header& h = *seg->header_;
    h.magic = kMagic;
    h.layout_version = kLayoutVersion;
    h.world_size = static_cast<std::uint32_t>(req.world_size);
    h.slots = req.slots;
    h.slot_bytes = req.slot_bytes;
    h.total_bytes = layout->total_bytes;
    h.rank_area_offset = layout->rank_area_offset;
    h.slot_offset = layout->slot_offset;
    h.direct_bytes = req.direct_bytes;
    h.direct_offset = layout->direct_offset;
    h.job_nonce = fnv1a(&h, sizeof(void*),
                        static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()));
    h.host_hash = req.host_hash;
    h.creator_pid = getpid();
    h.created_ns = static_cast<std::uint64_t>(realtime_ns(CLOCK_REALTIME_COARSE));
    RankArea& me = seg->rank_area(0);
    publish_cpus(me.info);
    me.info.pid.store(getpid(), std::memory_order_relaxed);
    me.info.host_hash.store(req.host_hash, std::memory_order_relaxed);
    me.info.state.store(kRankAttached, std::memory_order_relaxed);
    h.attached.store(1, std::memory_order_relaxed);
    h.status.store(kStatusReady, std::memory_order_release);  // last: "ready"
    if (req.world_size == 1) seg->unlink_name();
    return seg;
  }

  // ---- Ranks 1..N-1: open, validate, register. ----
  // A file of our name without its creator's lock is stale: left by an
  // earlier job (a new rank 0 will replace it) or by this job's rank 0, dead
  // during startup. It is the latter for sure when the file changed after we
  // began looking (ctime > a fine-grained clock read when we began: a file
  // timestamp never runs ahead of that clock, whether the kernel stamps files
  // with the coarse or the fine clock, while the coarse clock can lag a file
  // stamped finely just before we began) and has a size
  // (rank 0 locks before it reserves, so a sized file had a live creator), or
  // when we saw its creator alive before: then fail now and remove it, rather
  // than wait for the timeout and leave it behind. An empty unlocked file may
  // be a rank 0 between create and lock: only the deadline settles that.
  const std::int64_t began_ns = realtime_ns();
  const auto began = Clock::now();
  int it = 0;
  auto timed_out = [&](const std::string& what, const std::string& extra = {}) {
    return TimeoutError(fmt::format(
        "rank {}: timed out after {:.1f} s waiting for {} of segment '{}'{} (is rank 0 running "
        "with the same SHMRING_JOB_ID, world size and host? SHMRING_TIMEOUT sets the limit)",
        req.rank, std::chrono::duration<double>(Clock::now() - began).count(), what, req.name,
        extra));
  };
  auto rank0_died = [&](int pid, int fd) {
    unlink_if_same(req.name, fd);
    return PeerFailureError(fmt::format(
        "rank {}: rank 0 ({}) died while creating segment '{}', before every rank attached",
        req.rank, pid_text(pid), req.name));
  };
  for (;;) {
    if (auto why = path_problem(req.name); !why.empty()) throw not_ours(why);
    try {
      m.shm = bip::shared_memory_object(bip::open_only, req.name.c_str(), bip::read_write);
    } catch (const bip::interprocess_exception& e) {
      if (e.get_error_code() != bip::not_found_error)
        throw SystemError(fmt::format("rank {}: cannot open shared memory segment '{}': {}",
                                      req.rank, req.name, e.what()),
                          e.get_native_error());
      if (Clock::now() >= req.deadline) throw timed_out("the creation");
      sleep_backoff(it);
      continue;
    }
    int fd = handle_of(m.shm);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (auto why = fd_problem(fd); !why.empty()) throw not_ours(why);
    if (!lock_held(fd, 0)) {
      const int pid = creator_pid_of(m.shm, fd);
      if (file_size(fd) >= kHeaderBytes && linked_ctime_ns(fd) > began_ns && !lock_held(fd, 0))
        throw rank0_died(pid, fd);
      if (Clock::now() >= req.deadline) {
        bool removed = !lock_held(fd, 0) && unlink_if_same(req.name, fd);
        throw timed_out("a live rank 0",
                        fmt::format("; a stale segment of that name (creator {}, dead) was "
                                    "there all along{}",
                                    pid_text(pid), removed ? " and has been removed" : ""));
      }
      m.shm = bip::shared_memory_object();
      sleep_backoff(it);
      continue;
    }
    // The creator is alive: wait for its header, watching its lock.
    std::optional<bip::mapped_region> hr;
    Header* h = nullptr;
    for (;;) {
      if (!hr && file_size(fd) >= kHeaderBytes) {
        hr.emplace(m.shm, bip::read_write, 0, kHeaderBytes);
        h = static_cast<Header*>(hr->get_address());
      }
      if (h != nullptr && h->status.load(std::memory_order_acquire) != kStatusInit) break;
      if (!lock_held(fd, 0)) throw rank0_died(h ? h->creator_pid : 0, fd);
      if (Clock::now() >= req.deadline) throw timed_out("the header");
      sleep_backoff(it);
    }
    if (auto why = mode_problem(fd); !why.empty()) throw not_ours(why);
    const bool ours = h->magic == kMagic && h->layout_version == kLayoutVersion;
    if (ours && h->status.load(std::memory_order_acquire) == kStatusFailed) {
      h->attached.fetch_add(1, std::memory_order_acq_rel);
      throw_from_header(*h, req.rank);
    }
    HeaderCheck check =
        validate_header(h, kHeaderBytes, file_size(fd), req.world_size, req.host_hash);
    if (!check) {
      std::string msg =
          fmt::format("rank {}: segment '{}' refused: {}", req.rank, req.name, check.error);
      if (ours) record_abort(*h, ErrorCode::invalid_argument, req.rank, msg);
      throw InvalidArgumentError(msg);
    }
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
  m.region = bip::mapped_region(m.shm, bip::read_write, 0, seg->layout_.total_bytes, nullptr,
                                MAP_POPULATE);
  seg->base_ = static_cast<std::byte*>(m.region.get_address());
  seg->header_ = reinterpret_cast<Header*>(seg->base_);
  RankArea& me = seg->rank_area(req.rank);
  if (!try_lock_rank(seg->fd_, req.rank)) {
    // Not written to the abort word: the segment may belong to another job
    // that happens to use our job id, and a bystander must not be aborted.
    const int holder = me.info.pid.load();
    std::string msg = fmt::format(
        "rank {}: another process ({}) already attached as rank {} to segment '{}': either two "
        "ranks of this job share SHMRING_RANK={}, or another job on this host uses the same "
        "SHMRING_JOB_ID (shmrun gives each job a fresh one)",
        req.rank, holder > 0 ? fmt::format("pid {}", holder) : std::string("pid not yet known"),
        req.rank, req.name, req.rank);
    throw InvalidArgumentError(msg);
  }
  publish_cpus(me.info);
  me.info.pid.store(getpid(), std::memory_order_relaxed);
  me.info.host_hash.store(req.host_hash, std::memory_order_relaxed);
  me.info.state.store(kRankAttached, std::memory_order_release);
  std::uint32_t now_attached = seg->header_->attached.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (now_attached == static_cast<std::uint32_t>(req.world_size)) seg->unlink_name();
  return seg;
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
      unlink_name();
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
    try {
      bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_only);
      int fd = handle_of(shm);
      info.bytes = file_size(fd);
      info.creator_alive = lock_held(fd, 0);
      if (info.bytes >= kHeaderBytes) {
        bip::mapped_region hr(shm, bip::read_only, 0, kHeaderBytes);
        info.creator_pid = static_cast<const Header*>(hr.get_address())->creator_pid;
      }
    } catch (const bip::interprocess_exception&) {
      continue;
    }
    out.push_back(info);
  }
  closedir(d);
  return out;
}

}  // namespace shmring::detail
