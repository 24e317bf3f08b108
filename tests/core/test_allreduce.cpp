// Allreduce correctness: every datatype and operator, N in {1,2,3,4,5,8}
// (oversubscribed on 2 cores), counts around N and past a slot, in place and
// out of place, checked exactly against a serial reference on every rank.
//
// Inputs differ per (rank, index) and are chosen so that the exact result is
// representable (small integers for 16-bit floats, powers of two for prod):
// then any order of reduction gives the same bits, and a wrong offset,
// chunk or slice cannot pass.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "harness.hpp"
#include "kernels/reduce.hpp"

using namespace shmring;
using shmring::detail::bfloat16_to_float;
using shmring::detail::float_to_bfloat16;
using shmring::detail::float_to_half;
using shmring::detail::half_to_float;

namespace {

constexpr DataType kTypes[] = {DataType::float32,  DataType::float64, DataType::float16,
                               DataType::bfloat16, DataType::int8,    DataType::uint8,
                               DataType::int32,    DataType::int64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max,
                             ReduceOp::avg};

bool is16(DataType t) {
  return t == DataType::float16 || t == DataType::bfloat16;
}

// Exact input value of (rank, index) for a datatype and operator.
double input_value(DataType t, ReduceOp op, int r, std::size_t i) {
  const auto ri = static_cast<long long>(r) + static_cast<long long>(i % 1000003);
  if (is_floating(t)) {
    if (op == ReduceOp::prod) {
      const int span = is16(t) ? 3 : 7;
      double sign = (ri % 5 == 0) ? -1.0 : 1.0;
      return sign * std::ldexp(1.0, static_cast<int>(ri % span) - span / 2);
    }
    if (is16(t)) {
      long long v = (r * 5 + static_cast<long long>(i % 64)) % 16;
      return (op == ReduceOp::min || op == ReduceOp::max) ? v * 3 - 24.0 : static_cast<double>(v);
    }
    if (t == DataType::float32 && (op == ReduceOp::sum || op == ReduceOp::avg))
      return r * 16384.0 + static_cast<double>(i % 16384) - 5000.0;
    return r * 1e6 + static_cast<double>(i) - 3e5;
  }
  if (t == DataType::int8 || t == DataType::uint8)
    return static_cast<double>((r * 37 + static_cast<long long>(i % 256) * 11) % 256);
  return r * 1e6 + static_cast<double>(i) - 2e6;
}

// Encodes `v` into element i of buffer p (exact for our values; integers wrap).
void store(DataType t, void* p, std::size_t i, double v) {
  auto* b = static_cast<unsigned char*>(p);
  switch (t) {
    case DataType::float32: {
      float f = static_cast<float>(v);
      std::memcpy(b + 4 * i, &f, 4);
      break;
    }
    case DataType::float64:
      std::memcpy(b + 8 * i, &v, 8);
      break;
    case DataType::float16: {
      auto h = float_to_half(static_cast<float>(v));
      std::memcpy(b + 2 * i, &h, 2);
      break;
    }
    case DataType::bfloat16: {
      auto h = float_to_bfloat16(static_cast<float>(v));
      std::memcpy(b + 2 * i, &h, 2);
      break;
    }
    case DataType::int8:
    case DataType::uint8:
      b[i] = static_cast<unsigned char>(static_cast<long long>(v) & 0xff);
      break;
    case DataType::int32: {
      auto x = static_cast<std::uint32_t>(static_cast<long long>(v));
      std::memcpy(b + 4 * i, &x, 4);
      break;
    }
    case DataType::int64: {
      auto x = static_cast<std::int64_t>(v);
      std::memcpy(b + 8 * i, &x, 8);
      break;
    }
  }
}

double load_signed_int(DataType t, const void* p, std::size_t i) {
  auto* b = static_cast<const unsigned char*>(p);
  switch (t) {
    case DataType::int8:
      return static_cast<std::int8_t>(b[i]);
    case DataType::uint8:
      return b[i];
    case DataType::int32: {
      std::int32_t x;
      std::memcpy(&x, b + 4 * i, 4);
      return x;
    }
    default: {
      std::int64_t x;
      std::memcpy(&x, b + 8 * i, 8);
      return static_cast<double>(x);
    }
  }
}

// Expected element i: the reduction over ranks, computed serially and exactly.
void store_expected(DataType t, ReduceOp op, int n, std::size_t i, void* out) {
  if (!is_floating(t)) {
    // Modular arithmetic in 64 bits, truncated on store: exact in any order.
    std::uint64_t acc = 0;
    double best = 0;
    unsigned char tmp[8];
    for (int r = 0; r < n; ++r) {
      double v = input_value(t, op, r, i);
      store(t, tmp, 0, v);
      double typed = load_signed_int(t, tmp, 0);
      auto u = static_cast<std::uint64_t>(static_cast<std::int64_t>(typed));
      if (r == 0) {
        acc = u;
        best = typed;
      } else if (op == ReduceOp::sum) {
        acc += u;
      } else if (op == ReduceOp::prod) {
        acc *= u;
      } else if (op == ReduceOp::min) {
        best = std::min(best, typed);
      } else {
        best = std::max(best, typed);
      }
    }
    if (op == ReduceOp::min || op == ReduceOp::max) {
      store(t, out, i, best);
    } else {
      // Store the low bits of acc directly.
      auto* b = static_cast<unsigned char*>(out);
      std::size_t es = datatype_size(t);
      std::memcpy(b + es * i, &acc, es);  // little-endian: low bytes first
    }
    return;
  }
  double acc = input_value(t, op, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = input_value(t, op, r, i);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        acc += v;
        break;
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == ReduceOp::avg && n > 1) {
    // One rounding of the exact sum divided by n, in the type's arithmetic
    // (float32 for the 16-bit types, then rounded to 16 bits).
    if (t == DataType::float64) {
      acc = acc / n;
    } else {
      acc = static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
    }
  }
  if (is16(t)) {
    // The 16-bit encoding of the float32 value, with one rounding.
    auto* b = static_cast<unsigned char*>(out);
    std::uint16_t h = t == DataType::float16 ? float_to_half(static_cast<float>(acc))
                                             : float_to_bfloat16(static_cast<float>(acc));
    std::memcpy(b + 2 * i, &h, 2);
    return;
  }
  store(t, out, i, acc);
}

void check_allreduce(Communicator& comm, DataType t, ReduceOp op, std::size_t count,
                     bool in_place) {
  const int n = comm.size(), r = comm.rank();
  const std::size_t es = datatype_size(t);
  std::vector<unsigned char> send(count * es + 1), recv(count * es + 1, 0xAB), want(count * es + 1);
  for (std::size_t i = 0; i < count; ++i) {
    store(t, send.data(), i, input_value(t, op, r, i));
    store_expected(t, op, n, i, want.data());
  }
  void* out = in_place ? send.data() : recv.data();
  comm.allreduce(send.data(), out, count, t, op);
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<unsigned char*>(out) + i * es, want.data() + i * es, es) != 0) {
      SHMRING_CHILD_CHECK(false,
                          "rank %d/%d: allreduce %s %s count=%zu %s: element %zu wrong "
                          "(input %.17g)",
                          r, n, std::string(to_string(t)).c_str(),
                          std::string(to_string(op)).c_str(), count,
                          in_place ? "in place" : "out of place", i, input_value(t, op, r, i));
    }
  }
  // The guard byte past the end is untouched.
  if (!in_place) SHMRING_CHILD_CHECK(recv[count * es] == 0xAB, "rank %d wrote past the end", r);
}

