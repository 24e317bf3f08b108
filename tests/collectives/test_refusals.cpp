// Every argument check of the front (communicator.cpp's make_* functions,
// collective_set.cpp, front_checks.hpp, and the span forms of
// include/shmring/communicator.hpp) has a call here that triggers it, in
// each collective that makes it, and the test checks that every rank fails:
//   - refused on one rank (rank 1), blocking and non-blocking: rank 1 gets
//     InvalidArgumentError naming the value, the others MismatchError "rank 1
//     made an invalid call" with rank 1's own message, all within seconds
//     (never SHMRING_TIMEOUT); the
//     communicator is then broken on every rank (AbortedError);
//   - refused on every rank alike: InvalidArgumentError everywhere, and the
//     communicator stays usable.
// Point-to-point checks (p2p.cpp checked_p2p) concern the caller only: they
// are checked on the caller, and the peer must stay usable.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "harness.hpp"

using namespace shmring;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kBad = 1;
constexpr std::size_t kHuge = std::numeric_limits<std::size_t>::max() / 2;
// Far above what a refusal may take, far below the communicators' timeout.
constexpr double kFastS = 5;
constexpr double kTimeoutS = 30;

// Buffers of one call, large enough for every case (gather and scatter
// blocks are past the eager size, so that a non-root waits for the root).
struct Bufs {
  static constexpr std::size_t kN = 16384;
  std::vector<float> a = std::vector<float>(4 * kN, 1.0f), b = std::vector<float>(4 * kN, 0.0f);
  std::vector<std::int32_t> ia = std::vector<std::int32_t>(64, 1),
                            ib = std::vector<std::int32_t>(64, 0);
  float* A() { return a.data(); }
  float* B() { return b.data(); }
};

// One refusal: `call(c, bad, nonblocking)` makes the refused form when
// `bad`, else the matching correct call. `every_rank`: the bad form refuses
// on every rank (false where only a root checks it).
struct Case {
  std::string name;
  std::string words;  // in the refusing rank's message, after "rank R: "
  std::function<void(Communicator&, bool, bool)> call;
  bool every_rank = true;
  // A small gather's non-roots may return once their block is deposited
  // and learn of the root's refusal at their next call (the contract of
  // Communicator::gather in include/shmring/communicator.hpp).
  bool eager = false;
};

// Runs the blocking or the i-form of a call.
#define SHMRING_CALL(nb, ...) ((nb) ? (void)c.i##__VA_ARGS__.wait() : (void)c.__VA_ARGS__)

const DataType kBadDtype = static_cast<DataType>(99);
const ReduceOp kBadOp = static_cast<ReduceOp>(99);

