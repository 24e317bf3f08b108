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
#include "base/log.hpp"
#include "shmring/error.hpp"
#include "transport/wait.hpp"

namespace shmring::detail {

// The segment's descriptor and its one mapping. Plain POSIX rather than
// Boost.Interprocess: rank 0 creates the file unnamed (O_TMPFILE) and names it
// only once it is locked and ready, and the mapping is marked MADV_DONTFORK;
// neither fits bip's objects.
struct Segment::Mapping {
  int fd = -1;
  void* addr = nullptr;
  std::size_t len = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr != nullptr) ::munmap(addr, len);
    if (fd >= 0) ::close(fd);
  }
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

std::uint64_t file_size(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_size);
}

std::string mib(std::uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
}

std::string shm_dir_free() {
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) != 0) return "unknown";
  const auto free = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  return fmt::format("{} bytes ({})", free, mib(free));
}

// Why a segment of `l` does not fit /dev/shm: each part's size and what
// sets it. It travels to the other ranks in the header's abort reason
// (kReasonBytes), so it stays short of that even with a long name.
std::string shm_full_reason(const SegmentRequest& req, const Layout& l, int err) {
  const std::uint64_t n = req.world_size;
  const std::uint64_t slots = n * req.slots * req.slot_bytes;
  const std::uint64_t direct = n * kDirectBuffers * req.direct_bytes;
  const std::uint64_t p2p = p2p_region_bytes(n);
  const std::uint64_t eager = l.total_bytes - l.eager_offset;
  const std::uint64_t rest = l.total_bytes - slots - direct - p2p - eager;
  return fmt::format(
      "rank 0: cannot reserve shared memory segment '{}': it needs {} bytes ({}) and /dev/shm has "
      "{} free ({}). Parts: ring slots {} ({} ranks x {} x {} bytes; SHMRING_SLOTS, "
      "SHMRING_SLOT_BYTES), direct buffers {} ({} x {} x {} bytes; SHMRING_DIRECT_BYTES), "
      "point-to-point queues {} ({} KiB x ranks^2 + {} KiB x ranks; no setting), eager rings, "
      "header and rank areas {} (fixed). Lower those settings or run fewer ranks, or give "
      "/dev/shm more: docker run --shm-size=<size>; Kubernetes: an emptyDir volume with medium: "
      "Memory (and a sizeLimit) mounted at /dev/shm",
      req.name, l.total_bytes, mib(l.total_bytes), shm_dir_free(), std::strerror(err), mib(slots),
      n, req.slots, req.slot_bytes, mib(direct), n, kDirectBuffers, req.direct_bytes, mib(p2p),
      sizeof(P2pChannel) / 1024, (kP2pStageSlots * kP2pStageBytes + kP2pOutboxBytes) / 1024,
      mib(eager + rest));
}

void sleep_backoff(int& iteration) {
  // 0.1 ms, doubling up to 10 ms: quick when peers start together, cheap when not.
  long us = std::min(10'000L, 100L << std::min(iteration, 7));
  std::this_thread::sleep_for(std::chrono::microseconds(us));
  ++iteration;
}

// ---- Fork without exec. ----
// A child forked from a rank inherits its descriptor, and with it the
// open-file-description lock that says "rank r is alive": the rank would
// look alive for as long as the child lives. The child therefore closes every
// segment descriptor right after fork (the parent still holds the open file
// description, so its lock stays), does not inherit the mapping at all
// (MADV_DONTFORK: a mapping also pins the open file description), and
// every communicator checks the fork generation before it touches anything.
std::atomic<std::uint64_t> g_fork_generation{0};
std::mutex g_fork_mutex;
std::vector<int>& fork_fds() {
  static auto* fds = new std::vector<int>();  // never destroyed: atfork may run late
  return *fds;
}
void fork_prepare() {
  g_fork_mutex.lock();
}
void fork_parent() {
  g_fork_mutex.unlock();
}
void fork_child() {
  for (int fd : fork_fds()) ::close(fd);
  fork_fds().clear();
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
  g_fork_mutex.unlock();
}
void track_fd(int fd) {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(fork_prepare, fork_parent, fork_child); });
  std::lock_guard<std::mutex> lock(g_fork_mutex);
  fork_fds().push_back(fd);
}
void untrack_fd(int fd) {
  std::lock_guard<std::mutex> lock(g_fork_mutex);
  auto& v = fork_fds();
  for (auto it = v.begin(); it != v.end(); ++it)
    if (*it == fd) {
      v.erase(it);
      return;
    }
}

