// The documented promises (docs/guide/datatypes-and-accuracy.md), each with
// inputs on which a broken promise changes the bits:
//   - the direct path reduces in rank order 0, 1, ..., N-1: order-sensitive
//     float inputs, checked bitwise against the rank-order sum, on every
//     rank, for allreduce, reduce_scatter and reduce (every root);
//   - results are bitwise identical on every rank (the ring too):
//     order-sensitive inputs, every rank's result compared with rank 0's;
//   - each operator (sum, prod, min, max, avg) on each collective
//     (allreduce, reduce_scatter, reduce to every root) on each path (direct,
//     ring/chain): inputs exact in any order, so that the only right answer
//     is one set of bits (avg's divisor, NaN wherever it sits for min/max).

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "harness.hpp"

using namespace shmring;

namespace {

// Runs fn(comm) on n ranks with SHMRING_ALGO = algo set in each child first.
void run(int n, const char* algo, const std::function<void(Communicator&)>& fn) {
  const std::string job = test::unique_job_id("prom");
  auto status = test::run_processes(
      n,
      [&](int r) {
        setenv("SHMRING_ALGO", algo, 1);
        Communicator comm(r, n, job);
        fn(comm);
      },
      300);
  for (int r = 0; r < n; ++r)
    CHECK_MESSAGE(status[r] == 0, "N=", n, " algo=", std::string(algo), ": rank ", r, " status ",
                  status[r]);
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::prod:
      return "prod";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::avg:
      return "avg";
  }
  return "?";
}

// ---- Order-sensitive inputs (test-gaps.md, 1). ----

template <class T>
T wavy(int r, std::size_t i, ReduceOp op) {
  const double s = std::sin(7.0 * static_cast<double>(i) + 13.0 * r);
  // prod: near 1, so that products of N stay finite and every order rounds
  // differently; sum / avg: the case's x[i] = sin(7i + 13r) * 1000 + 0.001 r.
  if (op == ReduceOp::prod) return static_cast<T>(1.0 + s * 0.01 + 0.0001 * r);
  return static_cast<T>(s * 1000 + 0.001 * r);
}

// The rank-order reduction ((x0 op x1) op x2) ... in T, avg divided last.
template <class T>
T rank_order(int n, std::size_t i, ReduceOp op) {
  T acc = wavy<T>(0, i, op);
  for (int q = 1; q < n; ++q)
    acc = op == ReduceOp::prod ? static_cast<T>(acc * wavy<T>(q, i, op))
                               : static_cast<T>(acc + wavy<T>(q, i, op));
  if (op == ReduceOp::avg) acc = static_cast<T>(acc / static_cast<T>(n));
  return acc;
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
void check_rank_order(Communicator& comm, DataType dt, std::size_t count) {
  const int n = comm.size(), r = comm.rank();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::prod}) {
    std::vector<T> send(count * n), recv(count * n);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = wavy<T>(r, i, op);
    comm.allreduce(send.data(), recv.data(), count, dt, op);
    for (std::size_t i = 0; i < count; ++i)
      SHMRING_CHILD_CHECK(same_bits(recv[i], rank_order<T>(n, i, op)),
                          "allreduce %s rank %d [%zu] = %.9g, rank-order result %.9g", op_name(op),
                          r, i, (double)recv[i], (double)rank_order<T>(n, i, op));
    comm.reduce_scatter(send.data(), recv.data(), count, dt, op);
    for (std::size_t i = 0; i < count; ++i)
      SHMRING_CHILD_CHECK(same_bits(recv[i], rank_order<T>(n, r * count + i, op)),
                          "reduce_scatter %s rank %d [%zu] = %.9g, rank-order result %.9g",
                          op_name(op), r, i, (double)recv[i],
                          (double)rank_order<T>(n, r * count + i, op));
    for (int root = 0; root < n; ++root) {
      comm.reduce(send.data(), recv.data(), count, dt, op, root);
      if (r == root)
        for (std::size_t i = 0; i < count; ++i)
          SHMRING_CHILD_CHECK(same_bits(recv[i], rank_order<T>(n, i, op)),
                              "reduce %s root %d [%zu] = %.9g, rank-order result %.9g", op_name(op),
                              root, i, (double)recv[i], (double)rank_order<T>(n, i, op));
    }
  }
}

