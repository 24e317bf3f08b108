// Communicator::reject_call and shmring_reject: a binding layer's refusal of
// a collective reaches the peers in call order. Refused on one rank, every
// rank fails at once (the peers with MismatchError naming that rank) and the
// communicator is broken on all; refused on every rank, it stays usable; a
// refusal behind pending requests keeps their order.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <numeric>
#include <vector>

#include "harness.hpp"
#include "shmring/shmring.h"

using namespace shmring;

namespace {

using Clock = std::chrono::steady_clock;

// Far above the bound checked below: a peer that waited would show.
Options slow_timeout() {
  Options o;
  o.timeout_s = 30;
  return o;
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Distinct per (rank, index).
std::vector<float> values(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank * 1000 + i);
  return v;
}

template <class E, class F>
std::string expect_throw(int r, F&& f, const char* needle) {
  try {
    f();
  } catch (const E& e) {
    SHMRING_CHILD_CHECK(std::string(e.what()).find(needle) != std::string::npos,
                        "rank %d: message '%s' lacks '%s'", r, e.what(), needle);
    return e.what();
  } catch (const Error& e) {
    SHMRING_CHILD_CHECK(false, "rank %d: wrong error (code %d): %s", r, static_cast<int>(e.code()),
                        e.what());
  }
  SHMRING_CHILD_CHECK(false, "rank %d: no error (expected one naming '%s')", r, needle);
  return {};
}

std::string fmt_rank_invalid(int rank) {
  return "rank " + std::to_string(rank) + " made an invalid call (it refused its arguments";
}

}  // namespace

TEST_CASE(
    "a refusal on one rank is an error on every rank at once, then the communicator is "
    "broken on all") {
  for (std::size_t n : {std::size_t{8}, std::size_t{300000}}) {  // direct path, then ring
    auto status = test::run_ranks(
        3,
        [n](Communicator& c) {
          const int r = c.rank();
          c.barrier();
          auto t0 = Clock::now();
          std::vector<float> x = values(r, n);
          if (r == 1) {
            expect_throw<InvalidArgumentError>(
                r, [&] { c.reject_call("allreduce", "buffer: dtype complex64 is not supported"); },
                "rank 1: allreduce: buffer: dtype complex64");
          } else {
            expect_throw<MismatchError>(
                r, [&] { c.allreduce(x.data(), x.data(), n, DataType::float32, ReduceOp::sum); },
                "rank 1 made an invalid call (it refused its arguments: rank 1: allreduce: "
                "buffer: dtype complex64 is not supported)");
          }
          SHMRING_CHILD_CHECK(since(t0) < 5.0, "rank %d: took %.1f s", r, since(t0));
          expect_throw<AbortedError>(
              r, [&] { c.barrier(); }, "unusable");
        },
        120, slow_timeout());
    CHECK(test::all_zero(status));
  }
}

// A scatter's root and a gather's non-roots return without waiting on the
// eager paths (small blocks: the eager ring; bigger ones: a direct buffer).
// A rank that refused the call settles it at its next call, before that
// call moves data: the next call fails on every rank, with every buffer
// untouched, instead of succeeding on some ranks and failing on others.
TEST_CASE("a refused eager scatter or gather fails the next call on every rank") {
  struct Case {
    bool scatter;
    int refuser;  // scatter: a non-root; gather: the root
    std::size_t count;
  };
  for (int n : {2, 3})
    for (Case k :
         {Case{true, 1, 4}, Case{true, 1, 2000}, Case{false, 0, 4}, Case{false, 0, 2000}}) {
      CAPTURE(n);
      CAPTURE(k.scatter);
      CAPTURE(k.count);
      auto status = test::run_ranks(
          n,
          [k](Communicator& c) {
            const int r = c.rank(), size = c.size();
            const std::size_t count = k.count;
            std::vector<float> all = values(r, count * static_cast<std::size_t>(size));
            std::vector<float> mine = values(r, count);
            const char* what = k.scatter ? "scatter" : "gather";
            // A rank that waits for the refuser in the refused call itself
            // (a scatter's reader, when the refuser settled first) fails there.
            bool failed = false;
            if (r == k.refuser) {
              expect_throw<InvalidArgumentError>(
                  r, [&] { c.reject_call(what, "out: read-only"); }, "out: read-only");
            } else {
              try {
                if (k.scatter)
                  c.scatter(r == 0 ? all.data() : nullptr, mine.data(), count, DataType::float32,
                            0);
                else
                  c.gather(mine.data(), nullptr, count, DataType::float32, 0);
              } catch (const MismatchError& e) {
                SHMRING_CHILD_CHECK(r != 0 || !k.scatter, "rank %d: the eager root waited: %s", r,
                                    e.what());
                SHMRING_CHILD_CHECK(
                    std::string(e.what()).find(fmt_rank_invalid(k.refuser)) != std::string::npos,
                    "rank %d: %s", r, e.what());
                failed = true;
              }
            }
            std::vector<float> x = values(r, 1000);
            const std::vector<float> before = x;
            if (r == k.refuser || failed)
              expect_throw<AbortedError>(
                  r, [&] { c.allreduce(std::span<float>(x), ReduceOp::sum); },
                  "made an invalid call (it refused its arguments");
            else
              expect_throw<MismatchError>(
                  r, [&] { c.allreduce(std::span<float>(x), ReduceOp::sum); },
                  fmt_rank_invalid(k.refuser).c_str());
            SHMRING_CHILD_CHECK(x == before, "rank %d: the failed allreduce wrote its buffer", r);
            expect_throw<AbortedError>(
                r, [&] { c.barrier(); }, "unusable");
          },
          120, slow_timeout());
      CHECK(test::all_zero(status));
    }
}