void run_matrix(int n, std::vector<std::size_t> counts, const Options& options = {}) {
  auto status = test::run_ranks(
      n,
      [&](Communicator& comm) {
        for (std::size_t count : counts)
          for (DataType t : kTypes)
            for (ReduceOp op : kOps) {
              if (op == ReduceOp::avg && !is_floating(t)) continue;
              for (bool in_place : {false, true}) check_allreduce(comm, t, op, count, in_place);
            }
      },
      120, options);
  for (int r = 0; r < n; ++r) CHECK_MESSAGE(status[r] == 0, "rank ", r, " exit status ", status[r]);
}

std::vector<std::size_t> counts_for(int n, bool big) {
  auto N = static_cast<std::size_t>(n);
  std::vector<std::size_t> c = {0, 1, N - 1, N + 1, 2 * N - 1, 1009};
  // SHMRING_TEST_QUICK=1 (sanitizer runs) drops the 2^20+3 count.
  if (big && std::getenv("SHMRING_TEST_QUICK") == nullptr) c.push_back((1u << 20) + 3);
  return c;
}

}  // namespace

TEST_CASE("allreduce is exact for every datatype and operator, N=1") {
  run_matrix(1, counts_for(1, true));
}
TEST_CASE("allreduce is exact for every datatype and operator, N=2") {
  run_matrix(2, counts_for(2, true));
}
TEST_CASE("allreduce is exact for every datatype and operator, N=3") {
  run_matrix(3, counts_for(3, true));
}
TEST_CASE("allreduce is exact for every datatype and operator, N=4") {
  run_matrix(4, counts_for(4, true));
}
TEST_CASE("allreduce is exact for every datatype and operator, N=5") {
  run_matrix(5, counts_for(5, true));
}
TEST_CASE("allreduce is exact for every datatype and operator, N=8") {
  run_matrix(8, counts_for(8, true));
}

