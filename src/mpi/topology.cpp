// Setup, run once per communicator: who shares a node, the shmring
// communicator of each node and the MPI communicators between nodes.
//
// Node groups come from shmring's own host identity (hostname + boot id, the
// hash in every segment name), gathered with one MPI_Allgather: two ranks
// belong to one node exactly when they would open the same segment. The
// launcher's idea of locality (OMPI_COMM_WORLD_LOCAL_*, MPI_COMM_TYPE_SHARED)
// is not consulted: in containers, and in tools/fake-nodes, it disagrees
// with which processes share /dev/shm.

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <string_view>
#include <unordered_map>

#include "impl.hpp"
#include "shmring/settings.hpp"

namespace shmring::mpi {

namespace {

Algorithm parse_algorithm(const std::string& raw, const char* where) {
  std::string s = raw;
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s.empty() || s == "auto") return Algorithm::automatic;
  if (s == "leaders") return Algorithm::leaders;
  if (s == "shards") return Algorithm::shards;
  if (s == "flat") return Algorithm::flat;
  throw InvalidArgumentError(
      fmt::format("{}='{}': expected auto, leaders, shards or flat", where, raw));
}

// A fresh 64-bit value per communicator: the job id of every node comm.
// random_device alone would do; the clock and pid guard against a weak one.
std::uint64_t fresh_nonce() {
  std::random_device rd;
  std::uint64_t v = (std::uint64_t{rd()} << 32) ^ rd();
  v ^= static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  v ^= static_cast<std::uint64_t>(getpid()) << 40;
  return v;
}

// Which kernel this rank runs on: ranks with one boot id share CPUs even
// when their host identities differ (containers, tools/fake-nodes' UTS
// namespaces). Unreadable: the host identity, as if the node were a machine.
std::uint64_t machine_identity() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (f && std::getline(f, id) && !id.empty()) return std::hash<std::string>{}(id);
  return shmring::host_identity();
}

using CpuInfo = Communicator::Impl::CpuInfo;
static_assert(sizeof(CpuInfo) == 17 * sizeof(std::uint64_t), "gathered as 17 MPI_UINT64_T");

// This rank's machine and the CPUs it may run on (cpu_set_t's first 1024).
CpuInfo my_cpu_info() {
  CpuInfo info;
  info.machine = machine_identity();
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE && cpu < 1024; ++cpu)
      if (CPU_ISSET(cpu, &set)) info.mask[cpu / 64] |= std::uint64_t{1} << (cpu % 64);
  } else {
    info.mask[0] = 1;  // unknown: one CPU, so no pipelining is assumed to pay
  }
  return info;
}

}  // namespace

bool Communicator::Impl::spare_cpus_everywhere() const {
  // Per machine: the union of its ranks' affinity masks against two threads
  // per rank (the caller driving MPI, the node communicator's progress
  // thread running the pieces' reduce-scatters and allgathers).
  std::map<std::uint64_t, std::pair<std::array<std::uint64_t, 16>, int>> machines;  // mask, ranks
  for (const auto& info : cpu_info) {
    auto& [mask, ranks] = machines[info.machine];
    for (std::size_t w = 0; w < mask.size(); ++w) mask[w] |= info.mask[w];
    ++ranks;
  }
  for (const auto& [machine, m] : machines) {
    int cpus = 0;
    for (std::uint64_t w : m.first) cpus += std::popcount(w);
    if (cpus < 2 * m.second) return false;
  }
  return true;
}

bool Communicator::Impl::machine_oversubscribed(std::uint64_t machine) const {
  // The machine's ranks, of every node, against the union of their
  // affinity masks.
  std::array<std::uint64_t, 16> mask{};
  int ranks = 0;
  for (const auto& info : cpu_info) {
    if (info.machine != machine) continue;
    for (std::size_t w = 0; w < mask.size(); ++w) mask[w] |= info.mask[w];
    ++ranks;
  }
  int cpus = 0;
  for (std::uint64_t w : mask) cpus += std::popcount(w);
  return ranks > cpus;
}

bool Communicator::Impl::machine_oversubscribed() const {
  return machine_oversubscribed(cpu_info[static_cast<std::size_t>(rank)].machine);
}

bool Communicator::Impl::any_machine_oversubscribed() const {
  return std::any_of(cpu_info.begin(), cpu_info.end(),
                     [&](const CpuInfo& info) { return machine_oversubscribed(info.machine); });
}