// ---- Inputs exact in any order, distinct per (rank, index). ----

float exact_value(ReduceOp op, int n, int r, std::size_t i) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return static_cast<float>(r * 4096 + static_cast<int>(i % 4093) - 2000);
    case ReduceOp::prod: {  // +-2^k, k in -3..3: products of 8 are exact
      const int k = static_cast<int>((i + 3 * r) % 7) - 3;
      return std::ldexp((i + r) % 5 == 0 ? -1.0f : 1.0f, k);
    }
    case ReduceOp::min:
    case ReduceOp::max:
      // NaN at one rank (a different one along the buffer) every 7th element.
      if (i % 7 == 3 && static_cast<int>((i / 7) % n) == r)
        return std::numeric_limits<float>::quiet_NaN();
      return static_cast<float>((static_cast<int>(i * 37 + r * 101) % 997) - 400) +
             0.25f * static_cast<float>(r);
  }
  return 0;
}

float exact_expected(ReduceOp op, int n, std::size_t i) {
  double acc = op == ReduceOp::prod ? 1.0 : 0.0;
  bool nan = false;
  float mn = std::numeric_limits<float>::infinity(), mx = -mn;
  for (int q = 0; q < n; ++q) {
    const float v = exact_value(op, n, q, i);
    nan = nan || std::isnan(v);
    acc = op == ReduceOp::prod ? acc * v : acc + v;
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::prod:
      return static_cast<float>(acc);
    case ReduceOp::avg:
      return static_cast<float>(acc) / static_cast<float>(n);
    case ReduceOp::min:
      return nan ? std::numeric_limits<float>::quiet_NaN() : mn;
    case ReduceOp::max:
      return nan ? std::numeric_limits<float>::quiet_NaN() : mx;
  }
  return 0;
}

bool matches(float got, float want) {
  return std::isnan(want) ? std::isnan(got) : same_bits(got, want);
}

void check_every_operator(Communicator& comm, std::size_t count) {
  const int n = comm.size(), r = comm.rank();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
    std::vector<float> send(count * n), recv(count * n, -1.0f);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = exact_value(op, n, r, i);
    comm.allreduce(send.data(), recv.data(), count, DataType::float32, op);
    for (std::size_t i = 0; i < count; ++i)
      SHMRING_CHILD_CHECK(matches(recv[i], exact_expected(op, n, i)),
                          "allreduce %s count %zu rank %d [%zu] = %.9g, want %.9g", op_name(op),
                          count, r, i, recv[i], exact_expected(op, n, i));
    comm.reduce_scatter(send.data(), recv.data(), count, DataType::float32, op);
    for (std::size_t i = 0; i < count; ++i)
      SHMRING_CHILD_CHECK(matches(recv[i], exact_expected(op, n, r * count + i)),
                          "reduce_scatter %s count %zu rank %d [%zu] = %.9g, want %.9g",
                          op_name(op), count, r, i, recv[i], exact_expected(op, n, r * count + i));
    for (int root = 0; root < n; ++root) {
      std::fill(recv.begin(), recv.end(), -1.0f);
      comm.reduce(send.data(), recv.data(), count, DataType::float32, op, root);
      if (r == root)
        for (std::size_t i = 0; i < count; ++i)
          SHMRING_CHILD_CHECK(matches(recv[i], exact_expected(op, n, i)),
                              "reduce %s count %zu root %d [%zu] = %.9g, want %.9g", op_name(op),
                              count, root, i, recv[i], exact_expected(op, n, i));
    }
  }
}

}  // namespace

TEST_CASE("test-gaps 1: the direct path sums float32 in rank order, bitwise, on every rank (N=4)") {
  run(4, "direct", [](Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    std::vector<float> x(256), y(256);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] =
          static_cast<float>(std::sin(7.0 * static_cast<double>(i) + 13.0 * r) * 1000 + 0.001 * r);
    comm.allreduce(x.data(), y.data(), x.size(), DataType::float32, ReduceOp::sum);
    for (std::size_t i = 0; i < x.size(); ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) {
        const float v = static_cast<float>(
            std::sin(7.0 * static_cast<double>(i) + 13.0 * q) * 1000 + 0.001 * q);
        want = q == 0 ? v : want + v;
      }
      SHMRING_CHILD_CHECK(same_bits(y[i], want), "rank %d [%zu] = %.9g, ((x0+x1)+x2)+x3 = %.9g", r,
                          i, y[i], want);
    }
  });
}

