// Ranks stacked on one CPU get apart (placement.hpp; shared/cases/
// default-speed.md, input 2): after a futex wake-up put both ranks of a job
// on one CPU, they stayed there for 1000 calls, each call 40-100x slower.
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
