// The staged collectives (alltoall, alltoallv, gather, scatter, allgatherv,
// reduce_scatter_v) against a serial reference, on real forked ranks:
// N in {1, 2, 3, 5, 8}, counts 0, 1, uneven, zeros in the middle of a
// v-vector, 2^20+3 (at N <= 3), every root, in place where MPI allows it,
// blocking and non-blocking; every input element distinct per (rank, index)
// so a wrong offset cannot pass. Mismatches fail every rank with a
// MismatchError naming the values.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "harness.hpp"

using namespace shmring;
using test::run_ranks;

namespace {

const std::vector<int> kSizes = {1, 2, 3, 5, 8};
// Eager gathers and scatters of blocks up to 488 bytes may run this many
// collectives ahead (src/transport/layout.hpp kEagerEntries): a rank that left one
// early hears of a disagreement within that many later calls.
constexpr int kRunAhead = 32;
constexpr std::size_t kBig = (1u << 20) + 3;

// Distinct per (rank, index) for rank < 8 and index < 2^24.
std::int32_t val(int rank, std::size_t i) {
  return static_cast<std::int32_t>((static_cast<std::uint32_t>(rank) << 24) + i + 1);
}

std::vector<std::size_t> counts_for(int n) {  // uneven, with zeros in the middle
  std::vector<std::size_t> c(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j)
    c[j] = (n > 2 && j == n / 2) ? 0 : static_cast<std::size_t>(3 * j + 1);
  return c;
}

// Displacements in reverse rank order, with a gap of 2 elements between
// blocks, so a rank-order layout would land wrong. Returns the buffer size.
std::size_t reverse_displs(const std::vector<std::size_t>& counts, std::vector<std::size_t>& d) {
  d.assign(counts.size(), 0);
  std::size_t at = 1;
  for (std::size_t k = counts.size(); k-- > 0;) {
    d[k] = at;
    at += counts[k] + 2;
  }
  return at;
}

void check_all(const std::vector<int>& st) {
  for (std::size_t r = 0; r < st.size(); ++r)
    CHECK_MESSAGE(st[r] == 0, "rank ", r, " status ", st[r]);
}

// Blocking, or the i-form waited on at once (alternating exercises both).
template <class F, class G>
void call(bool nonblocking, F blocking, G immediate) {
  if (nonblocking) {
    Request q = immediate();
    q.wait();
  } else {
    blocking();
  }
}

// allgatherv of val(rank, i) blocks of rc[rank] elements, laid out by
// reverse_displs: out of place (blocking), then in place (the i-form when
// `nb_in_place`); every element of every block, and nothing in the gaps.
void allgatherv_both_forms(Communicator& c, const std::vector<std::size_t>& rc, bool nb_in_place,
                           const char* what) {
  const int me = c.rank();
  std::vector<std::size_t> d;
  std::vector<std::int32_t> out(reverse_displs(rc, d), -7), in(rc[me]);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = val(me, i);
  for (bool in_place : {false, true}) {
    std::fill(out.begin(), out.end(), -7);
    const void* send = in.data();
    if (in_place) {
      std::copy(in.begin(), in.end(), out.begin() + static_cast<long>(d[me]));
      send = out.data() + d[me];
    }
    call(
        in_place && nb_in_place,
        [&] { c.allgatherv(send, rc[me], out.data(), rc, d, DataType::int32); },
        [&] { return c.iallgatherv(send, rc[me], out.data(), rc, d, DataType::int32); });
    for (std::size_t j = 0; j < rc.size(); ++j)
      for (std::size_t i = 0; i < rc[j]; ++i)
        SHMRING_CHILD_CHECK(out[d[j] + i] == val(static_cast<int>(j), i),
                            "%s: rank %d in_place %d from %zu [%zu] = %d", what, me, in_place, j, i,
                            out[d[j] + i]);
    std::size_t touched = 0;
    for (auto x : out) touched += x != -7;
    SHMRING_CHILD_CHECK(touched == std::accumulate(rc.begin(), rc.end(), std::size_t{0}),
                        "%s: rank %d in_place %d wrote outside the blocks", what, me, in_place);
  }
}

}  // namespace

TEST_CASE("alltoall: block j of rank i lands in block i of rank j") {
  for (int n : kSizes) {
    std::vector<std::size_t> counts = {0, 1, 7, 1000};
    if (n <= 3) counts.push_back(kBig);
    INFO("n=", n);
    check_all(run_ranks(n, [&](Communicator& c) {
      int me = c.rank();
      int round = 0;
      for (std::size_t count : counts) {
        const std::size_t total = count * n;
        std::vector<std::int32_t> in(total), out(total, -1);
        for (std::size_t i = 0; i < total; ++i) in[i] = val(me, i);
        const bool nb = (round++ % 2) == 1;
        call(
            nb, [&] { c.alltoall(in.data(), out.data(), count, DataType::int32); },
            [&] { return c.ialltoall(in.data(), out.data(), count, DataType::int32); });
        for (int j = 0; j < n; ++j)
          for (std::size_t i = 0; i < count; ++i)
            SHMRING_CHILD_CHECK(out[j * count + i] == val(j, me * count + i),
                                "rank %d count %zu nb %d: block %d [%zu] = %d, expected %d", me,
                                count, nb, j, i, out[j * count + i], val(j, me * count + i));
      }
      // 2-byte elements and 8-byte elements through the same lanes.
      std::vector<std::uint16_t> h(5 * n), ho(5 * n);
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::uint16_t>(me * 1000 + i);
      c.alltoall(h.data(), ho.data(), 5, DataType::float16);
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < 5; ++i)
          SHMRING_CHILD_CHECK(ho[j * 5 + i] == j * 1000 + me * 5 + i, "float16 block %d", j);
    }));
  }
}

TEST_CASE("alltoallv: uneven counts, zeros, displacements out of rank order") {
  // Without zeros too: at N=2 the zero rule empties both cross blocks, and
  // small ones travel in the low-latency line (low_latency.cpp).
  for (bool zeros : {true, false})
    for (int n : kSizes) {
      INFO("n=", n, " zeros=", zeros);
      for (bool big : {false, true}) {
        if (big && n > 3) continue;
        check_all(run_ranks(n, [&](Communicator& c) {
          const int me = c.rank();
          // f(i, j): elements rank i sends to rank j (0 for some pairs).
          auto f = [&](int i, int j) -> std::size_t {
            if (big && i == 0 && j == n - 1) return kBig;
            if (zeros && (i + j) % 3 == 1) return 0;
            return static_cast<std::size_t>(i * 5 + j * 2 + 1);
          };
          std::vector<std::size_t> sc(n), rc(n), sd, rd;
          for (int j = 0; j < n; ++j) {
            sc[j] = f(me, j);
            rc[j] = f(j, me);
          }
          std::vector<std::int32_t> in(reverse_displs(sc, sd)), out(reverse_displs(rc, rd), -7);
          for (std::size_t i = 0; i < in.size(); ++i) in[i] = val(me, i);
          for (bool nb : {false, true}) {
            std::fill(out.begin(), out.end(), -7);
            call(
                nb, [&] { c.alltoallv(in.data(), sc, sd, out.data(), rc, rd, DataType::int32); },
                [&] {
                  return c.ialltoallv(in.data(), sc, sd, out.data(), rc, rd, DataType::int32);
                });
            // Rank j sent me its block at its send_displs[me] (reverse_displs of its counts).
            std::vector<std::size_t> j_sc(n), j_sd;
            for (int j = 0; j < n; ++j) {
              for (int k = 0; k < n; ++k) j_sc[k] = f(j, k);
              reverse_displs(j_sc, j_sd);
              for (std::size_t i = 0; i < rc[j]; ++i)
                SHMRING_CHILD_CHECK(out[rd[j] + i] == val(j, j_sd[me] + i),
                                    "rank %d from %d [%zu]: %d expected %d", me, j, i,
                                    out[rd[j] + i], val(j, j_sd[me] + i));
            }
            // The gaps stay untouched.
            for (std::size_t i = 0; i < out.size(); ++i) {
              bool inside = false;
              for (int j = 0; j < n; ++j) inside |= i >= rd[j] && i < rd[j] + rc[j];
              if (!inside) SHMRING_CHILD_CHECK(out[i] == -7, "rank %d wrote a gap at %zu", me, i);
            }
          }
        }));
      }
    }
}

