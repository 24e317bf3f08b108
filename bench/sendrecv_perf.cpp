// sendrecv_perf / mpi_sendrecv_perf: a ping-pong between rank pairs (0,1),
// (2,3), ... in the nccl-tests table form, for shmring's send/recv and, built
// with -DSHMRING_SENDRECV_MPI, for MPI_Send/MPI_Recv (Open MPI) beside it.
//
//   build/tools/shmrun -n 2 -- build/bench/sendrecv_perf -b 8 -e 64M -f 2
//   mpirun -np 2 build/bench/mpi_sendrecv_perf -b 8 -e 64M -f 2
//
// One iteration: the even rank sends `size` bytes and receives them back; the
// odd rank receives and sends back. time = round trip / 2 (one-way latency),
// algbw = size / time, busbw = algbw (factor 1, as nccl-tests' sendrecv).
// Every pair runs at once; a row shows the slowest rank. #wrong counts
// elements that differ from the sender's pattern in one checked exchange
// after the timed ones (values distinct per sender, size and index).

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef SHMRING_SENDRECV_MPI
#include <mpi.h>
#else
#include <shmring/shmring.hpp>
#endif

namespace {

#ifdef SHMRING_SENDRECV_MPI
class Backend {
 public:
  Backend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const char* name() const { return "mpi"; }
  void send(const float* buf, std::size_t count, int peer) {
    check(MPI_Send(buf, as_int(count), MPI_FLOAT, peer, 0, MPI_COMM_WORLD), "MPI_Send");
  }
  void recv(float* buf, std::size_t count, int peer) {
    check(MPI_Recv(buf, as_int(count), MPI_FLOAT, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
          "MPI_Recv");
  }
  void barrier() { MPI_Barrier(MPI_COMM_WORLD); }
  double max_over_ranks(double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
  }

 private:
  static int as_int(std::size_t count) {
    if (count > static_cast<std::size_t>(INT32_MAX))
      throw std::runtime_error(fmt::format("count {} exceeds MPI's int", count));
    return static_cast<int>(count);
  }
  static void check(int rc, const char* what) {
    if (rc != MPI_SUCCESS) throw std::runtime_error(fmt::format("{} returned {}", what, rc));
  }
  int rank_ = 0, size_ = 1;
};
#else
class Backend {
 public:
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  const char* name() const { return "shmring"; }
  void send(const float* buf, std::size_t count, int peer) {
    comm_.send(buf, count, shmring::DataType::float32, peer, 0);
  }
  void recv(float* buf, std::size_t count, int peer) {
    comm_.recv(buf, count, shmring::DataType::float32, peer, 0);
  }
  void barrier() { comm_.barrier(); }
  double max_over_ranks(double v) {
    comm_.allreduce(&v, &v, 1, shmring::DataType::float64, shmring::ReduceOp::max);
    return v;
  }

