// reduce_scatter, allgather, broadcast, reduce and barrier against serial
// references: values distinct per (rank, index), N in {1, 2, 3, 5, 8},
// uneven and zero counts, every root, both algorithms (direct for small
// messages, ring/chain for large, and each forced with SHMRING_ALGO), and
// streaming stores forced on.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/mman.h>

#include <cstdlib>

#include "harness.hpp"

using namespace shmring;

namespace {

std::int64_t value(int rank, std::size_t i) {
  return static_cast<std::int64_t>(rank) * 1000003 + static_cast<std::int64_t>(i) * 7 - 500;
}

// Small counts take the direct path, the large one the ring (its buffer is
// bigger than the 64 KiB direct buffers). 6007 int64 (47 KiB) fill most of
// a direct buffer, past the 16 KiB from which its writes may stream.
std::vector<std::size_t> counts(int n) {
  auto N = static_cast<std::size_t>(n);
  return {0, 1, N - 1 + (n == 1), N + 1, 1009, 6007, 70001};
}

void check_all_collectives(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  for (std::size_t count : counts(n)) {
    // reduce_scatter (sum and max), out of place and in place.
    {
      std::vector<std::int64_t> send(n * count), recv(count, -1);
      for (std::size_t i = 0; i < send.size(); ++i) send[i] = value(r, i);
      comm.reduce_scatter(send.data(), recv.data(), count, DataType::int64, ReduceOp::sum);
      for (std::size_t i = 0; i < count; ++i) {
        std::int64_t want = 0;
        for (int q = 0; q < n; ++q) want += value(q, r * count + i);
        SHMRING_CHILD_CHECK(recv[i] == want, "reduce_scatter count %zu: [%zu]=%lld want %lld",
                            count, i, (long long)recv[i], (long long)want);
      }
      comm.reduce_scatter(send.data(), send.data() + r * count, count, DataType::int64,
                          ReduceOp::max);
      for (std::size_t i = 0; i < count; ++i)
        SHMRING_CHILD_CHECK(send[r * count + i] == value(n - 1, r * count + i),
                            "in-place reduce_scatter max count %zu [%zu]", count, i);
    }
    // allgather, out of place and in place.
    {
      std::vector<float> send(count), recv(n * count, -1.0f);
      for (std::size_t i = 0; i < count; ++i) send[i] = static_cast<float>(r * 100000 + i % 99991);
      comm.allgather(send.data(), recv.data(), count, DataType::float32);
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i)
          SHMRING_CHILD_CHECK(recv[q * count + i] == static_cast<float>(q * 100000 + i % 99991),
                              "allgather count %zu: chunk %d [%zu]", count, q, i);
      std::vector<float> inplace(n * count, -2.0f);
      std::copy(send.begin(), send.end(), inplace.begin() + r * count);
      comm.allgather(inplace.data() + r * count, inplace.data(), count, DataType::float32);
      SHMRING_CHILD_CHECK(inplace == recv, "in-place allgather count %zu differs", count);
    }
    // broadcast and reduce from every root.
    for (int root = 0; root < n; ++root) {
      std::vector<std::int32_t> buf(count);
      for (std::size_t i = 0; i < count; ++i)
        buf[i] = r == root ? static_cast<std::int32_t>(value(root, i)) : -7;
      comm.broadcast(buf.data(), count, DataType::int32, root);
      for (std::size_t i = 0; i < count; ++i)
        SHMRING_CHILD_CHECK(buf[i] == static_cast<std::int32_t>(value(root, i)),
                            "broadcast root %d count %zu [%zu]=%d", root, count, i, buf[i]);

      std::vector<double> send(count), recv(r == root ? count : 0, -1.0);
      for (std::size_t i = 0; i < count; ++i) send[i] = static_cast<double>(value(r, i));
      comm.reduce(send.data(), r == root ? recv.data() : nullptr, count, DataType::float64,
                  ReduceOp::sum, root);
      if (r == root)
        for (std::size_t i = 0; i < count; ++i) {
          double want = 0;
          for (int q = 0; q < n; ++q) want += static_cast<double>(value(q, i));
          SHMRING_CHILD_CHECK(recv[i] == want, "reduce root %d count %zu [%zu]", root, count, i);
        }
    }
    comm.barrier();
  }
}