TEST_CASE("gather: every root, counts 0, 1, uneven, big; in place at the root") {
  for (int n : kSizes) {
    std::vector<std::size_t> counts = {0, 1, 13};
    if (n <= 3) counts.push_back(kBig);
    INFO("n=", n);
    check_all(run_ranks(n, [&](Communicator& c) {
      const int me = c.rank();
      int round = 0;
      for (std::size_t count : counts)
        for (int root = 0; root < n; ++root)
          for (bool in_place : {false, true}) {
            std::vector<std::int32_t> in(count), out(count * n, -1);
            for (std::size_t i = 0; i < count; ++i) in[i] = val(me, i);
            const void* send = in.data();
            if (in_place && me == root) {
              std::copy(in.begin(), in.end(), out.begin() + static_cast<long>(root * count));
              send = out.data() + root * count;
            }
            void* recv = me == root ? out.data() : nullptr;
            const bool nb = (round++ % 2) == 1;
            call(
                nb, [&] { c.gather(send, recv, count, DataType::int32, root); },
                [&] { return c.igather(send, recv, count, DataType::int32, root); });
            if (me != root) continue;
            for (int j = 0; j < n; ++j)
              for (std::size_t i = 0; i < count; ++i)
                SHMRING_CHILD_CHECK(out[j * count + i] == val(j, i),
                                    "root %d count %zu: block %d [%zu] = %d", root, count, j, i,
                                    out[j * count + i]);
          }
    }));
  }
}

TEST_CASE("scatter: every root, counts 0, 1, uneven, big; in place at the root") {
  for (int n : kSizes) {
    std::vector<std::size_t> counts = {0, 1, 13};
    if (n <= 3) counts.push_back(kBig);
    INFO("n=", n);
    check_all(run_ranks(n, [&](Communicator& c) {
      const int me = c.rank();
      int round = 0;
      for (std::size_t count : counts)
        for (int root = 0; root < n; ++root)
          for (bool in_place : {false, true}) {
            std::vector<std::int32_t> in(me == root ? count * n : 0), out(count, -1);
            for (std::size_t i = 0; i < in.size(); ++i) in[i] = val(me, i);
            void* recv = out.data();
            if (in_place && me == root) recv = in.data() + root * count;
            const void* send = me == root ? in.data() : nullptr;
            const bool nb = (round++ % 2) == 1;
            call(
                nb, [&] { c.scatter(send, recv, count, DataType::int32, root); },
                [&] { return c.iscatter(send, recv, count, DataType::int32, root); });
            const auto* got = static_cast<const std::int32_t*>(recv);
            for (std::size_t i = 0; i < count; ++i)
              SHMRING_CHILD_CHECK(got[i] == val(root, me * count + i),
                                  "rank %d root %d count %zu [%zu] = %d", me, root, count, i,
                                  got[i]);
          }
    }));
  }
}

TEST_CASE("allgatherv: uneven counts with zeros, displacements out of order, in place") {
  // Default paths, then the ring (allgatherv_ring) at every size, with 4 KiB
  // slots so that the big block takes many rounds while the others are done
  // after the first.
  for (bool ring : {false, true})
    for (int n : kSizes) {
      INFO("n=", n, " ring=", ring);
      if (ring) setenv("SHMRING_ALGO", "ring", 1), setenv("SHMRING_SLOT_BYTES", "4096", 1);
      for (bool big : {false, true}) {
        if (big && n > 3) continue;
        check_all(run_ranks(n, [&](Communicator& c) {
          std::vector<std::size_t> rc = counts_for(n);
          if (big) rc[n - 1] = kBig;
          allgatherv_both_forms(c, rc, true, "allgatherv");
        }));
      }
      unsetenv("SHMRING_ALGO");
      unsetenv("SHMRING_SLOT_BYTES");
    }
}

TEST_CASE("allgatherv: large uneven blocks at N=2 take the ring, even ones one copy") {
  // The choice (collective_set.cpp allgatherv_algorithm) runs on real data
  // both ways: blocks of 1/3 and 2/3 of 24 MiB, then of 12 MiB each, with
  // displacements reversed and gaps, out of place and in place.
  for (bool even : {false, true}) {
    INFO("even=", even);
    check_all(run_ranks(2, [&](Communicator& c) {
      const std::size_t unit = (std::size_t{1} << 21) + 5;  // 8 MiB + 20 bytes of int32
      allgatherv_both_forms(c, {even ? unit * 3 / 2 : unit, even ? unit * 3 / 2 : 2 * unit}, false,
                            "allgatherv");
    }));
  }
}

TEST_CASE("reduce_scatter_v: int32 and float32 sum, max, in place, big blocks") {
  for (int n : kSizes) {
    INFO("n=", n);
    for (bool big : {false, true}) {
      if (big && n > 3) continue;
      check_all(run_ranks(n, [&](Communicator& c) {
        const int me = c.rank();
        std::vector<std::size_t> rc = counts_for(n);
        if (big) rc[0] = kBig;
        const std::size_t total = std::accumulate(rc.begin(), rc.end(), std::size_t{0});
        std::size_t mine = 0;
        for (int j = 0; j < me; ++j) mine += rc[j];
        auto x = [](int r, std::size_t i) {  // small, so float32 sums are exact
          return static_cast<std::int32_t>((i * 7 + static_cast<std::size_t>(r) * 131) % 1000);
        };
        std::vector<std::int32_t> in(total);
        std::vector<float> fin(total);
        for (std::size_t i = 0; i < total; ++i) {
          in[i] = x(me, i);
          fin[i] = static_cast<float>(x(me, i)) + 0.5f * static_cast<float>(me);
        }
        int round = 0;
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max})
          for (bool in_place : {false, true}) {
            std::vector<std::int32_t> work = in, out(rc[me], -1);
            std::int32_t* recv = in_place ? work.data() + mine : out.data();
            const bool nb = (round++ % 2) == 1;
            call(
                nb, [&] { c.reduce_scatter_v(work.data(), recv, rc, DataType::int32, op); },
                [&] { return c.ireduce_scatter_v(work.data(), recv, rc, DataType::int32, op); });
            for (std::size_t i = 0; i < rc[me]; ++i) {
              std::int32_t e = x(0, mine + i);
              for (int r = 1; r < n; ++r)
                e = op == ReduceOp::sum ? e + x(r, mine + i) : std::max(e, x(r, mine + i));
              SHMRING_CHILD_CHECK(recv[i] == e, "rank %d op %d in_place %d [%zu] = %d, expected %d",
                                  me, static_cast<int>(op), in_place, i, recv[i], e);
            }
          }
        std::vector<float> fout(rc[me]);
        c.reduce_scatter_v(fin.data(), fout.data(), rc, DataType::float32, ReduceOp::sum);
        for (std::size_t i = 0; i < rc[me]; ++i) {
          float e = 0;
          for (int r = 0; r < n; ++r)
            e += static_cast<float>(x(r, mine + i)) + 0.5f * static_cast<float>(r);
          SHMRING_CHILD_CHECK(fout[i] == e, "rank %d float32 [%zu] = %g, expected %g", me, i,
                              static_cast<double>(fout[i]), static_cast<double>(e));
        }
      }));
    }
  }
}