// A read-only (or read-write) mapping of a segment's header page, unmapped
// when it goes out of scope.
class HeaderView {
 public:
  HeaderView(int fd, bool writable) {
    if (file_size(fd) < kHeaderBytes) return;
    void* p = ::mmap(nullptr, kHeaderBytes, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                     MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) addr_ = p;
  }
  ~HeaderView() {
    if (addr_ != nullptr) ::munmap(addr_, kHeaderBytes);
  }
  HeaderView(const HeaderView&) = delete;
  HeaderView& operator=(const HeaderView&) = delete;
  Header* get() const { return static_cast<Header*>(addr_); }
  const std::byte* bytes() const { return static_cast<const std::byte*>(addr_); }

 private:
  void* addr_ = nullptr;
};

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

bool Segment::forked_away() const noexcept {
  return g_fork_generation.load(std::memory_order_relaxed) != fork_generation_;
}

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

}  // namespace

void Segment::unlink_name() {
  if (unlinked_) return;
  unlinked_ = true;
  // Only while the name is still ours: after an abort, another job (or a
  // fresh attempt of this one) may have its own segment under the name by
  // now, and removing it would leave its ranks waiting for the timeout.
  unlink_if_same(name_, fd_);
}

namespace {

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

// The creator pid recorded in a segment's header; 0 when there is no header
// of ours to read it from (a file cut short or of another layout: its bytes
// at that offset would be noise, not a pid).
int creator_pid_of(int fd) {
  HeaderView hv(fd, false);
  if (hv.get() == nullptr) return 0;
  if (read_field<std::uint64_t>(hv.bytes(), offsetof(Header, magic)) != kMagic) return 0;
  return read_field<std::int32_t>(hv.bytes(), offsetof(Header, creator_pid));
}

std::string pid_text(int pid) {
  return pid > 0 ? fmt::format("pid {}", pid) : std::string("pid unknown");
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

// Header word `nonce_source`: where the job nonce came from.
constexpr std::uint32_t kNonceRandom = 0;    // rank 0 made it up: nothing to compare
constexpr std::uint32_t kNonceLauncher = 1;  // SHMRING_JOB_NONCE, the same on every rank

// The launcher's job nonce (shmrun sets SHMRING_JOB_NONCE, 1 to 16 hex
// digits, fresh per job); 0 when there is none.
std::uint64_t launcher_nonce(int rank) {
  try {
    return settings::hex("SHMRING_JOB_NONCE").value_or(0);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(fmt::format("rank {}: {}", rank, e.what()));
  }
}

// What the owner of a live segment of our name is to us, and what to say.
struct Identity {
  std::string job_id;
  int rank;
  int world_size;
  std::uint64_t nonce;  // 0: none
};

// Whether the segment in `h` was made by another job (the launchers' nonces
// differ, or only one of the two has one) — or cannot be told apart (no nonce
// on either side): then the message names both possibilities.
enum class Collision { other_job, same_job, unknown };
Collision classify(const Header& h, const Identity& me) {
  const bool theirs = h.reserved == kNonceLauncher;
  if (me.nonce == 0 && !theirs) return Collision::unknown;
  if (me.nonce != 0 && theirs && h.job_nonce == me.nonce) return Collision::same_job;
  return Collision::other_job;
}

std::string two_jobs_message(const Identity& me, const std::string& name, int their_pid) {
  // Every rank of both jobs prints this (it travels as the abort reason):
  // it names the process that found the clash, not "this process".
  return fmt::format(
      "rank {}: two jobs share job id '{}' on this host: pid {} (rank {} of {} in one of them) "
      "found shared memory segment '{}' made by the other, whose rank 0 is {}; give each job a "
      "job id of its own (SHMRING_JOB_ID, shmrun --job-id), or let shmrun choose one",
      me.rank, me.job_id, getpid(), me.rank, me.world_size, name, pid_text(their_pid));
}

std::string duplicate_rank_message(const Identity& me, const std::string& name, int holder,
                                   Collision kind) {
  return fmt::format(
      "rank {}: two processes claim rank {} of job '{}': {} already holds it and pid {} claims "
      "it too (segment '{}'); {}",
      me.rank, me.rank, me.job_id, pid_text(holder), getpid(), name,
      kind == Collision::same_job
          ? "the launcher gave two processes the same rank (check SHMRING_RANK, RANK, "
            "OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID)"
          : "either two processes of one job were given the same rank (check SHMRING_RANK and the "
            "launcher's rank variables), or two jobs on this host share the job id");
}

// O_TMPFILE in /dev/shm: a file with no name yet. Our segment gets its name
// (linkat) only once its creator holds its lock and its header is ready, so
// no process ever finds the name with a live creator that is not yet locked
// (the race that made a rank 0 take a starting creator for a dead one).
int open_unnamed() {
  return ::open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
}

// 0, or the errno of linking `fd` as `name`: EEXIST when the name is taken.
// Through /proc/self/fd, which needs no capability (AT_EMPTY_PATH does).
int link_as(int fd, const std::string& name) {
  const std::string from = fmt::format("/proc/self/fd/{}", fd);
  if (::linkat(AT_FDCWD, from.c_str(), AT_FDCWD, shm_path(name).c_str(), AT_SYMLINK_FOLLOW) == 0)
    return 0;
  return errno;
}

}  // namespace

std::unique_ptr<Segment> Segment::create_or_attach(const SegmentRequest& req) {
  const bool refusing = !req.refusal.empty();
  // A refusing rank raises its error once the others have heard it; where
  // they are slow to come (or rank 0 never does), say it at once.
  const auto refusal_start = Clock::now();
  bool refusal_said = false;
  auto say_refusal_if_slow = [&] {
    if (!refusing || refusal_said || Clock::now() - refusal_start < std::chrono::seconds(1)) return;
    refusal_said = true;
    SHMRING_LOG(warn,
                "{} (this rank waits to tell the other ranks of its job, then raises it; "
                "SHMRING_TIMEOUT bounds the wait)",
                req.refusal);
  };
  auto layout = compute_layout(req.world_size, req.slots, req.slot_bytes, req.direct_bytes);
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
  seg->fork_generation_ = g_fork_generation.load(std::memory_order_relaxed);
  seg->owner_pid_ = getpid();
  seg->map_ = std::make_unique<Mapping>();
  auto& m = *seg->map_;
  auto not_ours = [&](const std::string& why) {
    return InvalidArgumentError(fmt::format(
        "rank {}: shared memory segment '{}' exists but is not this job's to use: {}; refusing to "
        "open or remove it (choose a different SHMRING_JOB_ID, or remove it as its owner)",
        req.rank, req.name, why));
  };
  // A live segment of our name whose owner clashes with us: record why in its
  // header (so that its ranks fail now, not at their timeout) and throw the
  // job's first error. Both jobs' ranks are involved: all must fail.
  auto collide = [&](Header* h, const std::string& msg) -> Error {
    if (h != nullptr && h->magic == kMagic && h->layout_version == kLayoutVersion) {
      AbortInfo a = record_abort(*h, ErrorCode::invalid_argument, req.rank, msg);
      return Error(static_cast<ErrorCode>(a.code), a.reason);
    }
    return InvalidArgumentError(msg);
  };
  auto rethrow = [](const Error& e) { throw_error(e.code(), e.what(), e.sys_errno()); };

  if (req.rank == 0) {
    // ---- Create: unnamed, locked and filled first, then named. ----
    int fd = open_unnamed();
    const bool unnamed = fd >= 0;
    if (!unnamed) {
      // No O_TMPFILE (an old kernel, or /dev/shm not a tmpfs): create the
      // name exclusively and lock it at once; a narrow window remains in
      // which the name exists unlocked (see the stale check below).
      fd = ::shm_open(req.name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
    m.fd = fd;
    auto handle_existing = [&]() {
      // The name exists: a stale segment of a dead job, or a live collision.
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
    };
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
    // Names the file once it is ready (unnamed case): a stale file of our
    // name is removed, a live one is a collision.
    auto publish_name = [&]() {
      if (!unnamed) return;
      for (int attempt = 0;; ++attempt) {
        int e = link_as(seg->fd_, req.name);
        if (e == 0) return;
        if (e != EEXIST || attempt >= 3)
          throw SystemError(fmt::format("rank 0: cannot name shared memory segment '{}': {}",
                                        req.name, std::strerror(e)),
                            e);
        handle_existing();
      }
    };
    // Tells the other ranks why this job cannot start through a header-only
    // segment that says so (each that finds it counts itself in `attached`
    // and throws the reason), kept until all have come or the deadline, then
    // removed.
    auto announce_failure = [&](ErrorCode code, const std::string& reason) {
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
    };
    if (refusing) {
      if (posix_fallocate(seg->fd_, 0, static_cast<off_t>(kHeaderBytes)) == 0)
        announce_failure(ErrorCode::invalid_argument, req.refusal);
      else
        unlink_if_same(req.name, seg->fd_);
      throw InvalidArgumentError(req.refusal);
    }
    // Reserve every page now: a full /dev/shm must be an error here, not a
    // SIGBUS on first touch later. The header page first, so that a failure
    // of the big reservation can still be told to the other ranks through it.
    int err = posix_fallocate(seg->fd_, 0, static_cast<off_t>(kHeaderBytes));
    const bool header_reserved = err == 0;
    if (header_reserved)
      err = posix_fallocate(seg->fd_, 0, static_cast<off_t>(layout->total_bytes));
    if (err != 0) {
      const std::string reason = shm_full_reason(req, *layout, err);
      // Tell the other ranks through a header-only segment, then remove it.
      if (header_reserved)
        announce_failure(ErrorCode::out_of_shared_memory, reason);
      else
        unlink_if_same(req.name, seg->fd_);
      throw OutOfSharedMemoryError(reason, err);
    }
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
    h.job_nonce = me.nonce != 0
                      ? me.nonce
                      : fnv1a(&h, sizeof(void*),
                              static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()));
    h.reserved = me.nonce != 0 ? kNonceLauncher : kNonceRandom;
    h.host_hash = req.host_hash;
    h.creator_pid = getpid();
    h.created_ns = static_cast<std::uint64_t>(realtime_ns(CLOCK_REALTIME_COARSE));
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
    if (req.world_size == 1) {
      seg->unlinked_ = true;  // never named (or removed right away below)
      if (!unnamed) ::shm_unlink(req.name.c_str());
      return seg;
    }
    publish_name();
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
  // (rank 0 locks before it names or reserves, so a sized file had a live
  // creator), or when we saw its creator alive before: then fail now and
  // remove it, rather than wait for the timeout and leave it behind.
  const std::int64_t began_ns = realtime_ns();
  const auto began = Clock::now();
  int it = 0;
  auto timed_out = [&](const std::string& what, const std::string& extra = {}) {
    return TimeoutError(fmt::format(
        "rank {}: timed out after {:.1f} s waiting for {} of segment '{}'{} (is rank 0 running "
        "with the same SHMRING_JOB_ID, world size and host? A job that already ran without this "
        "process removed its segment: then this is a late or duplicate rank. SHMRING_TIMEOUT sets "
        "the limit)",
        req.rank, std::chrono::duration<double>(Clock::now() - began).count(), what, req.name,
        extra));
  };
  auto rank0_died = [&](int pid, int fd) {
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
  };
  auto close_fd = [&] {
    if (m.fd >= 0) ::close(m.fd);
    m.fd = -1;
  };
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
      close_fd();
      sleep_backoff(it);
      continue;
    }
    // The creator is alive: wait for its header (ready at once unless its
    // creator had no O_TMPFILE), watching its lock.
    std::optional<HeaderView> hv;
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
  return seg;
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
