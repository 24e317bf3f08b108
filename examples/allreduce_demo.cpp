// allreduce_demo: every rank contributes rank * 1e6 + i at index i; the sum
// is known in closed form, so each rank verifies its result and prints it.
//
//   build/tools/shmrun -n 4 -- build/examples/allreduce_demo [count]

#include <charconv>
#include <cstdio>
#include <cstring>
#include <shmring/shmring.hpp>
#include <vector>

namespace {

// The whole of `text` as a non-negative integer, or false.
bool parse_count(const char* text, std::size_t& out) {
  const char* end = text + std::strlen(text);
  auto [ptr, ec] = std::from_chars(text, end, out);
  return ec == std::errc{} && ptr == end && ptr != text;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t count = 1'000'003;
  if (argc > 2 || (argc == 2 && !parse_count(argv[1], count))) {
    std::fprintf(stderr,
                 "usage: allreduce_demo [count]  (count: elements, a non-negative integer; "
                 "default 1000003)\n       run it under shmrun: shmrun -n 4 -- allreduce_demo\n");
    return 2;
  }
  try {
    shmring::Communicator comm;  // rank, size and job id from shmrun
    const int n = comm.size();
    std::vector<double> buf(count);
    for (std::size_t i = 0; i < count; ++i) buf[i] = comm.rank() * 1e6 + static_cast<double>(i);
    comm.allreduce(std::span<double>(buf), shmring::ReduceOp::sum);
    std::size_t wrong = 0;
    const double ranks_sum = 1e6 * n * (n - 1) / 2.0;
    for (std::size_t i = 0; i < count; ++i)
      if (buf[i] != ranks_sum + static_cast<double>(n) * static_cast<double>(i)) ++wrong;
    std::printf("rank %d/%d: allreduce(sum) of %zu float64: %s (%zu wrong), x[last]=%.1f\n",
                comm.rank(), n, count, wrong == 0 ? "verified" : "WRONG", wrong,
                count ? buf[count - 1] : 0.0);
    return wrong == 0 ? 0 : 1;
  } catch (const shmring::Error& e) {
    std::fprintf(stderr, "allreduce_demo: %s\n", e.what());
    return 1;
  }
}