 private:
  shmring::Communicator comm_;
};
#endif

std::size_t parse_size(const std::string& s) {
  std::size_t pos = 0;
  const unsigned long long v = std::stoull(s, &pos);
  std::size_t mult = 1;
  if (pos < s.size()) {
    switch (s[pos]) {
      case 'K':
      case 'k':
        mult = 1ull << 10;
        break;
      case 'M':
      case 'm':
        mult = 1ull << 20;
        break;
      case 'G':
      case 'g':
        mult = 1ull << 30;
        break;
      default:
        throw std::invalid_argument(fmt::format("size '{}': expected a number with K, M or G", s));
    }
  }
  return static_cast<std::size_t>(v) * mult;
}

float pattern(int rank, std::size_t size, std::size_t i) {
  return static_cast<float>((rank * 131 + size % 1009 + i * 7) % 65521);
}

int run(Backend& b, std::size_t min_bytes, std::size_t max_bytes, double factor, int iters,
        int warmup) {
  const int rank = b.rank(), n = b.size();
  const int peer = (rank % 2 == 0) ? rank + 1 : rank - 1;
  const bool active = peer < n;  // an odd world size leaves the last rank idle
  const bool first = rank % 2 == 0;
  std::vector<float> out(std::max<std::size_t>(max_bytes / 4, 1)), in(out.size());
  if (rank == 0) {
    fmt::print("# {} sendrecv_perf: ping-pong between rank pairs, {} ranks ({} pairs)\n", b.name(),
               n, n / 2);
    fmt::print("# time = round trip / 2; algbw = busbw = size / time\n#\n");
    fmt::print("# {:>10} {:>12} {:>6} {:>10} {:>8} {:>8} {:>7}\n", "size", "count", "type",
               "time(us)", "algbw", "busbw", "#wrong");
    fmt::print("# {:>10} {:>12} {:>6} {:>10} {:>8} {:>8} {:>7}\n", "(B)", "(elements)", "", "",
               "(GB/s)", "(GB/s)", "");
  }
  int wrong_total = 0;
  for (std::size_t bytes = min_bytes; bytes <= max_bytes;
       bytes = std::max(bytes + 1, static_cast<std::size_t>(static_cast<double>(bytes) * factor))) {
    const std::size_t count = std::max<std::size_t>(bytes / 4, 1);
    const int n_iters = iters > 0              ? iters
                        : bytes <= (64u << 10) ? 2000
                        : bytes <= (4u << 20)  ? 200
                                               : 20;
    auto exchange = [&] {
      if (!active) return;
      if (first) {
        b.send(out.data(), count, peer);
        b.recv(in.data(), count, peer);
      } else {
        b.recv(in.data(), count, peer);
        b.send(out.data(), count, peer);
      }
    };
    for (std::size_t i = 0; i < count; ++i) out[i] = pattern(rank, bytes, i);
    b.barrier();
    for (int i = 0; i < warmup; ++i) exchange();
    b.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n_iters; ++i) exchange();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Checked exchange: the receiver compares what arrived with the pattern.
    std::fill(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(count), -1.0f);
    exchange();
    int wrong = 0;
    if (active)
      for (std::size_t i = 0; i < count; ++i) wrong += in[i] != pattern(peer, bytes, i);
    const double us = b.max_over_ranks(active ? s / n_iters / 2 * 1e6 : 0.0);
    const double all_wrong = b.max_over_ranks(static_cast<double>(wrong));
    wrong_total += static_cast<int>(all_wrong);
    const double gbs = static_cast<double>(count * 4) / (us * 1e-6) / 1e9;
    if (rank == 0)
      fmt::print("  {:>10} {:>12} {:>6} {:>10.2f} {:>8.2f} {:>8.2f} {:>7}\n", count * 4, count,
                 "float", us, gbs, gbs, static_cast<int>(all_wrong));
    if (bytes == max_bytes) break;
  }
  if (rank == 0) fmt::print("# wrong elements: {}\n", wrong_total);
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef SHMRING_SENDRECV_MPI
  MPI_Init(&argc, &argv);
#endif
  CLI::App app{"sendrecv_perf: point-to-point ping-pong latency and bandwidth"};
  std::string b_str = "8", e_str = "64M";
  double factor = 2;
  int iters = 0, warmup = 5;
  app.add_option("-b,--minbytes", b_str, "Smallest size (bytes; K, M, G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", e_str, "Largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", factor, "Multiply the size by this each step")
      ->capture_default_str();
  app.add_option("-n,--iters", iters, "Timed round trips per size (0: 2000 to 20 by size)")
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", warmup, "Untimed round trips first")->capture_default_str();
  int rc = 0;
  try {
    app.parse(argc, argv);
    const std::size_t lo = parse_size(b_str), hi = parse_size(e_str);
    if (lo == 0 || hi < lo || factor <= 1)
      throw std::invalid_argument(
          fmt::format("sizes {}..{} step x{}: expected 0 < minbytes <= maxbytes and a factor > 1",
                      lo, hi, factor));
    Backend b;
    rc = run(b, lo, hi, factor, iters, warmup);
  } catch (const CLI::Error& e) {
    rc = app.exit(e);
  } catch (const std::exception& e) {
    fmt::print(stderr, "sendrecv_perf: {}\n", e.what());
#ifdef SHMRING_SENDRECV_MPI
    MPI_Abort(MPI_COMM_WORLD, 1);
#endif
    rc = 1;
  }
#ifdef SHMRING_SENDRECV_MPI
  MPI_Finalize();
#endif
  return rc;
}
