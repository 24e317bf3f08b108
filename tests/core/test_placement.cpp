// Ranks stacked on one CPU get apart (base/placement.hpp): after a futex wake-up put both ranks of
// a job on one CPU, they stayed there for 1000 calls, each call 40-100x slower.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sched.h>

#include <vector>

#include "harness.hpp"

using namespace shmring;
using namespace shmring::test;

namespace {

int cpus_in_mask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return CPU_COUNT(&set);
}

// Both ranks pinned to the first CPU of the mask, then given their whole
// mask back: they stay stacked unless something moves one of them.
void stack_on_first_cpu() {
  cpu_set_t all, one;
  CPU_ZERO(&all);
  sched_getaffinity(0, sizeof all, &all);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &one);
      break;
    }
  sched_setaffinity(0, sizeof one, &one);
  sched_setaffinity(0, sizeof all, &all);
}

}  // namespace

TEST_CASE("two ranks stacked on one CPU move apart within their first calls") {
  if (cpus_in_mask() < 2) {
    MESSAGE("skipped: needs 2 CPUs in the affinity mask");
    return;
  }
  constexpr int kCalls = 300;
  auto st = run_ranks(2, [](Communicator& comm) {
    comm.barrier();
    stack_on_first_cpu();
    // Both are on one CPU now; no rank may have moved before this point.
    comm.barrier();
    std::vector<std::int32_t> cpus(2 * kCalls);
    float x = 1;
    for (int i = 0; i < kCalls; ++i) {
      comm.allreduce(&x, &x, 1, DataType::float32, ReduceOp::sum);
      cpus[static_cast<std::size_t>(comm.rank() * kCalls + i)] = sched_getcpu();
      x = 1;
    }
    // Each rank's CPU after each call, side by side.
    comm.allreduce(cpus.data(), cpus.data(), cpus.size(), DataType::int32, ReduceOp::max);
    int apart = 0;
    for (int i = 0; i < kCalls; ++i) apart += cpus[i] != cpus[kCalls + i];
    SHMRING_CHILD_CHECK(apart > 0,
                        "rank %d: the ranks ran on the same CPU after every one of %d calls",
                        comm.rank(), kCalls);
  });
  CHECK(all_zero(st));
}

// More ranks than CPUs: the scheduler left three of four ranks on one of two
// CPUs for whole runs (each of the three got a third of a CPU, the fourth
// waited for them: 64 KiB allreduces 1.5x slower). Waiters spread them two
// and two (base/placement.hpp).
TEST_CASE("four ranks on two CPUs, three of them stacked on one, spread two and two") {
  if (cpus_in_mask() < 2) {
    MESSAGE("skipped: needs 2 CPUs in the affinity mask");
    return;
  }
  constexpr int kRanks = 4, kCalls = 600, kCount = 1024;
  const std::string job = unique_job_id("spread");
  auto st = run_processes(kRanks, [&](int r) {
    // Every rank on the first two CPUs of its mask: 4 ranks on 2 CPUs.
    cpu_set_t home, two, one;
    CPU_ZERO(&home);
    sched_getaffinity(0, sizeof home, &home);
    int first[2] = {-1, -1};
    for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; ++c)
      if (CPU_ISSET(c, &home)) first[k++] = c;
    CPU_ZERO(&two);
    CPU_SET(first[0], &two);
    CPU_SET(first[1], &two);
    sched_setaffinity(0, sizeof two, &two);
    Communicator comm(r, kRanks, job);
    SHMRING_CHILD_CHECK(comm.config().oversubscribed, "rank %d: 4 ranks on 2 CPUs are not crowded",
                        r);
    comm.barrier();
    // Ranks 0-2 on the first CPU, rank 3 on the second, then the two-CPU
    // mask back: they stay 3 and 1 unless something moves them.
    CPU_ZERO(&one);
    CPU_SET(first[r == kRanks - 1 ? 1 : 0], &one);
    sched_setaffinity(0, sizeof one, &one);
    sched_setaffinity(0, sizeof two, &two);
    comm.barrier();
    std::vector<std::int32_t> cpus(static_cast<std::size_t>(kRanks) * kCalls, -1);
    std::vector<float> x(kCount);
    for (int i = 0; i < kCalls; ++i) {
      std::fill(x.begin(), x.end(), 1.0f);
      comm.allreduce(x.data(), x.data(), x.size(), DataType::float32, ReduceOp::sum);
      SHMRING_CHILD_CHECK(x[0] == kRanks && x[kCount - 1] == kRanks, "rank %d: call %d gave %g", r,
                          i, x[0]);
      cpus[static_cast<std::size_t>(r * kCalls + i)] = sched_getcpu();
    }
    comm.allreduce(cpus.data(), cpus.data(), cpus.size(), DataType::int32, ReduceOp::max);
    // Over the second half of the calls: how often a CPU held 3 or 4 ranks.
    int crowded = 0;
    for (int i = kCalls / 2; i < kCalls; ++i) {
      int on_first = 0;
      for (int q = 0; q < kRanks; ++q)
        on_first += cpus[static_cast<std::size_t>(q * kCalls + i)] == first[0];
      crowded += on_first != 2;
    }
    SHMRING_CHILD_CHECK(crowded < kCalls / 4,
                        "rank %d: in %d of the last %d calls the ranks were not two per CPU", r,
                        crowded, kCalls / 2);
  });
  CHECK(all_zero(st));
}

