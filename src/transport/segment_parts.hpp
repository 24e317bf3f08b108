#pragma once

// What the files of the segment share (segment.hpp is the interface):
// the mapping, a view of a header page, the liveness locks, the names,
// owners and identities of segment files (segment_identity.cpp), and the
// steps of Segment::create_or_attach (segment_open.cpp, segment_attach.cpp).
// Private to src/transport.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include "shmring/error.hpp"
#include "transport/header_check.hpp"
#include "transport/segment.hpp"
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

/// The size of the file open on `fd` (0 when fstat fails).
std::uint64_t file_size(int fd);

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

// Liveness locks (segment.cpp): rank r's byte, held by the process that
// attached rank r for as long as it lives.
bool try_lock_rank(int fd, int r);
bool lock_held(int fd, int r);
/// Sleeps 0.1 ms, doubling up to 10 ms with `iteration`, and counts it.
void sleep_backoff(int& iteration);
AbortInfo record_abort(Header& h, ErrorCode code, int rank, const std::string& msg);

// Names, owners and identities of segment files (segment_identity.cpp).
std::string shm_full_reason(const SegmentRequest& req, const Layout& l, int err);
std::string mode_problem(int fd);
std::string shm_path(const std::string& name);
std::string path_problem(const std::string& name);
std::string fd_problem(int fd);
bool unlink_if_same(const std::string& name, int fd);
int creator_pid_of(int fd);
std::string pid_text(int pid);
// Header word `nonce_source`: where the job nonce came from.
inline constexpr std::uint32_t kNonceRandom = 0;    // rank 0 made it up: nothing to compare
inline constexpr std::uint32_t kNonceLauncher = 1;  // SHMRING_JOB_NONCE, the same on every rank

std::uint64_t launcher_nonce(int rank);

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
Collision classify(const Header& h, const Identity& me);
std::string two_jobs_message(const Identity& me, const std::string& name, int their_pid);
std::string duplicate_rank_message(const Identity& me, const std::string& name, int holder,
                                   Collision kind);
int open_unnamed();
int link_as(int fd, const std::string& name);

// This rank's entries in its RankArea, and clocks (segment_open.cpp).
std::int64_t realtime_ns(clockid_t clock = CLOCK_REALTIME);
/// When this process started, on CLOCK_REALTIME: the time it was forked
/// where the library saw the fork (base/fork.hpp), else /proc/self/stat's
/// start time rounded up to the next clock tick; -1 where neither says.
std::int64_t process_start_realtime_ns();
void publish_cpus(RankInfo& info, const SegmentRequest& req);

// The steps of Segment::create_or_attach and what they share: the request,
// this rank's identity, and the segment being made with its mapping. Rank 0
// creates (segment_open.cpp), the others attach (segment_attach.cpp).
struct Segment::Opening {
  Opening(const SegmentRequest& req, std::chrono::steady_clock::time_point refusal_start,
          std::optional<Layout> layout, Identity me, std::unique_ptr<Segment> seg);

  // A refusing rank raises its error once the others have heard it; where
  // they are slow to come (or rank 0 never does), say it at once.
  void say_refusal_if_slow();
  InvalidArgumentError not_ours(const std::string& why) const;
  // A live segment of our name whose owner clashes with us: record why in its
  // header (so that its ranks fail now, not at their timeout) and return the
  // job's first error. Both jobs' ranks are involved: all must fail.
  Error collide(Header* h, const std::string& msg) const;
  static void rethrow(const Error& e);

  // Rank 0 (segment_open.cpp).
  std::unique_ptr<Segment> create();
  void open_new_file();
  void handle_existing();
  void publish_name();
  void announce_failure(ErrorCode code, const std::string& reason);
  void reserve();
  void map_new();
  void fill_header();

  // Ranks 1..N-1 (segment_attach.cpp).
  std::unique_ptr<Segment> attach();
  TimeoutError timed_out(const std::string& what, const std::string& extra = {}) const;
  Error rank0_died(int pid, int fd) const;
  void close_fd();
  void check_unlocked(int fd);
  Header* wait_for_header(int fd, std::optional<HeaderView>& hv);
  HeaderCheck check_header(int fd, Header* h);
  std::unique_ptr<Segment> register_rank();

  const SegmentRequest& req;
  const bool refusing;
  const std::chrono::steady_clock::time_point refusal_start;
  bool refusal_said = false;
  const std::optional<Layout> layout;
  const Identity me;
  std::unique_ptr<Segment> seg;
  Mapping& m;
  bool unnamed = false;  // rank 0: the file was made with O_TMPFILE
  // Ranks 1..N-1: when this rank began looking (began_ns: or when this
  // process started, if earlier; see attach()), and its backoff.
  std::int64_t began_ns = 0;
  std::chrono::steady_clock::time_point began;
  int it = 0;
};

}  // namespace shmring::detail
