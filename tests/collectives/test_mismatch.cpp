// Mismatched calls: every rank gets a MismatchError within 1 s naming both
// calls, nothing hangs, and the communicator refuses further work.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "harness.hpp"

using namespace shmring;

namespace {

// Runs `call` on every rank of an N-rank job; every rank must throw
// MismatchError whose message contains `needle`, within 1 s, and later
// calls must be refused. With `or_next_call`, a rank whose part of the call
// needs nothing from the disagreeing rank (a broadcast root sends and
// leaves) may complete it and get the error from its next call instead.
void expect_mismatch(int n, const std::function<void(Communicator&)>& call, const char* needle,
                     const char* algo = nullptr, bool or_next_call = false) {
  auto status = test::run_processes(n, [&, job = test::unique_job_id("mm")](int r) {
    if (algo) setenv("SHMRING_ALGO", algo, 1);
    Options o;
    o.rank = r;
    o.world_size = n;
    o.job_id = job;
    o.timeout_s = 30;  // far above the bound we check: a hang would show
    Communicator comm(o);
    comm.barrier();
    auto t0 = std::chrono::steady_clock::now();
    std::string what;
    auto run = [&](const std::function<void()>& f) {
      try {
        f();
      } catch (const MismatchError& e) {
        what = e.what();
      } catch (const Error& e) {
        SHMRING_CHILD_CHECK(false, "rank %d: expected MismatchError, got code %d: %s", r,
                            static_cast<int>(e.code()), e.what());
      }
    };
    run([&] { call(comm); });
    if (what.empty() && or_next_call) run([&] { comm.barrier(); });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SHMRING_CHILD_CHECK(!what.empty(), "rank %d: no error", r);
    SHMRING_CHILD_CHECK(what.find(needle) != std::string::npos, "rank %d: message '%s' lacks '%s'",
                        r, what.c_str(), needle);
    // Usually milliseconds; the bound only has to tell the check apart from
    // the 30 s timeout, with room for the loaded CI VM's rare stalls of a
    // second (tests/faults/faults.hpp, kDetectionBoundS).
    SHMRING_CHILD_CHECK(s < 5.0, "rank %d: took %.3f s", r, s);
    bool refused = false;
    try {
      comm.barrier();
    } catch (const Error&) {
      refused = true;
    }
    SHMRING_CHILD_CHECK(refused, "rank %d: communicator still accepts work", r);
    if (r == 0) std::fprintf(stderr, "(expected, after %.1f ms) %s\n", s * 1e3, what.c_str());
  });
  for (int r = 0; r < n; ++r) CHECK_MESSAGE(status[r] == 0, "rank ", r, " status ", status[r]);
}

}  // namespace

TEST_CASE("rank 0 passes count N while the others pass N-2") {
  for (int n : {3, 5}) {
    for (std::size_t scale : {1u, 100000u}) {  // direct path, then ring
      expect_mismatch(
          n,
          [n, scale](Communicator& c) {
            std::size_t count = (c.rank() == 0 ? n : n - 2) * scale;
            std::vector<float> x(count, 1.0f);
            c.allreduce(std::span<float>(x), ReduceOp::sum);
          },
          "count=");
    }
  }
}

TEST_CASE("an allreduce that fits one line against one that does not, and barrier vs allreduce") {
  // 26 float32 take the low-latency path, 27 the direct path: the
  // ranks disagree on the path as well as the count, and still every rank
  // gets the mismatch.
  for (int n : {2, 3}) {
    expect_mismatch(
        n,
        [](Communicator& c) {
          std::vector<float> x(c.rank() == 0 ? 26 : 27, 1.0f);
          c.allreduce(std::span<float>(x), ReduceOp::sum);
        },
        "count=");
    expect_mismatch(
        n,
        [n](Communicator& c) {
          std::vector<float> x(2, 1.0f);
          if (c.rank() == n - 1)
            c.barrier();
          else
            c.allreduce(std::span<float>(x), ReduceOp::sum);
        },
        "barrier");
  }
}

TEST_CASE("allgather and alltoall that fit one line against ones that do not, and each other") {
  // 26 float32 per rank (allgather) or in the whole send buffer (alltoall)
  // take the low-latency path; one more takes the direct or staged path.
  for (int n : {2, 3}) {
    expect_mismatch(
        n,
        [n](Communicator& c) {
          const std::size_t count = c.rank() == 0 ? 26 : 27;
          std::vector<float> x(count, 1.0f), y(count * n);
          c.allgather(x.data(), y.data(), count, DataType::float32);
        },
        "count=");
    expect_mismatch(
        n,
        [n](Communicator& c) {
          const std::size_t count = c.rank() == 0 ? 26 / n : 26 / n + 1;
          std::vector<float> x(count * n, 1.0f), y(count * n);
          c.alltoall(x.data(), y.data(), count, DataType::float32);
        },
        "count=");
    // allgatherv: one line per block up to 26 float32; the recv_counts
    // travel as a hash in the line, so ranks on the line that disagree on
    // them are told, as is one whose counts take the staged path.
    for (std::size_t last : {std::size_t{2}, std::size_t{27}})
      expect_mismatch(
          n,
          [n, last](Communicator& c) {
            std::vector<std::size_t> counts(n, 1), displs(n);
            if (c.rank() == 0) counts[n - 1] = last;
            for (int q = 1; q < n; ++q) displs[q] = displs[q - 1] + counts[q - 1];
            std::vector<float> x(counts[c.rank()], 1.0f), y(displs[n - 1] + counts[n - 1]);
            c.allgatherv(x.data(), x.size(), y.data(), counts, displs, DataType::float32);
          },
          "passed different recv_counts");
    expect_mismatch(
        n,
        [n](Communicator& c) {
          std::vector<float> x(n, 1.0f), y(n * n);
          if (c.rank() == n - 1)
            c.allgather(x.data(), y.data(), 1, DataType::float32);
          else
            c.alltoall(x.data(), y.data(), 1, DataType::float32);
        },
        "alltoall(count=1");
  }
}