TEST_CASE("allreduce crosses many slots with small slots (pipelining, K=2 and K=3)") {
  for (std::size_t slots : {2, 3}) {
    Options o;
    o.slots = slots;
    o.slot_bytes = 4096;
    auto status = test::run_ranks(
        3,
        [&](Communicator& comm) {
          for (std::size_t count : {4096u * 3 + 7, 100000u}) {
            check_allreduce(comm, DataType::float32, ReduceOp::sum, count, false);
            check_allreduce(comm, DataType::int64, ReduceOp::max, count, true);
          }
        },
        120, o);
    CHECK(test::all_zero(status));
  }
}

TEST_CASE("allreduce is exact in 64 KiB slices (oversubscribed), 16-bit partials included") {
  // A crowded job moves at most 64 KiB per ring step (Config::slice_bytes);
  // 16-bit sums at N=3 carry float64 partials, 8192 elements a slice.
  Options o;
  o.oversubscribed = 1;
  auto status = test::run_ranks(
      3,
      [&](Communicator& comm) {
        SHMRING_CHILD_CHECK(comm.config().slice_bytes == 64 * 1024, "slice_bytes %zu",
                            comm.config().slice_bytes);
        for (std::size_t count : {std::size_t{8192} * 3 * 2 + 5, std::size_t{100003}})
          for (bool in_place : {false, true}) {
            check_allreduce(comm, DataType::float16, ReduceOp::sum, count, in_place);
            check_allreduce(comm, DataType::bfloat16, ReduceOp::avg, count, in_place);
            check_allreduce(comm, DataType::float32, ReduceOp::sum, count, in_place);
            check_allreduce(comm, DataType::int8, ReduceOp::max, count, in_place);
          }
      },
      120, o);
  CHECK(test::all_zero(status));
}

TEST_CASE("NaN propagates from whichever rank holds it, for sum, prod, min and max") {
  for (int holder : {0, 2}) {
    auto status = test::run_ranks(3, [&](Communicator& comm) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
        std::vector<float> x(1000, 1.0f + static_cast<float>(comm.rank()));
        if (comm.rank() == holder) x[17] = std::numeric_limits<float>::quiet_NaN();
        comm.allreduce(std::span<float>(x), op);
        SHMRING_CHILD_CHECK(std::isnan(x[17]), "op %d: x[17]=%g, want NaN", static_cast<int>(op),
                            x[17]);
        SHMRING_CHILD_CHECK(!std::isnan(x[16]) && !std::isnan(x[18]), "NaN leaked");
        std::vector<std::uint16_t> h(64, float_to_bfloat16(2.0f));
        if (comm.rank() == holder) h[5] = 0x7fc1;
        comm.allreduce(h.data(), h.data(), h.size(), DataType::bfloat16, op);
        SHMRING_CHILD_CHECK(std::isnan(bfloat16_to_float(h[5])), "bf16 NaN lost for op %d",
                            static_cast<int>(op));
      }
    });
    CHECK(test::all_zero(status));
  }
}