TEST_CASE("reduce_scatter_v float16 / bfloat16: the same bits as the direct allreduce") {
  // The direct allreduce reduces in rank order and rounds once (README
  // "Accuracy"); reduce_scatter_v must give each block the same bits.
  for (int n : {2, 3, 5}) {
    for (DataType dt : {DataType::float16, DataType::bfloat16})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::prod}) {
        INFO("n=", n, " dtype=", to_string(dt), " op=", to_string(op));
        setenv("SHMRING_ALGO", "direct", 1);  // read when the communicator starts
        check_all(run_ranks(n, [&](Communicator& c) {
          const int me = c.rank();
          std::vector<std::size_t> rc = counts_for(n);
          for (auto& k : rc) k *= 37;
          const std::size_t total = std::accumulate(rc.begin(), rc.end(), std::size_t{0});
          std::vector<std::uint16_t> in(total), all(total), out(rc[me]);
          for (std::size_t i = 0; i < total; ++i) {
            // 1.0 .. 2.0 with varied low mantissa bits (float16: 0x3c00.., bfloat16: 0x3f80..).
            const std::uint16_t one = dt == DataType::float16 ? 0x3c00 : 0x3f80;
            in[i] = static_cast<std::uint16_t>(one + ((i * 37 + me * 101) % 0x7f));
          }
          c.allreduce(in.data(), all.data(), total, dt, op);
          c.reduce_scatter_v(in.data(), out.data(), rc, dt, op);
          std::size_t mine = 0;
          for (int j = 0; j < me; ++j) mine += rc[j];
          for (std::size_t i = 0; i < rc[me]; ++i)
            SHMRING_CHILD_CHECK(out[i] == all[mine + i], "rank %d [%zu]: %04x vs allreduce %04x",
                                me, i, out[i], all[mine + i]);
        }));
        unsetenv("SHMRING_ALGO");
      }
  }
}

// ---- Mismatches: every rank fails with MismatchError naming the values. ----

namespace {

void expect_mismatch(int n, const std::function<void(Communicator&)>& fn, const char* needle) {
  auto status = test::run_processes(n, [&, job = test::unique_job_id("set-mm")](int r) {
    Options o;
    o.rank = r;
    o.world_size = n;
    o.job_id = job;
    o.timeout_s = 30;  // far above the bound checked: a hang would show
    Communicator comm(o);
    comm.barrier();
    auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      fn(comm);
    } catch (const MismatchError& e) {
      what = e.what();
    } catch (const Error& e) {
      SHMRING_CHILD_CHECK(false, "rank %d: expected MismatchError, got: %s", r, e.what());
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SHMRING_CHILD_CHECK(!what.empty(), "rank %d: no error", r);
    SHMRING_CHILD_CHECK(what.find(needle) != std::string::npos, "rank %d: '%s' lacks '%s'", r,
                        what.c_str(), needle);
    SHMRING_CHILD_CHECK(s < 5.0, "rank %d: took %.3f s", r, s);
    if (r == 0) std::fprintf(stderr, "(expected) %s\n", what.c_str());
  });
  check_all(status);
}

}  // namespace

TEST_CASE("alltoall: counts differ") {
  expect_mismatch(
      3,
      [](Communicator& c) {
        std::size_t count = c.rank() == 2 ? 4 : 5;
        std::vector<std::int32_t> a(count * 3), b(count * 3);
        c.alltoall(a.data(), b.data(), count, DataType::int32);
      },
      "count=4");
}

TEST_CASE("alltoallv: one pair disagrees; every rank names it, also the uninvolved ones") {
  for (int n : {2, 4}) {
    expect_mismatch(
        n,
        [n](Communicator& c) {
          std::vector<std::size_t> sc(n, 3), rc(n, 3), sd(n), rd(n);
          for (int j = 0; j < n; ++j) sd[j] = rd[j] = 3 * j;
          if (c.rank() == 1) rc[0] = 2;  // rank 0 sends 3
          std::vector<float> a(3 * n), b(3 * n);
          c.alltoallv(a.data(), sc, sd, b.data(), rc, rd, DataType::float32);
        },
        "rank 0 sends 3 elements to rank 1 (its send_counts[1]) but rank 1 expects 2");
  }
  // N=2 small blocks travel in the low-latency line (low_latency.cpp): the
  // other direction of the pair, then a rank whose counts send it to the
  // staged rounds while its peer takes the line.
  expect_mismatch(
      2,
      [](Communicator& c) {
        std::vector<std::size_t> sc = {3, 3}, rc = {3, 3}, d = {0, 3};
        if (c.rank() == 0) rc[1] = 2;  // rank 1 sends 3
        std::vector<float> a(6), b(6);
        c.alltoallv(a.data(), sc, d, b.data(), rc, d, DataType::float32);
      },
      "rank 1 sends 3 elements to rank 0 (its send_counts[0]) but rank 0 expects 2");
  expect_mismatch(
      2,
      [](Communicator& c) {
        std::vector<std::size_t> sc = {3, 3}, sd = {0, 3}, rc = {3, 3}, rd = {0, 3};
        if (c.rank() == 1) rc[0] = 300, rd[1] = 300;  // 1200 bytes: not a line
        std::vector<float> a(600), b(600);
        c.alltoallv(a.data(), sc, sd, b.data(), rc, rd, DataType::float32);
      },
      "recv_counts[i] on rank j must equal send_counts[j] on rank i");
}

TEST_CASE("gather and scatter: roots differ, counts differ") {
  expect_mismatch(
      3,
      [](Communicator& c) {
        std::vector<float> a(4), b(12);
        // A small gather's non-roots may return before the root checks
        // them; they fail at their next call at the latest.
        c.gather(a.data(), b.data(), 4, DataType::float32, c.rank() == 1 ? 2 : 0);
        c.barrier();
      },
      "root=");
  expect_mismatch(
      3,
      [](Communicator& c) {
        std::vector<float> a(12), b(4);
        c.scatter(a.data(), b.data(), c.rank() == 0 ? 4 : 3, DataType::float32, 0);
        c.barrier();  // a small scatter's root may return first, as above
      },
      "count=");
}