void Communicator::Impl::setup(MPI_Comm comm, const Options& options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    throw InvalidArgumentError(
        "shmring::mpi::Communicator: MPI is not initialised: call MPI_Init first");
  if (comm == MPI_COMM_NULL)
    throw InvalidArgumentError("shmring::mpi::Communicator: comm is MPI_COMM_NULL");

  // Settings first. The environment may differ between ranks, so a bad
  // value on one rank is agreed on after MPI_Comm_dup: every rank then
  // throws the lowest refusing rank's message, rather than that rank alone
  // while the others wait in MPI, which has no timeout.
  std::string refused;
  bool shards_auto = false;        // decided below once the ranks' CPUs are known
  bool pipeline_auto = false;      // likewise
  std::string oversubscribed_env;  // SHMRING_OVERSUBSCRIBED, for the node communicator
  try {
    oversubscribed_env = settings::choice("SHMRING_OVERSUBSCRIBED").value_or("auto");
    // The environment's values through the library's one table and parser
    // (shmring/settings.hpp), Options' through this layer's own checks.
    algorithm = !options.algorithm.empty()
                    ? parse_algorithm(options.algorithm, "Options::algorithm")
                    : parse_algorithm(settings::choice("SHMRING_MPI_ALGO").value_or("auto"),
                                      "SHMRING_MPI_ALGO");
    // The shards crossover: explicit (options, then the environment), or
    // decided below once the ranks' CPUs are known (shards_auto).
    shards_bytes = options.shards_bytes;
    if (shards_bytes == 0) {
      const auto env = settings::bytes("SHMRING_MPI_SHARDS_BYTES");  // "auto": unset
      shards_bytes = env ? static_cast<std::size_t>(*env) : kDefaultShardsBytes;
      shards_auto = !env;
    }
    // Pieces: explicit (options, then the environment), or decided below once
    // the ranks' CPUs are known (pipeline_auto).
    piece_bytes = options.piece_bytes;
    if (piece_bytes == 0) {
      const auto env = settings::bytes("SHMRING_MPI_PIECE_BYTES");  // "auto": unset
      if (env)
        piece_bytes = static_cast<std::size_t>(*env);
      else
        pipeline_auto = true;
    } else if (piece_bytes == SIZE_MAX) {
      piece_bytes = 0;  // not pipelined
    }
    // MPI call size: explicit (options, then the environment) or the default.
    // Below a page a large stage would take a call per few elements.
    call_bytes = options.call_bytes;
    if (call_bytes == SIZE_MAX) {
      call_bytes = 0;  // one call
    } else if (call_bytes != 0) {
      if (call_bytes < kMinCallBytes)
        throw InvalidArgumentError(fmt::format(
            "Options::call_bytes={}: expected 0 (the default), SIZE_MAX (one call) or >= {}",
            call_bytes, kMinCallBytes));
    } else {
      // The table declares the same minimum (kMinCallBytes) and refuses less.
      const auto env = settings::bytes("SHMRING_MPI_CALL_BYTES");
      call_bytes = env ? static_cast<std::size_t>(*env) : kDefaultCallBytes;
    }
    if (options.abort_on_error >= 0) {
      abort_on_error = options.abort_on_error != 0;
    } else {
      abort_on_error = settings::choice("SHMRING_MPI_ON_ERROR").value_or("abort") == "abort";
    }
  } catch (const InvalidArgumentError& e) {
    refused = e.what();
  }

  check_mpi(MPI_Comm_dup(comm, &world), "setup: MPI_Comm_dup");
  // Errors come back as codes, so that they get our message and policy.
  MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  {
    const int mine = refused.empty() ? size : rank;
    int first = size;
    check_mpi(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, world),
              "setup: MPI_Allreduce of the settings checks");
    if (first < size) {
      std::array<char, 1024> text{};
      if (first == rank) {
        const std::string m = fmt::format("rank {}: {}", rank, refused);
        std::copy_n(m.begin(), std::min(m.size(), text.size() - 1), text.begin());
      }
      check_mpi(MPI_Bcast(text.data(), static_cast<int>(text.size()), MPI_CHAR, first, world),
                "setup: MPI_Bcast of a refused setting");
      MPI_Comm_free(&world);
      throw InvalidArgumentError(text.data());
    }
  }

  // Node groups: one MPI_Allgather of every rank's host identity. Nodes are
  // numbered in the order of their lowest rank, local ranks by MPI rank, so
  // every rank computes the same topology from the same array.
  const std::uint64_t mine = shmring::host_identity();
  std::vector<std::uint64_t> ids(static_cast<std::size_t>(size));
  check_mpi(MPI_Allgather(&mine, 1, MPI_UINT64_T, ids.data(), 1, MPI_UINT64_T, world),
            "setup: MPI_Allgather of host identities");
  std::unordered_map<std::uint64_t, int> node_index;
  node_of.assign(ids.size(), 0);
  local_of.assign(ids.size(), 0);
  node_ranks.clear();
  for (int r = 0; r < size; ++r) {
    auto [it, fresh] = node_index.try_emplace(ids[r], static_cast<int>(node_ranks.size()));
    if (fresh) node_ranks.emplace_back();
    node_of[r] = it->second;
    local_of[r] = static_cast<int>(node_ranks[it->second].size());
    node_ranks[it->second].push_back(r);
  }
  num_nodes = static_cast<int>(node_ranks.size());

  // The pipeline overlaps a piece's MPI stage (this thread) with the next
  // piece's shmring stages (the node communicator's progress thread): it
  // gains only where each rank has a CPU for each. Where ranks outnumber
  // half the CPUs of their machine, the threads take turns on the CPUs and
  // the pieces' extra synchronisations are pure cost: on 2 fake nodes x 2
  // ranks sharing 2 CPUs, one piece took 556-689 us at 1 MiB against
  // 942-987 pipelined, 14.6 ms against 16.5 at 16 MiB (docs/performance/notes).
  cpu_info.resize(static_cast<std::size_t>(size));
  const CpuInfo my_info = my_cpu_info();
  check_mpi(MPI_Allgather(&my_info, 17, MPI_UINT64_T, cpu_info.data(), 17, MPI_UINT64_T, world),
            "setup: MPI_Allgather of CPU masks");
  if (pipeline_auto) piece_bytes = spare_cpus_everywhere() ? kDefaultPieceBytes : 0;
  // Where a machine runs more ranks than it has CPUs, the leaders' path
  // (two busy ranks per node pair instead of all of them) stays faster up
  // to larger messages (kCrowdedShardsBytes). The same on every rank: every
  // rank has every rank's CPUs.
  if (shards_auto && any_machine_oversubscribed()) shards_bytes = kCrowdedShardsBytes;
  node = node_of[rank];
  local_rank = local_of[rank];
  local_size = static_cast<int>(node_ranks[node].size());
  balanced = std::all_of(node_ranks.begin(), node_ranks.end(),
                         [&](const auto& n) { return n.size() == node_ranks[0].size(); });

  // One nonce per communicator, from rank 0: two jobs, or two communicators
  // of one job, never open each other's segments.
  std::uint64_t nonce = rank == 0 ? fresh_nonce() : 0;
  check_mpi(MPI_Bcast(&nonce, 1, MPI_UINT64_T, 0, world), "setup: MPI_Bcast of the nonce");
  job_id = fmt::format("mpi-{:016x}", nonce);

  // Between nodes: built once here, collective over `world` on every rank
  // (the conditions below are the same on every rank).
  if (num_nodes > 1) {
    if (balanced) {
      check_mpi(MPI_Comm_split(world, local_rank, node, &cross), "setup: MPI_Comm_split (cross)");
      MPI_Comm_set_errhandler(cross, MPI_ERRORS_RETURN);
    }
    check_mpi(MPI_Comm_split(world, local_rank == 0 ? 0 : MPI_UNDEFINED, node, &leaders),
              "setup: MPI_Comm_split (leaders)");
    if (leaders != MPI_COMM_NULL) MPI_Comm_set_errhandler(leaders, MPI_ERRORS_RETURN);
  }
  create_ops();

  // Inside the node: a shmring communicator of the local ranks. The last
  // step, so that a segment exists only once every MPI step has worked.
  shmring::Options o = options.node;
  o.rank = local_rank;
  o.world_size = local_size;
  o.local_rank = local_rank;
  o.local_world_size = local_size;
  o.job_id = job_id;
  // The node communicator sees only its own ranks' CPUs. Where this
  // machine runs more ranks (other nodes' too: containers, fake nodes) than
  // it has CPUs, its waits must yield to them rather than spin (2 fake nodes
  // x 2 ranks on 2 CPUs: docs/performance/notes/2026-12-01-intel-hierarchical-p2p.md). The caller's
  // Options::node or SHMRING_OVERSUBSCRIBED, when 0 or 1, decides instead.
  const bool env_auto = oversubscribed_env == "auto";  // checked with the settings above
  if (o.oversubscribed < 0 && env_auto && machine_oversubscribed()) o.oversubscribed = 1;
  // A bad setting throws alike on every rank before any segment exists: it
  // goes back to the caller. Anything later (a rank that never arrives, a
  // full /dev/shm) follows the error policy.
  try {
    node_comm.emplace(o);
  } catch (const InvalidArgumentError&) {
    throw;
  } catch (const Error& e) {
    fail("setup: the node's shmring communicator", e.code(), e.what());
  }
}

void Communicator::Impl::teardown() noexcept {
  node_comm.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // too late to free anything; MPI has released it all
  free_ops();
  for (MPI_Comm* c : {&cross, &leaders, &world})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

}  // namespace shmring::mpi
