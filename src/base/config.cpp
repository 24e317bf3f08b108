#include "base/config.hpp"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/log.hpp"
#include "base/settings.hpp"

namespace shmring::detail {

namespace {

// The launchers' variables, named at run time (kLaunchers): shmrun's are in
// the table (base/settings.hpp), the other launchers' (RANK,
// OMPI_COMM_WORLD_SIZE, ...) are theirs to document. Either way they are
// parsed by the table's parser, with its messages.
const settings::Setting* declared(const char* name) {
  const settings::Setting* s = settings::find(name);
  if (s == nullptr && std::string_view(name).starts_with("SHMRING_"))
    throw std::logic_error(fmt::format("{} is not declared in base/settings.hpp", name));
  return s;
}

std::optional<std::string> env_string(const char* name) {
  (void)declared(name);
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::optional<long long> env_int(const char* name, long long lo, long long hi,
                                 const std::string& why = {}) {
  auto s = env_string(name);
  if (!s) return std::nullopt;
  return settings::parse_integer(name, *s, lo, hi, 0, {}, why);
}

}  // namespace

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h) {
  auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::uint64_t host_hash() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  std::uint64_t h = fnv1a(host, std::char_traits<char>::length(host));
  return fnv1a(boot.data(), boot.size(), h);
}

bool valid_job_id(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string segment_name(const std::string& job_id, std::uint64_t host) {
  return fmt::format("shmring-{}-{}-{:016x}", static_cast<unsigned>(getuid()), job_id, host);
}

namespace {

// A job id derived from another launcher's variables may hold any character:
// keep the safe ones and make it unique with a hash of the original.
std::string derived_job_id(const std::string& raw) {
  std::string s;
  for (char c : raw) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    s += ok ? c : '_';
    if (s.size() >= 40) break;
  }
  return fmt::format("{}.{:08x}", s, static_cast<std::uint32_t>(fnv1a(raw.data(), raw.size())));
}

struct RankEnv {
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
  const char* launcher;
};

// Innermost launcher first. A launcher may run inside another (torchrun or
// shmrun inside an srun or mpirun task, mpirun inside a Slurm allocation):
// its processes inherit the outer launcher's variables, which describe the
// task that started the inner launcher, not them. So the first set present
// wins, and each other set must fit around it (see check_outer).
constexpr RankEnv kLaunchers[] = {
    {"SHMRING_RANK", "SHMRING_WORLD_SIZE", "SHMRING_LOCAL_RANK", "SHMRING_LOCAL_WORLD_SIZE",
     "shmrun"},
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI"},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "MPICH/Hydra"},
    // SLURM_TASKS_PER_NODE reads like "4(x2)": no plain local size from Slurm.
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "Slurm"},
};

struct FoundRanks {
  const RankEnv* env;
  long long rank, size;
  std::string describe() const {
    return fmt::format("{}'s {}={} {}={}", env->launcher, env->rank, rank, env->size, size);
  }
};

// An outer launcher's set fits around the inner one when every outer task
// may have started a launcher of one or more inner processes: then the inner
// world is at least as large, and when both are the same size (one inner
// process per outer task) the ranks agree. Slurm's variables are exempt: a
// whole allocation inherits them, mpirun's processes in a batch script too.
bool fits_around(const FoundRanks& inner, const FoundRanks& outer) {
  if (std::string(outer.env->launcher) == "Slurm") return true;
  if (outer.size > inner.size) return false;
  return outer.size != inner.size || outer.rank == inner.rank;
}

// Start time of process `pid` in clock ticks since boot (/proc/PID/stat
// field 22); 0 if unreadable. With the pid, it names a process for good.
std::string process_start(int pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  std::getline(f, stat);
  auto close = stat.rfind(')');
  if (close == std::string::npos) return "0";
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
  }
  return field;
}

std::optional<std::string> launcher_job_id(const std::string& launcher) {
  if (auto id = settings::text("SHMRING_JOB_ID")) return id;
  if (launcher == "torchrun") {
    if (auto id = env_string("TORCHELASTIC_RUN_ID")) return derived_job_id("torch-" + *id);
    auto addr = env_string("MASTER_ADDR");
    auto port = env_string("MASTER_PORT");
    if (addr && port) return derived_job_id("torch-" + *addr + ":" + *port);
  } else if (launcher == "Open MPI") {
    if (auto id = env_string("OMPI_MCA_orte_ess_jobid")) return derived_job_id("ompi-" + *id);
    if (auto id = env_string("PMIX_NAMESPACE")) return derived_job_id("ompi-" + *id);
  } else if (launcher == "MPICH/Hydra") {
    if (auto id = env_string("PMI_KVSNAME")) return derived_job_id("mpich-" + *id);
    if (auto id = env_string("PMIX_NAMESPACE")) return derived_job_id("mpich-" + *id);
    // Hydra starts a job's ranks of one host from one proxy process: its
    // pid and start time name the job on this host.
    const int proxy = static_cast<int>(getppid());
    return derived_job_id(fmt::format("mpich-{}-{}", proxy, process_start(proxy)));
  } else if (launcher == "Slurm") {
    auto job = env_string("SLURM_JOB_ID");
    auto step = env_string("SLURM_STEP_ID");
    if (job) return derived_job_id("slurm-" + *job + "." + step.value_or("0"));
  }
  return std::nullopt;
}

}  // namespace