TEST_CASE(
    "small gather: a non-root that left early fails within kRunAhead calls when roots differ") {
  // The later calls are small gathers (the rank leaves early again),
  // barriers, or big gathers (staged rounds). Cases: one rank names another
  // root (the root catches it); two ranks each name the other (nobody is
  // the root in its own view: a later call's check catches it).
  for (int next = 0; next < 3; ++next)
    for (int scenario = 0; scenario < 2; ++scenario) {
      INFO("next=", next, " scenario=", scenario);
      const int n = scenario == 0 ? 4 : 2;
      auto st = run_ranks(n, [&](Communicator& c) {
        const int me = c.rank();
        c.barrier();
        const int root = scenario == 0 ? (me == 3 ? 1 : 0) : 1 - me;
        std::vector<float> a(4, static_cast<float>(me)), b(4 * n);
        int failed_at = 0, later = 0;
        std::string what;
        try {
          c.gather(a.data(), b.data(), 4, DataType::float32, root);
          failed_at = 2;
          for (int i = 0; i < kRunAhead; ++i) {
            ++later;
            if (next == 0) c.gather(a.data(), b.data(), 4, DataType::float32, 0);
            if (next == 1) c.barrier();
            if (next == 2) {
              std::vector<float> big(100000), all(me == 0 ? 100000 * n : 0);
              c.gather(big.data(), all.data(), 100000, DataType::float32, 0);
            }
          }
          failed_at = 3;
        } catch (const MismatchError& e) {
          what = e.what();
        } catch (const Error& e) {
          SHMRING_CHILD_CHECK(false, "rank %d: expected MismatchError, got: %s", me, e.what());
        }
        SHMRING_CHILD_CHECK(failed_at < 3, "rank %d: all calls returned", me);
        // A barrier proves the readers are past the eager call: its end
        // confirms it at once, without waiting for the run-ahead bound (a
        // rank with nothing to confirm may finish that barrier before the
        // abort, and fails at the next).
        SHMRING_CHILD_CHECK(next != 1 || later <= 2, "rank %d: failed at barrier %d, not 1 or 2",
                            me, later);
        SHMRING_CHILD_CHECK(what.find("root=") != std::string::npos,
                            "rank %d: '%s' lacks root=", me, what.c_str());
        // Whoever checks first fails the first call (the root here in
        // scenario 0); nobody may use the communicator afterwards.
        if (scenario == 0 && me == 0) SHMRING_CHILD_CHECK(failed_at == 0, "root returned");
        bool refused = false;
        try {
          c.barrier();
        } catch (const Error&) {
          refused = true;
        }
        SHMRING_CHILD_CHECK(refused, "rank %d: communicator usable after the mismatch", me);
      });
      check_all(st);
    }
}

TEST_CASE("small scatter: a root that left early fails within kRunAhead calls when roots differ") {
  // Two ranks each think themselves the root (each returns its own block
  // at once), or a non-root names a rank that thinks itself the root.
  for (int next = 0; next < 2; ++next)
    for (int scenario = 0; scenario < 2; ++scenario) {
      INFO("next=", next, " scenario=", scenario);
      auto st = run_ranks(4, [&](Communicator& c) {
        const int me = c.rank();
        c.barrier();
        const int root = scenario == 0 ? (me == 2 ? 2 : 0) : (me == 3 ? 2 : 0);
        std::vector<float> a(16, static_cast<float>(me)), b(4);
        int failed_at = 0, later = 0;
        std::string what;
        try {
          c.scatter(a.data(), b.data(), 4, DataType::float32, root);
          failed_at = 2;
          for (int i = 0; i < kRunAhead; ++i) {
            ++later;
            if (next == 0) c.scatter(a.data(), b.data(), 4, DataType::float32, 0);
            if (next == 1) c.barrier();
          }
          failed_at = 3;
        } catch (const MismatchError& e) {
          what = e.what();
        } catch (const Error& e) {
          SHMRING_CHILD_CHECK(false, "rank %d: expected MismatchError, got: %s", me, e.what());
        }
        SHMRING_CHILD_CHECK(failed_at < 3, "rank %d: all calls returned", me);
        // A barrier proves the readers are past the eager call: its end
        // confirms it at once, without waiting for the run-ahead bound (a
        // rank with nothing to confirm may finish that barrier before the
        // abort, and fails at the next).
        SHMRING_CHILD_CHECK(next != 1 || later <= 2, "rank %d: failed at barrier %d, not 1 or 2",
                            me, later);
        SHMRING_CHILD_CHECK(what.find("root=") != std::string::npos,
                            "rank %d: '%s' lacks root=", me, what.c_str());
        bool refused = false;
        try {
          c.barrier();
        } catch (const Error&) {
          refused = true;
        }
        SHMRING_CHILD_CHECK(refused, "rank %d: communicator usable after the mismatch", me);
      });
      check_all(st);
    }
}

TEST_CASE(
    "small gathers and scatters back to back: ranks run ahead, buffers never overwritten early") {
  // Fixed and rotating roots, mixed with other small collectives that
  // share the direct buffers: a non-root runs up to two gathers ahead of
  // its root, so a buffer reused too early shows as a wrong value.
  for (int n : {2, 3, 5}) {
    INFO("n=", n);
    check_all(run_ranks(n, [&](Communicator& c) {
      const int me = c.rank();
      for (int it = 0; it < 300; ++it) {
        const int root = (it / 50) % 2 ? it % n : n - 1;
        const std::size_t k = static_cast<std::size_t>(it % 5 + 1);
        std::vector<std::int32_t> a(k), g(k * n, -1);
        for (std::size_t i = 0; i < k; ++i) a[i] = val(me, i + it);
        c.gather(a.data(), me == root ? g.data() : nullptr, k, DataType::int32, root);
        if (me == root)
          for (int j = 0; j < n; ++j)
            for (std::size_t i = 0; i < k; ++i)
              SHMRING_CHILD_CHECK(g[j * k + i] == val(j, i + it), "it %d from %d [%zu]", it, j, i);
        if (it % 37 == 0) {
          float x = static_cast<float>(me + it), y = 0;
          c.allreduce(&x, &y, 1, DataType::float32, ReduceOp::sum);
          SHMRING_CHILD_CHECK(y == static_cast<float>(n * (n - 1) / 2 + n * it), "allreduce %d",
                              it);
        }
        if (it % 3 == 0) {  // scatters back to back too, roots rotating
          std::vector<std::int32_t> s(k, -1), all(k * n);
          for (std::size_t i = 0; i < all.size(); ++i) all[i] = val(me, i + it);
          c.scatter(all.data(), s.data(), k, DataType::int32, (root + 1) % n);
          for (std::size_t i = 0; i < k; ++i)
            SHMRING_CHILD_CHECK(s[i] == val((root + 1) % n, me * k + i + it), "scatter %d", it);
        }
      }
    }));
  }
}