std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&](std::string name, std::string words,
                 std::function<void(Communicator&, bool, bool)> f, bool every = true) {
    v.push_back({std::move(name), std::move(words), std::move(f), every});
  };
  const auto F = DataType::float32;
  const auto S = ReduceOp::sum;
  constexpr std::size_t n = 8;

  // ---- allreduce (communicator.cpp make_allreduce)
  add("allreduce dtype", "allreduce: datatype 99 is not a DataType",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        SHMRING_CALL(nb, allreduce(x.A(), x.B(), n, bad ? kBadDtype : F, S));
      });
  add("allreduce op", "allreduce: operator 99 is not a ReduceOp", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, allreduce(x.A(), x.B(), n, F, bad ? kBadOp : S));
  });
  add("allreduce avg int", "allreduce: avg needs a floating datatype, got int32",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        SHMRING_CALL(
            nb, allreduce(x.ia.data(), x.ib.data(), n, DataType::int32, bad ? ReduceOp::avg : S));
      });
  add("allreduce overflow",
      "allreduce: count " + std::to_string(kHuge) + " of float32 (x1) overflows",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        SHMRING_CALL(nb, allreduce(x.A(), x.B(), bad ? kHuge : n, F, S));
      });
  add("allreduce null send", "allreduce: send is null but holds 32 bytes",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        SHMRING_CALL(nb, allreduce(bad ? nullptr : x.A(), x.B(), n, F, S));
      });
  add("allreduce null recv", "allreduce: recv is null but holds 32 bytes",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        SHMRING_CALL(nb, allreduce(x.A(), bad ? nullptr : x.B(), n, F, S));
      });
  add("allreduce overlap", "allreduce: send and recv overlap without being the in-place form",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        SHMRING_CALL(nb, allreduce(x.A(), bad ? x.A() + 1 : x.B(), n, F, S));
      });
  // ---- reduce_scatter (make_reduce_scatter)
  add("reduce_scatter dtype", "reduce_scatter: datatype 99", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, reduce_scatter(x.A(), x.B(), n, bad ? kBadDtype : F, S));
  });
  add("reduce_scatter op", "reduce_scatter: operator 99", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, reduce_scatter(x.A(), x.B(), n, F, bad ? kBadOp : S));
  });
  add("reduce_scatter avg int", "reduce_scatter: avg needs a floating datatype",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        SHMRING_CALL(nb, reduce_scatter(x.ia.data(), x.ib.data(), n, DataType::int32,
                                        bad ? ReduceOp::avg : S));
      });
  add("reduce_scatter overflow", "reduce_scatter: count " + std::to_string(kHuge / 4),
      [=](auto& c, bool bad, bool nb) {
        Bufs x;  // count x 4 bytes fits; x size() does not
        SHMRING_CALL(nb, reduce_scatter(x.A(), x.B(), bad ? kHuge / 4 : n, F, S));
      });
  add("reduce_scatter null send", "reduce_scatter: send is null", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, reduce_scatter(bad ? nullptr : x.A(), x.B(), n, F, S));
  });
  add("reduce_scatter null recv", "reduce_scatter: recv is null", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, reduce_scatter(x.A(), bad ? nullptr : x.B(), n, F, S));
  });
  add("reduce_scatter overlap", "reduce_scatter: send and recv overlap",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;  // in place is recv == send + rank * n; send + rank * n + 1 is not
        SHMRING_CALL(nb, reduce_scatter(x.A(), bad ? x.A() + c.rank() * n + 1 : x.B(), n, F, S));
      });
  // ---- allgather (make_allgather)
  add("allgather dtype", "allgather: datatype 99", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, allgather(x.A(), x.B(), n, bad ? kBadDtype : F));
  });
  add("allgather overflow", "allgather: count " + std::to_string(kHuge / 4),
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        SHMRING_CALL(nb, allgather(x.A(), x.B(), bad ? kHuge / 4 : n, F));
      });
  add("allgather null send", "allgather: send is null", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, allgather(bad ? nullptr : x.A(), x.B(), n, F));
  });
  add("allgather null recv", "allgather: recv is null", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, allgather(x.A(), bad ? nullptr : x.B(), n, F));
  });
  add("allgather overlap", "allgather: send and recv overlap", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, allgather(bad ? x.B() + c.rank() * n + 1 : x.A(), x.B(), n, F));
  });
  // ---- broadcast (make_broadcast)
  add("broadcast dtype", "broadcast: datatype 99", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, broadcast(x.A(), n, bad ? kBadDtype : F, 0));
  });
  add("broadcast root -1", "broadcast: root -1 is not a rank", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, broadcast(x.A(), n, F, bad ? -1 : 0));
  });
  add("broadcast root size", "broadcast: root ", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, broadcast(x.A(), n, F, bad ? c.size() : 0));
  });
  add("broadcast overflow", "broadcast: count", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, broadcast(x.A(), bad ? kHuge : n, F, 0));
  });
  add("broadcast null", "broadcast: buffer is null", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, broadcast(bad ? nullptr : x.A(), n, F, 0));
  });
  // ---- reduce (make_reduce); root kBad where only the root checks
  add("reduce dtype", "reduce: datatype 99", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, reduce(x.A(), x.B(), n, bad ? kBadDtype : F, S, 0));
  });
  add("reduce op", "reduce: operator 99", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, reduce(x.A(), x.B(), n, F, bad ? kBadOp : S, 0));
  });
  add("reduce avg int", "reduce: avg needs", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb,
                 reduce(x.ia.data(), x.ib.data(), n, DataType::int32, bad ? ReduceOp::avg : S, 0));
  });
  add("reduce root", "reduce: root -1", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, reduce(x.A(), x.B(), n, F, S, bad ? -1 : 0));
  });
  add("reduce overflow", "reduce: count", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, reduce(x.A(), x.B(), bad ? kHuge : n, F, S, 0));
  });
  add("reduce null send", "reduce: send is null", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, reduce(bad ? nullptr : x.A(), x.B(), n, F, S, 0));
  });
  add(
      "reduce null recv at the root", "reduce: recv (at the root) is null",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        SHMRING_CALL(nb, reduce(x.A(), bad ? nullptr : x.B(), n, F, S, kBad));
      },
      false);
  add(
      "reduce overlap at the root", "reduce: send and recv overlap",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        SHMRING_CALL(nb, reduce(x.A(), bad ? x.A() + 1 : x.B(), n, F, S, kBad));
      },
      false);
  // ---- split (Communicator::split)
  add("split color", "split: color -1 must be >= 0",
      [=](auto& c, bool bad, bool) { (void)c.split(bad ? -1 : 0, c.rank()); });
  // ---- alltoall (collective_set.cpp make_alltoall)
  add("alltoall dtype", "alltoall: datatype 99", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, alltoall(x.A(), x.B(), n, bad ? kBadDtype : F));
  });
  add("alltoall overflow", "alltoall: count", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, alltoall(x.A(), x.B(), bad ? kHuge / 4 : n, F));
  });
  add("alltoall null send", "alltoall: send is null", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, alltoall(bad ? nullptr : x.A(), x.B(), n, F));
  });
  add("alltoall null recv", "alltoall: recv is null", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, alltoall(x.A(), bad ? nullptr : x.B(), n, F));
  });
  add("alltoall in place", "alltoall: send and recv overlap", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    SHMRING_CALL(nb, alltoall(x.A(), bad ? x.A() : x.B(), n, F));
  });
  return v;
}

