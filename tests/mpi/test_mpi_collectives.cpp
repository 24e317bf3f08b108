// Every collective of shmring::mpi::Communicator, every datatype and
// operator, against values computed here from the inputs' formula. Run under
// mpirun, usually through tools/fake-nodes (several fake nodes on this
// machine):
//
//   tools/fake-nodes --nodes 2x2 -- build/tests/mpi/test_mpi_collectives
//
// Inputs are integers, distinct per (rank, index), small enough that every
// partial result is exact in every datatype (so the order of reduction
// cannot change a bit) and that a wrong offset or a wrong rank's block
// cannot pass. Each rank checks its own outputs; the failures are summed
// over ranks and the program exits 1 if there is any.
//
// Options: --algos auto,leaders,shards,flat (the allreduce algorithms to
// run; one communicator each; ALGO/BYTES sets Options::piece_bytes, "none"
// for no pipelining; ALGO@BYTES Options::call_bytes, "none" for one MPI
// call per stage); --quick (counts without 2^20+3); --few-big
// (2^20+3 for a few datatype/operator pairs only, in every collective);
// --expect-nodes K (fail unless the layer sees K nodes).

#include <fmt/format.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <shmring/mpi.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

using shmring::DataType;
using shmring::ReduceOp;
namespace smpi = shmring::mpi;

constexpr DataType kTypes[] = {DataType::float32,  DataType::float64, DataType::float16,
                               DataType::bfloat16, DataType::int8,    DataType::uint8,
                               DataType::int32,    DataType::int64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max,
                             ReduceOp::avg};

int g_rank = 0, g_size = 1;
long g_cases = 0, g_failures = 0;

// --- Values <-> the bits of each datatype ------------------------------------

std::uint16_t to_bf16(double v) {  // exact for the integers used here
  const float f = static_cast<float>(v);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);
}
double from_bf16(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void store(DataType t, void* base, std::size_t i, double v) {
  switch (t) {
    case DataType::float32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DataType::float64:
      static_cast<double*>(base)[i] = v;
      break;
    case DataType::float16:
      static_cast<_Float16*>(base)[i] = static_cast<_Float16>(v);
      break;
    case DataType::bfloat16:
      static_cast<std::uint16_t*>(base)[i] = to_bf16(v);
      break;
    case DataType::int8:
      static_cast<std::int8_t*>(base)[i] = static_cast<std::int8_t>(v);
      break;
    case DataType::uint8:
      static_cast<std::uint8_t*>(base)[i] = static_cast<std::uint8_t>(v);
      break;
    case DataType::int32:
      static_cast<std::int32_t*>(base)[i] = static_cast<std::int32_t>(v);
      break;
    case DataType::int64:
      static_cast<std::int64_t*>(base)[i] = static_cast<std::int64_t>(v);
      break;
  }
}

double load(DataType t, const void* base, std::size_t i) {
  switch (t) {
    case DataType::float32:
      return static_cast<const float*>(base)[i];
    case DataType::float64:
      return static_cast<const double*>(base)[i];
    case DataType::float16:
      return static_cast<double>(static_cast<const _Float16*>(base)[i]);
    case DataType::bfloat16:
      return from_bf16(static_cast<const std::uint16_t*>(base)[i]);
    case DataType::int8:
      return static_cast<const std::int8_t*>(base)[i];
    case DataType::uint8:
      return static_cast<const std::uint8_t*>(base)[i];
    case DataType::int32:
      return static_cast<const std::int32_t*>(base)[i];
    case DataType::int64:
      return static_cast<double>(static_cast<const std::int64_t*>(base)[i]);
  }
  return 0;
}

// --- Inputs -------------------------------------------------------------------

// Largest magnitude any partial result may reach and stay exact (and in range).
double budget(DataType t) {
  switch (t) {
    case DataType::int8:
      return 127;
    case DataType::uint8:
      return 255;
    case DataType::bfloat16:
      return 256;
    case DataType::float16:
      return 2048;
    case DataType::float32:
      return 1 << 24;
    default:
      return 1e12;
  }
}

// Input of `rank` at index i, for op. Distinct per (rank, index): the
// pattern moves with both, with a period (a prime) far from any offset.
double input(DataType t, ReduceOp op, int rank, std::size_t i) {
  const auto k = static_cast<long long>(i);
  if (op == ReduceOp::prod) {
    static constexpr double kSigned[] = {1, 2, -1, 3};
    static constexpr double kUnsigned[] = {1, 2, 1, 3};
    const auto j = static_cast<std::size_t>((k + 3 * rank) % 4);
    return t == DataType::uint8 ? kUnsigned[j] : kSigned[j];
  }
  // Sums of g_size values stay within budget; avg's values are multiples of
  // g_size so that the average is an exact integer too.
  const double scale = op == ReduceOp::avg ? g_size : 1;
  auto half = static_cast<long long>(budget(t) / g_size / scale);
  if (t == DataType::uint8) {
    const long long m = std::max(2ll, half + 1);
    return static_cast<double>((k * 7 + rank * 13 + 1) % m) * scale;
  }
  half = std::min(half, 1000000ll);
  const long long m = 2 * half + 1;
  return static_cast<double>((k * 7919 + rank * 104729 + 11) % m - half) * scale;
}

double reduced(DataType t, ReduceOp op, std::size_t i) {
  double acc = input(t, op, 0, i);
  for (int r = 1; r < g_size; ++r) {
    const double v = input(t, op, r, i);
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
  return op == ReduceOp::avg ? acc / g_size : acc;
}

template <class F>
void fill(DataType t, void* buf, std::size_t n, F&& f) {
  for (std::size_t i = 0; i < n; ++i) store(t, buf, i, f(i));
}

constexpr std::byte kSentinel{0x5a};

// Compares buf[0..n) with expect(i), bit for bit; reports the first miss.
// The expected values are written out whole, then compared with memcmp.
template <class F>
bool check(const std::string& what, DataType t, const void* buf, std::size_t n, F&& expect) {
  const std::size_t es = shmring::datatype_size(t);
  std::vector<std::byte> want(n * es);
  fill(t, want.data(), n, expect);
  if (std::memcmp(want.data(), buf, n * es) == 0) return true;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(want.data() + i * es, static_cast<const std::byte*>(buf) + i * es, es) != 0) {
      fmt::print(stderr, "rank {}: FAIL {}: element {} of {} is {}, expected {}\n", g_rank, what, i,
                 n, load(t, buf, i), expect(i));
      return false;
    }
  }
  return true;
}

