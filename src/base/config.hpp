#pragma once

// Tunables and rank discovery. Every tunable is read from one environment
// variable declared in base/settings.hpp (its one table and parser),
// validated, and reported by Communicator::config() and SHMRING_DEBUG=INFO.

#include <cstdint>
#include <optional>
#include <string>

#include "base/settings.hpp"
#include "shmring/communicator.hpp"

namespace shmring::detail {

inline constexpr std::size_t kDefaultSlots = 4;
/// Most slots a ring edge may have (SHMRING_SLOTS); the descriptor ring
/// (transport/layout.hpp kDescRing) is sized from it.
inline constexpr std::size_t kMaxSlots = 62;
inline constexpr std::size_t kDefaultSlotBytes = 256 * 1024;
/// Most bytes one ring or chain step moves through a slot where the job is
/// oversubscribed (Config::slice_bytes; apply_placement has the numbers).
inline constexpr std::size_t kCrowdedSliceBytes = 64 * 1024;
inline constexpr double kDefaultTimeoutS = 300.0;
inline constexpr std::size_t kDefaultDirectBytes = 64 * 1024;

/// SHMRING_CMA_MIN_BYTES's default (src/core/comm.hpp cma_min_bytes has the numbers).
inline constexpr std::size_t kDefaultCmaMinBytes = 16 * 1024;

/// Resolves options + environment + defaults into a Config (segment_name,
/// segment_bytes and the placement-dependent fields are filled later: see
/// apply_placement; until then threads == 0 and spin_us, yield_us < 0 mean
/// "automatic"). Throws InvalidArgumentError.
Config resolve_config(const Options& options);
/// resolve_config in two steps: who this rank is (rank, world size, local
/// rank and size, job id), then the settings. A rank whose identity is
/// known can tell its peers why its settings failed (Segment's refusal).
/// With `deferred`, a bad local rank or local world size in the launcher's
/// variables (rank, world size and job id being fine) does not throw: its
/// message ("rank R: ...") goes there, for the caller to tell the peers and
/// raise; the returned local rank and size are then the global ones.
Config resolve_identity(const Options& options, std::string* deferred = nullptr);
void resolve_settings(const Options& options, Config& c);

/// CPUs in this process's affinity mask (the online count if unreadable).
int affinity_cpus();

/// CPUs in this process's affinity mask together with its parent's (the
/// launcher's: what its ranks inherit before any binding); the online count
/// where the parent's mask is unreadable. job_crowding_hint compares the
/// launcher's local size with it.
int launcher_cpus();

/// Fills the settings that depend on where the ranks run, once every rank
/// has attached: `my_cpus` is this rank's affinity mask size, `job_cpus` the
/// size of the union of all ranks' masks, `job_request` the ranks' combined
/// Options::oversubscribed (-1 automatic, 0, 1: Segment::oversubscribed_request).
/// Sets job_cpus and oversubscribed (the request, else ranks > job_cpus),
/// slice_bytes (slot_bytes, at most kCrowdedSliceBytes when oversubscribed)
/// and, unless set explicitly, spin_us and yield_us (no spin when
/// oversubscribed) and threads (min(my_cpus, job_cpus / local ranks)).
void apply_placement(Config& c, int my_cpus, int job_cpus, int job_request = -1);

/// Why this process's job crowds the machine, known before a new
/// communicator's ranks compare their CPUs; empty when nothing says so.
/// Crowding is the job's, not one communicator's: ranks of a 2-rank
/// communicator on 2 CPUs still share them with the job's other busy
/// processes (MPI sub-communicators, torch subgroups, a communicator made
/// beside the first). Two signs: a live communicator of this process is
/// oversubscribed (CrowdedMark), or the launcher counts more ranks on this
/// machine (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, ...) than the
/// CPUs of this process's and its launcher's masks (launcher_cpus). A rank
/// whose own setting is automatic publishes it as a request for 1, so that
/// every rank of the communicator agrees (Segment::oversubscribed_request).
std::string job_crowding_hint();

/// True while any communicator of this process is oversubscribed (holds a
/// CrowdedMark). One relaxed load: communicators made before the crowded
/// one read it on every wait (Communicator::Impl::crowded_by_job).
bool crowded_communicator_alive() noexcept;

/// Held by each communicator of this process that is oversubscribed, for
/// its lifetime: job_crowding_hint() says so while any is held.
class CrowdedMark {
 public:
  CrowdedMark();
  ~CrowdedMark();
  CrowdedMark(const CrowdedMark&) = delete;
  CrowdedMark& operator=(const CrowdedMark&) = delete;
};

/// Stable identity of this host and boot: FNV-1a of hostname and boot id.
std::uint64_t host_hash();

/// "shmring-<uid>-<job id>-<host hash>".
std::string segment_name(const std::string& job_id, std::uint64_t host);

/// Job ids appear in file names: only [A-Za-z0-9._-], 1..64 characters.
bool valid_job_id(const std::string& id);

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 14695981039346656037ull);

}  // namespace shmring::detail
