// Communicators of MPI sub-communicators wait as the whole job's crowding
// requires (docs/guide/tuning.md, "Oversubscription"): 4 ranks on 2 CPUs, each
// splits MPI_COMM_WORLD in two halves by rank parity and makes a
// shmring::mpi::Communicator on the world and on its half. The halves'
// node communicators count 2 ranks on 2 CPUs, yet share those CPUs with
// the other half's 2 busy ranks: they must not spin. Then 300 rounds of an
// allreduce of 7 doubles alternate between the two, checked, and rank 0
// prints the time. Run on one machine (one fake node):
//
//   tools/fake-nodes --nodes 1x4 --cpus shared -- build/tests/mpi/test_mpi_crowded
//
// Each rank first narrows its affinity mask to the first 2 CPUs of it, so
// that the job crowds them on any machine (--no-pin: keep the mask, as a
// plain `mpirun -np 4` on a 2-CPU machine; --rounds N). --half-first makes
// the half's communicator before the world's and hides the launcher's local
// size (OMPI_COMM_WORLD_LOCAL_SIZE, ...) from shmring, as where it does not
// exceed the online CPUs: then only the later world's crowding can stop the
// half's waits spinning. Exits 1 on a failure, 77 (skipped) with fewer than
// 2 CPUs or other than 4 ranks.
//
// The case's measurement, on the 2-CPU VM without fake nodes:
//
//   mpirun --oversubscribe --mca btl self,vader -np 4 build/tests/mpi/test_mpi_crowded --no-pin

#include <fmt/format.h>
#include <sched.h>

#include <cstdlib>
#include <optional>
#include <shmring/mpi.hpp>
#include <string>
#include <vector>

namespace smpi = shmring::mpi;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  bool pin = true, half_first = false;
  int rounds = 300;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-pin")
      pin = false;
    else if (a == "--half-first")
      half_first = true;
    else if (a == "--rounds" && i + 1 < argc)
      rounds = std::atoi(argv[++i]);
  }
  if (half_first)
    for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS",
                          "SHMRING_LOCAL_WORLD_SIZE"})
      unsetenv(v);
  cpu_set_t mask;
  CPU_ZERO(&mask);
  sched_getaffinity(0, sizeof mask, &mask);
  int cpus = CPU_COUNT(&mask);
  int fewest = 0;
  MPI_Allreduce(&cpus, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (size != 4 || fewest < 2) {
    if (rank == 0) fmt::print("skipped: needs 4 ranks with 2 CPUs each\n");
    MPI_Finalize();
    return 77;
  }
  if (pin) {
    cpu_set_t two;
    CPU_ZERO(&two);
    for (int c = 0, n = 0; c < CPU_SETSIZE && n < 2; ++c)
      if (CPU_ISSET(c, &mask)) {
        CPU_SET(c, &two);
        ++n;
      }
    sched_setaffinity(0, sizeof two, &two);
    cpus = 2;
  }
  const char* env = std::getenv("SHMRING_OVERSUBSCRIBED");
  const bool automatic = env == nullptr || *env == '\0' || std::string(env) == "auto";
  int failures = 0;
  {
    MPI_Comm half_mpi = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half_mpi);
    smpi::Options o;
    o.abort_on_error = 0;
    std::optional<smpi::Communicator> early;
    if (half_first) early.emplace(half_mpi, o);
    smpi::Communicator world(MPI_COMM_WORLD, o);
    if (!half_first) early.emplace(half_mpi, o);
    smpi::Communicator& half = *early;
    // 4 ranks on the 2 CPUs: every communicator of the job is crowded. Its
    // waits never spin; the one made last also agreed on it at creation
    // (made first, the half's may have agreed otherwise where the launcher
    // does not tell: then only its waits follow the job).
    if (automatic && (!pin || cpus == 2)) {
      for (auto* c : {&world, &half}) {
        const shmring::Communicator& node = c->node_communicator();
        const shmring::Config& cfg = node.config();
        const bool made_last = half_first ? c == &world : c == &half;
        if (node.waits_may_spin() || (made_last && (!cfg.oversubscribed || cfg.spin_us != 0))) {
          fmt::print(stderr,
                     "rank {}: FAIL the {}'s node communicator ({} ranks, job_cpus={}) has "
                     "oversubscribed={} spin_us={} waits_may_spin={}: 4 ranks share 2 CPUs\n",
                     rank, c == &world ? "world" : "half", c->size(), cfg.job_cpus,
                     cfg.oversubscribed, cfg.spin_us, node.waits_may_spin());
          ++failures;
        }
      }
    }
    std::vector<double> a(7), b(7);
    const double want_world = 1 + 2 + 3 + 4;
    const double want_half = rank % 2 == 0 ? 1 + 3 : 2 + 4;
    world.barrier();
    const double t0 = MPI_Wtime();
    for (int i = 0; i < rounds; ++i) {
      for (auto& v : a) v = rank + 1;
      for (auto& v : b) v = rank + 1;
      world.allreduce(a.data(), a.data(), a.size(), shmring::DataType::float64,
                      shmring::ReduceOp::sum);
      half.allreduce(b.data(), b.data(), b.size(), shmring::DataType::float64,
                     shmring::ReduceOp::sum);
      for (std::size_t k = 0; k < a.size(); ++k)
        if (a[k] != want_world || b[k] != want_half) {
          if (failures < 5)
            fmt::print(stderr,
                       "rank {}: FAIL round {} element {}: world {} (want {}), half {} "
                       "(want {})\n",
                       rank, i, k, a[k], want_world, b[k], want_half);
          ++failures;
        }
    }
    world.barrier();
    const double t = MPI_Wtime() - t0;
    if (rank == 0)
      fmt::print("{} rounds of world + half allreduce of 7 doubles: {:.3f} s\n", rounds, t);
    MPI_Comm_free(&half_mpi);
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