// oversubscribed: the job says so (Options::oversubscribed = 1), so the
// ring and chain steps move 64 KiB slices, not whole 256 KiB slots.
// streaming: SHMRING_NT_STORES=1, every copy into a slot or a direct buffer
// that may stream does.
void run(int n, const char* algo, bool oversubscribed = false, bool streaming = false) {
  auto status = test::run_processes(
      n,
      [&, job = test::unique_job_id("coll")](int r) {
        if (algo) setenv("SHMRING_ALGO", algo, 1);
        if (streaming) setenv("SHMRING_NT_STORES", "1", 1);
        Options o;
        o.rank = r;
        o.world_size = n;
        o.job_id = job;
        if (oversubscribed) o.oversubscribed = 1;
        Communicator comm(o);
        if (oversubscribed)
          SHMRING_CHILD_CHECK(comm.config().slice_bytes == 64 * 1024, "rank %d: slice_bytes %zu", r,
                              comm.config().slice_bytes);
        if (streaming)
          SHMRING_CHILD_CHECK(comm.config().nt_stores == NtStores::always,
                              "rank %d: nt_stores not forced", r);
        check_all_collectives(comm);
      },
      300);
  for (int r = 0; r < n; ++r) CHECK_MESSAGE(status[r] == 0, "rank ", r, " status ", status[r]);
}

}  // namespace

TEST_CASE("every collective matches the serial reference, N=1") {
  run(1, nullptr);
}
TEST_CASE("every collective matches the serial reference, N=2") {
  run(2, nullptr);
}
TEST_CASE("every collective matches the serial reference, N=3") {
  run(3, nullptr);
}
TEST_CASE("every collective matches the serial reference, N=5") {
  run(5, nullptr);
}
TEST_CASE("every collective matches the serial reference, N=8") {
  run(8, nullptr);
}
TEST_CASE("every collective matches the serial reference on the ring path, N=3 and N=5") {
  run(3, "ring");
  run(5, "ring");
}
TEST_CASE("every collective matches the serial reference in 64 KiB slices (oversubscribed)") {
  // The 70001-element buffers cross several slices (int64: 8 of 64 KiB).
  run(2, nullptr, true);
  run(3, "ring", true);
}
TEST_CASE("every collective matches the serial reference with streaming stores, N=2 and N=3") {
  // Streaming stores into the slots and the direct buffers that may stream
  // (a broadcast root's, staged blocks), also where the ranks share CPUs
  // (N=3 on the 2-CPU machine), with the store fence before every publish
  // as the only ordering.
  run(2, nullptr, false, true);
  run(3, nullptr, false, true);
}

namespace {
// A sequence that every rank derives from the same seed mixes one-line,
// direct and ring allreduces, chain broadcasts from every root and barriers;
// every result is checked.
void mixed_sequence(Communicator& c, int iterations) {
  const int r = c.rank(), n = c.size();
  std::uint64_t seed = 12345;
  for (int it = 0; it < iterations; ++it) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const unsigned pick = static_cast<unsigned>(seed >> 60);         // 0..15
    const std::size_t count = pick < 10   ? 1 + (seed >> 40) % 26    // one line
                              : pick < 13 ? 27 + (seed >> 40) % 500  // direct
                                          : 40000;                   // ring, or a chain broadcast
    if (pick == 15) {
      c.barrier();
      continue;
    }
    if (pick == 14) {
      // A chain broadcast lets a rank finish before a far peer has
      // even read the previous collective's lines.
      const int root = it % n;
      std::vector<std::int32_t> b(count, r == root ? it : -1);
      c.broadcast(std::span<std::int32_t>(b), root);
      SHMRING_CHILD_CHECK(b.front() == it && b.back() == it, "broadcast %d", it);
      continue;
    }
    std::vector<std::int32_t> x(count);
    for (std::size_t i = 0; i < count; ++i)
      x[i] = static_cast<std::int32_t>(value(r, i + static_cast<std::size_t>(it)));
    c.allreduce(std::span<std::int32_t>(x), ReduceOp::sum);
    for (std::size_t i = 0; i < count; ++i) {
      std::int64_t want = 0;
      for (int q = 0; q < n; ++q)
        want += static_cast<std::int32_t>(value(q, i + static_cast<std::size_t>(it)));
      SHMRING_CHILD_CHECK(x[i] == static_cast<std::int32_t>(want),
                          "rank %d iteration %d count %zu [%zu]: %d, want %lld", r, it, count, i,
                          x[i], static_cast<long long>(want));
    }
  }
}
}  // namespace

TEST_CASE("low-latency allreduces interleaved with the other paths keep every result") {
  // Back-to-back one-line allreduces skip the done counters (the previous
  // lines prove every peer finished the collective before); after a
  // collective on another path they wait for them. N = 2, 3, 5
  // (oversubscribed: ranks get descheduled mid-call).
  for (int n : {2, 3, 5}) {
    auto status = test::run_ranks(
        n, [](Communicator& c) { mixed_sequence(c, 3000); }, 120);
    CHECK(test::all_zero(status));
  }
}