TEST_CASE("datatype float32 against bfloat16") {
  for (const char* algo : {"direct", "ring"}) {
    expect_mismatch(
        4,
        [](Communicator& c) {
          std::vector<float> x(1000, 1.0f);
          DataType t = c.rank() == 2 ? DataType::bfloat16 : DataType::float32;
          c.allreduce(x.data(), x.data(), 1000, t, ReduceOp::sum);
        },
        "bfloat16", algo);
  }
}

TEST_CASE("rank 0 calls allreduce then broadcast, the others broadcast then allreduce") {
  for (std::size_t count : {10u, 200000u}) {
    expect_mismatch(
        3,
        [count](Communicator& c) {
          std::vector<float> x(count, 1.0f);
          if (c.rank() == 0) {
            c.allreduce(std::span<float>(x), ReduceOp::sum);
            c.broadcast(std::span<float>(x), 0);
          } else {
            c.broadcast(std::span<float>(x), 0);
            c.allreduce(std::span<float>(x), ReduceOp::sum);
          }
        },
        "broadcast");
  }
}

TEST_CASE("different roots, different operators, and a rank that rejects its arguments") {
  expect_mismatch(
      3,
      [](Communicator& c) {
        std::vector<std::int32_t> x(100000, 1);
        c.broadcast(std::span<std::int32_t>(x), c.rank() == 1 ? 1 : 0);
      },
      "root=", nullptr, /*or_next_call=*/true);
  expect_mismatch(
      2,
      [](Communicator& c) {
        std::vector<std::int32_t> x(8, 1);
        c.allreduce(std::span<std::int32_t>(x), c.rank() == 0 ? ReduceOp::sum : ReduceOp::max);
      },
      "max");
  // Rank 1 asks for avg on int32: it gets InvalidArgumentError, and the
  // others a mismatch naming its invalid call instead of a hang.
  auto status = test::run_ranks(
      3,
      [](Communicator& c) {
        std::vector<std::int32_t> x(8, 1);
        try {
          c.allreduce(std::span<std::int32_t>(x), c.rank() == 1 ? ReduceOp::avg : ReduceOp::sum);
          SHMRING_CHILD_CHECK(false, "rank %d: no error", c.rank());
        } catch (const InvalidArgumentError& e) {
          SHMRING_CHILD_CHECK(c.rank() == 1, "rank %d: unexpected InvalidArgumentError", c.rank());
        } catch (const MismatchError& e) {
          SHMRING_CHILD_CHECK(std::string(e.what()).find("invalid call") != std::string::npos,
                              "message: %s", e.what());
        }
      },
      20);
  CHECK(test::all_zero(status));
}

TEST_CASE(
    "two ranks agree on a root the third disagrees with: every rank fails, none returns data") {
  // Found by a new user: ranks 1 and 2 called broadcast(root=1), rank 0
  // broadcast(root=0); rank 2 checked only its root (or its left neighbour)
  // and returned root 1's data in 2 of 3 runs. Now each rank checks every
  // rank's descriptor, on both paths. With more slices than slots (2^21
  // floats are 32 slices of 256 KiB; where oversubscribed, slices of 64 KiB,
  // 200000 floats are 13) the rank that believes itself root 0 filled its
  // slots for a right neighbour that, root itself, never read them, and
  // waited out the timeout; now a writer checks its right neighbour before
  // it waits.
  for (std::size_t count : {std::size_t{10}, std::size_t{200000}, std::size_t{1} << 21}) {
    for (const char* algo : {"direct", "ring"}) {
      expect_mismatch(
          3,
          [count](Communicator& c) {
            std::vector<float> x(count, static_cast<float>(c.rank()));
            c.broadcast(x.data(), count, DataType::float32, c.rank() == 0 ? 0 : 1);
          },
          "root", algo);
      expect_mismatch(
          3,
          [count](Communicator& c) {
            std::vector<float> x(count, 1.0f), y(count);
            c.reduce(x.data(), y.data(), count, DataType::float32, ReduceOp::sum,
                     c.rank() == 0 ? 0 : 1);
          },
          "root", algo);
    }
  }
}