TEST_CASE("allgatherv and reduce_scatter_v: recv_counts differ (same sum too)") {
  // Blocks past 104 bytes take the staged path, which names the entry; up
  // to 104 bytes they travel in one line per rank with a hash of the
  // counts, and the message names the rank.
  for (std::size_t scale : {std::size_t{20}, std::size_t{1}})
    expect_mismatch(
        3,
        [scale](Communicator& c) {
          std::vector<std::size_t> rc = {2, 3, 4}, d = {0, 2, 5};
          if (c.rank() == 2) rc = {3, 2, 4}, d = {0, 3, 5};
          for (auto& x : rc) x *= scale;
          for (auto& x : d) x *= scale;
          std::vector<float> a(rc[c.rank()]), b(9 * scale);
          c.allgatherv(a.data(), a.size(), b.data(), rc, d, DataType::float32);
        },
        scale > 1 ? "recv_counts[0]=" : "passed different recv_counts");
  // N=2, large blocks: rank 0's counts are uneven (the ring), rank 1's even
  // (one copy), so the two paths meet; then both on the ring.
  for (bool both_ring : {false, true})
    expect_mismatch(
        2,
        [both_ring](Communicator& c) {
          const std::size_t m = std::size_t{1} << 20;  // 4 MiB of float32
          std::vector<std::size_t> rc = {m, 2 * m}, d = {0, m};
          if (c.rank() == 1)
            rc = both_ring ? std::vector<std::size_t>{m, 3 * m}
                           : std::vector<std::size_t>{3 * m / 2, 3 * m / 2};
          if (c.rank() == 1) d = {0, rc[0]};
          std::vector<float> a(rc[c.rank()]), b(rc[0] + rc[1]);
          c.allgatherv(a.data(), a.size(), b.data(), rc, d, DataType::float32);
        },
        "passed different recv_counts");
  expect_mismatch(
      3,
      [](Communicator& c) {
        std::vector<std::size_t> rc = {2, 3, 4};
        if (c.rank() == 0) rc = {2, 3, 5};
        std::vector<float> a(10), b(5);
        c.reduce_scatter_v(a.data(), b.data(), rc, DataType::float32, ReduceOp::sum);
      },
      "recv_counts[2]=");
  expect_mismatch(
      3,
      [](Communicator& c) {
        std::vector<std::size_t> rc = {2, 3, 4};
        std::vector<float> a(9), b(4);
        c.reduce_scatter_v(a.data(), b.data(), rc, DataType::float32,
                           c.rank() == 1 ? ReduceOp::max : ReduceOp::sum);
      },
      "max");
}

TEST_CASE("bad arguments: InvalidArgumentError here, MismatchError on the peers") {
  auto st = run_ranks(3, [](Communicator& c) {
    std::vector<std::size_t> sc(3, 1), d = {0, 1, 2};
    std::vector<float> a(3), b(3);
    std::string what;
    try {
      if (c.rank() == 1)
        c.alltoallv(a.data(), std::span(sc).first(2), d, b.data(), sc, d, DataType::float32);
      else
        c.alltoallv(a.data(), sc, d, b.data(), sc, d, DataType::float32);
    } catch (const InvalidArgumentError& e) {
      SHMRING_CHILD_CHECK(c.rank() == 1, "rank %d: %s", c.rank(), e.what());
      what = e.what();
      SHMRING_CHILD_CHECK(what.find("send_counts has 2 entries") != std::string::npos, "%s",
                          e.what());
    } catch (const MismatchError& e) {
      SHMRING_CHILD_CHECK(c.rank() != 1, "rank 1: %s", e.what());
      what = e.what();
    }
    SHMRING_CHILD_CHECK(!what.empty(), "rank %d: no error", c.rank());
  });
  check_all(st);
}

TEST_CASE("a pending v-collective keeps its counts while later calls bring other ones") {
  // The front reuses a v-collective's argument copies once no request holds
  // them: a queued iallgatherv must keep its own counts while a blocking
  // call and another queued one with different counts follow.
  for (int n : {2, 3}) {
    INFO("n=", n);
    check_all(run_ranks(n, [&](Communicator& c) {
      const int me = c.rank();
      for (int it = 0; it < 20; ++it) {
        std::vector<std::size_t> rc[3], d[3];
        std::vector<std::int32_t> out[3], in[3];
        for (int t = 0; t < 3; ++t) {
          rc[t].resize(n);
          for (int j = 0; j < n; ++j) rc[t][j] = static_cast<std::size_t>((j + 2 * t + it) % 4);
          if (it % 5 == 0) rc[t][0] = 20000 + t;  // some calls take data rounds
          out[t].assign(reverse_displs(rc[t], d[t]), -7);
          in[t].resize(rc[t][me]);
          for (std::size_t i = 0; i < in[t].size(); ++i) in[t][i] = val(me, i + 100 * t + it);
        }
        Request first =
            c.iallgatherv(in[0].data(), rc[0][me], out[0].data(), rc[0], d[0], DataType::int32);
        c.allgatherv(in[1].data(), rc[1][me], out[1].data(), rc[1], d[1], DataType::int32);
        Request third =
            c.iallgatherv(in[2].data(), rc[2][me], out[2].data(), rc[2], d[2], DataType::int32);
        // The caller's vectors may change once the calls returned.
        for (auto& v : rc) std::fill(v.begin(), v.end(), 0);
        first.wait();
        third.wait();
        for (int t = 0; t < 3; ++t) {
          std::size_t at = 1;  // reverse_displs: block j after blocks n-1..j+1
          std::vector<std::size_t> count(n);
          for (int j = 0; j < n; ++j) count[j] = static_cast<std::size_t>((j + 2 * t + it) % 4);
          if (it % 5 == 0) count[0] = 20000 + t;
          for (int j = n; j-- > 0;) {
            for (std::size_t i = 0; i < count[j]; ++i)
              SHMRING_CHILD_CHECK(out[t][at + i] == val(j, i + 100 * t + it),
                                  "it %d call %d block %d [%zu]", it, t, j, i);
            at += count[j] + 2;
          }
        }
      }
    }));
  }
}

namespace {

// The staged collectives share the direct buffers with the one-shot and
// two-shot paths: a rank that runs ahead must never overwrite a buffer a
// slower rank still reads. Sizes cross the one-round / many-round line.
void check_interleaved_staged(std::initializer_list<int> sizes) {
  for (int n : sizes) {
    INFO("n=", n);
    check_all(run_ranks(n, [&](Communicator& c) {
      const int me = c.rank();
      for (int it = 0; it < 40; ++it) {
        const std::size_t k = (it % 4 == 0) ? 40000 : static_cast<std::size_t>(it % 7 + 1);
        std::vector<std::int32_t> a(k * n), a_out(k * n, -1), g(k * n, -1), s(k, -1);
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = val(me, i + it);
        std::vector<float> x(k * n, static_cast<float>(me + 1)), y(k * n);
        std::vector<std::size_t> rc(n, k), d(n);
        for (int j = 0; j < n; ++j) d[j] = j * k;
        std::vector<std::int32_t> v_out(k * n, -1);
        const int root = it % n;
        std::vector<Request> reqs;
        reqs.push_back(c.ialltoall(a.data(), a_out.data(), k, DataType::int32));
        reqs.push_back(c.iallreduce(x.data(), y.data(), k * n, DataType::float32, ReduceOp::sum));
        reqs.push_back(
            c.igather(a.data(), me == root ? g.data() : nullptr, k, DataType::int32, root));
        reqs.push_back(c.iallgatherv(a.data() + me * k, k, v_out.data(), rc, d, DataType::int32));
        if (it % 2) {
          for (auto& r : reqs) r.wait();
          reqs.clear();
        }
        c.scatter(a.data(), s.data(), k, DataType::int32, root);
        c.barrier();
        for (auto& r : reqs) r.wait();
        for (int j = 0; j < n; ++j)
          for (std::size_t i = 0; i < k; ++i) {
            SHMRING_CHILD_CHECK(a_out[j * k + i] == val(j, me * k + i + it), "alltoall it %d", it);
            SHMRING_CHILD_CHECK(v_out[j * k + i] == val(j, j * k + i + it), "allgatherv it %d", it);
            if (me == root) SHMRING_CHILD_CHECK(g[j * k + i] == val(j, i + it), "gather it %d", it);
          }
        for (std::size_t i = 0; i < k; ++i)
          SHMRING_CHILD_CHECK(s[i] == val(root, me * k + i + it), "scatter it %d", it);
        for (float f : y)
          SHMRING_CHILD_CHECK(f == static_cast<float>(n * (n + 1) / 2), "allreduce it %d", it);
      }
    }));
  }
}

}  // namespace

