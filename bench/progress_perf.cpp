// progress_perf: does a non-blocking allreduce progress while its caller does
// something else? Each round starts an allreduce of --bytes float32 values,
// sleeps --sleep-ms without calling the library (compute, standing in for
// backward), then times wait(). A library whose own thread moves the data
// returns from wait() at once; one that progresses only inside its calls
// (Open MPI's MPI_Iallreduce over shared memory) does the whole collective
// inside wait(). Prints, per rank, min / median / max of the wait() time over
// --rounds rounds, next to the time of the same allreduce, blocking; then
// the time per call of --latency-iters 8-byte allreduces, blocking and
// started + waited (what the hop to the progress thread costs).
//
//   build/tools/shmrun -n 2 -- build/bench/progress_perf --bytes 64M --sleep-ms 500 --rounds 5
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/mpi_progress_perf --bytes 64M
//
// (mpi_progress_perf is this file built with SHMRING_PROGRESS_MPI, when MPI
// is found.) The result of every round is checked.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#ifdef SHMRING_PROGRESS_MPI
#include <mpi.h>
#else
#include "shmring/shmring.hpp"
#endif

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::size_t parse_bytes(const std::string& s) {
  std::size_t pos = 0;
  double v = std::stod(s, &pos);
  std::string unit = s.substr(pos);
  double mult = unit.empty() || unit == "B"    ? 1
                : unit == "K" || unit == "KiB" ? 1024.0
                : unit == "M" || unit == "MiB" ? 1024.0 * 1024
                : unit == "G" || unit == "GiB" ? 1024.0 * 1024 * 1024
                                               : -1;
  if (mult < 0 || v < 0) throw CLI::ValidationError("--bytes", "expected e.g. 4096, 64K, 64M");
  return static_cast<std::size_t>(v * mult);
}

#ifdef SHMRING_PROGRESS_MPI
struct Backend {
  Backend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  const char* name = "mpi (MPI_Iallreduce)";
  int rank = 0, size = 1;
  MPI_Request req = MPI_REQUEST_NULL;
  void start(float* buf, std::size_t count) {
    MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                   &req);
  }
  void wait() { MPI_Wait(&req, MPI_STATUS_IGNORE); }
  void blocking(float* buf, std::size_t count) {
    MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  void barrier() { MPI_Barrier(MPI_COMM_WORLD); }
  std::vector<double> gather(const std::vector<double>& mine) {
    std::vector<double> all(mine.size() * static_cast<std::size_t>(size));
    MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                  static_cast<int>(mine.size()), MPI_DOUBLE, MPI_COMM_WORLD);
    return all;
  }
};
#else
struct Backend {
  shmring::Communicator comm;
  const char* name = "shmring (iallreduce)";
  int rank = comm.rank(), size = comm.size();
  shmring::Request req;
  void start(float* buf, std::size_t count) {
    req = comm.iallreduce(buf, buf, count, shmring::DataType::float32, shmring::ReduceOp::sum);
  }
  void wait() { req.wait(); }
  void blocking(float* buf, std::size_t count) {
    comm.allreduce(buf, buf, count, shmring::DataType::float32, shmring::ReduceOp::sum);
  }
  void barrier() { comm.barrier(); }
  std::vector<double> gather(const std::vector<double>& mine) {
    std::vector<double> all(mine.size() * static_cast<std::size_t>(size));
    comm.allgather(mine.data(), all.data(), mine.size(), shmring::DataType::float64);
    return all;
  }
};
#endif

struct Stats {
  double min, median, max;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2], v.back()};
}

int run(int argc, char** argv, Backend& b) {
  CLI::App app{"Time of wait() after a non-blocking allreduce and a sleep without library calls"};
  std::string bytes_s = "64M";
  int sleep_ms = 500, rounds = 5, latency_iters = 2000;
  app.add_option("--bytes", bytes_s, "Message size (float32 elements x 4), e.g. 64M")
      ->capture_default_str();
  app.add_option("--sleep-ms", sleep_ms, "Sleep between start and wait, ms")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--latency-iters", latency_iters,
                 "Also time 8-byte calls, blocking vs start+wait (the thread hop), this many "
                 "(0: skip)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rounds", rounds, "Rounds (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return b.rank == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  const std::size_t count = parse_bytes(bytes_s) / sizeof(float);
  std::vector<float> buf(count);
  auto fill = [&] {
    for (std::size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(b.rank + 1 + i % 7);
  };
  auto verify = [&](const char* what) {
    const float n = static_cast<float>(b.size);
    for (std::size_t i = 0; i < count; i += 997) {
      float want = n * (n + 1) / 2 + n * static_cast<float>(i % 7);
      if (buf[i] != want) {
        std::fprintf(stderr, "rank %d: %s: [%zu] = %g, expected %g\n", b.rank, what, i, buf[i],
                     want);
        return false;
      }
    }
    return true;
  };

  // The blocking allreduce, for scale (warm-up included).
  std::vector<double> blocking_ms, wait_ms;
  for (int r = 0; r <= rounds; ++r) {
    fill();
    b.barrier();
    auto t0 = Clock::now();
    b.blocking(buf.data(), count);
    if (r > 0) blocking_ms.push_back(ms_since(t0));
    if (!verify("blocking")) return 1;
  }
  for (int r = 0; r <= rounds; ++r) {
    fill();
    b.barrier();
    b.start(buf.data(), count);
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    auto t0 = Clock::now();
    b.wait();
    if (r > 0) wait_ms.push_back(ms_since(t0));
    if (!verify("non-blocking")) return 1;
  }
  // Small messages: what the progress thread's hop costs per call.
  double lat_blocking_us = 0, lat_nonblocking_us = 0;
  if (latency_iters > 0) {
    float small[2];
    auto time_calls = [&](bool nonblocking) {
      std::vector<double> per_round;
      for (int round = 0; round < 5; ++round) {
        b.barrier();
        auto t0 = Clock::now();
        for (int i = 0; i < latency_iters; ++i) {
          if (nonblocking) {
            b.start(small, 2);
            b.wait();
          } else {
            b.blocking(small, 2);
          }
        }
        per_round.push_back(ms_since(t0) * 1000 / latency_iters);
      }
      return stats(per_round).median;
    };
    small[0] = small[1] = 0;
    lat_blocking_us = time_calls(false);
    lat_nonblocking_us = time_calls(true);
  }
  Stats w = stats(wait_ms), k = stats(blocking_ms);
  auto all = b.gather({w.min, w.median, w.max, k.median, lat_blocking_us, lat_nonblocking_us});
  if (b.rank == 0) {
    std::printf("# %s: %zu bytes, N=%d, sleep %d ms, %d rounds\n", b.name, count * sizeof(float),
                b.size, sleep_ms, rounds);
    std::printf("# %4s %14s %14s %14s %18s %16s %16s\n", "rank", "wait_min_ms", "wait_med_ms",
                "wait_max_ms", "blocking_med_ms", "8B_blocking_us", "8B_start_wait_us");
    for (int q = 0; q < b.size; ++q) {
      const double* v = &all[6 * static_cast<std::size_t>(q)];
      std::printf("  %4d %14.3f %14.3f %14.3f %18.3f %16.3f %16.3f\n", q, v[0], v[1], v[2], v[3],
                  v[4], v[5]);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef SHMRING_PROGRESS_MPI
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    Backend b;
    rc = run(argc, argv, b);
  }
  MPI_Finalize();
  return rc;
#else
  try {
    Backend b;
    return run(argc, argv, b);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "progress_perf: %s\n", e.what());
    return 1;
  }
#endif
}
