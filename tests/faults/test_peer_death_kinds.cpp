// Peer death in every collective, on both paths: a rank SIGKILLed right
// before collective #3 of a loop of reduce_scatter, allgather, broadcast,
// reduce or barrier calls. Every survivor must get PeerFailureError naming
// it promptly: within 1 s at the median over each test case's deaths, each
// within test::kDetectionBoundS (faults.hpp says why). (A survivor whose
// part of a call needs nothing from the dead rank, e.g. a broadcast root, may
// finish that call and hear of the death from its next one; the bounds
// still hold.)

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <functional>

#include "faults.hpp"

using namespace shmring;
using test::FaultBoard;

namespace {

using Call = std::function<void(Communicator&, std::vector<float>&, std::vector<float>&)>;

void run_kind(const char* what, int n, int victim, std::size_t count, const Call& call,
              std::vector<double>& latencies) {
  FaultBoard* board = FaultBoard::create();
  REQUIRE(board != nullptr);
  const std::string job = test::unique_job_id("kind");
  auto status = test::run_processes(
      n,
      [&](int r) {
        Options o;
        o.rank = r;
        o.world_size = n;
        o.job_id = job;
        o.timeout_s = 60;
        Communicator comm(o);
        std::vector<float> a(count * n, 1.0f), b(count * n, 0.0f);
        try {
          for (int i = 0; i < 100000; ++i) {
            if (r == victim && i == 3) {
              board->fault_ns.store(test::mono_ns());
              raise(SIGKILL);
            }
            call(comm, a, b);
          }
          SHMRING_CHILD_CHECK(false, "rank %d: no error", r);
        } catch (const PeerFailureError& e) {
          board->note(r, e.what());
          const std::string want = "rank " + std::to_string(victim) + " (pid ";
          SHMRING_CHILD_CHECK(std::string(e.what()).find(want) != std::string::npos,
                              "rank %d: the error must name rank %d: %s", r, victim, e.what());
        }
      },
      90);
  double worst = 0;
  for (int r = 0; r < n; ++r) {
    if (r == victim) {
      CHECK(status[r] == 128 + SIGKILL);
      continue;
    }
    CHECK_MESSAGE(status[r] == 0, what, ": survivor rank ", r, " status ", status[r]);
    double s = board->latency_s(r);
    CHECK_MESSAGE((s >= 0 && s < test::kDetectionBoundS), what, ": rank ", r, " noticed after ", s,
                  " s");
    worst = std::max(worst, s);
    if (s >= 0) latencies.push_back(s);  // a missing one failed above
  }
  std::printf("%-15s N=%d victim=%d count=%-6zu worst detection %6.2f ms | %s\n", what, n, victim,
              count, worst * 1e3, board->message[victim == 0 ? 1 : 0]);
  CHECK(test::shm_files_with(job).empty());
  FaultBoard::destroy(board);
}

void run_all(std::size_t count) {
  const std::pair<const char*, Call> kinds[] = {
      {"reduce_scatter",
       [count](Communicator& c, auto& a, auto& b) {
         c.reduce_scatter(a.data(), b.data(), count, DataType::float32, ReduceOp::sum);
       }},
      {"allgather",
       [count](Communicator& c, auto& a, auto& b) {
         c.allgather(a.data(), b.data(), count, DataType::float32);
       }},
      {"broadcast", [count](Communicator& c, auto& a,
                            auto&) { c.broadcast(a.data(), count, DataType::float32, 0); }},
      {"reduce",
       [count](Communicator& c, auto& a, auto& b) {
         c.reduce(a.data(), b.data(), count, DataType::float32, ReduceOp::sum, 0);
       }},
      {"barrier", [](Communicator& c, auto&, auto&) { c.barrier(); }},
  };
  std::vector<double> latencies;
  for (const auto& [what, call] : kinds)
    for (int victim : {0, 1}) run_kind(what, 3, victim, count, call, latencies);
  const double median = test::median_detection(latencies);
  CHECK_MESSAGE(median < test::kMedianDetectionBoundS, "median detection ", median, " s");
}

}  // namespace

TEST_CASE("a rank killed in any collective on the direct path fails the survivors promptly") {
  run_all(7);
}
TEST_CASE("a rank killed in any collective on the ring path fails the survivors promptly") {
  run_all(200000);  // 800 KB per rank: ring / chain
}
