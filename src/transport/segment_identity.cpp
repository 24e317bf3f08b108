// Names, owners and identities of segment files: whose a file of our name
// is, whether it may be opened or removed, which job made it, and what to
// say when it does not fit or belongs to someone else.

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/config.hpp"
#include "transport/segment_parts.hpp"

namespace shmring::detail {

namespace {

std::string mib(std::uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
}

std::string shm_dir_free() {
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) != 0) return "unknown";
  const auto free = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  return fmt::format("{} bytes ({})", free, mib(free));
}

// Ownership rule for a file of our name: ours (effective uid). Root's shm_open would open anyone's
// file, so it is checked explicitly rather than left to the permission bits.
std::string owner_problem(const struct stat& st) {
  if (!S_ISREG(st.st_mode)) return "it is not a regular file";
  if (st.st_uid != geteuid())
    return fmt::format("it belongs to uid {}, not to this process's uid {}", st.st_uid, geteuid());
  return {};
}

}  // namespace

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

// The launcher's job nonce (shmrun sets SHMRING_JOB_NONCE, 1 to 16 hex
// digits, fresh per job); 0 when there is none.
std::uint64_t launcher_nonce(int rank) {
  try {
    return settings::hex("SHMRING_JOB_NONCE").value_or(0);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(fmt::format("rank {}: {}", rank, e.what()));
  }
}

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

}  // namespace shmring::detail