TEST_CASE("SHMRING_MIGRATE is validated") {
  auto st = run_processes(1, [](int) {
    setenv("SHMRING_MIGRATE", "yes", 1);
    try {
      Communicator comm(0, 1, unique_job_id("migrate"));
    } catch (const InvalidArgumentError& e) {
      SHMRING_CHILD_CHECK(std::string(e.what()).find("SHMRING_MIGRATE") != std::string::npos,
                          "message: %s", e.what());
      return;
    }
    SHMRING_CHILD_CHECK(false, "SHMRING_MIGRATE=yes was accepted");
  });
  CHECK(all_zero(st));
}

namespace {

// Pins this process to the first CPU of `home`, or gives it `home` back.
void pin_first(const cpu_set_t& home, bool pin) {
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &home)) {
      CPU_SET(c, &one);
      break;
    }
  sched_setaffinity(0, sizeof(cpu_set_t), pin ? &one : &home);
}

// No launcher variables: the tests below decide what the launcher says.
void clear_launcher_env() {
  for (const char* v :
       {"SHMRING_RANK", "SHMRING_WORLD_SIZE", "SHMRING_LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE",
        "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "SLURM_PROCID",
        "SLURM_NTASKS", "SHMRING_OVERSUBSCRIBED"})
    unsetenv(v);
}

}  // namespace

// Crowding is the job's (README, SHMRING_OVERSUBSCRIBED): a communicator
// whose own ranks have a CPU each still shares the CPUs with the job's
// other busy processes. Here the first communicator's ranks share one CPU;
// the second's, made by the same processes on their whole masks, would
// count 2 ranks on 2+ CPUs and spin.
TEST_CASE("a communicator made beside an oversubscribed one waits as oversubscribed") {
  if (cpus_in_mask() < 2) {
    MESSAGE("skipped: needs 2 CPUs in the affinity mask");
    return;
  }
  const std::string first = unique_job_id("crowd-a"), second = unique_job_id("crowd-b"),
                    third = unique_job_id("crowd-c");
  auto st = run_processes(2, [&](int r) {
    clear_launcher_env();
    cpu_set_t home;
    CPU_ZERO(&home);
    sched_getaffinity(0, sizeof home, &home);
    {
      pin_first(home, true);
      Communicator crowded(r, 2, first);
      pin_first(home, false);
      SHMRING_CHILD_CHECK(crowded.config().oversubscribed,
                          "rank %d: 2 ranks on one CPU are not oversubscribed", r);
      Communicator beside(r, 2, second);
      SHMRING_CHILD_CHECK(beside.config().oversubscribed && beside.config().spin_us == 0,
                          "rank %d: a communicator beside an oversubscribed one of this job "
                          "spins (oversubscribed=%d spin_us=%g)",
                          r, beside.config().oversubscribed, beside.config().spin_us);
      // Explicitly not: the caller's word stands.
      Options o;
      o.rank = r;
      o.world_size = 2;
      o.job_id = second + "x";
      o.oversubscribed = 0;
      Communicator told(o);
      SHMRING_CHILD_CHECK(!told.config().oversubscribed,
                          "rank %d: Options::oversubscribed=0 was overridden", r);
      float x = 1;
      beside.allreduce(&x, &x, 1, DataType::float32, ReduceOp::sum);
      SHMRING_CHILD_CHECK(x == 2, "rank %d: allreduce gave %g", r, x);
    }
    // Once those are gone, nothing crowds the CPUs any more.
    Communicator alone(r, 2, third);
    SHMRING_CHILD_CHECK(!alone.config().oversubscribed,
                        "rank %d: still oversubscribed after the crowded communicator ended", r);
  });
  CHECK(all_zero(st));
}