// alltoallv, allgatherv and reduce_scatter_v: count vectors of size()
// entries, kBlock elements per block, packed unless a case says otherwise.
constexpr std::size_t kBlock = 4;
struct V {
  std::vector<std::size_t> counts, displs;
  explicit V(int size) : counts(static_cast<std::size_t>(size), kBlock), displs(counts.size()) {
    for (std::size_t j = 0; j < displs.size(); ++j) displs[j] = j * kBlock;
  }
};

std::vector<Case> vector_cases() {
  std::vector<Case> v;
  auto add = [&](std::string name, std::string words,
                 std::function<void(Communicator&, bool, bool)> f) {
    v.push_back({std::move(name), std::move(words), std::move(f), true});
  };
  const auto F = DataType::float32;
  const auto S = ReduceOp::sum;
  constexpr std::size_t n = kBlock;

  // ---- alltoallv (make_alltoallv)
  add("alltoallv dtype", "alltoallv: datatype 99", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    V a(c.size());
    SHMRING_CALL(
        nb, alltoallv(x.A(), a.counts, a.displs, x.B(), a.counts, a.displs, bad ? kBadDtype : F));
  });
  for (int which = 0; which < 4; ++which) {
    static const char* names[] = {"send_counts", "send_displs", "recv_counts", "recv_displs"};
    add(std::string("alltoallv short ") + names[which],
        std::string("alltoallv: ") + names[which] + " has 1 entries, expected size() = ",
        [=](auto& c, bool bad, bool nb) {
          Bufs x;
          V a(c.size());
          std::span<const std::size_t> full_c(a.counts), full_d(a.displs);
          auto pick = [&](int k, std::span<const std::size_t> s) {
            return bad && k == which ? s.first(1) : s;
          };
          SHMRING_CALL(nb, alltoallv(x.A(), pick(0, full_c), pick(1, full_d), x.B(),
                                     pick(2, full_c), pick(3, full_d), F));
        });
  }
  add("alltoallv self count", "alltoallv: send_counts[1]=5 but recv_counts[1]=4",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size()), s(c.size());
        if (bad) s.counts[static_cast<std::size_t>(c.rank())] = 5;
        SHMRING_CALL(nb, alltoallv(x.A(), s.counts, s.displs, x.B(), a.counts, a.displs, F));
      });
  add("alltoallv block overflow", "alltoallv: block 0 of recv (displacement",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size()), r(c.size());
        if (bad) r.displs[0] = kHuge;
        SHMRING_CALL(nb, alltoallv(x.A(), a.counts, a.displs, x.B(), a.counts, r.displs, F));
      });
  add("alltoallv null send", "alltoallv: send is null", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    V a(c.size());
    SHMRING_CALL(
        nb, alltoallv(bad ? nullptr : x.A(), a.counts, a.displs, x.B(), a.counts, a.displs, F));
  });
  add("alltoallv null recv", "alltoallv: recv is null", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    V a(c.size());
    SHMRING_CALL(
        nb, alltoallv(x.A(), a.counts, a.displs, bad ? nullptr : x.B(), a.counts, a.displs, F));
  });
  add("alltoallv recv blocks overlap", "alltoallv: receive blocks overlap",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size()), r(c.size());
        if (bad) r.displs[1] = n / 2;
        SHMRING_CALL(nb, alltoallv(x.A(), a.counts, a.displs, x.B(), a.counts, r.displs, F));
      });
  add("alltoallv send overlaps recv", "alltoallv: send overlaps the receive block",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        // recv placed past the send blocks, or over their end
        float* recv = bad ? x.A() + (c.size() - 1) * n : x.B();
        SHMRING_CALL(nb, alltoallv(x.A(), a.counts, a.displs, recv, a.counts, a.displs, F));
      });
  // ---- allgatherv (make_allgatherv)
  add("allgatherv dtype", "allgatherv: datatype 99", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    V a(c.size());
    SHMRING_CALL(nb, allgatherv(x.A(), n, x.B(), a.counts, a.displs, bad ? kBadDtype : F));
  });
  add("allgatherv short recv_counts", "allgatherv: recv_counts has 1 entries",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        std::span<const std::size_t> rc(a.counts);
        SHMRING_CALL(nb, allgatherv(x.A(), n, x.B(), bad ? rc.first(1) : rc, a.displs, F));
      });
  add("allgatherv short displs", "allgatherv: displs has 1 entries",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        std::span<const std::size_t> d(a.displs);
        SHMRING_CALL(nb, allgatherv(x.A(), n, x.B(), a.counts, bad ? d.first(1) : d, F));
      });
  add("allgatherv send_count", "allgatherv: send_count 3 differs from recv_counts[",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        SHMRING_CALL(nb, allgatherv(x.A(), bad ? 3 : n, x.B(), a.counts, a.displs, F));
      });
  add("allgatherv sum overflow", "allgatherv: the sum of recv_counts overflows",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        // Every rank passes these counts alike (the refusing rank's own
        // block stays n): a sum past 2^64.
        if (bad)
          for (std::size_t j = 0; j < a.counts.size(); ++j)
            if (j != static_cast<std::size_t>(c.rank()))
              a.counts[j] = std::numeric_limits<std::size_t>::max() - 1;
        SHMRING_CALL(nb, allgatherv(x.A(), n, x.B(), a.counts, a.displs, F));
      });
  add("allgatherv block overflow", "allgatherv: block 0 of recv (displacement",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        if (bad) a.displs[0] = kHuge;
        SHMRING_CALL(nb, allgatherv(x.A(), n, x.B(), a.counts, a.displs, F));
      });
  add("allgatherv null send", "allgatherv: send is null", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    V a(c.size());
    SHMRING_CALL(nb, allgatherv(bad ? nullptr : x.A(), n, x.B(), a.counts, a.displs, F));
  });
  add("allgatherv null recv", "allgatherv: recv is null", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    V a(c.size());
    SHMRING_CALL(nb, allgatherv(x.A(), n, bad ? nullptr : x.B(), a.counts, a.displs, F));
  });
  // The input of the planted-bug report: 4 int32 per rank, recv_counts
  // {4, 4}, displs {0, 2} (at N=2; block j at 4j otherwise).
  add("allgatherv recv blocks overlap", "allgatherv: receive blocks overlap",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        if (bad) a.displs[1] = 2;
        SHMRING_CALL(nb,
                     allgatherv(x.ia.data(), n, x.ib.data(), a.counts, a.displs, DataType::int32));
      });
  add("allgatherv send overlaps recv", "allgatherv: send overlaps the receive block",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        // in place is send == recv + displs[rank]; one element further is not
        const float* send = bad ? x.B() + a.displs[static_cast<std::size_t>(c.rank())] + 1 : x.A();
        SHMRING_CALL(nb, allgatherv(send, n, x.B(), a.counts, a.displs, F));
      });
  // ---- reduce_scatter_v (make_reduce_scatter_v)
  add("reduce_scatter_v dtype", "reduce_scatter_v: datatype 99", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    V a(c.size());
    SHMRING_CALL(nb, reduce_scatter_v(x.A(), x.B(), a.counts, bad ? kBadDtype : F, S));
  });
  add("reduce_scatter_v op", "reduce_scatter_v: operator 99", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    V a(c.size());
    SHMRING_CALL(nb, reduce_scatter_v(x.A(), x.B(), a.counts, F, bad ? kBadOp : S));
  });
  add("reduce_scatter_v avg int", "reduce_scatter_v: avg needs", [=](auto& c, bool bad, bool nb) {
    Bufs x;
    V a(c.size());
    SHMRING_CALL(nb, reduce_scatter_v(x.ia.data(), x.ib.data(), a.counts, DataType::int32,
                                      bad ? ReduceOp::avg : S));
  });
  add("reduce_scatter_v short recv_counts", "reduce_scatter_v: recv_counts has 1 entries",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        std::span<const std::size_t> rc(a.counts);
        SHMRING_CALL(nb, reduce_scatter_v(x.A(), x.B(), bad ? rc.first(1) : rc, F, S));
      });
  add("reduce_scatter_v sum overflow", "reduce_scatter_v: the sum of recv_counts overflows",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        if (bad) a.counts[0] = std::numeric_limits<std::size_t>::max() - 1;
        SHMRING_CALL(nb, reduce_scatter_v(x.A(), x.B(), a.counts, F, S));
      });
  add("reduce_scatter_v null send", "reduce_scatter_v: send is null",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        SHMRING_CALL(nb, reduce_scatter_v(bad ? nullptr : x.A(), x.B(), a.counts, F, S));
      });
  add("reduce_scatter_v null recv", "reduce_scatter_v: recv is null",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        SHMRING_CALL(nb, reduce_scatter_v(x.A(), bad ? nullptr : x.B(), a.counts, F, S));
      });
  add("reduce_scatter_v overlap", "reduce_scatter_v: send and recv overlap",
      [=](auto& c, bool bad, bool nb) {
        Bufs x;
        V a(c.size());
        float* recv = bad ? x.A() + a.displs[static_cast<std::size_t>(c.rank())] + 1 : x.B();
        SHMRING_CALL(nb, reduce_scatter_v(x.A(), recv, a.counts, F, S));
      });
  return v;
}

