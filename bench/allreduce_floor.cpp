// allreduce_floor: the best an N=2 in-place float32 sum allreduce can do on
// this machine, measured: two processes whose buffers already live in one
// shared mapping (no copy in or out, no library, no checks, no slots), each
// reading the other's buffer directly. Printed beside every rank copying its
// buffer once with memcpy at the same time (the `floor` column of the
// *_perf tools), so that a tool's time can be set against both in one run.
//
//   two_phase: each process sums its half of the peer's buffer into its own
//              (reads S/2 of its own, S/2 of the peer's, writes S/2), a
//              handshake, then copies the peer's summed half into its own
//              buffer (reads S/2, writes S/2), a handshake: the data
//              movement of a ring or two-shot allreduce at N=2 (Patarasuk and
//              Yuan, "Bandwidth optimal all-reduce algorithms", 2009), with
//              zero copies.
//   one_shot:  each process sums the peer's whole buffer into a scratch
//              result and copies it back (reads 2S, writes 2S), one
//              handshake: the direct (one-shot) allreduce.
//   memcpy:    each process copies S bytes between two private buffers.
//
// Each size runs warm-up calls, then `--rounds` timed rounds lasting at
// least `--min-time` seconds together; the table gives the median round's
// mean time per call in us and min/max over the rounds, one row per size.
//
// Usage: allreduce_floor [-b 64K] [-e 64M] [-f 2] [--min-time 0.1]
//                        [--rounds 5] [--bind-to core|none]
// Errors: exits 1 with a message when mmap, fork or pinning fails.
// Thread safety: a program of its own (two processes, one thread each).

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "process_pair.hpp"
#include "sizes.hpp"

namespace {

using namespace shmring::bench;

using Clock = std::chrono::steady_clock;
constexpr int kModes = 3;  // two_phase, one_shot, memcpy
constexpr int kMaxRounds = 100;

struct alignas(128) Line {
  std::atomic<std::uint64_t> seq{0};
};

struct Control {
  PairStart start;
  Line line[2];
  std::atomic<int> failed{0};  // a scheme computed a wrong result
  // Process 0's choices, read by process 1: the warm-up batch (0: the
  // warm-up is over) and the timed rounds' calls. Two words, because process
  // 0 may store the second before process 1 has read the first.
  alignas(128) std::atomic<long> batch{0};
  std::atomic<long> round_calls{0};
  double round_us[kModes][kMaxRounds];  // process 0's rounds
};

class Pair {
 public:
  Pair(Control& ctl, int me) : ctl_(ctl), me_(me) {}
  // Both processes past this point.
  void sync() {
    ++seq_;
    ctl_.line[me_].seq.store(seq_, std::memory_order_release);
    while (ctl_.line[1 - me_].seq.load(std::memory_order_acquire) < seq_) {
    }
  }
  int me() const { return me_; }
  Control& control() { return ctl_; }