// CPUs this process may run on (its affinity mask); the online count when
// the mask cannot be read.
int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, CPU_COUNT(&set));
}

// CPUs the job's processes on this machine can share, as far as this
// process can tell without its peers: its own affinity mask together with
// its launcher's (the parent: Open MPI's daemon, torchrun, shmrun,
// slurmstepd), which the launcher's ranks inherit before a binding narrows
// them. A job under `taskset -c 0,1`, or in a 2-CPU cpuset of a bigger
// machine (whose online count is the host's), counts 2; ranks bound one
// per core count their launcher's whole mask, so a binding alone never
// reads as crowding. The online CPUs where the parent's mask is unreadable.
int launcher_cpus() {
  cpu_set_t launcher, mine;
  CPU_ZERO(&launcher);
  CPU_ZERO(&mine);
  if (sched_getaffinity(getppid(), sizeof launcher, &launcher) != 0) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? static_cast<int>(online) : affinity_cpus();
  }
  if (sched_getaffinity(0, sizeof mine, &mine) == 0) CPU_OR(&launcher, &launcher, &mine);
  return std::max(1, CPU_COUNT(&launcher));
}

namespace {
std::atomic<int> g_crowded_communicators{0};
}  // namespace

CrowdedMark::CrowdedMark() {
  g_crowded_communicators.fetch_add(1, std::memory_order_relaxed);
}
CrowdedMark::~CrowdedMark() {
  g_crowded_communicators.fetch_sub(1, std::memory_order_relaxed);
}

bool crowded_communicator_alive() noexcept {
  return g_crowded_communicators.load(std::memory_order_relaxed) > 0;
}

std::string job_crowding_hint() {
  if (crowded_communicator_alive()) return "another communicator of this process is oversubscribed";
  // The innermost launcher's count of its ranks on this machine (the set
  // resolve_config would use) against the CPUs they can share
  // (launcher_cpus: at most the online ones); a bad value is
  // resolve_config's to report, not ours.
  for (const auto& l : kLaunchers) {
    if (!env_string(l.rank) && !env_string(l.size)) continue;
    if (l.local_size == nullptr) break;
    const auto raw = env_string(l.local_size);
    if (!raw) break;
    char* end = nullptr;
    errno = 0;
    const long long local = std::strtoll(raw->c_str(), &end, 10);
    if (errno != 0 || end == raw->c_str() || *end != '\0') break;
    const int cpus = launcher_cpus();
    if (local > cpus)
      return fmt::format("{}={} ranks on the {} CPUs of this rank's and its launcher's masks",
                         l.local_size, local, cpus);
    break;
  }
  return {};
}

