// Segment::create_or_attach: what every rank does first, and rank 0's
// steps: create the file unnamed, lock it, reserve and map it, fill its
// header, then name it (the other ranks' steps: segment_attach.cpp).

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <sched.h>

#include "base/fork.hpp"
#include "base/log.hpp"
#include "transport/segment_parts.hpp"

namespace shmring::detail {

std::int64_t realtime_ns(clockid_t clock) {
  struct timespec ts {};
  clock_gettime(clock, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

std::int64_t process_start_realtime_ns() {
  if (const std::int64_t forked = forked_at_realtime_ns(); forked >= 0) return forked;
  // proc(5): field 22 of /proc/self/stat, starttime, in clock ticks since
  // boot; the fields after the command name's closing parenthesis start at
  // field 3. 0 or unreadable: unknown.
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return -1;
  const auto paren = line.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(line.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
  }
  const long tick = sysconf(_SC_CLK_TCK);
  char* end = nullptr;
  const unsigned long long ticks = std::strtoull(field.c_str(), &end, 10);
  if (!fields || end == field.c_str() || *end != '\0' || ticks == 0 || tick <= 0) return -1;
  const std::int64_t boot = realtime_ns(CLOCK_REALTIME) - realtime_ns(CLOCK_BOOTTIME);
  return boot + static_cast<std::int64_t>((ticks + 1) * (1'000'000'000ull / tick));
}

// This process's affinity mask into `info.cpus` (all CPUs if unreadable),
// whether it takes part in the asymmetric fence (wait.hpp), and its
// Options::oversubscribed.
void publish_cpus(RankInfo& info, const SegmentRequest& req) {
  info.asymmetric_fence.store(req.asymmetric_fence ? 1 : 0, std::memory_order_relaxed);
  info.oversubscribed.store(req.oversubscribed, std::memory_order_relaxed);
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

std::unique_ptr<Segment> Segment::create_or_attach(const SegmentRequest& req) {
  const bool refusing = !req.refusal.empty();
  const auto refusal_start = Clock::now();
  auto layout = compute_layout(req.world_size, req.slots, req.slot_bytes, req.direct_bytes,
                               req.recorder_entries);
  if (!layout && !refusing)
    throw InvalidArgumentError(
        fmt::format("rank {}: segment of {} ranks x {} slots x {} bytes overflows", req.rank,
                    req.world_size, req.slots, req.slot_bytes));
  const Identity me{req.job_id.empty() ? req.name : req.job_id, req.rank, req.world_size,
                    req.job_nonce != 0 ? req.job_nonce : launcher_nonce(req.rank)};
  std::unique_ptr<Segment> seg(new Segment());
  seg->name_ = req.name;
  seg->rank_ = req.rank;
  seg->world_size_ = req.world_size;
  seg->fork_generation_ = fork_generation();
  seg->owner_pid_ = getpid();
  seg->map_ = std::make_unique<Mapping>();
  Opening o(req, refusal_start, layout, me, std::move(seg));
  if (req.rank == 0) return o.create();
  return o.attach();
}

Segment::Opening::Opening(const SegmentRequest& req,
                          std::chrono::steady_clock::time_point refusal_start,
                          std::optional<Layout> layout, Identity me, std::unique_ptr<Segment> seg)
    : req(req),
      refusing(!req.refusal.empty()),
      refusal_start(refusal_start),
      layout(std::move(layout)),
      me(std::move(me)),
      seg(std::move(seg)),
      m(*this->seg->map_) {}

void Segment::Opening::say_refusal_if_slow() {
  if (!refusing || refusal_said || Clock::now() - refusal_start < std::chrono::seconds(1)) return;
  refusal_said = true;
  SHMRING_LOG(warn,
              "{} (this rank waits to tell the other ranks of its job, then raises it; "
              "SHMRING_TIMEOUT bounds the wait)",
              req.refusal);
}

InvalidArgumentError Segment::Opening::not_ours(const std::string& why) const {
  return InvalidArgumentError(fmt::format(
      "rank {}: shared memory segment '{}' exists but is not this job's to use: {}; refusing to "
      "open or remove it (choose a different SHMRING_JOB_ID, or remove it as its owner)",
      req.rank, req.name, why));
}

Error Segment::Opening::collide(Header* h, const std::string& msg) const {
  if (h != nullptr && h->magic == kMagic && h->layout_version == kLayoutVersion) {
    AbortInfo a = record_abort(*h, ErrorCode::invalid_argument, req.rank, msg);
    return Error(static_cast<ErrorCode>(a.code), a.reason);
  }
  return InvalidArgumentError(msg);
}

void Segment::Opening::rethrow(const Error& e) {
  throw_error(e.code(), e.what(), e.sys_errno());
}

// ---- Create: unnamed, locked and filled first, then named. ----
std::unique_ptr<Segment> Segment::Opening::create() {
  open_new_file();
  if (refusing) {
    if (posix_fallocate(seg->fd_, 0, static_cast<off_t>(kHeaderBytes)) == 0)
      announce_failure(ErrorCode::invalid_argument, req.refusal);
    else
      unlink_if_same(req.name, seg->fd_);
    throw InvalidArgumentError(req.refusal);
  }
  reserve();
  map_new();
  fill_header();
  if (req.world_size == 1) {
    seg->unlinked_ = true;  // never named (or removed right away below)
    if (!unnamed) ::shm_unlink(req.name.c_str());
    return std::move(seg);
  }
  publish_name();
  return std::move(seg);
}

void Segment::Opening::open_new_file() {
  int fd = open_unnamed();
  unnamed = fd >= 0;
  if (!unnamed) {
    // No O_TMPFILE (an old kernel, or /dev/shm not a tmpfs): create the
    // name exclusively and lock it at once; a narrow window remains in
    // which the name exists unlocked (see the stale check below).
    fd = ::shm_open(req.name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  }
  m.fd = fd;
  if (!unnamed) {
    for (int attempt = 0; m.fd < 0; ++attempt) {
      if (errno != EEXIST || attempt >= 3)
        throw SystemError(fmt::format("rank 0: cannot create shared memory segment '{}': {}",
                                      req.name, std::strerror(errno)),
                          errno);
      handle_existing();
      m.fd = ::shm_open(req.name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
  }
  seg->fd_ = m.fd;
  if (!try_lock_rank(seg->fd_, 0)) {
    int e = errno;
    if (!unnamed) unlink_if_same(req.name, seg->fd_);
    throw SystemError(
        fmt::format("rank 0: cannot lock segment '{}': {}", req.name, std::strerror(e)), e);
  }
}

// The name exists: a stale segment of a dead job (removed; the caller
// retries), or a live collision (thrown).
void Segment::Opening::handle_existing() {
  if (auto why = path_problem(req.name); !why.empty()) throw not_ours(why);
  int ofd = ::shm_open(req.name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (ofd < 0) {
    if (errno == ENOENT) return;  // vanished meanwhile: retry
    throw SystemError(fmt::format("rank 0: cannot inspect existing segment '{}': {}", req.name,
                                  std::strerror(errno)),
                      errno);
  }
  Mapping guard;
  guard.fd = ofd;
  if (auto why = fd_problem(ofd); !why.empty()) throw not_ours(why);
  // A creator without O_TMPFILE (or of an older shmring) locks just
  // after the name appears: give an empty, unlocked file a moment.
  for (int i = 0; i < 100 && !lock_held(ofd, 0) && file_size(ofd) < kHeaderBytes; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!lock_held(ofd, 0)) {
    SHMRING_LOG(warn, "removing stale shared memory segment '{}' (its creator, {}, is dead)",
                req.name, pid_text(creator_pid_of(ofd)));
    unlink_if_same(req.name, ofd);
    return;
  }
  // Its creator is alive: another rank 0. Wait (briefly) for its header,
  // ready at once unless that creator had no O_TMPFILE.
  std::optional<HeaderView> hv;
  Header* h = nullptr;
  for (int i = 0; i < 100; ++i) {
    if (h == nullptr) h = hv.emplace(ofd, true).get();
    if (h != nullptr && h->status.load(std::memory_order_acquire) != kStatusInit) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool ours = h != nullptr && h->magic == kMagic && h->layout_version == kLayoutVersion;
  const int pid = ours ? h->creator_pid : 0;
  const Collision kind = ours ? classify(*h, me) : Collision::unknown;
  rethrow(collide(ours ? h : nullptr, kind == Collision::other_job
                                          ? two_jobs_message(me, req.name, pid)
                                          : duplicate_rank_message(me, req.name, pid, kind)));
}

// Names the file once it is ready (unnamed case): a stale file of our
// name is removed, a live one is a collision.
void Segment::Opening::publish_name() {
  if (!unnamed) return;
  for (int attempt = 0;; ++attempt) {
    int e = link_as(seg->fd_, req.name);
    if (e == 0) return;
    if (e != EEXIST || attempt >= 3)
      throw SystemError(fmt::format("rank 0: cannot name shared memory segment '{}': {}", req.name,
                                    std::strerror(e)),
                        e);
    handle_existing();
  }
}

// Tells the other ranks why this job cannot start through a header-only
// segment that says so (each that finds it counts itself in `attached`
// and throws the reason), kept until all have come or the deadline, then
// removed.
void Segment::Opening::announce_failure(ErrorCode code, const std::string& reason) {
  if (req.world_size > 1 && file_size(seg->fd_) >= kHeaderBytes) {
    (void)!ftruncate(seg->fd_, static_cast<off_t>(kHeaderBytes));
    HeaderView hv(seg->fd_, true);
    if (Header* h = hv.get()) {
      h->magic = kMagic;
      h->layout_version = kLayoutVersion;
      h->world_size = static_cast<std::uint32_t>(req.world_size);
      h->creator_pid = getpid();
      h->job_nonce = me.nonce;
      h->reserved = me.nonce != 0 ? kNonceLauncher : kNonceRandom;
      record_abort(*h, code, 0, reason);
      h->attached.store(1, std::memory_order_relaxed);
      h->status.store(kStatusFailed, std::memory_order_release);
      try {
        publish_name();
        int it = 0;
        while (h->attached.load(std::memory_order_acquire) <
                   static_cast<std::uint32_t>(req.world_size) &&
               std::chrono::steady_clock::now() < req.deadline) {
          say_refusal_if_slow();
          sleep_backoff(it);
        }
      } catch (const Error&) {
      }
    }
  }
  unlink_if_same(req.name, seg->fd_);
}

// Reserve every page now: a full /dev/shm must be an error here, not a
// SIGBUS on first touch later. The header page first, so that a failure
// of the big reservation can still be told to the other ranks through it.
void Segment::Opening::reserve() {
  int err = posix_fallocate(seg->fd_, 0, static_cast<off_t>(kHeaderBytes));
  const bool header_reserved = err == 0;
  if (header_reserved) err = posix_fallocate(seg->fd_, 0, static_cast<off_t>(layout->total_bytes));
  if (err != 0) {
    const std::string reason = shm_full_reason(req, *layout, err);
    // Tell the other ranks through a header-only segment, then remove it.
    if (header_reserved)
      announce_failure(ErrorCode::out_of_shared_memory, reason);
    else
      unlink_if_same(req.name, seg->fd_);
    throw OutOfSharedMemoryError(reason, err);
  }
}

void Segment::Opening::map_new() {
  void* addr = ::mmap(nullptr, layout->total_bytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_POPULATE, seg->fd_, 0);
  if (addr == MAP_FAILED) {
    int e = errno;
    if (!unnamed) unlink_if_same(req.name, seg->fd_);
    throw SystemError(fmt::format("rank 0: cannot map shared memory segment '{}' ({} bytes): {}",
                                  req.name, layout->total_bytes, std::strerror(e)),
                      e);
  }
  m.addr = addr;
  m.len = layout->total_bytes;
  ::madvise(addr, m.len, MADV_DONTFORK);
  seg->base_ = static_cast<std::byte*>(addr);
  seg->header_ = reinterpret_cast<Header*>(seg->base_);
  seg->layout_ = *layout;
  seg->slots_ = req.slots;
  seg->slot_bytes_ = req.slot_bytes;
  seg->direct_bytes_ = req.direct_bytes;
}

// Fresh tmpfs pages are zero: counters, descriptors and abort word start at 0.
void Segment::Opening::fill_header() {
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
  h.job_nonce = me.nonce != 0
                    ? me.nonce
                    : fnv1a(&h, sizeof(void*),
                            static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()));
  h.reserved = me.nonce != 0 ? kNonceLauncher : kNonceRandom;
  h.host_hash = req.host_hash;
  h.creator_pid = getpid();
  h.created_ns = static_cast<std::uint64_t>(realtime_ns(CLOCK_REALTIME_COARSE));
  h.recorder_entries = req.recorder_entries;
  RankArea& mine = seg->rank_area(0);
  publish_cpus(mine.info, req);
  mine.info.pid.store(getpid(), std::memory_order_relaxed);
  mine.info.host_hash.store(req.host_hash, std::memory_order_relaxed);
  mine.info.probe_addr.store(reinterpret_cast<std::uint64_t>(&mine.info.probe_addr),
                             std::memory_order_relaxed);
  mine.info.state.store(kRankAttached, std::memory_order_relaxed);
  h.attached.store(1, std::memory_order_relaxed);
  h.status.store(kStatusReady, std::memory_order_release);  // last: "ready"
  seg->registered_ = true;
  track_fd(seg->fd_);
}

}  // namespace shmring::detail