 private:
  Control& ctl_;
  int me_;
  std::uint64_t seq_ = 0;
};

// The buffers of one size: both processes' data in one shared mapping, and
// this process's private scratch and memcpy pair.
struct Buffers {
  float* shared[2];
  std::vector<float> scratch, from, to;
};

void two_phase(Pair& p, Buffers& b, std::size_t n) {
  const int me = p.me();
  float* mine = b.shared[me];
  const float* peer = b.shared[1 - me];
  const std::size_t half = n / 2;
  const std::size_t lo = me == 0 ? 0 : half, hi = me == 0 ? half : n;
  for (std::size_t i = lo; i < hi; ++i) mine[i] += peer[i];
  p.sync();
  const std::size_t plo = me == 0 ? half : 0, phi = me == 0 ? n : half;
  std::memcpy(mine + plo, peer + plo, (phi - plo) * sizeof(float));
  p.sync();
}

void one_shot(Pair& p, Buffers& b, std::size_t n) {
  const int me = p.me();
  float* mine = b.shared[me];
  const float* peer = b.shared[1 - me];
  float* out = b.scratch.data();
  // Rank order, so that both results are bitwise the same.
  const float* first = me == 0 ? mine : peer;
  const float* second = me == 0 ? peer : mine;
  for (std::size_t i = 0; i < n; ++i) out[i] = first[i] + second[i];
  p.sync();  // the peer has read our buffer: we may overwrite it
  std::memcpy(mine, out, n * sizeof(float));
}

void copy_once(Pair&, Buffers& b, std::size_t n) {
  std::memcpy(b.to.data(), b.from.data(), n * sizeof(float));
  asm volatile("" : : "r"(b.to.data()) : "memory");
}

// Runs `call` for the warm-up and the timed rounds; process 0 chooses the
// number of calls per round and records the rounds.
template <class Call>
void measure(Pair& p, Buffers& b, std::size_t n, int mode, double min_time_s, int rounds,
             Call&& call) {
  Control& ctl = p.control();
  p.sync();
  // Warm-up: doubling batches for a tenth of min_time; the last batch's
  // time per call sizes the rounds.
  long calls = 1;
  if (p.me() == 0) {
    double per_call_us = 0;
    double spent_us = 0;
    for (long batch = 1; spent_us < min_time_s * 1e5 && batch <= (1l << 22); batch *= 2) {
      ctl.batch.store(batch, std::memory_order_release);
      p.sync();
      auto t0 = Clock::now();
      for (long i = 0; i < batch; ++i) call(p, b, n);
      p.sync();
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      spent_us += us;
      per_call_us = us / static_cast<double>(batch);
    }
    ctl.batch.store(0, std::memory_order_release);
    p.sync();
    calls =
        std::max(1l, static_cast<long>(min_time_s * 1e6 / rounds / std::max(per_call_us, 1e-3)));
    ctl.round_calls.store(calls, std::memory_order_release);
    p.sync();
  } else {
    for (;;) {
      p.sync();
      const long batch = ctl.batch.load(std::memory_order_acquire);
      if (batch == 0) break;
      for (long i = 0; i < batch; ++i) call(p, b, n);
      p.sync();
    }
    p.sync();
    calls = ctl.round_calls.load(std::memory_order_acquire);
  }
  for (int r = 0; r < rounds; ++r) {
    p.sync();
    auto t0 = Clock::now();
    for (long i = 0; i < calls; ++i) call(p, b, n);
    p.sync();
    if (p.me() == 0)
      ctl.round_us[mode][r] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                              static_cast<double>(calls);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "allreduce_floor: the best N=2 in-place float32 allreduce on this machine (zero "
      "copy, no library), beside a concurrent memcpy"};
  std::string min_s = "64K", max_s = "64M", bind = "core";
  double factor = 2, min_time_s = 0.1;
  int rounds = 5;
  app.add_option("-b,--minbytes", min_s, "Smallest size in bytes (8, 64K, 1M, ...)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", max_s, "Largest size in bytes")->capture_default_str();
  app.add_option("-f,--stepfactor", factor, "Multiply the size by this factor each step")
      ->check(CLI::Range(1.0001, 1e6))
      ->capture_default_str();
  app.add_option("--min-time", min_time_s, "Seconds the timed rounds of one size and mode last")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "Timed rounds per size and mode")
      ->check(CLI::Range(1, kMaxRounds))
      ->capture_default_str();
  app.add_option("--bind-to", bind,
                 "core (default): the two processes on the first two CPUs of the mask, as "
                 "mpirun; none: wherever the scheduler puts them")
      ->check(CLI::IsMember({"core", "none"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::size_t min_bytes = 0, max_bytes = 0;
  try {
    min_bytes = parse_bytes(min_s);
    max_bytes = parse_bytes(max_s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_floor: %s\n", e.what());
    return 1;
  }
  if (min_bytes < 8 || max_bytes < min_bytes) {
    std::fprintf(stderr, "allreduce_floor: sizes %zu..%zu: expected 8 <= -b <= -e\n", min_bytes,
                 max_bytes);
    return 1;
  }

  void* ctl_mem = shared_mapping(sizeof(Control), "allreduce_floor: mmap");
  const std::size_t max_n = max_bytes / sizeof(float);
  const std::size_t region = std::max<std::size_t>(max_n * sizeof(float), 4096);
  void* data = shared_mapping(2 * region, "allreduce_floor: mmap");
  if (ctl_mem == nullptr || data == nullptr) return 1;
  auto& ctl = *new (ctl_mem) Control;
  const PairSide side = start_pair(ctl.start, bind, "allreduce_floor");
  if (side.me < 0) return 1;
  const int me = side.me;
  Pair pair(ctl, me);
  Buffers b;
  b.shared[0] = static_cast<float*>(data);
  b.shared[1] = reinterpret_cast<float*>(static_cast<char*>(data) + region);
  b.scratch.assign(max_n, 0.f);
  b.from.assign(max_n, 1.f);
  b.to.assign(max_n, 0.f);
  if (me == 0) {
    fmt::print(
        "# allreduce_floor: N=2, float32 sum in place, buffers shared (zero copy), "
        "bind-to {}; us per call, median round [min-max]\n",
        bind);
    fmt::print("{:>12} {:>24} {:>24} {:>24} {:>9}\n", "# size", "two_phase", "one_shot", "memcpy",
               "best/mem");
  }
  for (std::size_t bytes = min_bytes; bytes <= max_bytes;
       bytes = std::max(bytes + 1, static_cast<std::size_t>(static_cast<double>(bytes) * factor))) {
    const std::size_t n = bytes / sizeof(float);
    // The schemes compute the allreduce: one call of each on fresh inputs
    // (small integers, exact in float32), checked element by element.
    for (auto scheme : {two_phase, one_shot}) {
      for (std::size_t i = 0; i < n; ++i) b.shared[me][i] = static_cast<float>((i + me) % 3);
      pair.sync();
      scheme(pair, b, n);
      pair.sync();
      for (std::size_t i = 0; i < n; ++i) {
        const auto want = static_cast<float>(i % 3 + (i + 1) % 3);
        if (b.shared[me][i] != want) {
          std::fprintf(
              stderr, "allreduce_floor: process %d, %zu bytes: element %zu is %g, expected %g\n",
              me, bytes, i, static_cast<double>(b.shared[me][i]), static_cast<double>(want));
          ctl.failed.store(1);
          break;
        }
      }
      pair.sync();
      if (ctl.failed.load() != 0) return finish_pair(side, 1, "allreduce_floor") ? 0 : 1;
    }
    // The timed calls sum the buffers again and again; the values grow
    // (float32 reaches inf after about 128 calls at the same speed).
    measure(pair, b, n, 0, min_time_s, rounds, two_phase);
    measure(pair, b, n, 1, min_time_s, rounds, one_shot);
    measure(pair, b, n, 2, min_time_s, rounds, copy_once);
    if (me == 0) {
      double med[kModes];
      std::string cells[kModes];
      for (int m = 0; m < kModes; ++m) {
        std::vector<double> v(ctl.round_us[m], ctl.round_us[m] + rounds);
        std::sort(v.begin(), v.end());
        med[m] = v[(v.size() - 1) / 2];
        cells[m] = fmt::format("{:.2f} [{:.2f}-{:.2f}]", med[m], v.front(), v.back());
      }
      fmt::print("{:>12} {:>24} {:>24} {:>24} {:>9.2f}\n", bytes, cells[0], cells[1], cells[2],
                 std::min(med[0], med[1]) / med[2]);
      std::fflush(stdout);
    }
  }
  return finish_pair(side, 0, "allreduce_floor") ? 0 : 1;
}