TEST_CASE("ranks that sleep at once are always woken") {
  // No spin, no yield: every wait that is not satisfied at once sleeps on
  // the futex, so every publish must wake its sleepers (wait.hpp's
  // lost-wakeup argument). A lost wake-up costs a 10 ms sleep slice: with
  // every wake-up lost (planted), 3000 collectives took 17-27 s; kept, this
  // test and the one above took 0.4 s together (2-core VM).
  // Both forms of wait.hpp's fence: the writers' light publish with the
  // sleepers' membarrier, and seq_cst publishes (SHMRING_MEMBARRIER=0).
  setenv("SHMRING_SPIN_US", "0", 1);
  setenv("SHMRING_YIELD_US", "0", 1);
  for (const char* membarrier : {"1", "0"})
    for (int n : {2, 3}) {
      setenv("SHMRING_MEMBARRIER", membarrier, 1);
      INFO("N=", n, " SHMRING_MEMBARRIER=", membarrier);
      auto status = test::run_ranks(
          n,
          [](Communicator& c) {
            const auto start = std::chrono::steady_clock::now();
            mixed_sequence(c, 3000);
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            SHMRING_CHILD_CHECK(s < 12.0, "3000 sleeping collectives took %.1f s: lost wake-ups?",
                                s);
          },
          120);
      CHECK(test::all_zero(status));
    }
  unsetenv("SHMRING_MEMBARRIER");
  unsetenv("SHMRING_SPIN_US");
  unsetenv("SHMRING_YIELD_US");
}