// The other order: a communicator made first, on ranks with a CPU each,
// agreed to spin; once its process also holds an oversubscribed one, the
// job crowds the machine and its waits stop spinning (per rank, per wait:
// Communicator::waits_may_spin), and start again when that one ends. Its
// agreed config (slicing, algorithms) stays as made.
TEST_CASE("a communicator made before an oversubscribed one stops spinning while that one lives") {
  if (cpus_in_mask() < 2) {
    MESSAGE("skipped: needs 2 CPUs in the affinity mask");
    return;
  }
  const std::string early_id = unique_job_id("crowd-early"), told_id = unique_job_id("crowd-told"),
                    crowded_id = unique_job_id("crowd-late");
  auto st = run_processes(2, [&](int r) {
    clear_launcher_env();
    cpu_set_t home;
    CPU_ZERO(&home);
    sched_getaffinity(0, sizeof home, &home);
    Communicator early(r, 2, early_id);
    Options o;
    o.rank = r;
    o.world_size = 2;
    o.job_id = told_id;
    o.oversubscribed = 0;
    Communicator told(o);
    SHMRING_CHILD_CHECK(!early.config().oversubscribed && early.waits_may_spin(),
                        "rank %d: 2 ranks on their whole masks (%d CPUs) do not spin "
                        "(oversubscribed=%d)",
                        r, cpus_in_mask(), early.config().oversubscribed);
    {
      pin_first(home, true);
      Communicator crowded(r, 2, crowded_id);
      pin_first(home, false);
      SHMRING_CHILD_CHECK(crowded.config().oversubscribed && !crowded.waits_may_spin(),
                          "rank %d: 2 ranks on one CPU spin", r);
      SHMRING_CHILD_CHECK(!early.waits_may_spin(),
                          "rank %d: the earlier communicator still spins while this process "
                          "holds an oversubscribed one",
                          r);
      SHMRING_CHILD_CHECK(!early.config().oversubscribed,
                          "rank %d: the earlier communicator's agreed config changed", r);
      SHMRING_CHILD_CHECK(told.waits_may_spin(),
                          "rank %d: Options::oversubscribed=0 was overridden afterwards", r);
      // Its waits now yield and sleep; the results stay right.
      for (int i = 0; i < 50; ++i) {
        float x = static_cast<float>(r + 1);
        early.allreduce(&x, &x, 1, DataType::float32, ReduceOp::sum);
        SHMRING_CHILD_CHECK(x == 3, "rank %d: allreduce %d gave %g", r, i, x);
        x = static_cast<float>(r + 1);
        crowded.allreduce(&x, &x, 1, DataType::float32, ReduceOp::sum);
        SHMRING_CHILD_CHECK(x == 3, "rank %d: crowded allreduce %d gave %g", r, i, x);
      }
      early.barrier();
    }
    SHMRING_CHILD_CHECK(early.waits_may_spin(),
                        "rank %d: still not spinning after the crowded communicator ended", r);
  });
  CHECK(all_zero(st));
}