void record(bool ok) {
  ++g_cases;
  if (!ok) ++g_failures;
}

constexpr std::size_t kBig = (std::size_t{1} << 20) + 3;

// The counts of the issue: 0, 1, N-1, N+1, 1009 and 2^20+3 (N ranks). The
// big one runs for every datatype and operator where `all_big` (once per
// collective), else only for a few combinations that cover the kinds of path
// (float32, 16-bit through float32, integers); --quick drops it.
std::vector<std::size_t> counts(bool quick, bool all_big = true, DataType t = DataType::float32,
                                ReduceOp op = ReduceOp::sum) {
  const auto n = static_cast<std::size_t>(g_size);
  std::vector<std::size_t> c = {0, 1, n - 1, n + 1, 1009};
  const bool few = (t == DataType::float32 && op == ReduceOp::sum) ||
                   (t == DataType::bfloat16 && op == ReduceOp::avg) ||
                   (t == DataType::float16 && op == ReduceOp::max) ||
                   (t == DataType::int32 && op == ReduceOp::min) ||
                   (t == DataType::uint8 && op == ReduceOp::prod);
  if (!quick && (all_big || few)) c.push_back(kBig);
  return c;
}

bool valid(DataType t, ReduceOp op) {
  return op != ReduceOp::avg || shmring::is_floating(t);
}

std::string name(DataType t, ReduceOp op) {
  return fmt::format("{} {}", shmring::to_string(t), shmring::to_string(op));
}

// --- The cases -----------------------------------------------------------------