// A rank that fails a collective because a peer refused it returns with its
// output as it was: the own block, which never travels, is copied only once
// every peer's call was checked, and nothing else lands before that either
// (a gather's root or a ring rank takes no peer's block first). Each
// collective at the sizes of its paths (one line, a direct buffer or eager
// entry, staged rounds or the ring; the ring for every size with
// SHMRING_ALGO=ring, N=2 for alltoallv's line, N=5 for a refusing rank that
// is no neighbour of the ranks it stops); the roots are rank 0.
TEST_CASE("a peer's refusal leaves the failing ranks' outputs untouched") {
  const char* names[] = {"allgather", "alltoall",  "allgatherv", "alltoallv", "gather",
                         "scatter",   "broadcast", "allreduce",  "reduce",    "reduce_scatter"};
  struct Job {
    int n, refuser;
    const char* algo;  // SHMRING_ALGO, or null: the default choice
  };
  for (Job job : {Job{3, 1, nullptr}, Job{3, 2, nullptr}, Job{2, 1, nullptr}, Job{3, 2, "ring"},
                  Job{2, 1, "ring"}, Job{5, 2, "ring"}})
    for (const char* name : names)
      for (std::size_t count : {std::size_t{2}, std::size_t{600}, std::size_t{100000}}) {
        const int refuser = job.refuser;
        const std::string label = std::string(name) + " of " + std::to_string(count) +
                                  " at N=" + std::to_string(job.n) + ", refused by rank " +
                                  std::to_string(refuser) +
                                  ", SHMRING_ALGO=" + (job.algo ? job.algo : "auto");
        CAPTURE(label);
        if (job.algo) setenv("SHMRING_ALGO", job.algo, 1);  // the ranks inherit it
        auto status = test::run_ranks(
            job.n,
            [name, count, refuser](Communicator& c) {
              const int r = c.rank(), n = c.size();
              const std::string what = name;
              const std::size_t all = count * static_cast<std::size_t>(n);
              std::vector<float> send = values(r, all);
              std::vector<float> out(all, -7.0f);
              const std::vector<std::size_t> counts(n, count);
              std::vector<std::size_t> displs(n);
              for (int j = 0; j < n; ++j) displs[j] = count * static_cast<std::size_t>(j);
              if (r == refuser) {
                expect_throw<InvalidArgumentError>(
                    r, [&] { c.reject_call(name, "out: read-only"); }, "out: read-only");
                return;
              }
              bool failed = false;
              try {
                if (what == "allgather")
                  c.allgather(send.data(), out.data(), count, DataType::float32);
                else if (what == "alltoall")
                  c.alltoall(send.data(), out.data(), count, DataType::float32);
                else if (what == "allgatherv")
                  c.allgatherv(send.data(), count, out.data(), counts, displs, DataType::float32);
                else if (what == "alltoallv")
                  c.alltoallv(send.data(), counts, displs, out.data(), counts, displs,
                              DataType::float32);
                else if (what == "gather")
                  c.gather(send.data(), r == 0 ? out.data() : nullptr, count, DataType::float32, 0);
                else if (what == "scatter")
                  c.scatter(r == 0 ? send.data() : nullptr, out.data(), count, DataType::float32,
                            0);
                else if (what == "reduce_scatter")
                  c.reduce_scatter(send.data(), out.data(), count, DataType::float32,
                                   ReduceOp::sum);
                else if (what == "allreduce")
                  c.allreduce(send.data(), out.data(), all, DataType::float32, ReduceOp::sum);
                else if (what == "reduce")
                  c.reduce(send.data(), r == 0 ? out.data() : nullptr, all, DataType::float32,
                           ReduceOp::sum, 0);
                else
                  c.broadcast(r == 0 ? send.data() : out.data(), all, DataType::float32, 0);
              } catch (const MismatchError& e) {
                SHMRING_CHILD_CHECK(
                    std::string(e.what()).find(fmt_rank_invalid(refuser)) != std::string::npos,
                    "rank %d: %s", r, e.what());
                failed = true;
              }
              // An eager gather's non-root, an eager scatter's ranks (its
              // readers check the root only) and a broadcast's root may
              // return and fail at their next call instead.
              if (!failed) {
                SHMRING_CHILD_CHECK((what == "gather" && r != 0) ||
                                        (what == "broadcast" && r == 0) ||
                                        (what == "scatter" && count <= 600),
                                    "rank %d: %s did not fail", r, name);
                return;
              }
              for (std::size_t i = 0; i < all; ++i)
                SHMRING_CHILD_CHECK(out[i] == -7.0f, "rank %d: %s wrote out[%zu] = %g", r, name, i,
                                    out[i]);
            },
            120, slow_timeout());
        unsetenv("SHMRING_ALGO");
        CHECK(test::all_zero(status));
      }
}

