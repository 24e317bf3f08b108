// 100,000 back-to-back allreduces at N=4 (oversubscribed on 2 cores), with
// sizes drawn from a seed every rank shares and one rank now and then
// sleeping a few microseconds: no barrier between collectives, all exact.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <random>

#include "harness.hpp"

using namespace shmring;

TEST_CASE("100000 back-to-back allreduces of mixed sizes stay exact") {
  constexpr int kRanks = 4;
  constexpr int kIters = 100000;
  auto status = test::run_ranks(
      kRanks,
      [&](Communicator& comm) {
        std::mt19937_64 sizes(12345);             // same on every rank
        std::mt19937_64 jitter(comm.rank() + 1);  // differs per rank
        std::vector<std::int32_t> buf(1 << 20);
        for (int it = 0; it < kIters; ++it) {
          std::size_t count;
          std::uint64_t pick = sizes() % 1000;
          if (pick == 0)
            count = 1 << 18;  // 1 MiB of int32, rarely
          else if (pick < 50)
            count = 4097;
          else if (pick < 500)
            count = 1 + sizes() % 7;
          else
            count = 1 + sizes() % 64;
          for (std::size_t i = 0; i < count; ++i)
            buf[i] = static_cast<std::int32_t>(comm.rank() * 1000 + i + it);
          if (jitter() % 1000 == 0)
            std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 50));
          comm.allreduce(std::span<std::int32_t>(buf.data(), count), ReduceOp::sum);
          for (std::size_t i = 0; i < count; ++i) {
            const std::int32_t want =
                1000 * (kRanks * (kRanks - 1) / 2) + kRanks * static_cast<std::int32_t>(i + it);
            SHMRING_CHILD_CHECK(buf[i] == want, "iteration %d count %zu: buf[%zu]=%d want %d", it,
                                count, i, buf[i], want);
          }
        }
        SHMRING_CHILD_CHECK(comm.collective_count() == kIters, "count %llu",
                            static_cast<unsigned long long>(comm.collective_count()));
      },
      600);
  for (int r = 0; r < kRanks; ++r) CHECK_MESSAGE(status[r] == 0, "rank ", r, " status ", status[r]);
}