TEST_CASE("results are bitwise identical on every rank") {
  auto status = test::run_ranks(4, [&](Communicator& comm) {
    // Values whose float32 sum depends on the order: each rank must still get
    // the same bits (allgather copies one result everywhere).
    std::vector<float> x(50001);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(static_cast<float>(i * 7 + comm.rank() * 13)) * 1e3f + 1e-3f * comm.rank();
    comm.allreduce(std::span<float>(x), ReduceOp::sum);
    std::uint64_t h = 1469598103934665603ull;
    for (float f : x) {
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      h = (h ^ u) * 1099511628211ull;
    }
    std::int64_t mine = static_cast<std::int64_t>(h >> 1), lo = mine, hi = mine;
    comm.allreduce(std::span<std::int64_t>(&lo, 1), ReduceOp::min);
    comm.allreduce(std::span<std::int64_t>(&hi, 1), ReduceOp::max);
    SHMRING_CHILD_CHECK(lo == mine && hi == mine, "rank %d result hash differs", comm.rank());
  });
  CHECK(test::all_zero(status));
}

TEST_CASE("typed span overloads and invalid arguments") {
  auto status = test::run_ranks(2, [&](Communicator& comm) {
    std::vector<std::int32_t> a(10, comm.rank() + 1), b(10);
    comm.allreduce(std::span<const std::int32_t>(a), std::span<std::int32_t>(b), ReduceOp::sum);
    SHMRING_CHILD_CHECK(b[9] == 3, "b[9]=%d", b[9]);
    bool threw = false;
    try {
      comm.allreduce(a.data(), a.data(), a.size(), DataType::int32, ReduceOp::avg);
    } catch (const InvalidArgumentError& e) {
      threw = std::string(e.what()).find("avg") != std::string::npos;
    }
    SHMRING_CHILD_CHECK(threw, "avg on int32 must be an InvalidArgumentError naming avg");
    threw = false;
    try {  // overlapping, not equal
      comm.allreduce(a.data(), a.data() + 1, 5, DataType::int32, ReduceOp::sum);
    } catch (const InvalidArgumentError&) {
      threw = true;
    }
    SHMRING_CHILD_CHECK(threw, "overlapping buffers must be refused");
    threw = false;
    try {
      comm.allreduce(nullptr, nullptr, 3, DataType::int32, ReduceOp::sum);
    } catch (const InvalidArgumentError&) {
      threw = true;
    }
    SHMRING_CHILD_CHECK(threw, "null buffers with count 3 must be refused");
    // Local argument errors happen before any data moves: the communicator
    // still works, on both ranks.
    comm.allreduce(nullptr, nullptr, 0, DataType::float32, ReduceOp::sum);
    std::int32_t one = 1;
    comm.allreduce(std::span<std::int32_t>(&one, 1), ReduceOp::sum);
    SHMRING_CHILD_CHECK(one == 2, "one=%d", one);
  });
  CHECK(test::all_zero(status));
}

TEST_CASE("the oneTBB-parallel kernels (SHMRING_THREADS > 1) give the same exact results") {
#if defined(__SANITIZE_THREAD__)
  // libtbb is not TSan-instrumented: its internal synchronisation would be
  // reported as races (tools/sanitize explains). ASan/UBSan cover this path.
  MESSAGE("skipped under ThreadSanitizer");
  return;
#endif
  Options o;
  o.threads = 2;               // an arena of 2 threads per rank, oversubscribed on purpose
  o.slot_bytes = 1024 * 1024;  // slices big enough to be split across threads
  auto status = test::run_ranks(
      2,
      [&](Communicator& comm) {
        SHMRING_CHILD_CHECK(comm.config().threads == 2, "threads %d", comm.config().threads);
        for (DataType t : kTypes)
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
            if (op == ReduceOp::avg && !is_floating(t)) continue;
            check_allreduce(comm, t, op, (1u << 20) + 3, false);
          }
      },
      300, o);
  CHECK(test::all_zero(status));
}