// gather and scatter (check_rooted): blocks past the eager size, so that
// every non-root waits for the root's descriptor.
std::vector<Case> rooted_cases() {
  std::vector<Case> v;
  const auto F = DataType::float32;
  constexpr std::size_t n = Bufs::kN;
  for (bool is_gather : {true, false}) {
    const std::string w = is_gather ? "gather" : "scatter";
    // gather(send, recv) / scatter(send, recv): `one` is gather's send and
    // scatter's recv, `all` the root's size() blocks.
    auto call = [is_gather](Communicator& c, bool nb, const float* one, float* all, std::size_t k,
                            DataType dt, int root) {
      if (is_gather)
        SHMRING_CALL(nb, gather(one, all, k, dt, root));
      else
        SHMRING_CALL(nb, scatter(all, const_cast<float*>(one), k, dt, root));
    };
    auto add = [&](std::string name, std::string words,
                   std::function<void(Communicator&, bool, bool)> f, bool every = true) {
      v.push_back({w + " " + name, w + ": " + words, std::move(f), every, is_gather});
    };
    add("dtype", "datatype 99", [=](auto& c, bool bad, bool nb) {
      Bufs x;
      call(c, nb, x.A(), x.B(), n, bad ? kBadDtype : F, 0);
    });
    add("root", "root 7 is not a rank", [=](auto& c, bool bad, bool nb) {
      Bufs x;
      call(c, nb, x.A(), x.B(), n, F, bad ? 7 : 0);
    });
    add("overflow", "count", [=](auto& c, bool bad, bool nb) {
      Bufs x;
      call(c, nb, x.A(), x.B(), bad ? kHuge : n, F, 0);
    });
    add(std::string("null ") + (is_gather ? "send" : "recv"),
        std::string(is_gather ? "send" : "recv") + " is null", [=](auto& c, bool bad, bool nb) {
          Bufs x;
          call(c, nb, bad ? nullptr : x.A(), x.B(), n, F, 0);
        });
    add(
        std::string("null ") + (is_gather ? "recv" : "send") + " at the root",
        std::string(is_gather ? "recv" : "send") + " (at the root) is null",
        [=](auto& c, bool bad, bool nb) {
          Bufs x;
          call(c, nb, x.A(), bad ? nullptr : x.B(), n, F, kBad);
        },
        false);
    add(
        "overlap at the root", "send and recv overlap",
        [=](auto& c, bool bad, bool nb) {
          Bufs x;
          // in place is one == all + root * n; one element further is not
          call(c, nb, bad ? x.B() + kBad * n + 1 : x.A(), x.B(), n, F, kBad);
        },
        false);
  }
  return v;
}

