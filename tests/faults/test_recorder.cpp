// The flight recorder (docs/design/recorder.md): a rank that stalls before
// its 1001st allreduce is named, with its last completed call, in every
// rank's error; SHMRING_DUMP_DIR gets every rank's recorder as JSON;
// `shmrun --status` during the stall shows who is where. And stats().

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "faults.hpp"

using namespace shmring;
using test::contains;
namespace fs = std::filesystem;

namespace {

constexpr double kTimeoutS = 2.0;

Options opts(int r, int n, const std::string& job, double timeout = kTimeoutS) {
  Options o;
  o.rank = r;
  o.world_size = n;
  o.job_id = job;
  o.timeout_s = timeout;
  o.threads = 1;
  return o;
}

// The output of `cmd` (stdout), or "" when it cannot run.
std::string capture(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// The line of `table` that starts with `rank` (as its first column).
std::string row_of(const std::string& table, int rank) {
  std::istringstream in(table);
  std::string line;
  const std::regex row("^\\s*" + std::to_string(rank) + "\\s+\\d+\\s.*");
  while (std::getline(in, line))
    if (std::regex_match(line, row)) return line;
  return "";
}

// Rank 2 stalls before allreduce #1000 of `count` float32 (10000: the
// direct path; 2: the low-latency line, which stamps the start of a call
// after publishing its line, src/algorithms/low_latency.cpp).
void stall_before_1000(std::size_t count, const char* name) {
  const test::TempDir tmp("shmring-recorder");
  const std::string& dir = tmp.path();
  REQUIRE(!dir.empty());
  const char* shmrun = std::getenv("SHMRUN");
  REQUIRE_MESSAGE(shmrun != nullptr,
                  "SHMRUN must name build/tools/shmrun (tests/faults/meson.build)");
  // Empty in a cross build, whose shmrun this host cannot run directly.
  const bool with_status = *shmrun != '\0';
  // Messages and the status table, back to the parent.
  test::MessageBoard board(5);
  const std::string job = test::unique_job_id(name);
  auto status = test::run_processes(4, [&](int r) {
    setenv("SHMRING_DUMP_DIR", dir.c_str(), 1);
    Communicator comm(opts(r, 4, job));
    std::vector<float> x(count, 1.0f);
    for (int i = 0; i < 1000; ++i) comm.allreduce(std::span<float>(x), ReduceOp::sum);
    if (r == 2) {
      // The others wait in #1000 now; they time out 2 s after it began.
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      if (with_status) {
        const std::string table =
            capture(std::string(shmrun) + " --status --job-id " + job + " 2>&1");
        board.put(4, table);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    }
    try {
      comm.allreduce(std::span<float>(x), ReduceOp::sum);
      SHMRING_CHILD_CHECK(false, "rank %d: expected an error", r);
    } catch (const Error& e) {
      board.put(r, e.what());
    }
  });
  CHECK(test::all_zero(status));
  std::string dump;
  for (int r = 0; r < 4; ++r) {
    const std::string m = board[r];
    INFO("rank ", r, ": ", m);
    CHECK(contains(m, "timed out"));
    CHECK(contains(m, "rank(s) 2 never started collective #1000"));
    CHECK(contains(m,
                   "rank 2 has not entered allreduce #1000; its last completed call was "
                   "allreduce #999, "));
    CHECK(contains(m, "ranks 0, 1 and 3 wait in allreduce #1000"));
    std::smatch s;
    if (std::regex_search(m, s, std::regex("#999, ([0-9.]+) s ago"))) {
      // rank 2 finished #999 at most ~1 s before the others entered #1000;
      // the first of them spoke 2 s later.
      CHECK(std::stod(s[1]) >= 1.5);
      CHECK(std::stod(s[1]) < 6.0);
    }
    if (std::regex_search(m, s, std::regex("flight recorder: (\\S+\\.json)"))) dump = s[1];
  }
  // The dump the message names: every rank's calls up to its last.
  REQUIRE_MESSAGE(!dump.empty(), "the message must name the dump: " << board[0]);
  CHECK(fs::path(dump).parent_path() == fs::path(dir));
  std::ifstream in(dump);
  nlohmann::json j = nlohmann::json::parse(in);
  REQUIRE(j["ranks"].size() == 4);
  for (int r = 0; r < 4; ++r) {
    const auto& calls = j["ranks"][r]["calls"];
    INFO("rank ", r);
    REQUIRE(calls.size() == 64);  // SHMRING_RECORDER_ENTRIES' default
    const auto& last = calls.back();
    CHECK(last["kind"] == "allreduce");
    CHECK(last["count"] == count);
    CHECK(last["bytes"] == count * sizeof(float));
    CHECK(last["start_ns"].get<std::uint64_t>() > 0);
    CHECK(last["dtype"] == "float32");
    CHECK(last["op"] == "sum");
    if (r == 2) {
      CHECK(last["seq"] == 999);
      CHECK(last["state"] == "completed");
    } else {
      CHECK(last["seq"] == 1000);
      // In #1000 when the first rank to time out wrote the dump; a rank
      // that timed out too by then has marked it failed.
      CHECK((last["state"] == "started" || last["state"] == "failed"));
      CHECK(calls[62]["seq"] == 999);
      CHECK(calls[62]["state"] == "completed");
    }
    CHECK(j["ranks"][r]["calls_completed"] == 1000);
  }
  // `shmrun --status` during the stall: rank 2 outside any collective,
  // the others in #1000 waiting.
  const std::string table = board[4];
  INFO("shmrun --status:\n", table);
  if (with_status) {
    CHECK(contains(row_of(table, 2), "idle (last allreduce #999)"));
    for (int r : {0, 1, 3}) {
      const std::string row = row_of(table, r);
      CHECK(contains(row, "allreduce #1000"));
      CHECK(contains(row, "waits for"));
    }
  } else {
    MESSAGE("cross build: shmrun --status not run (SHMRUN is empty)");
  }
}

// Runs body(comm, rank, timed_out) on 3 ranks, rank 0 with a 1 s timeout
// and the others 10 s (SHMRING_ALGO=algo where given); returns rank 0's
// error. `timed_out` is set once rank 0 has its error: a late rank waits for
// it (wait_for) rather than sleeping past the timeout.
std::string rank0_error(
    const char* name, const char* algo,
    const std::function<void(Communicator&, int, const test::SharedFlag&)>& body) {
  constexpr int n = 3;
  const std::string job = test::unique_job_id(name);
  test::MessageBoard board(n);
  test::SharedFlag timed_out;
  auto status = test::run_processes(n, [&](int r) {
    if (algo != nullptr) setenv("SHMRING_ALGO", algo, 1);
    Communicator comm(opts(r, n, job, r == 0 ? 1.0 : 10.0));
    try {
      body(comm, r, timed_out);
      SHMRING_CHILD_CHECK(r != 0, "rank 0: expected a timeout");
    } catch (const Error& e) {
      board.put(r, e.what());
      if (r == 0) timed_out.set();
    }
  });
  CHECK(test::all_zero(status));
  return board[0];
}

}  // namespace

TEST_CASE("rank 2 stalls before allreduce #1000: every error names it and its last call") {
  stall_before_1000(10000, "stall");
}

TEST_CASE("the same with 8-byte allreduces (the low-latency line)") {
  stall_before_1000(2, "stall-ll");
}

TEST_CASE("stats(): calls, bytes, time inside and time blocked on a peer, per kind") {
  const std::string job = test::unique_job_id("stats");
  // Rank 1's lateness, longer in emulated runs, where rank 0 may take a
  // while to enter the call it is late for: rank 0 must wait at least 250 ms.
  const auto late = std::chrono::milliseconds(static_cast<int>(300 * test::timeout_scale()));
  const auto inside_ns = static_cast<std::uint64_t>(250'000'000 * test::timeout_scale());
  auto status = test::run_processes(2, [&](int r) {
    Communicator comm(opts(r, 2, job, 30.0));
    SHMRING_CHILD_CHECK(comm.stats().empty(), "rank %d: no calls yet", r);
    std::vector<float> x(10000, 1.0f);
    for (int i = 0; i < 10; ++i) comm.allreduce(std::span<float>(x), ReduceOp::sum);
    for (int i = 0; i < 3; ++i) comm.broadcast(x.data(), 100, DataType::float32, 0);
    // Rank 1 arrives late: rank 0's allreduce is blocked that long.
    if (r == 1) std::this_thread::sleep_for(late);
    comm.allreduce(std::span<float>(x), ReduceOp::sum);
    const auto st = comm.stats();
    SHMRING_CHILD_CHECK(st.size() == 2, "rank %d: %zu kinds", r, st.size());
    SHMRING_CHILD_CHECK(st[0].collective == "allreduce" && st[1].collective == "broadcast",
                        "rank %d: %s, %s", r, st[0].collective.c_str(), st[1].collective.c_str());
    SHMRING_CHILD_CHECK(st[0].calls == 11 && st[0].bytes == 11 * 40000,
                        "rank %d: allreduce %llu calls %llu bytes", r,
                        static_cast<unsigned long long>(st[0].calls),
                        static_cast<unsigned long long>(st[0].bytes));
    SHMRING_CHILD_CHECK(
        st[1].calls == 3 && st[1].bytes == 3 * 400, "rank %d: broadcast %llu calls %llu bytes", r,
        static_cast<unsigned long long>(st[1].calls), static_cast<unsigned long long>(st[1].bytes));
    SHMRING_CHILD_CHECK(st[0].wait_ns <= st[0].time_ns && st[0].time_ns > 0, "rank %d", r);
    if (r == 0)
      SHMRING_CHILD_CHECK(st[0].wait_ns >= 250'000'000 && st[0].time_ns < 5'000'000'000,
                          "rank 0 waited %llu ns of %llu",
                          static_cast<unsigned long long>(st[0].wait_ns),
                          static_cast<unsigned long long>(st[0].time_ns));
    else
      SHMRING_CHILD_CHECK(st[0].time_ns < inside_ns, "rank 1 was not late inside: %llu ns",
                          static_cast<unsigned long long>(st[0].time_ns));
    // Non-blocking calls count too.
    auto req = comm.iallreduce(x.data(), x.data(), 10, DataType::float32, ReduceOp::max);
    req.wait();
    SHMRING_CHILD_CHECK(comm.stats()[0].calls == 12, "rank %d: the async call counts", r);
    // A low-latency call's wait counts as well, once it falls back from
    // polling the peer's line to the peer's counter.
    if (r == 1) std::this_thread::sleep_for(late);
    comm.barrier();
    std::uint64_t barrier_wait_ns = 0, barriers = 0;
    for (const auto& k : comm.stats())
      if (k.collective == "barrier") barrier_wait_ns = k.wait_ns, barriers = k.calls;
    SHMRING_CHILD_CHECK(barriers == 1, "rank %d: %llu barriers", r,
                        static_cast<unsigned long long>(barriers));
    if (r == 0)
      SHMRING_CHILD_CHECK(barrier_wait_ns >= 250'000'000, "rank 0's barrier waited %llu ns",
                          static_cast<unsigned long long>(barrier_wait_ns));
    // And an eager gather's (8 bytes: the root reads rank 1's eager line).
    if (r == 1) std::this_thread::sleep_for(late);
    const std::int64_t mine = r;
    std::int64_t all[2] = {-1, -1};
    comm.gather(&mine, all, 1, DataType::int64, 0);
    std::uint64_t gather_wait_ns = 0;
    for (const auto& k : comm.stats())
      if (k.collective == "gather") gather_wait_ns = k.wait_ns;
    if (r == 0) {
      SHMRING_CHILD_CHECK(all[0] == 0 && all[1] == 1, "rank 0 gathered %lld, %lld",
                          static_cast<long long>(all[0]), static_cast<long long>(all[1]));
      SHMRING_CHILD_CHECK(gather_wait_ns >= 250'000'000, "rank 0's gather waited %llu ns",
                          static_cast<unsigned long long>(gather_wait_ns));
    }
  });
  CHECK(test::all_zero(status));
}

TEST_CASE("stats() bytes: each kind counts this rank's result buffer") {
  // Uneven sizes (a one-line call and a larger one), N=3, root 0; what
  // each call adds on each rank is in communicator.hpp (CollectiveStats).
  constexpr int n = 3;
  const std::string job = test::unique_job_id("statsbytes");
  auto status = test::run_processes(n, [&](int r) {
    Communicator comm(opts(r, n, job, 30.0));
    std::map<std::string, std::uint64_t> want;
    for (const std::size_t count : {std::size_t{2}, std::size_t{3000}}) {
      const std::size_t b = count * sizeof(float), all = n * b;
      std::vector<float> one(count, 1.0f), many(n * count, 1.0f), out(n * count);
      const std::vector<std::size_t> counts(n, count), displs{0, count, 2 * count};
      comm.allreduce(one.data(), out.data(), count, DataType::float32, ReduceOp::sum);
      want["allreduce"] += b;
      comm.reduce_scatter(many.data(), out.data(), count, DataType::float32, ReduceOp::sum);
      want["reduce_scatter"] += b;
      comm.allgather(one.data(), out.data(), count, DataType::float32);
      want["allgather"] += all;
      comm.broadcast(one.data(), count, DataType::float32, 0);
      want["broadcast"] += b;
      comm.reduce(one.data(), out.data(), count, DataType::float32, ReduceOp::sum, 0);
      want["reduce"] += b;
      comm.alltoall(many.data(), out.data(), count, DataType::float32);
      want["alltoall"] += all;
      comm.alltoallv(many.data(), counts, displs, out.data(), counts, displs, DataType::float32);
      want["alltoallv"] += all;
      comm.gather(one.data(), out.data(), count, DataType::float32, 0);
      want["gather"] += r == 0 ? all : b;
      comm.scatter(many.data(), out.data(), count, DataType::float32, 0);
      want["scatter"] += b;
      comm.allgatherv(one.data(), count, out.data(), counts, displs, DataType::float32);
      want["allgatherv"] += all;
      comm.reduce_scatter_v(many.data(), out.data(), counts, DataType::float32, ReduceOp::sum);
      want["reduce_scatter_v"] += b;
      comm.barrier();
      want["barrier"] += 0;
    }
    const auto st = comm.stats();
    SHMRING_CHILD_CHECK(st.size() == want.size(), "rank %d: %zu kinds, want %zu", r, st.size(),
                        want.size());
    for (const auto& k : st) {
      const auto it = want.find(k.collective);
      SHMRING_CHILD_CHECK(it != want.end(), "rank %d: unexpected kind %s", r, k.collective.c_str());
      SHMRING_CHILD_CHECK(k.calls == 2 && k.bytes == it->second,
                          "rank %d: %s: %llu calls, %llu bytes; want 2 calls, %llu bytes", r,
                          k.collective.c_str(), static_cast<unsigned long long>(k.calls),
                          static_cast<unsigned long long>(k.bytes),
                          static_cast<unsigned long long>(it->second));
    }
  });
  CHECK(test::all_zero(status));
}

TEST_CASE("stats(): a peer 30 ms late is counted from the start of the wait") {
  // The yield phase ends after 2 ms and the sleep phase's first slice
  // lasts 10 ms: a wait that ends within that slice is counted in full
  // too, whatever the path (the ring, the one-line path's fallback).
  // Each rank notes when it enters the call, and rank 0's count must cover
  // the time between, less 5 ms: a count that started at the sleep phase
  // would miss about 12 in every round. On a loaded or emulated machine a
  // round can fail to show it (rank 0 came too late to wait 20 ms, or was
  // descheduled between its note and its call), so each size has 5 rounds
  // to pass once.
  const std::string job = test::unique_job_id("statslate");
  auto* entered = static_cast<std::atomic<std::int64_t>*>(
      mmap(nullptr, 2 * sizeof(std::atomic<std::int64_t>), PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(entered != MAP_FAILED);
  auto status = test::run_processes(2, [&](int r) {
    Communicator comm(opts(r, 2, job, 30.0));
    std::vector<float> big(10000, 1.0f), small(2, 1.0f);
    for (auto* x : {&big, &small}) {
      std::int64_t passed = 0, waited = 0, late = 0;
      for (int round = 0; round < 5 && !passed; ++round) {
        comm.allreduce(std::span<float>(*x), ReduceOp::sum);  // the two ranks in step
        const std::uint64_t before = comm.stats()[0].wait_ns;
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
        entered[r].store(test::mono_ns());
        comm.allreduce(std::span<float>(*x), ReduceOp::sum);
        waited = static_cast<std::int64_t>(comm.stats()[0].wait_ns - before);
        late = entered[1].load() - entered[0].load();
        passed =
            r == 0 && late >= 20'000'000 && waited >= late - 5'000'000 && waited < 2'000'000'000;
        comm.allreduce(&passed, &passed, 1, DataType::int64, ReduceOp::max);  // rank 0's verdict
      }
      if (r == 0)
        SHMRING_CHILD_CHECK(passed, "rank 0 waited %lld ns for a peer %lld ns late (%zu floats)",
                            static_cast<long long>(waited), static_cast<long long>(late),
                            x->size());
    }
  });
  munmap(entered, 2 * sizeof(std::atomic<std::int64_t>));
  CHECK(test::all_zero(status));
}

TEST_CASE("a timeout after eager gathers: a rank past the call is not called late") {
  // Rank 1's 8-byte gathers are eager: it deposits its blocks of #2 and #3
  // and goes on (then sleeps, outside any call), while rank 2 sleeps
  // before gather #2 and rank 0 times out waiting for it.
  // Rank 0 enters #2 once rank 1 has left #3; ranks 1 and 2 go on once rank
  // 0 has timed out.
  test::SharedFlag ahead;
  const std::string m = rank0_error(
      "recahead", nullptr, [&](Communicator& comm, int r, const test::SharedFlag& timed_out) {
        const std::int64_t mine = r;
        std::int64_t all[3] = {};
        for (int i = 0; i < 6; ++i) {
          if (r == 0 && i == 2) (void)ahead.wait_for();
          if ((r == 2 && i == 2) || (r == 1 && i == 4)) (void)timed_out.wait_for();
          comm.gather(&mine, all, 1, DataType::int64, 0);
          if (r == 1 && i == 3) ahead.set();
        }
      });
  INFO("rank 0: ", m);
  CHECK(contains(m, "timed out"));
  CHECK(contains(m, "rank 2 has not entered gather #2; its last completed call was gather #1"));
  CHECK(contains(m,
                 "rank 1 has completed gather #2 and gone on; its last completed call was "
                 "gather #3"));
  CHECK(!contains(m, "rank 1 has not entered"));
}

TEST_CASE("a one-shot allreduce's wait says its data is out, not that none moved") {
  // Rank 2 sleeps before allreduce #1: rank 0 has published its buffer
  // (step 0) and times out waiting for rank 2's.
  const std::string m = rank0_error(
      "recstep", "direct", [](Communicator& comm, int r, const test::SharedFlag& timed_out) {
        std::vector<float> x(1000, 1.0f);
        comm.allreduce(std::span<float>(x), ReduceOp::sum);
        if (r == 2) (void)timed_out.wait_for();
        comm.allreduce(std::span<float>(x), ReduceOp::sum);
      });
  INFO("rank 0: ", m);
  CHECK(contains(m, "timed out"));
  CHECK(contains(m, "(collective #1, step 0)"));
  CHECK(!contains(m, "before any data moved"));
}

TEST_CASE("a rank killed inside a call: the others' error says it died there, not that it waits") {
  constexpr int n = 3;
  const std::string job = test::unique_job_id("recdead");
  test::MessageBoard board(n);
  test::SharedFlag pid1;
  auto status = test::run_processes(n, [&](int r) {
    Communicator comm(opts(r, n, job, 30.0));
    // Stored before allreduce #0, which rank 2 cannot leave without rank 1.
    if (r == 1) pid1.set(getpid());
    std::vector<float> x(10000, 1.0f);
    comm.allreduce(std::span<float>(x), ReduceOp::sum);
    if (r == 2) {
      // Rank 1 is inside allreduce #1, waiting for us, when it is killed
      // (given longer to get there in emulated runs).
      std::this_thread::sleep_for(
          std::chrono::milliseconds(static_cast<int>(300 * test::timeout_scale())));
      const pid_t victim = pid1.get();
      SHMRING_CHILD_CHECK(victim > 0, "rank 1's pid is %d", static_cast<int>(victim));
      kill(victim, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    try {
      comm.allreduce(std::span<float>(x), ReduceOp::sum);
      SHMRING_CHILD_CHECK(false, "rank %d: expected an error", r);
    } catch (const Error& e) {
      board.put(r, e.what());
    }
  });
  CHECK(status[0] == 0);
  CHECK(status[1] == 128 + SIGKILL);
  CHECK(status[2] == 0);
  // The rank that saw the death first speaks for the job; the other
  // rethrows its error.
  const std::string m = contains(board[0], "died while") ? board[0] : board[2];
  INFO("rank 0: ", board[0], "\nrank 2: ", board[2]);
  CHECK(contains(m, "rank 1 (pid "));
  CHECK(contains(m, "rank 1 (dead) was in allreduce #1, which it started "));
  CHECK(!contains(m, "ranks 0, 1 and 2 wait in"));
  CHECK(!contains(m, "ranks 0 and 1 wait in"));
  CHECK(!contains(m, "ranks 1 and 2 wait in"));
}

TEST_CASE("a rank that dies before allreduce #10: the survivors' error names its last call") {
  const std::string job = test::unique_job_id("recdeath");
  test::MessageBoard board(3);
  auto status = test::run_processes(3, [&](int r) {
    Communicator comm(opts(r, 3, job, 30.0));
    std::vector<float> x(10000, 1.0f);
    for (int i = 0; i < 10; ++i) comm.allreduce(std::span<float>(x), ReduceOp::sum);
    if (r == 1) _exit(0);  // dies without destroying its communicator
    try {
      comm.allreduce(std::span<float>(x), ReduceOp::sum);
      SHMRING_CHILD_CHECK(false, "rank %d: expected an error", r);
    } catch (const PeerFailureError& e) {
      board.put(r, e.what());
    }
  });
  CHECK(test::all_zero(status));
  for (int r : {0, 2}) {
    const std::string m = board[r];
    INFO("rank ", r, ": ", m);
    CHECK(contains(m, "rank 1 (pid "));
    CHECK(contains(m, "died"));
    CHECK(contains(m,
                   "rank 1 (dead) has not entered allreduce #10; its last completed call was "
                   "allreduce #9, "));
    CHECK(contains(m, "ranks 0 and 2 wait in allreduce #10"));
  }
}

TEST_CASE("a rank that leaves before allreduce #10: the survivors' error says it left") {
  const std::string job = test::unique_job_id("recleave");
  test::MessageBoard board(3);
  auto status = test::run_processes(3, [&](int r) {
    auto comm = std::make_unique<Communicator>(opts(r, 3, job, 30.0));
    std::vector<float> x(10000, 1.0f);
    for (int i = 0; i < 10; ++i) comm->allreduce(std::span<float>(x), ReduceOp::sum);
    if (r == 1) {
      comm.reset();  // destroys its communicator and stays alive a while
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return;
    }
    try {
      comm->allreduce(std::span<float>(x), ReduceOp::sum);
      SHMRING_CHILD_CHECK(false, "rank %d: expected an error", r);
    } catch (const PeerFailureError& e) {
      board.put(r, e.what());
    }
  });
  CHECK(test::all_zero(status));
  for (int r : {0, 2}) {
    const std::string m = board[r];
    INFO("rank ", r, ": ", m);
    CHECK(contains(m, "destroyed its communicator"));
    CHECK(contains(m,
                   "rank 1 (left: destroyed its communicator) has not entered allreduce #10; its "
                   "last completed call was allreduce #9, "));
    CHECK(!contains(m, "(dead)"));
  }
}

TEST_CASE("rank 0's SHMRING_RECORDER_ENTRIES sizes the job; 0 turns the recorder off") {
  const std::string job = test::unique_job_id("recoff");
  test::SharedFlag timed_out;  // rank 1 comes late: once rank 0 has timed out
  auto status = test::run_processes(2, [&](int r) {
    // Rank 1 asks for 16 entries; rank 0's 0 wins, so no summary.
    setenv("SHMRING_RECORDER_ENTRIES", r == 0 ? "0" : "16", 1);
    Communicator comm(opts(r, 2, job, 1.0));
    std::vector<float> x(10000, 1.0f);
    comm.allreduce(std::span<float>(x), ReduceOp::sum);
    if (r == 1) (void)timed_out.wait_for();
    try {
      comm.allreduce(std::span<float>(x), ReduceOp::sum);
      SHMRING_CHILD_CHECK(false, "rank %d: expected an error", r);
    } catch (const Error& e) {
      if (r == 0) timed_out.set();
      SHMRING_CHILD_CHECK(contains(e.what(), "rank(s) 1 never started collective #1"),
                          "rank %d: %s", r, e.what());
      SHMRING_CHILD_CHECK(!contains(e.what(), "has not entered"),
                          "rank %d: the recorder is off: %s", r, e.what());
    }
  });
  CHECK(test::all_zero(status));
}

TEST_CASE("a recorder of 5 entries keeps the last 5 calls through its wraparounds") {
  // 5 is not a power of two: entry c mod 5, through two and a half laps.
  const test::TempDir tmp("shmring-recorder-lap");
  const std::string& dir = tmp.path();
  REQUIRE(!dir.empty());
  test::MessageBoard board(2);
  const std::string job = test::unique_job_id("reclap");
  test::SharedFlag timed_out;
  auto status = test::run_processes(2, [&](int r) {
    setenv("SHMRING_DUMP_DIR", dir.c_str(), 1);
    setenv("SHMRING_RECORDER_ENTRIES", "5", 1);
    // Rank 0 times out first in #12; rank 1, late, finds the job broken.
    Communicator comm(opts(r, 2, job, r == 0 ? 0.5 : 10.0));
    std::vector<float> x(300, 1.0f);
    // Call i has count 100 + i, so that each entry names its call.
    for (int i = 0; i < 12; ++i)
      comm.allreduce(x.data(), x.data(), 100 + i, DataType::float32, ReduceOp::sum);
    if (r == 1) (void)timed_out.wait_for();
    try {
      comm.allreduce(x.data(), x.data(), 200, DataType::float32, ReduceOp::sum);
      SHMRING_CHILD_CHECK(false, "rank %d: expected an error", r);
    } catch (const Error& e) {
      board.put(r, e.what());
      if (r == 0) timed_out.set();
    }
  });
  CHECK(test::all_zero(status));
  const std::string m = board[0];
  INFO("rank 0: ", m);
  CHECK(contains(m,
                 "rank 1 has not entered allreduce #12; its last completed call was "
                 "allreduce #11, "));
  std::smatch s;
  REQUIRE(std::regex_search(m, s, std::regex("flight recorder: (\\S+\\.json)")));
  std::ifstream in(s[1].str());
  nlohmann::json j = nlohmann::json::parse(in);
  REQUIRE(j["ranks"].size() == 2);
  for (int r = 0; r < 2; ++r) {
    const auto& calls = j["ranks"][r]["calls"];
    INFO("rank ", r, ": ", calls.dump());
    REQUIRE(calls.size() == 5);
    // Rank 0: #8-#11 completed, #12 started; rank 1: #7-#11 completed.
    const int first = r == 0 ? 8 : 7;
    for (int k = 0; k < 5; ++k) {
      const int seq = first + k;
      CHECK(calls[k]["seq"] == seq);
      CHECK(calls[k]["count"] == (seq == 12 ? 200 : 100 + seq));
      CHECK(calls[k]["state"] == (seq == 12 ? "started" : "completed"));
    }
    CHECK(j["ranks"][r]["calls_completed"] == 12);
    // Both ranks live while rank 0 writes the dump, rank 0 (the reporter)
    // included.
    CHECK(j["ranks"][r]["alive"] == true);
  }
  CHECK(j["reporter"] == 0);
}

TEST_CASE("ranks that time out at once name one dump, written once") {
  // Enough waiting ranks that some reach their deadline while the first
  // still writes the dump.
  constexpr int kRanks = 6;
  const test::TempDir tmp("shmring-recorder-once");
  const std::string& dir = tmp.path();
  REQUIRE(!dir.empty());
  test::MessageBoard board(kRanks);
  const std::string job = test::unique_job_id("recone");
  auto status = test::run_processes(kRanks, [&](int r) {
    setenv("SHMRING_DUMP_DIR", dir.c_str(), 1);
    // The ranks but 2 enter a barrier together and time out together.
    Communicator comm(opts(r, kRanks, job, 0.5));
    comm.barrier();
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    try {
      comm.barrier();
      SHMRING_CHILD_CHECK(r == 2, "rank %d: expected an error", r);
    } catch (const Error& e) {
      board.put(r, e.what());
    }
  });
  CHECK(test::all_zero(status));
  std::vector<std::string> files;
  std::string listed;
  for (const auto& e : fs::directory_iterator(dir)) {
    files.push_back(e.path().string());
    listed += " " + files.back();
  }
  INFO("files:", listed);
  REQUIRE(files.size() == 1);
  CHECK(files[0].ends_with(".json"));
  for (int r = 0; r < kRanks; ++r) {
    if (r == 2) continue;
    INFO("rank ", r, ": ", board[r]);
    CHECK(contains(board[r], "flight recorder: " + files[0]));
  }
  std::ifstream in(files[0]);
  nlohmann::json j = nlohmann::json::parse(in);
  CHECK(j["ranks"].size() == kRanks);
  CHECK(j["reporter"] != 2);
}

TEST_CASE("a point-to-point call shows in the recorder: in shmrun --status and in the dump") {
  const test::TempDir tmp("shmring-recorder-p2p");
  const std::string& dir = tmp.path();
  REQUIRE(!dir.empty());
  const char* shmrun = std::getenv("SHMRUN");
  REQUIRE(shmrun != nullptr);
  const bool with_status = *shmrun != '\0';
  test::MessageBoard board(3);
  const std::string job = test::unique_job_id("p2prec");
  auto status = test::run_processes(3, [&](int r) {
    setenv("SHMRING_DUMP_DIR", dir.c_str(), 1);
    // Rank 2 times out first; the others, with a longer timeout, see its error.
    Communicator comm(opts(r, 3, job, r == 2 ? kTimeoutS : 3 * kTimeoutS));
    std::vector<float> x(1000, 1.0f);
    if (r == 1) comm.send(x.data(), x.size(), DataType::float32, 2, 5);  // a completed send
    if (r == 2) comm.recv(x.data(), x.size(), DataType::float32, 1, 5);
    comm.barrier();
    if (r == 0) {
      // In recv from rank 1 (tag 7), which never sends: rank 2's timeout
      // breaks the communicator and ends it.
      try {
        comm.recv(x.data(), x.size(), DataType::float32, 1, 7);
        SHMRING_CHILD_CHECK(false, "rank 0: the recv must fail");
      } catch (const Error&) {
      }
    } else if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
      if (with_status) {
        const std::string table =
            capture(std::string(shmrun) + " --status --job-id " + job + " 2>&1");
        board.put(0, table);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past rank 2's timeout
    } else {
      // Rank 2 enters an allreduce the others never join: its timeout's
      // message and dump show rank 0 in its recv and rank 1's last send.
      try {
        comm.allreduce(std::span<float>(x), ReduceOp::sum);
      } catch (const Error& e) {
        board.put(1, e.what());
      }
    }
  });
  CHECK(test::all_zero(status));
  const std::string table = board[0];
  INFO("shmrun --status:\n", table);
  if (with_status) {
    CHECK(contains(row_of(table, 0), "recv from rank 1 (tag 7, 1000 float32)"));
    CHECK(contains(row_of(table, 0), "waits for rank 1"));
  }
  const std::string msg = board[1];
  INFO("rank 2: ", msg);
  CHECK(contains(msg, "it is in recv from rank 1 (tag 7, 1000 float32) since"));
  std::smatch s;
  REQUIRE(std::regex_search(msg, s, std::regex("flight recorder: (\\S+\\.json)")));
  std::ifstream f(s[1].str());
  const auto j = nlohmann::json::parse(f);
  const auto& r0 = j["ranks"][0]["p2p_last"];
  CHECK(r0["kind"] == "recv");
  CHECK(r0["peer"] == 1);
  CHECK(r0["tag"] == 7);
  CHECK(r0["count"] == 1000);
  CHECK(r0["dtype"] == "float32");
  CHECK(r0["state"] == "started");
  const auto& r1 = j["ranks"][1]["p2p_last"];
  CHECK(r1["kind"] == "send");
  CHECK(r1["peer"] == 2);
  CHECK(r1["tag"] == 5);
  CHECK(r1["state"] == "completed");
  CHECK(j["ranks"][2]["p2p_last"]["kind"] == "recv");
}