TEST_CASE("staged collectives interleaved with direct, two-shot and ring ones, many in flight") {
  check_interleaved_staged({2, 3, 5});
}

TEST_CASE("the same with streaming stores (SHMRING_NT_STORES=1)") {
  // Streaming stores are weakly ordered: a missing fence before a publish
  // would let a reader see a stale direct buffer, slot or round buffer.
  setenv("SHMRING_NT_STORES", "1", 1);
  check_interleaved_staged({2, 3});
  unsetenv("SHMRING_NT_STORES");
}

TEST_CASE(
    "many rounds through the direct buffers (tiny slots), and big float16 blocks through "
    "the slots with the direct allreduce's bits") {
  // Slots of 2 x 4 KiB: half the slot area is smaller than a direct buffer,
  // so big blocks take many direct rounds instead.
  Options tiny;
  tiny.slots = 2;
  tiny.slot_bytes = 4096;
  for (int n : {2, 3, 5}) {
    INFO("n=", n);
    check_all(run_ranks(
        n,
        [&](Communicator& c) {
          const int me = c.rank();
          std::vector<std::size_t> rc = counts_for(n), d;
          rc[0] = 100003;
          const std::size_t total = std::accumulate(rc.begin(), rc.end(), std::size_t{0});
          std::vector<std::int32_t> out(reverse_displs(rc, d), -7), in(rc[me]);
          for (std::size_t i = 0; i < in.size(); ++i) in[i] = val(me, i);
          c.allgatherv(in.data(), rc[me], out.data(), rc, d, DataType::int32);
          for (int j = 0; j < n; ++j)
            for (std::size_t i = 0; i < rc[j]; ++i)
              SHMRING_CHILD_CHECK(out[d[j] + i] == val(j, i), "allgatherv from %d [%zu]", j, i);
          std::vector<std::int64_t> big(total), red(rc[me]);
          for (std::size_t i = 0; i < total; ++i) big[i] = val(me, i);
          c.reduce_scatter_v(big.data(), red.data(), rc, DataType::int64, ReduceOp::sum);
          std::size_t mine = 0;
          for (int j = 0; j < me; ++j) mine += rc[j];
          for (std::size_t i = 0; i < rc[me]; ++i) {
            std::int64_t e = 0;
            for (int r = 0; r < n; ++r) e += val(r, mine + i);
            SHMRING_CHILD_CHECK(red[i] == e, "reduce_scatter_v [%zu]", i);
          }
          const std::size_t k = 30011;
          std::vector<std::int32_t> a(k * n), b(k * n, -1);
          for (std::size_t i = 0; i < a.size(); ++i) a[i] = val(me, i);
          c.alltoall(a.data(), b.data(), k, DataType::int32);
          for (int j = 0; j < n; ++j)
            SHMRING_CHILD_CHECK(
                b[j * k + k - 1] == val(j, me * k + k - 1) && b[j * k] == val(j, me * k),
                "alltoall block %d", j);
        },
        120, tiny));
  }
  // Slots of 8 x 1 MiB and 1 MiB direct buffers: a 400 KB float16 block is
  // bigger than a direct lane, so it goes through the slots; the whole
  // buffer still fits the one-shot allreduce, which reduces in rank order.
  Options roomy;
  roomy.slots = 8;
  roomy.slot_bytes = 1 << 20;
  setenv("SHMRING_DIRECT_BYTES", "1048576", 1);
  setenv("SHMRING_ALGO", "direct", 1);
  check_all(run_ranks(
      3,
      [&](Communicator& c) {
        const int me = c.rank();
        std::vector<std::size_t> rc = {200000, 7, 30000};
        const std::size_t total = 230007;
        std::vector<std::uint16_t> in(total), all(total), out(rc[me]);
        for (std::size_t i = 0; i < total; ++i)
          in[i] = static_cast<std::uint16_t>(0x3c00 + ((i * 37 + me * 101) % 0x3ff));
        c.allreduce(in.data(), all.data(), total, DataType::float16, ReduceOp::sum);
        c.reduce_scatter_v(in.data(), out.data(), rc, DataType::float16, ReduceOp::sum);
        std::size_t mine = 0;
        for (int j = 0; j < me; ++j) mine += rc[j];
        for (std::size_t i = 0; i < rc[me]; ++i)
          SHMRING_CHILD_CHECK(out[i] == all[mine + i], "rank %d [%zu]: %04x vs %04x", me, i, out[i],
                              all[mine + i]);
      },
      120, roomy));
  unsetenv("SHMRING_DIRECT_BYTES");
  unsetenv("SHMRING_ALGO");
}

// ---- Eager rings: small gathers and scatters (blocks of at most 488 bytes)
// whose non-reading side runs up to kRunAhead collectives ahead.

