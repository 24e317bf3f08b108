// Peer death mid-collective: a rank SIGKILLed, or leaving with _exit, or
// destroying its communicator early, at several points of a run of
// allreduces. Every survivor must throw PeerFailureError naming the dead rank
// well before the timeout (60 s here), and the communicator must refuse
// further collectives.
// The median detection over each test case's deaths must stay within 1 s
// (the issue's bound), each single one within test::kDetectionBoundS (5 s;
// faults.hpp says why).

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "faults.hpp"

using namespace shmring;
using test::FaultBoard;

namespace {

enum class Death { sigkill, exit, leave };
const char* name_of(Death d) {
  return d == Death::sigkill ? "SIGKILL" : d == Death::exit ? "_exit(3)" : "destroy+return";
}

struct Case {
  int n;
  int victim;
  Death death;
  int before_collective;  // >= 0: die right before this collective
  int after_ms;           // otherwise: die this long after the first collective, mid-flight
  std::size_t count;      // elements per allreduce
};

void die(FaultBoard* board, Death d) {
  board->fault_ns.store(test::mono_ns());
  if (d == Death::sigkill) raise(SIGKILL);
  _exit(3);
}

// Returns the worst detection latency over the survivors.
double run_case(const Case& c, std::vector<double>& latencies) {
  FaultBoard* board = FaultBoard::create();
  REQUIRE(board != nullptr);
  const std::string job = test::unique_job_id("death");
  auto status = test::run_processes(
      c.n,
      [&](int r) {
        Options o;
        o.rank = r;
        o.world_size = c.n;
        o.job_id = job;
        o.slots = 2;
        o.slot_bytes = 4096;  // many slices per allreduce: death lands mid-collective
        o.timeout_s = 60;
        o.threads = 1;
        std::vector<float> x(c.count);
        if (r == c.victim) {
          std::optional<Communicator> comm(std::in_place, o);
          for (int i = 0;; ++i) {
            if (i == c.before_collective) {
              if (c.death != Death::leave) die(board, c.death);
              // The fault starts with the leaving: a survivor may notice it
              // before reset() returns (stored after, its latency came out
              // negative: "recorded no detection").
              board->fault_ns.store(test::mono_ns());
              comm.reset();  // leaves while the others wait for it
              return;
            }
            if (i == 1 && c.before_collective < 0)
              std::thread([&] {
                std::this_thread::sleep_for(std::chrono::milliseconds(c.after_ms));
                die(board, c.death);
              }).detach();
            std::fill(x.begin(), x.end(), 1.0f);
            comm->allreduce(std::span<float>(x), ReduceOp::sum);
          }
        }
        Communicator comm(o);
        try {
          for (int i = 0; i < 1'000'000; ++i) {
            std::fill(x.begin(), x.end(), 1.0f);
            comm.allreduce(std::span<float>(x), ReduceOp::sum);
            SHMRING_CHILD_CHECK(x[0] == static_cast<float>(c.n), "rank %d: wrong sum %g", r, x[0]);
          }
          SHMRING_CHILD_CHECK(false, "rank %d: no error after 10^6 allreduces", r);
        } catch (const PeerFailureError& e) {
          board->note(r, e.what());
          const std::string want = "rank " + std::to_string(c.victim) + " (pid ";
          SHMRING_CHILD_CHECK(std::string(e.what()).find(want) != std::string::npos,
                              "rank %d: the error must name rank %d: %s", r, c.victim, e.what());
        } catch (const Error& e) {
          board->note(r, e.what());
          SHMRING_CHILD_CHECK(false, "rank %d: expected PeerFailureError, got code %d: %s", r,
                              static_cast<int>(e.code()), e.what());
        }
        bool refused = false;
        try {
          comm.allreduce(std::span<float>(x), ReduceOp::sum);
        } catch (const Error&) {
          refused = true;
        }
        SHMRING_CHILD_CHECK(refused, "rank %d: a broken communicator must refuse collectives", r);
      },
      90);
  double worst = 0;
  std::string sample;
  for (int r = 0; r < c.n; ++r) {
    if (r == c.victim) {
      int want = c.death == Death::sigkill ? 128 + SIGKILL : c.death == Death::exit ? 3 : 0;
      CHECK_MESSAGE(status[r] == want, "victim rank ", r, " status ", status[r]);
      continue;
    }
    CHECK_MESSAGE(status[r] == 0, "survivor rank ", r, " status ", status[r]);
    double s = board->latency_s(r);
    CHECK_MESSAGE(s >= 0, "rank ", r, " recorded no detection");
    CHECK_MESSAGE(s < test::kDetectionBoundS, "rank ", r, " took ", s,
                  " s to notice: ", board->message[r]);
    worst = std::max(worst, s);
    if (s >= 0) latencies.push_back(s);  // a missing one failed above
    if (sample.empty()) sample = board->message[r];
  }
  std::printf("N=%d victim=%d %-14s %s%-3d count=%-6zu worst detection %7.2f ms | %s\n", c.n,
              c.victim, name_of(c.death), c.before_collective >= 0 ? "before#" : "after_ms=",
              c.before_collective >= 0 ? c.before_collective : c.after_ms, c.count, worst * 1e3,
              sample.c_str());
  FaultBoard::destroy(board);
  CHECK(test::shm_files_with(job).empty());
  return worst;
}

void check_median(const std::vector<double>& latencies) {
  const double median = test::median_detection(latencies);
  CHECK_MESSAGE(median < test::kMedianDetectionBoundS, "median detection ", median, " s");
}

void run_n(int n) {
  std::vector<double> latencies;
  std::vector<int> victims = {0, n - 1};
  if (n > 2) victims.push_back(1);
  for (int v : victims)
    for (Death d : {Death::sigkill, Death::exit}) {
      run_case({n, v, d, 3, 0, 65536}, latencies);   // between collectives: the others wait in #3
      run_case({n, v, d, -1, 2, 65536}, latencies);  // mid-collective, early
      run_case({n, v, d, -1, 25, 65536}, latencies);
    }
  // Small messages (a few elements: the small-message path where there is one).
  run_case({n, n - 1, Death::sigkill, 5, 0, 7}, latencies);
  run_case({n, 0, Death::exit, -1, 5, 7}, latencies);
  check_median(latencies);
}

}  // namespace

TEST_CASE("a rank that dies mid-allreduce fails every survivor promptly, N=2") {
  run_n(2);
}
TEST_CASE("a rank that dies mid-allreduce fails every survivor promptly, N=3") {
  run_n(3);
}
TEST_CASE("a rank that dies mid-allreduce fails every survivor promptly, N=4") {
  run_n(4);
}
TEST_CASE("a rank that destroys its communicator early fails the others, not hangs them") {
  std::vector<double> latencies;
  for (int n : {2, 3})
    for (int v : {0, n - 1}) run_case({n, v, Death::leave, 4, 0, 4096}, latencies);
  check_median(latencies);
}