// The launcher's count of ranks on this machine above its online CPUs (so
// above any mask):
// a communicator of fewer ranks (torch subgroups, MPI sub-communicators)
// knows the job crowds the machine even where it is the process's first.
TEST_CASE("a launcher's local world size above the online CPUs makes every communicator crowded") {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const std::string job = unique_job_id("crowd-env"), job2 = unique_job_id("crowd-env2");
  auto st = run_processes(2, [&](int r) {
    clear_launcher_env();
    {
      Communicator plain(r, 2, job2);
      SHMRING_CHILD_CHECK(!plain.config().oversubscribed || online < 2,
                          "rank %d: 2 ranks on %ld CPUs oversubscribed without a launcher", r,
                          online);
    }
    setenv("RANK", std::to_string(r).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(online + 1).c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", std::to_string(online + 1).c_str(), 1);
    Communicator sub(r, 2, job);
    SHMRING_CHILD_CHECK(sub.config().oversubscribed && !sub.waits_may_spin(),
                        "rank %d: LOCAL_WORLD_SIZE=%ld on %ld CPUs, yet oversubscribed=%d "
                        "waits_may_spin=%d",
                        r, online + 1, online, sub.config().oversubscribed, sub.waits_may_spin());
  });
  CHECK(all_zero(st));
}

// The launcher's local size against the CPUs its ranks can share: its own
// mask (which they inherit), not the machine's. A launcher confined to one
// CPU (taskset, a cpuset smaller than the host) whose 2 local ranks start
// here: even a 1-rank communicator of this process knows the job crowds that
// CPU, though 2 ranks do not outnumber the CPUs online. A rank the launcher
// bound to one CPU of its wider mask is not crowded by the binding alone.
TEST_CASE("the launcher's local size counts against the launcher's mask, not the online CPUs") {
  if (cpus_in_mask() < 2) {
    MESSAGE("skipped: needs 2 CPUs in the affinity mask");
    return;
  }
  const std::string job = unique_job_id("crowd-launcher"), bound_job = unique_job_id("crowd-bound");
  // Runs `rank` as the only child of a launcher process, with the
  // launcher's variables for 2 local ranks.
  auto launch = [](bool pin_launcher, bool pin_rank, const std::function<void()>& rank) {
    return run_processes(1, [&](int) {
      clear_launcher_env();
      cpu_set_t home;
      CPU_ZERO(&home);
      sched_getaffinity(0, sizeof home, &home);
      if (pin_launcher) pin_first(home, true);
      auto st = run_processes(1, [&](int) {
        if (pin_rank) pin_first(home, true);
        setenv("RANK", "0", 1);
        setenv("WORLD_SIZE", "2", 1);
        setenv("LOCAL_WORLD_SIZE", "2", 1);
        rank();
      });
      SHMRING_CHILD_CHECK(all_zero(st), "the launched rank failed (status %d)", st[0]);
    });
  };
  auto confined = launch(true, false, [&] {
    Communicator one(0, 1, job);
    SHMRING_CHILD_CHECK(one.config().oversubscribed && !one.waits_may_spin(),
                        "LOCAL_WORLD_SIZE=2 under a launcher confined to 1 CPU: "
                        "oversubscribed=%d waits_may_spin=%d",
                        one.config().oversubscribed, one.waits_may_spin());
  });
  CHECK(all_zero(confined));
  auto bound = launch(false, true, [&] {
    Communicator one(0, 1, bound_job);
    SHMRING_CHILD_CHECK(!one.config().oversubscribed && one.waits_may_spin(),
                        "LOCAL_WORLD_SIZE=2, bound to 1 CPU of the launcher's mask: "
                        "oversubscribed=%d waits_may_spin=%d",
                        one.config().oversubscribed, one.waits_may_spin());
  });
  CHECK(all_zero(bound));
}
