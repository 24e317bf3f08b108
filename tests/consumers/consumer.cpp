// A program outside the shmring tree, as a user writes it: built against an
// install by CMake (find_package) and by a plain compiler line from
// pkg-config, and by meson with shmring as a subproject (run_consumer.sh).
// Run under shmrun; every rank checks a float64 and an int32 allreduce whose
// inputs differ per (rank, index), and prints one "ok" line.
#include <shmring/shmring.hpp>

#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

int main() {
  try {
    shmring::Communicator comm;  // rank, world size and job id from shmrun
    const int r = comm.rank();
    const int n = comm.size();
    constexpr std::size_t kCount = 4099;  // not a multiple of any small n
    std::vector<double> x(kCount), y(kCount);
    for (std::size_t i = 0; i < kCount; ++i) x[i] = r * 1e6 + static_cast<double>(i);
    comm.allreduce(std::span<const double>(x), std::span<double>(y), shmring::ReduceOp::sum);
    const double rank_sum = 1e6 * n * (n - 1) / 2;
    for (std::size_t i = 0; i < kCount; ++i) {
      const double want = rank_sum + n * static_cast<double>(i);
      if (y[i] != want) {
        std::fprintf(stderr, "consumer: rank %d: y[%zu] = %g, expected %g\n", r, i, y[i], want);
        return 1;
      }
    }
    std::vector<std::int32_t> m(kCount);
    for (std::size_t i = 0; i < kCount; ++i) m[i] = static_cast<std::int32_t>(i) * (r + 1);
    comm.allreduce(std::span<std::int32_t>(m), shmring::ReduceOp::max);
    for (std::size_t i = 0; i < kCount; ++i) {
      if (m[i] != static_cast<std::int32_t>(i) * n) {
        std::fprintf(stderr, "consumer: rank %d: max[%zu] = %d\n", r, i, m[i]);
        return 1;
      }
    }
    std::printf("consumer: rank %d of %d ok (shmring %s)\n", r, n, SHMRING_VERSION_STRING);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