TEST_CASE("eager rings: thousands of small gathers and scatters, every root, interleaved") {
  // Blocks of 0..40 bytes (one line of the eager rings), 44..488 (a block's
  // further lines) and 492..520 bytes (the direct buffers' eager path)
  // interleave with low-latency and direct allreduces,
  // barriers, small alltoalls, staged big gathers and the non-blocking
  // forms, so ring entries, direct buffers and slots are reused while
  // ranks run ahead. N=8 oversubscribes this 2-core machine on purpose.
  for (int n : {2, 3, 5, 8}) {
    INFO("n=", n);
    const int iters = n == 8 ? 1200 : 2500;
    check_all(run_ranks(
        n,
        [&](Communicator& c) {
          const int me = c.rank();
          for (int it = 0; it < iters; ++it) {
            // Phases of a fixed root, then a root rotating every call.
            const int root = (it / 200) % 2 ? it % n : (it / 400) % n;
            const std::size_t k = it % 7 == 0 ? static_cast<std::size_t>(11 + it % 120)
                                              : static_cast<std::size_t>(it % 11);  // 0..130
            const std::size_t base = static_cast<std::size_t>(it) * 2048;
            std::vector<std::int32_t> a(k), g(k * n, -1), s(k, -1), all(k * n);
            for (std::size_t i = 0; i < k; ++i) a[i] = val(me, base + i);
            for (std::size_t i = 0; i < all.size(); ++i) all[i] = val(me, base + i);
            if (it % 5 == 4) {
              Request q = c.igather(a.data(), g.data(), k, DataType::int32, root);
              Request r = c.iscatter(all.data(), s.data(), k, DataType::int32, (root + 1) % n);
              q.wait();
              r.wait();
            } else {
              c.gather(a.data(), me == root ? g.data() : nullptr, k, DataType::int32, root);
              c.scatter(all.data(), s.data(), k, DataType::int32, (root + 1) % n);
            }
            if (me == root)
              for (int j = 0; j < n; ++j)
                for (std::size_t i = 0; i < k; ++i)
                  SHMRING_CHILD_CHECK(g[j * k + i] == val(j, base + i),
                                      "gather it %d from %d [%zu]", it, j, i);
            for (std::size_t i = 0; i < k; ++i)
              SHMRING_CHILD_CHECK(s[i] == val((root + 1) % n, base + me * k + i),
                                  "scatter it %d [%zu]", it, i);
            if (it % 17 == 0) {
              float x = static_cast<float>(me + it), y = 0;
              c.allreduce(&x, &y, 1, DataType::float32, ReduceOp::sum);
              SHMRING_CHILD_CHECK(y == static_cast<float>(n * (n - 1) / 2 + n * it),
                                  "allreduce it %d", it);
            }
            if (it % 41 == 0) c.barrier();
            if (it % 29 == 0) {  // direct allreduce (bigger than a line)
              std::vector<std::int32_t> x(64, me + it), y(64);
              c.allreduce(x.data(), y.data(), 64, DataType::int32, ReduceOp::sum);
              SHMRING_CHILD_CHECK(y[63] == n * it + n * (n - 1) / 2, "direct allreduce it %d", it);
            }
            if (it % 31 == 0) {
              std::vector<std::int32_t> x(3 * n), y(3 * n, -1);
              for (std::size_t i = 0; i < x.size(); ++i) x[i] = val(me, base + i);
              c.alltoall(x.data(), y.data(), 3, DataType::int32);
              for (int j = 0; j < n; ++j)
                SHMRING_CHILD_CHECK(y[j * 3 + 2] == val(j, base + me * 3 + 2), "alltoall it %d",
                                    it);
            }
            if (it % 97 == 0) {  // staged rounds through the slots
              const std::size_t big = 50000;
              std::vector<std::int32_t> x(big), y(me == root ? big * n : 0);
              for (std::size_t i = 0; i < big; ++i) x[i] = val(me, i);
              c.gather(x.data(), y.data(), big, DataType::int32, root);
              if (me == root)
                for (int j = 0; j < n; ++j)
                  SHMRING_CHILD_CHECK(
                      y[j * big + big - 1] == val(j, big - 1) && y[j * big] == val(j, 0),
                      "big gather it %d from %d", it, j);
            }
          }
        },
        300));
  }
}

TEST_CASE("eager rings: the writer runs kRunAhead calls ahead before it waits for its reader") {
  // The readers do not call anything until every writer has returned from
  // kRunAhead calls (they block on a pipe): with less run-ahead this hangs
  // and the harness kills it.
  for (int kind = 0; kind < 2; ++kind)
    for (int n : {2, 4}) {
      INFO("kind=", std::string(kind == 0 ? "gather" : "scatter"), " n=", n);
      int fds[2];
      REQUIRE(pipe(fds) == 0);
      auto st = run_ranks(
          n,
          [&](Communicator& c) {
            const int me = c.rank(), root = n - 1;
            c.barrier();
            // Gather: the non-roots write; scatter: the root writes.
            const bool writer = (kind == 0) == (me != root);
            if (!writer) {
              char b[8];
              const int want = kind == 0 ? n - 1 : 1;
              for (int got = 0; got < want;)
                if (const ssize_t r = read(fds[0], b, 1); r == 1) ++got;
            }
            for (int i = 0; i < 3 * kRunAhead; ++i) {
              std::int32_t x[2] = {val(me, 2 * i), val(me, 2 * i + 1)};
              std::vector<std::int32_t> all(2 * n), out(2 * n, -1), s(2, -1);
              for (int j = 0; j < 2 * n; ++j) all[j] = val(me, 100 * i + j);
              if (kind == 0) {
                c.gather(x, out.data(), 2, DataType::int32, root);
                if (me == root)
                  for (int j = 0; j < n; ++j)
                    SHMRING_CHILD_CHECK(out[2 * j + 1] == val(j, 2 * i + 1), "gather %d", i);
              } else {
                c.scatter(all.data(), s.data(), 2, DataType::int32, root);
                SHMRING_CHILD_CHECK(s[1] == val(root, 100 * i + 2 * me + 1), "scatter %d", i);
              }
              if (writer && i == kRunAhead - 1)  // a byte per reader (scatter: n-1 of them)
                for (int j = 0; j < (kind == 0 ? 1 : n - 1); ++j)
                  SHMRING_CHILD_CHECK(write(fds[1], "x", 1) == 1, "pipe");
            }
            c.barrier();
          },
          60);
      close(fds[0]);
      close(fds[1]);
      check_all(st);
    }
}

TEST_CASE(
    "eager rings: a disagreement after many run-ahead calls fails every rank within "
    "kRunAhead calls") {
  // 40 agreeing small calls (root 0), then at call `bad` one rank
  // disagrees: its count (still eager, or past the eager line), its root,
  // or its kind (gather against scatter). Every rank must throw a
  // MismatchError at call bad + kRunAhead at the latest, never hang.
  // Non-reading ranks really run ahead here: nothing else synchronises.
  constexpr int kGood = 40;
  struct Case {
    const char* name;
    int kind;  // 0 gather, 1 scatter
    int n;
    int odd;   // the disagreeing rank
    int what;  // 0 count (eager), 1 count (direct buffers' path), 2 root, 3 kind
    const char* needle;
  };
  const Case cases[] = {
      {"gather count", 0, 4, 2, 0, "count="},       {"gather path", 0, 4, 1, 1, "count="},
      {"gather root", 0, 4, 3, 2, "root="},         {"gather vs scatter", 0, 4, 1, 3, "scatter"},
      {"gather root n=2", 0, 2, 1, 2, "root="},     {"scatter count", 1, 4, 2, 0, "count="},
      {"scatter path", 1, 3, 1, 1, "count="},       {"scatter root", 1, 4, 3, 2, "root="},
      {"scatter root is odd", 1, 4, 0, 2, "root="}, {"scatter vs gather", 1, 5, 4, 3, "gather"},
  };
  for (const Case& cs : cases) {
    INFO(std::string(cs.name));
    auto st = test::run_processes(cs.n, [&, job = test::unique_job_id("eager-mm")](int r) {
      Options o;
      o.rank = r;
      o.world_size = cs.n;
      o.job_id = job;
      o.timeout_s = 30;
      Communicator c(o);
      const int me = c.rank(), n = cs.n;
      c.barrier();
      int failed_at = -1;
      std::string what;
      try {
        for (int i = 0; i < kGood + 3 * kRunAhead; ++i) {
          const bool odd = i == kGood && me == cs.odd;
          std::size_t k = 2;
          int root = 0, kind = cs.kind;
          if (odd && cs.what == 0) k = 3;
          if (odd && cs.what == 1) k = 60;  // 240 bytes: past the eager block
          if (odd && cs.what == 2) root = 1;
          if (odd && cs.what == 3) kind = 1 - kind;
          std::vector<std::int32_t> x(k * n, me), y(k * n, -1);
          failed_at = i;
          if (kind == 0)
            c.gather(x.data(), y.data(), k, DataType::int32, root);
          else
            c.scatter(x.data(), y.data(), k, DataType::int32, root);
        }
        failed_at = -1;
      } catch (const MismatchError& e) {
        what = e.what();
      } catch (const Error& e) {
        SHMRING_CHILD_CHECK(false, "rank %d: expected MismatchError, got: %s", r, e.what());
      }
      // A rank that lags fails earlier, in a call it had not finished when
      // the abort came (its peers ran up to kRunAhead calls ahead of it).
      SHMRING_CHILD_CHECK(failed_at >= kGood - kRunAhead && failed_at <= kGood + kRunAhead,
                          "rank %d failed at call %d (the disagreement is at %d)", r, failed_at,
                          kGood);
      SHMRING_CHILD_CHECK(what.find(cs.needle) != std::string::npos, "rank %d: '%s' lacks '%s'", r,
                          what.c_str(), cs.needle);
      if (r == 0)
        std::fprintf(stderr, "(expected, %s, call %d) %s\n", cs.name, failed_at, what.c_str());
    });
    check_all(st);
  }
}