void apply_placement(Config& c, int my_cpus, int job_cpus, int job_request) {
  c.job_cpus = std::max(1, job_cpus);
  // More ranks than the CPUs their affinity masks cover together: a waiter
  // that spins steals the CPU its producer needs. Judged on the union of
  // every rank's mask, so that ranks pinned one per core (shmrun --bind-to
  // core) are not oversubscribed while a whole job under `taskset -c 0,1`
  // is (on the 16-core device, 4 such ranks spinning were 3-6x slower than
  // Open MPI below 4 KiB).
  // A layer above may know of busy processes outside the job (shmring's
  // MPI layer: other fake nodes' ranks on this machine). 2 fake nodes x 2
  // ranks on the 2-CPU VM, hierarchical allreduce, 5 interleaved fresh runs
  // (docs/performance/notes/2026-12-01-intel-hierarchical-p2p.md): 2 MiB 1160-1878 us with the
  // setting against 1254-2177 without, 4 MiB 2255-2722 against 3159-5288.
  c.oversubscribed = job_request >= 0 ? job_request == 1 : c.world_size > c.job_cpus;
  // Ranks that share a CPU hand each other every slice by a context switch.
  // A slice that fits the cache the writer filled is still there when the
  // reader runs; four 256 KiB slices are not. N=2 under `taskset -c 0`, 1 /
  // 4 / 16 MiB, us, 256 KiB slices against 64 KiB (docs/performance/notes,
  // thirteenth session): allreduce 202 / 859 / 3365 against 122 / 608 /
  // 2340, reduce 93 / 443 / 1726 against 66 / 377 / 1482, broadcast
  // 95 / 451 / 1718 against 67 / 355 / 1442; 32 and 128 KiB were slower
  // than 64. Ranks on CPUs of their own keep whole slots (N=2 on 2 CPUs:
  // 64 KiB slices were 4-7% slower). The job's setting and rank 0's
  // slot_bytes are the same on every rank, so the slicing agrees.
  c.slice_bytes = c.oversubscribed ? std::min(c.slot_bytes, kCrowdedSliceBytes) : c.slot_bytes;
  // 5 us of spinning catches a peer running on its own core as well as 50 us
  // did (8 B: 0.18-0.19 vs 0.20-0.29 us), and costs a tenth when the host
  // deschedules the peer (then a wait costs the spin before it yields).
  if (c.spin_us < 0) c.spin_us = c.oversubscribed ? 0.0 : 5.0;
  // 2 ms before a futex sleep, also for ranks on CPUs of their own (where
  // the phase spins: policy_for): a rank that slept costs a wake-up when its
  // peer comes, 30-360 us on the 2-core VM, and that lands on the next
  // collective. The first 8-byte allreduce after the tool's barrier, 10
  // fresh runs each (bench/fresh_runs, ninth session): 3.5-358 us with 200
  // us (3 runs past 270), 3.3-39.7 with 1 ms, 3.3-8.9 with 2 ms; means and
  // the runs under foreign load unchanged. Progress threads keep 200 us.
  if (c.yield_us < 0) c.yield_us = 2000.0;
  // A rank's share of the job's CPUs, and never more than its own mask
  // (oneTBB caps its workers at the mask anyway, and warned "limited to 0
  // workers" on the device when each rank asked for cores / ranks threads
  // while pinned to one core).
  if (c.threads <= 0)
    c.threads = std::max(1, std::min(my_cpus, c.job_cpus / std::max(1, c.local_world_size)));
}

namespace {
void resolve_identity_impl(const Options& o, Config& c, std::string* deferred);
void resolve_settings_impl(const Options& o, Config& c);

// Every message starts with the rank that raises it; before the rank is
// known, with the process id.
template <class F>
void with_rank_prefix(const Config& c, F&& f) {
  try {
    f();
  } catch (const InvalidArgumentError& e) {
    std::string m = e.what();
    if (m.rfind("rank ", 0) == 0) throw;
    throw InvalidArgumentError(c.rank >= 0 ? fmt::format("rank {}: {}", c.rank, m)
                                           : fmt::format("rank unknown (pid {}): {}", getpid(), m));
  }
}
}  // namespace

Config resolve_identity(const Options& o, std::string* deferred) {
  Config c;
  c.rank = -1;
  with_rank_prefix(c, [&] { resolve_identity_impl(o, c, deferred); });
  if (deferred != nullptr && !deferred->empty() && deferred->rfind("rank ", 0) != 0)
    *deferred = fmt::format("rank {}: {}", c.rank, *deferred);
  return c;
}

void resolve_settings(const Options& o, Config& c) {
  with_rank_prefix(c, [&] { resolve_settings_impl(o, c); });
}

Config resolve_config(const Options& o) {
  Config c = resolve_identity(o);
  resolve_settings(o, c);
  return c;
}