// The span forms of include/shmring/communicator.hpp check sizes themselves.
std::vector<Case> span_cases() {
  std::vector<Case> v;
  v.push_back({"allreduce span sizes", "allreduce: send has 8 elements but recv has 7",
               [](Communicator& c, bool bad, bool) {
                 std::vector<float> a(8, 1.0f), b(8);
                 c.allreduce(std::span<const float>(a), std::span<float>(b).first(bad ? 7 : 8),
                             ReduceOp::sum);
               }});
  v.push_back({"allgather span sizes", "allgather: recv has ", [](Communicator& c, bool bad, bool) {
                 std::vector<float> a(8, 1.0f), b(8 * c.size());
                 c.allgather(std::span<const float>(a),
                             std::span<float>(b).first(b.size() - (bad ? 1 : 0)));
               }});
  v.push_back({"reduce_scatter span sizes", "reduce_scatter: send has ",
               [](Communicator& c, bool bad, bool) {
                 std::vector<float> a(8 * c.size(), 1.0f), b(8);
                 c.reduce_scatter(std::span<const float>(a).first(a.size() - (bad ? 1 : 0)),
                                  std::span<float>(b), ReduceOp::sum);
               }});
  return v;
}

std::vector<Case> all_cases() {
  std::vector<Case> v = cases();
  for (auto* more : {vector_cases, rooted_cases, span_cases})
    for (auto& c : more()) v.push_back(std::move(c));
  return v;
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs f; returns "" when it threw E whose message starts with `prefix` and
// holds `words` (quickly), else what went wrong.
template <class E>
std::string expect(const std::function<void()>& f, const std::string& words,
                   const std::string& prefix = "") {
  const auto t0 = Clock::now();
  try {
    f();
  } catch (const E& e) {
    const std::string m = e.what();
    if (m.find(words) == std::string::npos) return "message lacks '" + words + "': " + m;
    if (m.rfind(prefix, 0) != 0) return "message does not start with '" + prefix + "': " + m;
    if (since(t0) > kFastS) return "took " + std::to_string(since(t0)) + " s: " + m;
    return "";
  } catch (const Error& e) {
    return "wrong error (" + std::string(to_string(e.code())) + "): " + e.what();
  }
  return "no error (expected one naming '" + words + "')";
}

// Every case with the bad form on rank kBad only, each on a communicator of
// its own (the refusal breaks it). Returns the ranks' exit statuses.
std::vector<int> run_one_rank_refusals(int size, bool nonblocking) {
  const std::string job = test::unique_job_id(nonblocking ? "refuse-nb" : "refuse");
  return test::run_processes(size, [&](int r) {
    int failures = 0;
    int index = 0;
    for (const Case& k : all_cases()) {
      Options o;
      o.rank = r;
      o.world_size = size;
      o.job_id = job + "-" + std::to_string(index++);
      o.timeout_s = kTimeoutS;
      o.threads = 1;
      Communicator c(o);
      // The peers hear who refused and why (its own message, "rank 1: ...").
      const std::string told = "rank 1 made an invalid call (it refused its arguments: rank 1: ";
      std::string why;
      if (r == kBad)
        why = expect<InvalidArgumentError>([&] { k.call(c, true, nonblocking); }, k.words,
                                           "rank 1: ");
      else
        why = expect<MismatchError>([&] { k.call(c, false, nonblocking); }, told);
      if (k.eager && r != kBad && why.rfind("no error", 0) == 0)
        why = expect<MismatchError>([&] { c.barrier(); }, told);
      if (why.empty()) {
        // After an eager gather the peers find the refusal only in their
        // next call, which the refusing root may have finished meanwhile.
        const bool eager_root = k.eager && r == kBad;
        why = expect<AbortedError>([&] { c.barrier(); }, "unusable");
        if (eager_root && why.rfind("no error", 0) == 0)
          why = expect<AbortedError>([&] { c.barrier(); }, "unusable");
      }
      if (!why.empty()) {
        std::fprintf(stderr, "rank %d, %s%s: %s\n", r, k.name.c_str(),
                     nonblocking ? " (i-form)" : "", why.c_str());
        ++failures;
      }
    }
    std::exit(failures == 0 ? 0 : 1);
  });
}

}  // namespace