// ---- The single-copy round (staged.cpp "Single copy"): at N=2 with a CPU
// per rank, blocks of 64-256 KiB go straight from the writer's buffer to the
// reader's with process_vm_readv when every rank can read every other.

namespace {

// Every collective with a single-copy round, N=2, block sizes around its
// range (64 KiB - 256 KiB of int32): below it (inline), at both ends, in the
// middle, past it (slot rounds; a scatter's bound is 512 KiB); every root, in
// place where MPI allows it.
void single_copy_sweep(Communicator& c) {
  const int me = c.rank(), n = c.size();
  for (std::size_t count : {16383u, 16384u, 40000u, 65536u, 65537u, 100000u, 131072u, 140000u}) {
    std::vector<std::int32_t> in(count * n), out(count * n, -1);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = val(me, i);
    c.alltoall(in.data(), out.data(), count, DataType::int32);
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < count; ++i)
        SHMRING_CHILD_CHECK(out[j * count + i] == val(j, me * count + i),
                            "alltoall count %zu: block %d [%zu] = %d", count, j, i,
                            out[j * count + i]);
    for (int root = 0; root < n; ++root)
      for (bool in_place : {false, true}) {
        std::fill(out.begin(), out.end(), -1);
        const void* send = in.data();
        if (in_place && me == root) {
          std::copy_n(in.begin(), count, out.begin() + static_cast<long>(root * count));
          send = out.data() + root * count;
        }
        Request q =
            c.igather(send, me == root ? out.data() : nullptr, count, DataType::int32, root);
        q.wait();
        if (me == root)
          for (int j = 0; j < n; ++j)
            for (std::size_t i = 0; i < count; ++i)
              SHMRING_CHILD_CHECK(out[j * count + i] == val(j, i),
                                  "gather count %zu root %d: block %d [%zu] = %d", count, root, j,
                                  i, out[j * count + i]);
        std::vector<std::int32_t> part(count, -1);
        void* recv = in_place && me == root ? in.data() + root * count : part.data();
        c.scatter(me == root ? in.data() : nullptr, recv, count, DataType::int32, root);
        const auto* got = static_cast<const std::int32_t*>(recv);
        for (std::size_t i = 0; i < count; ++i)
          SHMRING_CHILD_CHECK(got[i] == val(root, me * count + i),
                              "scatter count %zu root %d [%zu] = %d", count, root, i, got[i]);
      }
    // Uneven: one block in the range, the other below it, empty or past it.
    for (std::size_t other : {0u, 100u, 20000u, 90000u})
      allgatherv_both_forms(c, {count, other}, false, "allgatherv, one block in the range");
  }
}

}  // namespace

TEST_CASE("single-copy round: every collective, on both ranks, on one, on neither") {
  // SHMRING_CMA is read when a communicator is made: each rank sets its own.
  for (int off_mask : {0, 2, 1, 3}) {  // bit r: rank r has single copies off
    INFO("SHMRING_CMA=0 on ranks (mask) ", off_mask);
    const std::string job = test::unique_job_id("cma");
    check_all(test::run_processes(2, [&](int r) {
      if (off_mask & (1 << r)) setenv("SHMRING_CMA", "0", 1);
      Options o;
      o.rank = r;
      o.world_size = 2;
      o.job_id = job;
      Communicator comm(o);
      single_copy_sweep(comm);
    }));
  }
}

TEST_CASE("single-copy round: a writer's buffer its process cannot read fails every rank") {
  // White-box: a gather's non-root in the single-copy round never touches
  // its send buffer, so the root's process_vm_readv is the first to find it
  // unreadable (EFAULT), and the job ends with the reason on both ranks.
  if (!test::sibling_reads_work()) {
    MESSAGE("skipped: process_vm_readv between sibling processes is refused here");
    return;
  }
  const std::size_t count = 32768;  // 128 KiB of int32
  check_all(run_ranks(2, [&](Communicator& c) {
    if (c.config().oversubscribed) return;  // no single-copy round: nothing to test
    const std::size_t bytes = count * sizeof(std::int32_t);
    void* page = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    SHMRING_CHILD_CHECK(page != MAP_FAILED, "mmap");
    std::vector<std::int32_t> out(2 * count);
    std::vector<std::int32_t> mine(count, 1);
    const void* send = c.rank() == 1 ? page : mine.data();
    try {
      c.gather(send, c.rank() == 0 ? out.data() : nullptr, count, DataType::int32, 0);
      SHMRING_CHILD_CHECK(false, "rank %d: gather of an unreadable buffer returned", c.rank());
    } catch (const Error& e) {
      const std::string what = e.what();
      SHMRING_CHILD_CHECK(e.code() == ErrorCode::system_error, "rank %d: code %d: %s", c.rank(),
                          static_cast<int>(e.code()), e.what());
      SHMRING_CHILD_CHECK(what.find("rank 1's buffer is not valid memory") != std::string::npos,
                          "rank %d: %s", c.rank(), e.what());
    }
    munmap(page, bytes);
  }));
}

TEST_CASE(
    "SHMRING_CMA and SHMRING_CMA_MIN_BYTES: a bad value fails when the communicator is made") {
  // They were read at the first point-to-point call: a collectives-only job
  // ran with a typo unnoticed.
  auto st = test::run_processes(1, [](int) {
    auto refused = [](const char* var, const char* value) {
      setenv(var, value, 1);
      Options o;
      o.rank = 0;
      o.world_size = 1;
      o.job_id = test::unique_job_id("cma-env");
      std::string what;
      try {
        Communicator c(o);
      } catch (const InvalidArgumentError& e) {
        what = e.what();
      }
      unsetenv(var);
      const std::string want = std::string(var) + "='" + value + "'";
      SHMRING_CHILD_CHECK(what.find(want) != std::string::npos, "%s: got '%s'", want.c_str(),
                          what.c_str());
    };
    refused("SHMRING_CMA", "2");
    refused("SHMRING_CMA", "yes");
    refused("SHMRING_CMA_MIN_BYTES", "-1");
    refused("SHMRING_CMA_MIN_BYTES", "abc");
  });
  check_all(st);
}