TEST_CASE("barrier: nobody leaves before the last rank arrives") {
  // A counter in memory shared by the forked ranks (mapped before the fork):
  // each rank counts its arrival, and after the barrier every arrival of
  // this round must be visible. One rank per round arrives late.
  auto* arrived =
      static_cast<std::atomic<int>*>(mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE,
                                          MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(arrived != MAP_FAILED);
  new (arrived) std::atomic<int>(0);
  constexpr int kRanks = 4, kRounds = 50;
  auto status = test::run_ranks(kRanks, [&](Communicator& comm) {
    for (int round = 0; round < kRounds; ++round) {
      if (comm.rank() == round % kRanks) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      arrived->fetch_add(1);
      comm.barrier();
      int seen = arrived->load();
      SHMRING_CHILD_CHECK(seen >= (round + 1) * kRanks,
                          "round %d: rank %d left the barrier with %d arrivals", round, comm.rank(),
                          seen);
    }
  });
  CHECK(test::all_zero(status));
  CHECK(arrived->load() == kRanks * kRounds);
  munmap(arrived, sizeof(std::atomic<int>));
}

TEST_CASE("split: a color refused on one rank fails every rank, naming split") {
  // The peers wait in split's allgather of (color, key); their error used to
  // name only that allgather, a call they never made.
  auto status = test::run_ranks(3, [](Communicator& world) {
    const int color = world.rank() == 1 ? -5 : 0;
    try {
      world.split(color, 0);
      SHMRING_CHILD_CHECK(false, "rank %d: split with a color of -5 on rank 1 returned",
                          world.rank());
    } catch (const Error& e) {
      const std::string what = e.what();
      if (world.rank() == 1)
        SHMRING_CHILD_CHECK(e.code() == ErrorCode::invalid_argument &&
                                what.find("color -5 must be >= 0") != std::string::npos,
                            "rank 1: %s", e.what());
      else
        SHMRING_CHILD_CHECK(e.code() == ErrorCode::mismatch &&
                                what.find("rank 1 made an invalid call") != std::string::npos &&
                                what.find("[in split()") != std::string::npos,
                            "rank %d: %s", world.rank(), e.what());
    }
  });
  CHECK(test::all_zero(status));
}

TEST_CASE("internal collectives are named by what the peer called: split, finalize") {
  // Rank 0 calls split (whose first step is an allgather of (color, key)),
  // then ifinalize (a barrier); rank 1 calls allreduce each time. Rank 1's
  // error names split and finalize, calls its peer made, never the
  // allgather or barrier inside them.
  for (bool leave : {false, true}) {
    CAPTURE(leave);
    auto status = test::run_ranks(2, [leave](Communicator& c) {
      std::vector<float> x(4, 1.0f);
      std::string what;
      try {
        if (c.rank() == 1)
          c.allreduce(std::span<float>(x), ReduceOp::sum);
        else if (leave)
          c.ifinalize().wait();
        else
          c.split(0, 7);
        SHMRING_CHILD_CHECK(false, "rank %d: no error", c.rank());
      } catch (const MismatchError& e) {
        what = e.what();
      }
      if (c.rank() == 1) {
        if (leave)
          SHMRING_CHILD_CHECK(what.find("finalize() [the rank is leaving") != std::string::npos &&
                                  what.find("barrier()") == std::string::npos,
                              "rank 1: %s", what.c_str());
        else
          SHMRING_CHILD_CHECK(what.find("[in split()") != std::string::npos, "rank 1: %s",
                              what.c_str());
      } else if (!leave) {
        SHMRING_CHILD_CHECK(what.find("[in split()") != std::string::npos, "rank 0: %s",
                            what.c_str());
      }
    });
    CHECK(test::all_zero(status));
  }
}

TEST_CASE("a call's purpose is part of it: barrier against finalize, allgather against split") {
  // Rank 0 finalizes (a barrier) or splits (an allgather of two int64),
  // rank 1 makes the very collective inside: both fail at once, instead of
  // the barrier returning (and rank 1's next call failing on a departed
  // rank) or the allgather returning rank 0's (color, key).
  for (bool leave : {false, true}) {
    CAPTURE(leave);
    auto status = test::run_ranks(
        2,
        [leave](Communicator& c) {
          std::vector<std::int64_t> mine = {0, 7}, all(4, -1);
          std::string what;
          try {
            if (c.rank() == 1 && leave)
              c.barrier();
            else if (c.rank() == 1)
              c.allgather(mine.data(), all.data(), 2, DataType::int64);
            else if (leave)
              c.finalize();
            else
              c.split(0, 7);
            SHMRING_CHILD_CHECK(false, "rank %d: no error", c.rank());
          } catch (const MismatchError& e) {
            what = e.what();
          }
          const char* needle =
              c.rank() == 0 ? (leave ? "rank 1 called collective #0 barrier()"
                                     : "rank 1 called collective #0 allgather(count=2, int64)")
                            : (leave ? "finalize() [the rank is leaving" : "[in split()");
          SHMRING_CHILD_CHECK(what.find(needle) != std::string::npos, "rank %d: '%s' lacks '%s'",
                              c.rank(), what.c_str(), needle);
          SHMRING_CHILD_CHECK(all[0] == -1 && all[2] == -1, "rank %d: allgather wrote", c.rank());
        },
        60);
    CHECK(test::all_zero(status));
  }
}

TEST_CASE("ifinalize: completes after the pending calls on every rank") {
  auto status = test::run_ranks(3, [](Communicator& c) {
    std::vector<float> x(1000, static_cast<float>(c.rank()));
    Request r = c.iallreduce(x.data(), x.data(), x.size(), DataType::float32, ReduceOp::sum);
    Request f = c.ifinalize();
    f.wait();
    SHMRING_CHILD_CHECK(r.test(), "rank %d: the allreduce before ifinalize is not complete",
                        c.rank());
    SHMRING_CHILD_CHECK(x[999] == 3.0f, "rank %d: x = %g", c.rank(), x[999]);
  });
  CHECK(test::all_zero(status));
}

TEST_CASE("split: two groups of a 5-rank world reduce concurrently, each its own sum") {
  auto status = test::run_ranks(5, [](Communicator& world) {
    const int color = world.rank() % 2;                      // {0, 2, 4} and {1, 3}
    Communicator group = world.split(color, -world.rank());  // key reverses the order
    const int want_size = color == 0 ? 3 : 2;
    SHMRING_CHILD_CHECK(group.size() == want_size, "group size %d", group.size());
    // Ranked by key = -world rank: the highest world rank is group rank 0.
    const int members[2][3] = {{4, 2, 0}, {3, 1, -1}};
    SHMRING_CHILD_CHECK(members[color][group.rank()] == world.rank(),
                        "world rank %d got group rank %d", world.rank(), group.rank());
    for (int it = 0; it < 50; ++it) {
      std::vector<std::int64_t> x(10000 + it * 1000, world.rank() + it);
      group.allreduce(std::span<std::int64_t>(x), ReduceOp::sum);
      const std::int64_t want = color == 0 ? (0 + 2 + 4) + 3 * it : (1 + 3) + 2 * it;
      SHMRING_CHILD_CHECK(x.front() == want && x.back() == want, "it %d: %lld want %lld", it,
                          (long long)x.front(), (long long)want);
    }
    // The parent still works after the split.
    std::int64_t one = 1;
    world.allreduce(std::span<std::int64_t>(&one, 1), ReduceOp::sum);
    SHMRING_CHILD_CHECK(one == 5, "world sum %lld", (long long)one);
  });
  CHECK(test::all_zero(status));
}