TEST_CASE(
    "the direct path reduces in rank order: sum, avg, prod; float32 and float64; every "
    "collective") {
  for (int n : {3, 4, 5})
    run(n, "direct", [](Communicator& comm) {
      check_rank_order<float>(comm, DataType::float32, 256);
      check_rank_order<double>(comm, DataType::float64, 129);
    });
}

TEST_CASE("test-gaps 2: reduce avg on the chain divides by N at every root (N=3, count 70001)") {
  for (const char* algo : {"auto", "ring"})
    run(3, algo, [](Communicator& comm) {
      const int n = comm.size(), r = comm.rank();
      const std::size_t count = 70001;
      std::vector<float> send(count), recv(count);
      for (std::size_t i = 0; i < count; ++i)
        send[i] = static_cast<float>(r * 16384 + static_cast<int>(i % 16384) - 5000);
      for (int root = 0; root < n; ++root) {
        std::fill(recv.begin(), recv.end(), -1.0f);
        comm.reduce(send.data(), recv.data(), count, DataType::float32, ReduceOp::avg, root);
        if (r != root) continue;
        for (std::size_t i = 0; i < count; ++i) {
          float sum = 0;
          for (int q = 0; q < n; ++q)
            sum += static_cast<float>(q * 16384 + static_cast<int>(i % 16384) - 5000);
          const float want = sum / 3.0f;
          SHMRING_CHILD_CHECK(same_bits(recv[i], want), "root %d [%zu] = %.9g, want %.9g", root, i,
                              recv[i], want);
        }
        SHMRING_CHILD_CHECK(recv[0] == 11384.0f, "root %d [0] = %.9g, want 11384", root, recv[0]);
      }
    });
}

TEST_CASE("every operator on every collective, direct path (N=3, 4)") {
  for (int n : {3, 4})
    run(n, "direct", [](Communicator& comm) { check_every_operator(comm, 301); });
}

TEST_CASE("every operator on every collective, two-shot allreduce (N=3, 4)") {
  for (int n : {3, 4})
    run(n, "two_shot", [](Communicator& comm) { check_every_operator(comm, 301); });
}

TEST_CASE("every operator on every collective, ring and chain (N=3, 4; forced and by size)") {
  for (int n : {3, 4}) {
    run(n, "ring", [](Communicator& comm) { check_every_operator(comm, 1003); });
    run(n, "auto", [](Communicator& comm) { check_every_operator(comm, 70001); });
  }
}

TEST_CASE("results are bitwise identical on every rank, ring and direct, order-sensitive inputs") {
  // Every rank writes its allreduce results into memory shared with the
  // parent, which compares them with rank 0's bit for bit; each must also
  // be near the float64 sum, so that identical garbage cannot pass.
  constexpr int kN = 5;
  constexpr std::size_t kCount = 70001;  // by size: the ring; forced: direct for 1001
  for (const char* algo : {"auto", "direct"}) {
    const std::size_t count = std::string(algo) == "direct" ? 1001 : kCount;
    const std::size_t per_rank = 3 * count;  // sum, avg, prod results
    const std::size_t bytes = kN * per_rank * sizeof(float);
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mem != MAP_FAILED);
    auto* shared = static_cast<float*>(mem);
    run(kN, algo, [&](Communicator& comm) {
      const int r = comm.rank();
      int k = 0;
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::prod}) {
        std::vector<float> x(count);
        for (std::size_t i = 0; i < count; ++i) x[i] = wavy<float>(r, i, op);
        comm.allreduce(x.data(), x.data(), count, DataType::float32, op);
        for (std::size_t i = 0; i < count; ++i) {
          double want = op == ReduceOp::prod ? 1.0 : 0.0;
          for (int q = 0; q < kN; ++q)
            want =
                op == ReduceOp::prod ? want * wavy<float>(q, i, op) : want + wavy<float>(q, i, op);
          if (op == ReduceOp::avg) want /= kN;
          SHMRING_CHILD_CHECK(std::fabs(x[i] - want) <= 1e-3 + 1e-5 * std::fabs(want),
                              "%s rank %d [%zu] = %.9g, float64 result %.9g", op_name(op), r, i,
                              x[i], want);
        }
        std::memcpy(shared + r * per_rank + k * count, x.data(), count * sizeof(float));
        ++k;
      }
    });
    for (int r = 1; r < kN; ++r) {
      const bool same = std::memcmp(shared + r * per_rank, shared, per_rank * sizeof(float)) == 0;
      CHECK_MESSAGE(same, "algo ", std::string(algo), ": rank ", r,
                    "'s results differ from rank 0's");
    }
    munmap(mem, bytes);
  }
}