namespace {
void resolve_identity_impl(const Options& o, Config& c, std::string* deferred) {
  constexpr long long kMaxRanks = 4096;
  std::string launcher = "options";
  if (o.rank != -1 || o.world_size != -1) {
    // One of the two given: the other is missing, not -1 (its "unset" value).
    // Any other value is checked below (rank=-5 names itself).
    if (o.world_size == -1)
      throw InvalidArgumentError(
          fmt::format("rank={} given but no world_size: pass both, or neither (then the launcher's "
                      "variables or SHMRING_RANK and SHMRING_WORLD_SIZE say)",
                      o.rank));
    if (o.rank == -1)
      throw InvalidArgumentError(
          fmt::format("world_size={} given but no rank: pass both, or neither (then the launcher's "
                      "variables or SHMRING_RANK and SHMRING_WORLD_SIZE say)",
                      o.world_size));
    if (o.world_size < 1 || o.world_size > kMaxRanks)
      throw InvalidArgumentError(
          fmt::format("world_size={}: expected an integer in [1, {}]", o.world_size, kMaxRanks));
    if (o.rank < 0 || o.rank >= o.world_size)
      throw InvalidArgumentError(
          fmt::format("rank={}: expected an integer in [0, {})", o.rank, o.world_size));
    c.rank = o.rank;
    c.world_size = o.world_size;
  } else {
    std::vector<FoundRanks> found;
    for (const auto& l : kLaunchers) {
      if (!env_string(l.rank) && !env_string(l.size)) continue;
      auto size = env_int(l.size, 1, kMaxRanks);
      if (!size)
        throw InvalidArgumentError(
            fmt::format("{} ({}) is set but {} is not", l.rank, l.launcher, l.size));
      auto rank = env_int(l.rank, 0, *size - 1);
      if (!rank)
        throw InvalidArgumentError(
            fmt::format("{} ({}) is set but {} is not", l.size, l.launcher, l.rank));
      found.push_back({&l, *rank, *size});
    }
    if (!found.empty()) {
      const FoundRanks& use = found.front();
      for (std::size_t i = 1; i < found.size(); ++i)
        if (!fits_around(use, found[i]))
          throw InvalidArgumentError(fmt::format(
              "the launchers' variables disagree: {} but {}; they cannot describe one "
              "job (the first set is used, so the other is left over, e.g. exported for a "
              "whole container): unset the variables of the launcher not in use, or set "
              "SHMRING_RANK and SHMRING_WORLD_SIZE",
              use.describe(), found[i].describe()));
      const RankEnv& l = *use.env;
      c.rank = static_cast<int>(use.rank);
      c.world_size = static_cast<int>(use.size);
      launcher = l.launcher;
      // The local size first: it bounds the local rank. Rank and world size
      // are known by now: a bad local value can be deferred, so that the
      // constructor tells the peers (the job id below is still needed).
      try {
        const auto local_size =
            l.local_size ? env_int(l.local_size, 1, use.size,
                                   fmt::format("at most {}={}, the ranks in all", l.size, use.size))
                         : std::nullopt;
        c.local_world_size = static_cast<int>(local_size.value_or(use.size));
        c.local_rank = static_cast<int>(
            env_int(l.local_rank, 0, c.local_world_size - 1,
                    local_size ? fmt::format("below {}={}", l.local_size, *local_size)
                               : fmt::format("below {}={}", l.size, use.size))
                .value_or(use.rank));
      } catch (const InvalidArgumentError& e) {
        if (deferred == nullptr) throw;
        *deferred = e.what();
        c.local_world_size = static_cast<int>(use.size);
        c.local_rank = static_cast<int>(use.rank);
      }
    }
    if (found.empty())
      throw InvalidArgumentError(
          "no rank and world size: run under shmrun (shmrun -n N -- prog), torchrun, mpirun or "
          "srun, or set SHMRING_RANK and SHMRING_WORLD_SIZE (and SHMRING_JOB_ID), or pass them "
          "explicitly (shmring::Options, shmring_comm_init)");
  }
  if (o.rank != -1) {
    // Checked as the launchers' variables are (-1: not given).
    if (o.local_world_size != -1 && (o.local_world_size < 1 || o.local_world_size > c.world_size))
      throw InvalidArgumentError(
          fmt::format("local_world_size={}: expected an integer in [1, {}] (at most world_size), "
                      "or -1 for world_size",
                      o.local_world_size, c.world_size));
    c.local_world_size = o.local_world_size != -1 ? o.local_world_size : c.world_size;
    if (o.local_rank != -1 && (o.local_rank < 0 || o.local_rank >= c.local_world_size))
      throw InvalidArgumentError(
          fmt::format("local_rank={}: expected an integer in [0, {}) (below local_world_size={}), "
                      "or -1 for rank",
                      o.local_rank, c.local_world_size, c.local_world_size));
    if (o.local_rank == -1 && c.rank >= c.local_world_size)
      throw InvalidArgumentError(
          fmt::format("local_world_size={} given but no local_rank, and rank={} is not below it: "
                      "pass local_rank too",
                      c.local_world_size, c.rank));
    c.local_rank = o.local_rank != -1 ? o.local_rank : c.rank;
  }
  if (c.local_world_size < 1) c.local_world_size = c.world_size;

  if (!o.job_id.empty()) {
    c.job_id = o.job_id;
  } else if (auto id = launcher_job_id(launcher)) {
    c.job_id = *id;
  } else {
    throw InvalidArgumentError(fmt::format(
        "rank {}: no job id: set SHMRING_JOB_ID to the same value on every rank (shmrun does "
        "this), or pass job_id to the Communicator",
        c.rank));
  }
  if (!valid_job_id(c.job_id))
    throw InvalidArgumentError(
        fmt::format("job id '{}' ({}): expected 1 to 64 characters from [A-Za-z0-9._-]", c.job_id,
                    !o.job_id.empty() ? "Options::job_id" : "SHMRING_JOB_ID or the launcher's"));
}

void resolve_settings_impl(const Options& o, Config& c) {
  c.slots =
      o.slots
          ? o.slots
          : static_cast<std::size_t>(settings::integer("SHMRING_SLOTS").value_or(kDefaultSlots));
  if (c.slots < 2 || c.slots > kMaxSlots)
    throw InvalidArgumentError(
        fmt::format("Options::slots={}: expected an integer in [2, {}]", c.slots, kMaxSlots));
  // The table checks SHMRING_SLOT_BYTES's range and multiple in one message
  // (a range check of its own said "an integer in [4096, 1073741824]" for
  // 1000, not "a multiple"); Options::slot_bytes is checked here alike.
  c.slot_bytes = o.slot_bytes
                     ? o.slot_bytes
                     : static_cast<std::size_t>(
                           settings::integer("SHMRING_SLOT_BYTES").value_or(kDefaultSlotBytes));
  if (c.slot_bytes < 4096 || c.slot_bytes > (1u << 30) || c.slot_bytes % 4096 != 0)
    throw InvalidArgumentError(fmt::format(
        "Options::slot_bytes={}: expected a multiple of 4096 in [4096, 2^30]", c.slot_bytes));

  c.direct_bytes = static_cast<std::size_t>(
      settings::integer("SHMRING_DIRECT_BYTES").value_or(kDefaultDirectBytes));
  if (auto a = settings::choice("SHMRING_ALGO")) c.algorithm = *a;

  // 0 = automatic: apply_placement() decides once every rank has attached.
  if (o.threads < 0 || o.threads > 1024)
    throw InvalidArgumentError(fmt::format(
        "Options::threads={}: expected an integer in [1, 1024], or 0 for SHMRING_THREADS or "
        "automatic",
        o.threads));
  c.threads = o.threads > 0 ? o.threads
                            : static_cast<int>(settings::integer("SHMRING_THREADS").value_or(0));

  // 0 = unset; anything else must be a usable deadline (a negative or NaN one
  // fell back to the default silently, while SHMRING_TIMEOUT=-1 was refused).
  if (o.timeout_s != 0 && !(o.timeout_s >= 0.001 && o.timeout_s <= 1e9))
    throw InvalidArgumentError(fmt::format(
        "Options::timeout_s={}: expected seconds in [0.001, 1e9], or 0 for SHMRING_TIMEOUT or "
        "the default ({} s)",
        o.timeout_s, kDefaultTimeoutS));
  c.timeout_s = o.timeout_s > 0 ? o.timeout_s
                                : settings::number("SHMRING_TIMEOUT").value_or(kDefaultTimeoutS);

  // Negative = automatic (apply_placement()).
  c.spin_us = settings::number("SHMRING_SPIN_US").value_or(-1);
  c.yield_us = settings::number("SHMRING_YIELD_US").value_or(-1);
  if (auto v = settings::choice("SHMRING_NT_STORES"))
    c.nt_stores = *v == "never"    ? NtStores::never
                  : *v == "always" ? NtStores::always
                                   : NtStores::automatic;
  if (auto m = settings::integer("SHMRING_MIGRATE")) c.migrate = *m != 0;
  c.cma = static_cast<int>(settings::integer("SHMRING_CMA").value_or(1));
  c.cma_large = static_cast<int>(settings::integer("SHMRING_CMA_LARGE").value_or(-1));
  c.cma_min_bytes = static_cast<std::size_t>(
      settings::integer("SHMRING_CMA_MIN_BYTES").value_or(kDefaultCmaMinBytes));
  if (o.oversubscribed < -1 || o.oversubscribed > 1)
    throw InvalidArgumentError(
        fmt::format("Options::oversubscribed={}: expected 1 (waits never spin), 0 (they may) or -1 "
                    "(SHMRING_OVERSUBSCRIBED, else automatic)",
                    o.oversubscribed));
  c.oversubscribed_request = o.oversubscribed;
  if (c.oversubscribed_request < 0) {
    if (auto v = settings::choice("SHMRING_OVERSUBSCRIBED"))
      c.oversubscribed_request = *v == "1" ? 1 : *v == "0" ? 0 : -1;
  }
}
}  // namespace

}  // namespace shmring::detail

namespace shmring {

// The public face of detail::host_hash(), for layers above the core.
std::uint64_t host_identity() {
  return detail::host_hash();
}

}  // namespace shmring