void test_allreduce(smpi::Communicator& comm, const std::string& algo, bool quick, bool all_big) {
  for (DataType t : kTypes)
    for (ReduceOp op : kOps) {
      if (!valid(t, op)) continue;
      const std::size_t es = shmring::datatype_size(t);
      for (std::size_t n : counts(quick, all_big, t, op))
        for (bool in_place : {false, true}) {
          const std::string what = fmt::format("allreduce[{}] {} count {} {}", algo, name(t, op), n,
                                               in_place ? "in place" : "out of place");
          std::vector<std::byte> send(n * es), recv(n * es, kSentinel);
          auto mine = [&](std::size_t i) { return input(t, op, g_rank, i); };
          void* dst = in_place ? send.data() : recv.data();
          fill(t, send.data(), n, mine);
          comm.allreduce(n ? send.data() : nullptr, n ? dst : nullptr, n, t, op);
          bool ok = check(what, t, dst, n, [&](std::size_t i) { return reduced(t, op, i); });
          if (!in_place) ok = check(what + " (send unchanged)", t, send.data(), n, mine) && ok;
          record(ok);
        }
    }
}

// min and max of -0 / +0 and NaN: IEEE 754-2019 minimum / maximum across
// nodes too (-0 < +0; any NaN gives the default quiet NaN), so the bits do
// not depend on how MPI and the node groups order the ranks. Element i holds
// -0 or +0 by the parity of i + rank (every element sees both zeros when
// there are 2+ ranks), and every 5th element a NaN with a payload on rank
// i mod size. float32 and float64, in place.
template <class T>
void test_minmax_signed_zero_nan(smpi::Communicator& comm, const std::string& algo) {
  const DataType t = sizeof(T) == 4 ? DataType::float32 : DataType::float64;
  for (ReduceOp op : {ReduceOp::min, ReduceOp::max})
    for (std::size_t n : {std::size_t{1009}, kBig}) {
      std::vector<T> buf(n);
      for (std::size_t i = 0; i < n; ++i) {
        buf[i] = (i + static_cast<std::size_t>(g_rank)) % 2 ? T(-0.0) : T(0.0);
        if (i % 5 == 0 && static_cast<int>(i % static_cast<std::size_t>(g_size)) == g_rank)
          buf[i] = -static_cast<T>(std::nan(std::to_string(g_rank + 1).c_str()));
      }
      comm.allreduce(buf.data(), buf.data(), n, t, op);
      const T qnan = std::numeric_limits<T>::quiet_NaN();
      const T zero = op == ReduceOp::min && g_size > 1 ? T(-0.0) : T(0.0);
      bool ok = true;
      for (std::size_t i = 0; i < n && ok; ++i) {
        // One rank alone keeps its own input: -0 where i is odd.
        const T want = i % 5 == 0 ? qnan : g_size == 1 && i % 2 ? T(-0.0) : zero;
        if (std::memcmp(&buf[i], &want, sizeof(T)) != 0) {
          fmt::print(stderr, "rank {}: FAIL allreduce[{}] {} {} of -0/+0/NaN: element {} is {}{}\n",
                     g_rank, algo, shmring::to_string(t), shmring::to_string(op), i,
                     std::signbit(buf[i]) ? "-" : "+", std::fabs(buf[i]));
          ok = false;
        }
      }
      record(ok);
    }
}

// A 16-bit sum, avg or prod that is NaN is the default quiet NaN (0x7e00,
// 0x7fc0) across nodes as within one (docs/design/accuracy.md): NaN inputs
// of either sign with payloads on one rank or on all, and +inf on rank 0
// against -inf on rank 1 (x86 makes that NaN negative). In place.
void test_16bit_nan(smpi::Communicator& comm, const std::string& algo) {
  for (DataType t : {DataType::float16, DataType::bfloat16})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::prod})
      for (std::size_t n : {std::size_t{1009}, kBig}) {
        const bool bf = t == DataType::bfloat16;
        const std::uint16_t inf = bf ? 0x7f80 : 0x7c00, quiet = bf ? 0x7fc0 : 0x7e00;
        const std::uint16_t one = bf ? 0x3f80 : 0x3c00;
        auto nan = [&](std::size_t i) {
          const std::uint16_t sign = (i + static_cast<std::size_t>(g_rank)) % 2 ? 0x8000 : 0;
          return static_cast<std::uint16_t>(sign | inf | (1 + (i + g_rank) % 31));
        };
        auto expect_nan = [&](std::size_t i) {
          return i % 3 == 0 || i % 3 == 1 || (i % 3 == 2 && g_size > 1 && op != ReduceOp::prod);
        };
        std::vector<std::uint16_t> buf(n);
        for (std::size_t i = 0; i < n; ++i) {
          switch (i % 3) {
            case 0:  // a NaN on one rank only
              buf[i] =
                  static_cast<int>(i % static_cast<std::size_t>(g_size)) == g_rank ? nan(i) : one;
              break;
            case 1:  // a NaN on every rank
              buf[i] = nan(i);
              break;
            default:  // inf - inf (prod: -inf)
              buf[i] = g_rank == 0   ? inf
                       : g_rank == 1 ? static_cast<std::uint16_t>(0x8000 | inf)
                                     : one;
          }
        }
        comm.allreduce(buf.data(), buf.data(), n, t, op);
        bool ok = true;
        for (std::size_t i = 0; i < n && ok; ++i) {
          if (!expect_nan(i)) continue;
          if (buf[i] != quiet) {
            fmt::print(stderr,
                       "rank {}: FAIL allreduce[{}] {} {} NaN: element {} is 0x{:04x}, "
                       "expected 0x{:04x}\n",
                       g_rank, algo, shmring::to_string(t), shmring::to_string(op), i, buf[i],
                       quiet);
            ok = false;
          }
        }
        record(ok);
      }
}