// The refusing rank destroys its communicator after refusing a small
// scatter whose root has returned (a message from the root says so): the
// root's next call names the refused scatter, not only a departed rank.
TEST_CASE("a refusal is settled when the refusing rank destroys its communicator") {
  const std::string job = test::unique_job_id("rejx");
  auto status = test::run_processes(2, [&](int r) {
    Options o = slow_timeout();
    o.rank = r;
    o.world_size = 2;
    o.job_id = job;
    auto c = std::make_unique<Communicator>(o);
    std::vector<float> all = values(r, 8), mine(4);
    if (r == 1) {
      expect_throw<InvalidArgumentError>(
          r, [&] { c->reject_call("scatter", "out: read-only"); }, "out: read-only");
      int started = 0;
      c->recv(&started, 1, DataType::int32, 0, 0);
      c.reset();
      return;
    }
    c->scatter(all.data(), mine.data(), 4, DataType::float32, 0);  // eager: returns
    int started = 1;
    c->send(&started, 1, DataType::int32, 1, 0);
    std::vector<float> x = values(r, 4);
    expect_throw<MismatchError>(
        r, [&] { c->allreduce(std::span<float>(x), ReduceOp::sum); },
        "rank 1 made an invalid call (it refused its arguments: rank 1: scatter: out: read-only)");
  });
  CHECK(test::all_zero(status));
}

// Every rank that refused a call another rank ran hears the same thing next:
// AbortedError, its first error having been its own refusal.
TEST_CASE("two ranks refuse what a third runs: both refusers get AbortedError next") {
  auto status = test::run_ranks(
      3,
      [](Communicator& c) {
        const int r = c.rank();
        std::vector<float> x = values(r, 8), all(24);
        if (r == 0)
          expect_throw<MismatchError>(
              r, [&] { c.allgather(x.data(), all.data(), 8, DataType::float32); },
              "made an invalid call (it refused its arguments");
        else
          expect_throw<InvalidArgumentError>(
              r, [&] { c.reject_call("allgather", "out: too small"); }, "out: too small");
        // The refused call took its place in the order; the failed one did
        // not complete (communicator.hpp, collective_count).
        SHMRING_CHILD_CHECK(c.collective_count() == (r == 0 ? 0u : 1u), "rank %d: %llu collectives",
                            r, static_cast<unsigned long long>(c.collective_count()));
        for (int i = 0; i < 2; ++i)
          expect_throw<AbortedError>(
              r, [&] { c.allreduce(std::span<float>(x), ReduceOp::sum); }, "unusable");
      },
      120, slow_timeout());
  CHECK(test::all_zero(status));
}