TEST_CASE("min and max give the same bits on every path: -0 < +0, any NaN is the default NaN") {
  // Element i holds, on rank r, one of: -0 / +0 by (i + r) parity, so that
  // every element meets both zeros in both orders over the ranks (the ring
  // and the direct path combine in different orders); every 7th element a
  // NaN with a payload of the rank's own on rank (i % n). float32 and
  // float64, allreduce, reduce_scatter and reduce; direct, ring, two-shot
  // and by size.
  auto check = [](Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    const std::size_t count = 200 * static_cast<std::size_t>(n);  // above the direct cutoff at N=2
    auto input = [&](std::size_t i) -> double {
      if (i % 7 == 0 && static_cast<int>(i % static_cast<std::size_t>(n)) == r)
        return -std::nan(std::to_string(r + 1).c_str());
      return (i + static_cast<std::size_t>(r)) % 2 ? -0.0 : 0.0;
    };
    auto expect = [&](ReduceOp op, std::size_t i, double got) {
      const bool nan = i % 7 == 0;
      const double want =
          nan ? std::numeric_limits<double>::quiet_NaN() : (op == ReduceOp::min ? -0.0 : 0.0);
      return nan ? std::isnan(got) && !std::signbit(got)
                 : (got == 0 && std::signbit(got) == std::signbit(want));
    };
    for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
      std::vector<float> f(count), fr(count / static_cast<std::size_t>(n));
      std::vector<double> d(count);
      for (std::size_t i = 0; i < count; ++i) {
        f[i] = static_cast<float>(input(i));
        d[i] = input(i);
      }
      std::vector<float> fs = f;
      comm.reduce_scatter(fs.data(), fr.data(), fr.size(), DataType::float32, op);
      comm.allreduce(f.data(), f.data(), count, DataType::float32, op);
      comm.allreduce(d.data(), d.data(), count, DataType::float64, op);
      const float qnan_f = std::numeric_limits<float>::quiet_NaN();
      const double qnan_d = std::numeric_limits<double>::quiet_NaN();
      for (std::size_t i = 0; i < count; ++i) {
        SHMRING_CHILD_CHECK(expect(op, i, f[i]) && expect(op, i, d[i]),
                            "%s rank %d [%zu]: float32 %g (sign %d), float64 %g (sign %d)",
                            op_name(op), r, i, f[i], std::signbit(f[i]), d[i], std::signbit(d[i]));
        if (i % 7 == 0)
          SHMRING_CHILD_CHECK(
              std::memcmp(&f[i], &qnan_f, 4) == 0 && std::memcmp(&d[i], &qnan_d, 8) == 0,
              "%s rank %d [%zu]: a NaN other than the default one", op_name(op), r, i);
      }
      const std::size_t base = fr.size() * static_cast<std::size_t>(r);
      for (std::size_t i = 0; i < fr.size(); ++i)
        SHMRING_CHILD_CHECK(expect(op, base + i, fr[i]), "reduce_scatter %s rank %d [%zu]: %g",
                            op_name(op), r, base + i, fr[i]);
      for (int root = 0; root < n; ++root) {
        std::vector<double> x(count), y(count, 1.0);
        for (std::size_t i = 0; i < count; ++i) x[i] = input(i);
        comm.reduce(x.data(), y.data(), count, DataType::float64, op, root);
        if (r == root)
          for (std::size_t i = 0; i < count; ++i)
            SHMRING_CHILD_CHECK(expect(op, i, y[i]), "reduce %s root %d [%zu]: %g", op_name(op),
                                root, i, y[i]);
      }
    }
  };
  for (int n : {2, 3})
    for (const char* algo : {"auto", "direct", "ring", "two_shot"}) run(n, algo, check);
}