void test_reduce_scatter(smpi::Communicator& comm, bool quick) {
  for (DataType t : kTypes)
    for (ReduceOp op : kOps) {
      if (!valid(t, op)) continue;
      const std::size_t es = shmring::datatype_size(t);
      for (std::size_t total : counts(quick, false, t, op))
        for (bool in_place : {false, true}) {
          const std::size_t rc = total / static_cast<std::size_t>(g_size) + (total % 2);
          const std::size_t n = rc * static_cast<std::size_t>(g_size);
          const std::size_t off = rc * static_cast<std::size_t>(g_rank);
          const std::string what = fmt::format("reduce_scatter {} recv_count {} {}", name(t, op),
                                               rc, in_place ? "in place" : "out of place");
          std::vector<std::byte> send(n * es), recv(rc * es, kSentinel);
          fill(t, send.data(), n, [&](std::size_t i) { return input(t, op, g_rank, i); });
          void* dst = in_place ? send.data() + off * es : recv.data();
          comm.reduce_scatter(n ? send.data() : nullptr, rc ? dst : nullptr, rc, t, op);
          record(check(what, t, dst, rc, [&](std::size_t i) { return reduced(t, op, off + i); }));
        }
    }
}

void test_allgather(smpi::Communicator& comm, bool quick) {
  for (DataType t : kTypes) {
    const std::size_t es = shmring::datatype_size(t);
    for (std::size_t total : counts(quick))
      for (bool in_place : {false, true}) {
        const std::size_t sc = total / static_cast<std::size_t>(g_size) + (total % 2);
        const std::size_t n = sc * static_cast<std::size_t>(g_size);
        const std::string what = fmt::format("allgather {} send_count {} {}", shmring::to_string(t),
                                             sc, in_place ? "in place" : "out of place");
        // Element i of rank r's block: input of rank r at index i.
        auto value = [&](int r, std::size_t i) { return input(t, ReduceOp::sum, r, i); };
        std::vector<std::byte> send(sc * es), recv(n * es, kSentinel);
        void* src = send.data();
        if (in_place) src = recv.data() + sc * static_cast<std::size_t>(g_rank) * es;
        fill(t, src, sc, [&](std::size_t i) { return value(g_rank, i); });
        comm.allgather(sc ? src : nullptr, n ? recv.data() : nullptr, sc, t);
        record(check(what, t, recv.data(), n,
                     [&](std::size_t i) { return value(static_cast<int>(i / sc), i % sc); }));
      }
  }
}

void test_broadcast(smpi::Communicator& comm, bool quick) {
  for (DataType t : kTypes) {
    const std::size_t es = shmring::datatype_size(t);
    for (std::size_t n : counts(quick))
      for (int root = 0; root < g_size; ++root) {
        if (n > 100000 && root != 0 && root != g_size - 1) continue;  // time
        const std::string what =
            fmt::format("broadcast {} count {} root {}", shmring::to_string(t), n, root);
        std::vector<std::byte> buf(n * es, kSentinel);
        if (g_rank == root)
          fill(t, buf.data(), n, [&](std::size_t i) { return input(t, ReduceOp::sum, root, i); });
        comm.broadcast(n ? buf.data() : nullptr, n, t, root);
        record(check(what, t, buf.data(), n,
                     [&](std::size_t i) { return input(t, ReduceOp::sum, root, i); }));
      }
  }
}