TEST_CASE("streaming slot writes (SHMRING_NT_STORES=1) give the same exact results") {
  // Forced on for every slice, small slots so that slices end at odd byte
  // offsets (2-byte types, counts not divisible by N), and K=2 so that a
  // missing store fence would let a reader see a stale slot.
  setenv("SHMRING_NT_STORES", "1", 1);
  Options o;
  o.slots = 2;
  o.slot_bytes = 4096;
  auto status = test::run_ranks(
      3,
      [&](Communicator& comm) {
        SHMRING_CHILD_CHECK(comm.config().nt_stores == NtStores::always, "nt_stores not forced");
        for (std::size_t count : {1009u, 4096u * 3 + 7, 100000u})
          for (DataType t : {DataType::float32, DataType::bfloat16, DataType::int8})
            for (bool in_place : {false, true})
              check_allreduce(comm, t, ReduceOp::sum, count, in_place);
      },
      120, o);
  CHECK(test::all_zero(status));
#if !defined(__SANITIZE_THREAD__)  // libtbb is not TSan-instrumented (see above)
  // Slices big enough to be streamed by 2 arena threads, each fencing its own.
  Options big;
  big.threads = 2;
  big.slot_bytes = 1024 * 1024;
  status = test::run_ranks(
      2,
      [&](Communicator& comm) {
        for (DataType t : {DataType::float32, DataType::float16})
          check_allreduce(comm, t, ReduceOp::sum, (1u << 20) + 3, false);
      },
      120, big);
  CHECK(test::all_zero(status));
#endif
  unsetenv("SHMRING_NT_STORES");
}

TEST_CASE("allreduce on the two-shot path is exact for every datatype and operator") {
  // Counts that leave some ranks' chunks empty (1, N-1) and uneven ones.
  setenv("SHMRING_ALGO", "two_shot", 1);
  for (int n : {2, 3, 5}) {
    auto N = static_cast<std::size_t>(n);
    run_matrix(n, {0, 1, N - 1, N + 1, 1009, 4001});
  }
  unsetenv("SHMRING_ALGO");
}

TEST_CASE("allreduce in two-shot rounds with 2 threads per rank is exact, every datatype and op") {
#if defined(__SANITIZE_THREAD__)
  MESSAGE("skipped under ThreadSanitizer (libtbb is not instrumented; see above)");
  return;
#endif
  // Default slots: rounds of 512 KiB. 2^19 + 1 elements leave every
  // datatype a last piece of one element, so two ranks' parts are empty
  // there; in the full pieces, at N=3 a float32 part of 43690 elements (5 x
  // 4 bytes touched each) splits into grains, and the two peers' parts are
  // gathered as one job of 341 KiB split over both threads (two_shot.cpp,
  // parallel.cpp).
  setenv("SHMRING_ALGO", "two_shot", 1);
  Options o;
  o.threads = 2;
  run_matrix(3, {(1u << 19) + 1}, o);
  unsetenv("SHMRING_ALGO");
}

TEST_CASE("allreduce in two-shot rounds is exact past the direct buffer, every datatype and op") {
  // 4 slots of 4 KiB: rounds of 8 KiB (two_shot.cpp), so these counts take
  // 2 to 40 rounds with a short last piece, parts of every size (some
  // empty in the last piece) and both halves of the slot area reused.
  setenv("SHMRING_ALGO", "two_shot", 1);
  setenv("SHMRING_DIRECT_BYTES", "4096", 1);
  Options small;
  small.slot_bytes = 4096;
  for (int n : {2, 3, 5}) run_matrix(n, {2049, 8192 + 1, 40000}, small);
  unsetenv("SHMRING_DIRECT_BYTES");
  unsetenv("SHMRING_ALGO");
}