TEST_CASE(
    "every front refusal on one rank: InvalidArgumentError there, MismatchError on the "
    "others, at once, blocking") {
  CHECK(test::all_zero(run_one_rank_refusals(2, false)));
}

TEST_CASE(
    "every front refusal on one rank: the i-forms throw at once, the peers' requests fail "
    "fast") {
  CHECK(test::all_zero(run_one_rank_refusals(3, true)));
}

TEST_CASE("every front refusal on every rank: InvalidArgumentError everywhere, still usable") {
  auto status = test::run_ranks(
      2,
      [](Communicator& c) {
        int failures = 0;
        for (const Case& k : all_cases()) {
          if (!k.every_rank) continue;
          std::string why = expect<InvalidArgumentError>([&] { k.call(c, true, false); },
                                                         k.words.substr(0, k.words.find(':')),
                                                         "rank " + std::to_string(c.rank()) + ": ");
          if (!why.empty()) {
            std::fprintf(stderr, "rank %d, %s: %s\n", c.rank(), k.name.c_str(), why.c_str());
            ++failures;
          }
        }
        // Nobody waited, and the next collective is right.
        std::vector<float> x(8, static_cast<float>(c.rank() + 1));
        c.allreduce(std::span<float>(x), ReduceOp::sum);
        SHMRING_CHILD_CHECK(x[7] == 3.0f, "rank %d: allreduce after the refusals: %g", c.rank(),
                            x[7]);
        SHMRING_CHILD_CHECK(failures == 0, "rank %d: %d refusal(s) failed", c.rank(), failures);
      },
      120,
      [] {
        Options o;
        o.timeout_s = kTimeoutS;
        o.threads = 1;
        return o;
      }());
  CHECK(test::all_zero(status));
}