void test_reduce(smpi::Communicator& comm, bool quick) {
  // Roots: the first and last rank and one that leads no node (rank 1 in
  // every layout tested here is either).
  std::vector<int> roots = {0};
  if (g_size > 1) roots.push_back(g_size - 1);
  if (g_size > 2) roots.push_back(1);
  for (DataType t : kTypes)
    for (ReduceOp op : kOps) {
      if (!valid(t, op)) continue;
      const std::size_t es = shmring::datatype_size(t);
      for (std::size_t n : counts(quick, false, t, op))
        for (int root : roots)
          for (bool in_place : {false, true}) {
            const std::string what = fmt::format("reduce {} count {} root {} {}", name(t, op), n,
                                                 root, in_place ? "in place" : "out of place");
            std::vector<std::byte> send(n * es), recv(n * es, kSentinel);
            fill(t, send.data(), n, [&](std::size_t i) { return input(t, op, g_rank, i); });
            void* dst = in_place && g_rank == root ? send.data() : recv.data();
            comm.reduce(n ? send.data() : nullptr, n ? dst : nullptr, n, t, op, root);
            if (g_rank == root) {
              record(check(what, t, dst, n, [&](std::size_t i) { return reduced(t, op, i); }));
            } else {
              // recv is ignored off the root: untouched.
              bool ok = true;
              for (std::byte b : recv) ok = ok && b == kSentinel;
              if (!ok)
                fmt::print(stderr, "rank {}: FAIL {}: recv written off the root\n", g_rank, what);
              record(ok);
            }
          }
    }
}

