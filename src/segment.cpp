#include "segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
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

  if (req.rank == 0) {
    // ---- Create, exclusively, mode 0600. ----
    for (int attempt = 0;; ++attempt) {
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
        bip::shared_memory_object old(bip::open_only, req.name.c_str(), bip::read_write);
        int ofd = handle_of(old);
        if (lock_held(ofd, 0)) {
          int pid = 0;
          if (file_size(ofd) >= kHeaderBytes) {
            bip::mapped_region hr(old, bip::read_only, 0, kHeaderBytes);
            pid = static_cast<const Header*>(hr.get_address())->creator_pid;
          }
          throw InvalidArgumentError(fmt::format(
              "rank 0: shared memory segment '{}' already exists and its creator (pid {}) is "
              "alive: another job is using job id '{}'; choose a different SHMRING_JOB_ID",
              req.name, pid, req.name));
        }
      } catch (const bip::interprocess_exception&) {
        // Vanished meanwhile, or not ours to open: retry the create.
      }
      SHMRING_LOG(warn, "removing stale shared memory segment '{}' (its creator is dead)",
                  req.name);
      bip::shared_memory_object::remove(req.name.c_str());
    }
    seg->fd_ = handle_of(m.shm);
    fcntl(seg->fd_, F_SETFD, FD_CLOEXEC);
    if (!try_lock_rank(seg->fd_, 0)) {
      int e = errno;
      bip::shared_memory_object::remove(req.name.c_str());
      throw SystemError(
          fmt::format("rank 0: cannot lock segment '{}': {}", req.name, std::strerror(e)), e);
    }
    // Reserve every page now: a full /dev/shm must be an error here, not a
    // SIGBUS on first touch later.
    int err = posix_fallocate(seg->fd_, 0, static_cast<off_t>(layout->total_bytes));
    if (err != 0) {
      std::string reason = fmt::format(
          "rank 0: cannot reserve shared memory segment '{}': it needs {} bytes ({} ranks x ({} "
          "slots x {} bytes + 2 x {} direct bytes) + {} bytes of header) and /dev/shm has {} "
          "free ({}); lower SHMRING_SLOTS or SHMRING_SLOT_BYTES, or enlarge /dev/shm",
          req.name, layout->total_bytes, req.world_size, req.slots, req.slot_bytes,
          req.direct_bytes, layout->slot_offset, shm_dir_free(), std::strerror(err));
      // Tell the other ranks through a header-only segment, then remove it.
      if (req.world_size > 1 && ftruncate(seg->fd_, kHeaderBytes) == 0) {
        try {
          bip::mapped_region hr(m.shm, bip::read_write, 0, kHeaderBytes);
          auto* h = static_cast<Header*>(hr.get_address());
          h->magic = kMagic;
          h->layout_version = kLayoutVersion;
          h->world_size = static_cast<std::uint32_t>(req.world_size);
          h->creator_pid = getpid();
          std::size_t n = std::min(reason.size(), kReasonBytes - 1);
          std::memcpy(h->abort_reason, reason.data(), n);
          h->abort_rank.store(0);
          h->abort_code.store(static_cast<std::uint32_t>(ErrorCode::out_of_shared_memory),
                              std::memory_order_release);
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
      bip::shared_memory_object::remove(req.name.c_str());
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
    RankArea& me = seg->rank_area(0);
    me.info.pid.store(getpid(), std::memory_order_relaxed);
    me.info.host_hash.store(req.host_hash, std::memory_order_relaxed);
    me.info.state.store(kRankAttached, std::memory_order_relaxed);
    h.attached.store(1, std::memory_order_relaxed);
    h.status.store(kStatusReady, std::memory_order_release);  // last: "ready"
    if (req.world_size == 1) seg->unlink_name();
    return seg;
  }

  // ---- Ranks 1..N-1: open, validate, register. ----
  int it = 0;
  auto timed_out = [&](const std::string& what) {
    return TimeoutError(fmt::format(
        "rank {}: timed out after waiting for {} of segment '{}' (is rank 0 running with the same "
        "SHMRING_JOB_ID and world size? SHMRING_TIMEOUT sets the limit)",
        req.rank, what, req.name));
  };
  for (;;) {
    if (std::chrono::steady_clock::now() >= req.deadline) throw timed_out("the creation");
    try {
      m.shm = bip::shared_memory_object(bip::open_only, req.name.c_str(), bip::read_write);
    } catch (const bip::interprocess_exception& e) {
      if (e.get_error_code() == bip::not_found_error) {
        sleep_backoff(it);
        continue;
      }
      throw SystemError(fmt::format("rank {}: cannot open shared memory segment '{}': {}", req.rank,
                                    req.name, e.what()),
                        e.get_native_error());
    }
    int fd = handle_of(m.shm);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    // Size 0: rank 0 is still reserving it. No creator lock: stale, rank 0
    // will replace it. Either way, look again shortly.
    if (file_size(fd) < kHeaderBytes || !lock_held(fd, 0)) {
      m.shm = bip::shared_memory_object();
      sleep_backoff(it);
      continue;
    }
    bip::mapped_region hr(m.shm, bip::read_write, 0, kHeaderBytes);
    auto* h = static_cast<Header*>(hr.get_address());
    while (h->status.load(std::memory_order_acquire) == kStatusInit) {
      if (std::chrono::steady_clock::now() >= req.deadline) throw timed_out("the header");
      sleep_backoff(it);
    }
    if (h->magic != kMagic || h->layout_version != kLayoutVersion)
      throw InvalidArgumentError(fmt::format(
          "rank {}: segment '{}' is not a shmring segment of layout version {} (magic {:#x}, "
          "version {})",
          req.rank, req.name, kLayoutVersion, h->magic, h->layout_version));
    if (h->status.load(std::memory_order_acquire) == kStatusFailed) {
      h->attached.fetch_add(1, std::memory_order_acq_rel);
      throw_from_header(*h, req.rank);
    }
    auto refuse = [&](const std::string& why) {
      std::string msg = fmt::format("rank {}: segment '{}' refused: {}", req.rank, req.name, why);
      // Tell the ranks already attached, so they fail now instead of at the timeout.
      std::uint32_t expected = kAbortNone;
      if (h->abort_code.compare_exchange_strong(expected, kAbortClaimed)) {
        std::size_t n = std::min(msg.size(), kReasonBytes - 1);
        std::memcpy(h->abort_reason, msg.data(), n);
        h->abort_reason[n] = '\0';
        h->abort_rank.store(req.rank);
        h->abort_code.store(static_cast<std::uint32_t>(ErrorCode::invalid_argument),
                            std::memory_order_release);
      }
      throw InvalidArgumentError(msg);
    };
    if (h->world_size != static_cast<std::uint32_t>(req.world_size))
      refuse(fmt::format("its world size is {} but this rank has world size {}", h->world_size,
                         req.world_size));
    if (h->host_hash != req.host_hash)
      refuse(fmt::format("it was made on another host (identity {:016x}, ours {:016x})",
                         h->host_hash, req.host_hash));
    // Slot settings follow rank 0's; recompute the layout from them and never
    // use an offset read from shared memory.
    if (h->slots < 2 || h->slots > kMaxSlots || h->slot_bytes < kPage ||
        h->slot_bytes > (1u << 30) || h->slot_bytes % kPage != 0 || h->direct_bytes < kPage ||
        h->direct_bytes > (1u << 26) || h->direct_bytes % kPage != 0)
      refuse(fmt::format("bad slot settings {} x {} bytes, direct {} bytes", h->slots,
                         h->slot_bytes, h->direct_bytes));
    auto l = compute_layout(req.world_size, h->slots, h->slot_bytes, h->direct_bytes);
    std::uint64_t fsize = file_size(fd);
    if (!l || l->total_bytes != h->total_bytes || l->slot_offset != h->slot_offset ||
        l->rank_area_offset != h->rank_area_offset || l->direct_offset != h->direct_offset ||
        fsize != l->total_bytes)
      refuse(fmt::format("sizes disagree: header says {} bytes, the file has {}, expected {}",
                         h->total_bytes, fsize, l ? l->total_bytes : 0));
    if (h->slots != req.slots || h->slot_bytes != req.slot_bytes)
      SHMRING_LOG(info, "using rank 0's slots={} slot_bytes={} (this rank asked for {} x {})",
                  h->slots, h->slot_bytes, req.slots, req.slot_bytes);
    seg->layout_ = *l;
    seg->slots_ = h->slots;
    seg->slot_bytes_ = h->slot_bytes;
    seg->direct_bytes_ = h->direct_bytes;
    seg->fd_ = fd;
    break;
  }
  m.region = bip::mapped_region(m.shm, bip::read_write, 0, seg->layout_.total_bytes, nullptr,
                                MAP_POPULATE);
  seg->base_ = static_cast<std::byte*>(m.region.get_address());
  seg->header_ = reinterpret_cast<Header*>(seg->base_);
  RankArea& me = seg->rank_area(req.rank);
  if (!try_lock_rank(seg->fd_, req.rank)) {
    std::string msg = fmt::format(
        "rank {}: another process (pid {}) already attached as rank {} to segment '{}': every "
        "rank needs a distinct SHMRING_RANK",
        req.rank, me.info.pid.load(), req.rank, req.name);
    raise_abort(*seg, req.world_size, static_cast<std::uint32_t>(ErrorCode::invalid_argument),
                req.rank, msg);
    throw InvalidArgumentError(msg);
  }
  me.info.pid.store(getpid(), std::memory_order_relaxed);
  me.info.host_hash.store(req.host_hash, std::memory_order_relaxed);
  me.info.state.store(kRankAttached, std::memory_order_release);
  std::uint32_t now_attached = seg->header_->attached.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (now_attached == static_cast<std::uint32_t>(req.world_size)) seg->unlink_name();
  return seg;
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
    if (rank_ != 0 && !rank_alive(0)) {
      unlink_name();
      throw PeerFailureError(
          fmt::format("rank {}: rank 0 (pid {}) exited before every rank attached to segment '{}'",
                      rank_, h.creator_pid, name_));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string missing;
      for (int r = 0; r < world_size_; ++r)
        if (rank_area(r).info.state.load(std::memory_order_acquire) == kRankAbsent)
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      unlink_name();
      throw TimeoutError(fmt::format(
          "rank {}: timed out waiting for every rank to attach to segment '{}': {} of {} "
          "attached, missing rank(s) {} (SHMRING_TIMEOUT sets the limit)",
          rank_, name_, h.attached.load(), world_size_, missing));
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