TEST_CASE("refused on every rank: nobody waits and the communicator stays usable") {
  auto status = test::run_ranks(
      3,
      [](Communicator& c) {
        const int r = c.rank();
        for (int i = 0; i < 100; ++i)  // more than the descriptor ring holds
          expect_throw<InvalidArgumentError>(
              r, [&] { c.reject_call("reduce", "bad root"); }, "reduce: bad root");
        std::vector<float> x = values(r, 1000);
        c.allreduce(std::span<float>(x), ReduceOp::sum);
        for (std::size_t i = 0; i < x.size(); ++i)
          SHMRING_CHILD_CHECK(x[i] == static_cast<float>(3000 + 3 * i), "rank %d: x[%zu] = %g", r,
                              i, x[i]);
        SHMRING_CHILD_CHECK(c.collective_count() == 101, "rank %d: %llu collectives", r,
                            static_cast<unsigned long long>(c.collective_count()));
      },
      120, slow_timeout());
  CHECK(test::all_zero(status));
}

TEST_CASE("a refusal behind pending requests keeps the call order") {
  auto status = test::run_ranks(
      3,
      [](Communicator& c) {
        const int r = c.rank();
        const std::size_t n = 100000;
        std::vector<float> a = values(r, n), b = values(r, n);
        Request ra = c.iallreduce(a.data(), a.data(), n, DataType::float32, ReduceOp::sum);
        Request rb = c.iallreduce(b.data(), b.data(), n, DataType::float32, ReduceOp::max);
        Request rc;
        std::vector<float> z = values(r, n);
        if (r == 2) {
          expect_throw<InvalidArgumentError>(
              r, [&] { c.reject_call("allreduce", "out: wrong size"); }, "rank 2");
        } else {
          rc = c.iallreduce(z.data(), z.data(), n, DataType::float32, ReduceOp::sum);
        }
        ra.wait();
        rb.wait();
        for (std::size_t i = 0; i < n; i += 997) {
          SHMRING_CHILD_CHECK(a[i] == static_cast<float>(3000 + 3 * i), "rank %d: a[%zu] = %g", r,
                              i, a[i]);
          SHMRING_CHILD_CHECK(b[i] == static_cast<float>(2000 + i), "rank %d: b[%zu] = %g", r, i,
                              b[i]);
        }
        if (r != 2)
          expect_throw<MismatchError>(
              r, [&] { rc.wait(); },
              "rank 2 made an invalid call (it refused its arguments: rank 2: allreduce: out: "
              "wrong size)");
        expect_throw<AbortedError>(
            r, [&] { c.barrier(); }, "unusable");
      },
      120, slow_timeout());
  CHECK(test::all_zero(status));
}

TEST_CASE("shmring_reject: SHMRING_ERR_INVALID_ARGUMENT here, a mismatch on the peer") {
  const std::string job = test::unique_job_id("crej");
  auto status = test::run_processes(2, [&](int r) {
    setenv("SHMRING_TIMEOUT", "30", 1);
    shmring_comm_t comm = nullptr;
    SHMRING_CHILD_CHECK(shmring_comm_init(&comm, r, 2, job.c_str()) == SHMRING_SUCCESS,
                        "rank %d: init: %s", r, shmring_get_last_error(nullptr));
    float x[4] = {1, 2, 3, 4};
    auto t0 = Clock::now();
    if (r == 0) {
      shmring_result_t rc = shmring_reject(comm, "allreduce", "send: not a float array");
      SHMRING_CHILD_CHECK(rc == SHMRING_ERR_INVALID_ARGUMENT, "rank 0: shmring_reject gave %d",
                          static_cast<int>(rc));
      const std::string m = shmring_get_last_error(comm);
      SHMRING_CHILD_CHECK(m.find("rank 0: allreduce: send: not a float array") != std::string::npos,
                          "rank 0: message '%s'", m.c_str());
    } else {
      shmring_result_t rc = shmring_allreduce(x, x, 4, SHMRING_FLOAT32, SHMRING_SUM, comm);
      SHMRING_CHILD_CHECK(rc == SHMRING_ERR_MISMATCH, "rank 1: allreduce gave %d: %s",
                          static_cast<int>(rc), shmring_get_last_error(comm));
      const std::string m = shmring_get_last_error(comm);
      SHMRING_CHILD_CHECK(m.find("rank 0 made an invalid call") != std::string::npos,
                          "rank 1: message '%s'", m.c_str());
    }
    SHMRING_CHILD_CHECK(since(t0) < 5.0, "rank %d: took %.1f s", r, since(t0));
    SHMRING_CHILD_CHECK(shmring_barrier(comm) == SHMRING_ERR_ABORTED, "rank %d: barrier after", r);
    SHMRING_CHILD_CHECK(shmring_reject(nullptr, "x", "y") == SHMRING_ERR_INVALID_ARGUMENT,
                        "rank %d: NULL comm", r);
    shmring_comm_destroy(comm);
  });
  CHECK(test::all_zero(status));
}
