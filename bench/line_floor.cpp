// line_floor: the hardware floor under the smallest collectives and
// messages: two processes handing each other one cache line, with nothing
// else around (no library, no checks, no descriptors). No N=2 collective
// that needs the peer's data can finish faster than `exchange`, and no
// ping-pong message can arrive faster than `one_way`.
//
//   exchange: both processes store their sequence number into their own
//             line (release), then poll the peer's line until it shows the
//             same number (acquire): one call of an 8-byte allreduce,
//             without the call.
//   one_way:  half the round trip of a ping-pong: A stores, B sees it and
//             answers in its own line, A sees the answer (sendrecv_perf's
//             latency, without the call).
//
// Each side alternates between two lines 128 bytes apart (as the library's
// low-latency lines do), so a store never waits for the peer to have read
// the line's previous value. Prints one line per measurement: the mean over
// all calls and the min / median / max of the rounds' means, in us, so that
// bench/fresh_runs and a reader can set a tool's time against it.
//
// Usage: line_floor [--iters N] [--rounds R] [--bind-to core|none]
// (default: pinned to two CPUs, the best case).
// Errors: exits 1 with a message when fork, mmap or pinning fails.
// Thread safety: a program of its own (two processes, one thread each).

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "process_pair.hpp"

namespace {

using namespace shmring::bench;

struct alignas(128) Line {
  std::atomic<std::uint64_t> seq{0};
};

struct Shared {
  PairStart start;
  Line lines[2][2];          // [process][parity]
  double round_us[2][1000];  // process 0's rounds: [mode][round]
};

using Clock = std::chrono::steady_clock;

void wait_seq(const Line& l, std::uint64_t want) {
  while (l.seq.load(std::memory_order_acquire) < want) {
  }
}

// One process's side of both measurements; process 0 records the rounds.
void run(Shared& s, int me, long iters, int rounds) {
  const int peer = 1 - me;
  std::uint64_t seq = 0;
  // A handshake through the same lines, so both start together.
  auto sync = [&] {
    ++seq;
    s.lines[me][seq % 2].seq.store(seq, std::memory_order_release);
    wait_seq(s.lines[peer][seq % 2], seq);
  };
  for (int r = 0; r < rounds; ++r) {
    sync();
    auto t0 = Clock::now();
    for (long i = 0; i < iters; ++i) sync();
    if (me == 0)
      s.round_us[0][r] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                         static_cast<double>(iters);
  }
  for (int r = 0; r < rounds; ++r) {
    sync();
    auto t0 = Clock::now();
    for (long i = 0; i < iters; ++i) {
      // Process 0 pings, process 1 answers; each message is one sequence
      // number in the sender's line.
      ++seq;
      if (me == 0) {
        s.lines[me][seq % 2].seq.store(seq, std::memory_order_release);
        wait_seq(s.lines[peer][seq % 2], seq);
      } else {
        wait_seq(s.lines[peer][seq % 2], seq);
        s.lines[me][seq % 2].seq.store(seq, std::memory_order_release);
      }
    }
    if (me == 0)
      s.round_us[1][r] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                         static_cast<double>(iters) / 2;
  }
}

void report(const char* name, const double* us, int rounds) {
  std::vector<double> v(us, us + rounds);
  double mean = 0;
  for (double x : v) mean += x;
  mean /= rounds;
  std::sort(v.begin(), v.end());
  fmt::print("{:<9} {:8.3f} {:8.3f} {:8.3f} {:8.3f}\n", name, mean, v.front(),
             v[(v.size() - 1) / 2], v.back());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "line_floor: two processes handing each other one cache line (the floor of "
      "8-byte collectives and ping-pongs)"};
  long iters = 200000;
  int rounds = 5;
  std::string bind = "core";
  app.add_option("-n,--iters", iters, "Calls per round")
      ->check(CLI::Range(1L, 100000000L))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "Timed rounds")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--bind-to", bind,
                 "core: the two processes on the first two CPUs of the mask (the best case, "
                 "as mpirun places them); none: wherever the scheduler puts them, as shmrun's "
                 "default (on a busy machine that can be slower than a library that waits "
                 "better)")
      ->check(CLI::IsMember({"core", "none"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  void* mem = shared_mapping(sizeof(Shared), "line_floor: mmap");
  if (mem == nullptr) return 1;
  auto& s = *new (mem) Shared;
  const PairSide side = start_pair(s.start, bind, "line_floor");
  if (side.me < 0) return 1;
  run(s, side.me, iters, rounds);
  if (!finish_pair(side, 0, "line_floor")) return 1;
  fmt::print("# line_floor: 2 processes, {} calls x {} rounds, bind-to {}; us per call\n", iters,
             rounds, bind);
  fmt::print("{:<9} {:>8} {:>8} {:>8} {:>8}\n", "# mode", "mean", "min", "median", "max");
  report("exchange", s.round_us[0], rounds);
  report("one_way", s.round_us[1], rounds);
  return 0;
}