TEST_CASE("the input of the planted-bug report: allgatherv blocks overlap at N=2, on both ranks") {
  auto status = test::run_ranks(2, [](Communicator& c) {
    std::vector<std::int32_t> send(4, c.rank() + 1), recv(8, 0);
    std::vector<std::size_t> counts = {4, 4}, displs = {0, 2};
    const std::string why = expect<InvalidArgumentError>(
        [&] { c.allgatherv(send.data(), 4, recv.data(), counts, displs, DataType::int32); },
        "receive blocks overlap");
    SHMRING_CHILD_CHECK(why.empty(), "rank %d: %s", c.rank(), why.c_str());
  });
  CHECK(test::all_zero(status));
}

TEST_CASE("point-to-point refusals stay with the caller; its peer stays usable") {
  auto status = test::run_ranks(2, [](Communicator& c) {
    const int r = c.rank(), peer = 1 - r;
    std::int64_t x = r;
    std::vector<std::pair<std::string, std::function<void()>>> refused = {
        {"datatype 99 is not a DataType", [&] { c.send(&x, 1, kBadDtype, peer, 0); }},
        {"recv(count=1, peer=2, tag=0): peer 2 is not another rank",
         [&] { c.recv(&x, 1, DataType::int64, 2, 0); }},
        {"peer -1 is not another rank", [&] { (void)c.isend(&x, 1, DataType::int64, -1, 0); }},
        {"is not another rank", [&] { c.send(&x, 1, DataType::int64, r, 0); }},
        {"tag -3 is negative", [&] { (void)c.irecv(&x, 1, DataType::int64, peer, -3); }},
        {"overflows", [&] { c.send(&x, kHuge, DataType::int64, peer, 0); }},
        {"buffer is null but holds 8 bytes", [&] { c.recv(nullptr, 1, DataType::int64, peer, 0); }},
    };
    for (auto& [words, f] : refused) {
      const std::string why =
          expect<InvalidArgumentError>(f, words, "rank " + std::to_string(r) + ": ");
      SHMRING_CHILD_CHECK(why.empty(), "rank %d, %s: %s", r, words.c_str(), why.c_str());
    }
    // Nothing was published: a message and a collective still go through.
    std::int64_t got = -1;
    if (r == 0) {
      c.send(&x, 1, DataType::int64, 1, 5);
    } else {
      c.recv(&got, 1, DataType::int64, 0, 5);
      SHMRING_CHILD_CHECK(got == 0, "rank 1 received %lld", static_cast<long long>(got));
    }
    c.barrier();
  });
  CHECK(test::all_zero(status));
}