void test_barrier(smpi::Communicator& comm) {
  // The last rank enters late; nobody may leave before it entered. Times from
  // CLOCK_MONOTONIC, one clock for every process of the machine.
  auto now = [] {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  for (int round = 0; round < 3; ++round) {
    double entered = 0;
    if (g_rank == g_size - 1) {
      usleep(200000);
      entered = now();
    }
    comm.barrier();
    const double left = now();
    comm.broadcast(&entered, 1, DataType::float64, g_size - 1);
    const bool ok = left >= entered;
    if (!ok)
      fmt::print(stderr,
                 "rank {}: FAIL barrier round {}: left {:.6f} s before the last rank entered\n",
                 g_rank, round, entered - left);
    record(ok);
  }
}

void test_bad_arguments(smpi::Communicator& comm) {
  // Rejected alike on every rank, before anything moves; the communicator
  // stays usable.
  int v = 1;
  bool ok = false;
  try {
    comm.allreduce(&v, &v, 1, DataType::int32, ReduceOp::avg);
  } catch (const shmring::InvalidArgumentError& e) {
    ok = std::string(e.what()).find("avg") != std::string::npos;
  }
  record(ok);
  ok = false;
  try {
    comm.broadcast(&v, 1, DataType::int32, g_size);
  } catch (const shmring::InvalidArgumentError& e) {
    ok = std::string(e.what()).find("root") != std::string::npos;
  }
  record(ok);
  comm.allreduce(&v, &v, 1, DataType::int32, ReduceOp::sum);
  record(v == g_size);
  // A bad setting is refused on every rank before any communication.
  ok = false;
  try {
    smpi::Options o;
    o.algorithm = "ring";
    smpi::Communicator bad(MPI_COMM_WORLD, o);
  } catch (const shmring::InvalidArgumentError& e) {
    ok = std::string(e.what()).find("leaders, shards or flat") != std::string::npos;
  }
  if (!ok) fmt::print(stderr, "rank {}: FAIL Options::algorithm='ring' was not refused\n", g_rank);
  record(ok);
  // MPI calls of a few bytes would make a large stage run for minutes.
  const char* was = std::getenv("SHMRING_MPI_CALL_BYTES");
  const std::string saved = was ? was : "";
  for (const char* env : {"3", "abc"}) {
    ok = false;
    setenv("SHMRING_MPI_CALL_BYTES", env, 1);
    try {
      smpi::Communicator bad(MPI_COMM_WORLD);
    } catch (const shmring::InvalidArgumentError& e) {
      ok = std::string(e.what()).find("SHMRING_MPI_CALL_BYTES") != std::string::npos;
    }
    if (was)
      setenv("SHMRING_MPI_CALL_BYTES", saved.c_str(), 1);
    else
      unsetenv("SHMRING_MPI_CALL_BYTES");
    if (!ok)
      fmt::print(stderr, "rank {}: FAIL SHMRING_MPI_CALL_BYTES={} was not refused\n", g_rank, env);
    record(ok);
  }
  // A bad value on one rank only: every rank throws that rank's error at
  // once (no rank waits in MPI for the refusing one).
  for (const char* var : {"SHMRING_MPI_ALGO", "SHMRING_OVERSUBSCRIBED"}) {
    const int bad_rank = g_size - 1;
    ok = false;
    if (g_rank == bad_rank) setenv(var, "bogus", 1);
    try {
      smpi::Communicator bad(MPI_COMM_WORLD);
    } catch (const shmring::InvalidArgumentError& e) {
      const std::string m = e.what();
      ok = m.find(fmt::format("rank {}", bad_rank)) != std::string::npos &&
           m.find(fmt::format("{}='bogus'", var)) != std::string::npos;
    }
    if (g_rank == bad_rank) unsetenv(var);
    if (!ok)
      fmt::print(stderr, "rank {}: FAIL {}=bogus on rank {} only was not refused on every rank\n",
                 g_rank, var, bad_rank);
    record(ok);
  }
  ok = false;
  try {
    smpi::Options o;
    o.call_bytes = 1;
    smpi::Communicator bad(MPI_COMM_WORLD, o);
  } catch (const shmring::InvalidArgumentError& e) {
    ok = std::string(e.what()).find("call_bytes=1") != std::string::npos;
  }
  if (!ok) fmt::print(stderr, "rank {}: FAIL Options::call_bytes=1 was not refused\n", g_rank);
  record(ok);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  std::string algos = "auto,leaders,shards,shards/none,shards/256,flat";
  bool quick = false, few_big = false;
  int expect_nodes = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--algos" && i + 1 < argc)
      algos = argv[++i];
    else if (a == "--quick")
      quick = true;
    else if (a == "--few-big")
      few_big = true;
    else if (a == "--expect-nodes" && i + 1 < argc)
      expect_nodes = std::atoi(argv[++i]);
  }
  const double t0 = MPI_Wtime();
  try {
    bool first = true;
    for (const std::string& algo : split(algos)) {
      // ALGO, ALGO/PIECE_BYTES (the shards path's pieces; "none": not
      // pipelined; small pieces put every count > 1 piece through the
      // pipeline) or ALGO@CALL_BYTES (the most bytes per MPI call of a
      // stage; "none": one call; small ones put large stages in many).
      smpi::Options o;
      o.algorithm = algo.substr(0, algo.find_first_of("/@"));
      if (const auto slash = algo.find('/'); slash != std::string::npos) {
        const std::string pieces = algo.substr(slash + 1);
        o.piece_bytes = pieces == "none" ? SIZE_MAX : std::stoull(pieces);
      }
      if (const auto at = algo.find('@'); at != std::string::npos) {
        const std::string call = algo.substr(at + 1);
        o.call_bytes = call == "none" ? SIZE_MAX : std::stoull(call);
      }
      smpi::Communicator comm(MPI_COMM_WORLD, o);
      if (first) {
        fmt::print("rank {}/{}: node {}/{}, local rank {}/{}, segment {}\n", g_rank, g_size,
                   comm.node(), comm.num_nodes(), comm.local_rank(), comm.local_size(),
                   comm.node_communicator().config().segment_name);
        std::fflush(stdout);
        // Default pieces: pipelined only with two CPUs per rank on the
        // machine (every rank of this rig shares one kernel). Expected value
        // from the ranks' own affinity masks, independent of the layer.
        if (o.piece_bytes == 0 && std::getenv("SHMRING_MPI_PIECE_BYTES") == nullptr) {
          cpu_set_t mine, all;
          CPU_ZERO(&mine);
          sched_getaffinity(0, sizeof mine, &mine);
          MPI_Allreduce(&mine, &all, sizeof mine, MPI_BYTE, MPI_BOR, MPI_COMM_WORLD);
          const bool spare = CPU_COUNT(&all) >= 2 * g_size;
          const bool ok = (comm.piece_bytes() > 0) == spare;
          if (!ok)
            fmt::print(stderr,
                       "rank {}: FAIL default piece_bytes {} with {} CPUs for {} ranks: expected "
                       "{}\n",
                       g_rank, comm.piece_bytes(), CPU_COUNT(&all), g_size,
                       spare ? "pipelining (> 0)" : "0 (one piece)");
          record(ok);
        }
        // The node communicator yields to the other nodes' ranks where the
        // machine's CPUs are fewer than all its ranks (unless the caller
        // set SHMRING_OVERSUBSCRIBED to 0 or 1; then its value decides).
        const char* env = std::getenv("SHMRING_OVERSUBSCRIBED");
        if (env == nullptr || *env == '\0' || std::string(env) == "auto") {
          cpu_set_t mine, all;
          CPU_ZERO(&mine);
          sched_getaffinity(0, sizeof mine, &mine);
          MPI_Allreduce(&mine, &all, sizeof mine, MPI_BYTE, MPI_BOR, MPI_COMM_WORLD);
          const bool crowded = g_size > CPU_COUNT(&all);
          const bool ok = comm.node_communicator().config().oversubscribed == crowded;
          if (!ok)
            fmt::print(stderr,
                       "rank {}: FAIL node communicator oversubscribed={} with {} CPUs for {} "
                       "ranks on this machine\n",
                       g_rank, comm.node_communicator().config().oversubscribed, CPU_COUNT(&all),
                       g_size);
          record(ok);
          // And the shards crossover moves up there (leaders below 4 MiB).
          if (std::getenv("SHMRING_MPI_SHARDS_BYTES") == nullptr) {
            const std::size_t want = crowded ? 4u << 20 : 64u << 10;
            const bool ok2 = comm.shards_bytes() == want;
            if (!ok2)
              fmt::print(stderr, "rank {}: FAIL default shards_bytes {}, expected {}\n", g_rank,
                         comm.shards_bytes(), want);
            record(ok2);
          }
        }
        // MPI stages go in calls of at most 2 MiB unless set otherwise.
        if (o.call_bytes == 0 && std::getenv("SHMRING_MPI_CALL_BYTES") == nullptr) {
          const bool ok = comm.call_bytes() == 2u << 20;
          if (!ok)
            fmt::print(stderr, "rank {}: FAIL default call_bytes {}, expected 2 MiB\n", g_rank,
                       comm.call_bytes());
          record(ok);
        }
        if (expect_nodes > 0) {
          const bool ok = comm.num_nodes() == expect_nodes;
          if (!ok)
            fmt::print(stderr, "rank {}: FAIL the layer sees {} nodes, expected {}\n", g_rank,
                       comm.num_nodes(), expect_nodes);
          record(ok);
        }
      }
      auto timed = [&](const char* what, auto&& body) {
        const double t = MPI_Wtime();
        body();
        if (g_rank == 0) fmt::print("# {}: {:.1f} s\n", what, MPI_Wtime() - t);
        std::fflush(stdout);
      };
      timed(("allreduce " + algo).c_str(),
            [&] { test_allreduce(comm, algo, quick, first && !few_big); });
      test_minmax_signed_zero_nan<float>(comm, algo);
      test_minmax_signed_zero_nan<double>(comm, algo);
      test_16bit_nan(comm, algo);
      if (first) {
        timed("reduce_scatter", [&] { test_reduce_scatter(comm, quick); });
        timed("allgather", [&] { test_allgather(comm, quick); });
        timed("broadcast", [&] { test_broadcast(comm, quick); });
        timed("reduce", [&] { test_reduce(comm, quick); });
        timed("barrier", [&] { test_barrier(comm); });
        test_bad_arguments(comm);
      }
      first = false;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "rank {}: FAIL uncaught exception: {}\n", g_rank, e.what());
    ++g_failures;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  long totals[2] = {g_cases, g_failures};
  MPI_Allreduce(MPI_IN_PLACE, totals, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    fmt::print("{} ranks: {} checks, {} failed ({:.1f} s)\n", g_size, totals[0], totals[1],
               MPI_Wtime() - t0);
  MPI_Finalize();
  return totals[1] == 0 ? 0 : 1;
}
