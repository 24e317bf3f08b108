// The check of the *_perf tools: test patterns exact in every type and
// for every operator, the per-rank layouts of the v-collectives, the calls
// themselves (out of place and in place) and one checked call per phase that
// counts the wrong elements over all ranks.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "perf_internal.hpp"

namespace shmring::bench {

// ---- Values: conversions between the element types and double. ----

namespace {

std::uint16_t bf16_from_double(double d) {
  float f = static_cast<float>(d);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>(u);
}
double bf16_to_double(std::uint16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

void store_value(void* base, std::size_t i, DataType t, double v) {
  switch (t) {
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
    case DataType::float16:
      static_cast<_Float16*>(base)[i] = static_cast<_Float16>(v);
      break;
    case DataType::bfloat16:
      static_cast<std::uint16_t*>(base)[i] = bf16_from_double(v);
      break;
    case DataType::float32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DataType::float64:
      static_cast<double*>(base)[i] = v;
      break;
  }
}

double load_value(const void* base, std::size_t i, DataType t) {
  switch (t) {
    case DataType::int8:
      return static_cast<const std::int8_t*>(base)[i];
    case DataType::uint8:
      return static_cast<const std::uint8_t*>(base)[i];
    case DataType::int32:
      return static_cast<const std::int32_t*>(base)[i];
    case DataType::int64:
      return static_cast<double>(static_cast<const std::int64_t*>(base)[i]);
    case DataType::float16:
      return static_cast<double>(static_cast<const _Float16*>(base)[i]);
    case DataType::bfloat16:
      return bf16_to_double(static_cast<const std::uint16_t*>(base)[i]);
    case DataType::float32:
      return static_cast<const float*>(base)[i];
    case DataType::float64:
      return static_cast<const double*>(base)[i];
  }
  return 0;
}

// Test pattern: small integers that differ with rank and index (a wrong
// offset cannot pass), exact in every type and for every operator, so the
// expected value does not depend on the order of the reduction. uint8 gets
// non-negative values; prod uses {-1, 1, 2} so products stay small.
double pattern(int rank, std::size_t i, DataType t, ReduceOp op) {
  const auto k = static_cast<long long>((i * 13 + static_cast<std::size_t>(rank) * 7) % 17);
  if (op == ReduceOp::prod) {
    if ((i + static_cast<std::size_t>(rank)) % 5 == 0) return 2;
    return (t != DataType::uint8 && (i * 3 + static_cast<std::size_t>(rank)) % 7 == 0) ? -1 : 1;
  }
  return t == DataType::uint8 ? static_cast<double>(k % 9) : static_cast<double>(k - 8);
}

namespace {

double expected_value(int nranks, std::size_t i, DataType t, ReduceOp op) {
  double acc = pattern(0, i, t, op);
  for (int r = 1; r < nranks; ++r) {
    double v = pattern(r, i, t, op);
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
  if (op == ReduceOp::avg) acc /= nranks;
  // Integer results wrap like the library's (two's complement).
  if (t == DataType::int8) acc = static_cast<std::int8_t>(static_cast<long long>(acc));
  if (t == DataType::uint8) acc = static_cast<std::uint8_t>(static_cast<long long>(acc));
  return acc;
}

// Relative tolerance: zero except for avg, whose final division rounds.
double tolerance(DataType t, ReduceOp op) {
  if (op != ReduceOp::avg) return 0;
  switch (t) {
    case DataType::float16:
      return 1.0 / 1024;
    case DataType::bfloat16:
      return 1.0 / 128;
    case DataType::float32:
      return 1e-6;
    default:
      return 1e-14;
  }
}

// Pattern of the collectives that only move data (allgather, broadcast):
// no reduction to keep exact, so a wider range, with a rank term that never
// repeats between two ranks at the same index (31 x dr is not a multiple of
// 199 for |dr| < 199). Exact in every type, bfloat16 included (|v| < 256).
double move_pattern(int rank, std::size_t i, DataType t) {
  const auto v = static_cast<long long>((i * 7 + static_cast<std::size_t>(rank) * 31 + 3) % 199);
  return t == DataType::uint8 ? static_cast<double>(v) : static_cast<double>(v - 99);
}

// Written into every output before a check, so a collective that leaves its
// output alone cannot pass on the results of the timed runs. Outside both
// patterns' ranges (and their sums for fewer than 15 ranks).
double poison(DataType t) {
  return t == DataType::uint8 ? 255 : 127;
}

// `total` elements in n parts that grow with the part's index: part k gets
// about (k+1) / (n(n+1)/2) of the total, the rounding remainder goes to the
// last, so the parts sum to `total` exactly and small totals leave zeros in
// the first parts (the case a v-collective must not trip on).
std::vector<std::size_t> uneven_split(std::size_t total, int n) {
  std::vector<std::size_t> parts(static_cast<std::size_t>(n));
  const std::size_t weights = static_cast<std::size_t>(n) * (n + 1) / 2;
  std::size_t given = 0;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    parts[k] = total * (k + 1) / weights;
    given += parts[k];
  }
  parts.back() += total - given;
  return parts;
}

std::vector<std::size_t> packed_displs(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> displs(counts.size());
  std::size_t offset = 0;
  for (std::size_t j = 0; j < counts.size(); ++j) {
    displs[j] = offset;
    offset += counts[j];
  }
  return displs;
}

}  // namespace

// The layout of rank `me` for a count column of `count`:
// - alltoall: count elements to and from every peer, blocks in rank order.
// - alltoallv: rank i sends f((j - i) mod n) elements to rank j, f =
//   uneven_split(n x count): every rank sends and receives n x count in all
//   (each f value once per row and column), the pair (i, j) differs from
//   (j, i), and the blocks to oneself are the smallest.
// - allgatherv: rank r contributes uneven_split(n x count)[r] elements
//   (count each with `even`), packed in rank order.
VLayout v_layout(Collective c, std::size_t count, int n, int me, bool even) {
  VLayout v;
  const auto un = static_cast<std::size_t>(n);
  const auto ume = static_cast<std::size_t>(me);
  switch (c) {
    case Collective::alltoall:
      v.send_counts.assign(un, count);
      v.recv_counts.assign(un, count);
      break;
    case Collective::alltoallv: {
      const std::vector<std::size_t> f = uneven_split(un * count, n);
      for (std::size_t j = 0; j < un; ++j) {
        v.send_counts.push_back(f[(j + un - ume) % un]);
        v.recv_counts.push_back(f[(ume + un - j) % un]);
      }
      break;
    }
    case Collective::allgatherv:
      v.recv_counts = even ? std::vector<std::size_t>(un, count) : uneven_split(un * count, n);
      v.send_counts = {v.recv_counts[ume]};
      break;
    default:
      return v;
  }
  v.send_displs = packed_displs(v.send_counts);
  v.recv_displs = packed_displs(v.recv_counts);
  return v;
}

// Out of place: send -> recv. In place: everything in `buf`, which holds the
// size column's bytes, with nccl-tests' offsets (allgather sends from
// buf + rank x count, reduce_scatter receives there; reduce and broadcast
// use buf for both).
void invoke(PerfBackend& b, const Call& c, const void* send, void* recv) {
  switch (c.coll) {
    case Collective::allreduce:
      b.allreduce(send, recv, c.count, c.dtype, c.op);
      return;
    case Collective::reduce_scatter:
      b.reduce_scatter(send, recv, c.count, c.dtype, c.op);
      return;
    case Collective::allgather:
      b.allgather(send, recv, c.count, c.dtype);
      return;
    case Collective::broadcast:
      b.broadcast(recv, c.count, c.dtype, c.root);
      return;
    case Collective::reduce:
      b.reduce(send, recv, c.count, c.dtype, c.op, c.root);
      return;
    case Collective::alltoall:
      b.alltoall(send, recv, c.count, c.dtype);
      return;
    case Collective::alltoallv:
      b.alltoallv(send, c.v.send_counts, c.v.send_displs, recv, c.v.recv_counts, c.v.recv_displs,
                  c.dtype);
      return;
    case Collective::gather:
      b.gather(send, recv, c.count, c.dtype, c.root);
      return;
    case Collective::scatter:
      b.scatter(send, recv, c.count, c.dtype, c.root);
      return;
    case Collective::allgatherv:
      b.allgatherv(send, c.v.send_counts[0], recv, c.v.recv_counts, c.v.recv_displs, c.dtype);
      return;
  }
}

void invoke_in_place(PerfBackend& b, const Call& c, void* buf) {
  const auto mine = static_cast<std::size_t>(b.rank()) * c.count;
  switch (c.coll) {
    case Collective::reduce_scatter:
      invoke(b, c, buf, at(buf, mine, c.elem_size));
      return;
    case Collective::allgather:
    case Collective::gather:
      invoke(b, c, at(buf, mine, c.elem_size), buf);
      return;
    case Collective::scatter:
      invoke(b, c, buf, at(buf, mine, c.elem_size));
      return;
    case Collective::allgatherv:
      invoke(b, c, at(buf, c.v.recv_displs[static_cast<std::size_t>(b.rank())], c.elem_size), buf);
      return;
    case Collective::alltoall:
    case Collective::alltoallv:
      throw std::logic_error(fmt::format("{} has no in-place form", info(c.coll).name));
    default:
      invoke(b, c, buf, buf);
      return;
  }
}

long long check_once(PerfBackend& b, const Call& c, void* send, void* recv, bool in_place) {
  const int n = b.size(), me = b.rank();
  const std::size_t count = c.count, mine = static_cast<std::size_t>(me) * count;
  const DataType t = c.dtype;
  const double tol = tolerance(t, c.op);
  long long wrong = 0;
  auto expect = [&](const void* out, std::size_t i, double want) {
    double got = load_value(out, i, t);
    if (!(std::abs(got - want) <= tol * std::max(1.0, std::abs(want)))) ++wrong;
  };
  auto fill = [&](void* p, std::size_t from, std::size_t to, auto&& value) {
    for (std::size_t i = from; i < to; ++i) store_value(p, i, t, value(i));
  };
  auto reduced = [&](std::size_t i) { return pattern(me, i, t, c.op); };
  auto bad = [&](std::size_t) { return poison(t); };

  switch (c.coll) {
    case Collective::allreduce:
    case Collective::reduce: {
      void* in = in_place ? recv : send;
      fill(in, 0, count, reduced);
      if (!in_place) fill(recv, 0, count, bad);
      invoke(b, c, in, recv);
      if (c.coll == Collective::allreduce || me == c.root)
        for (std::size_t i = 0; i < count; ++i) expect(recv, i, expected_value(n, i, t, c.op));
      break;
    }
    case Collective::reduce_scatter: {
      // Element j of every rank's send buffer is pattern(rank, j); rank r
      // receives block r of the reduction.
      void* in = in_place ? recv : send;
      fill(in, 0, count * static_cast<std::size_t>(n), reduced);
      void* out = in_place ? at(recv, mine, c.elem_size) : recv;
      if (!in_place) fill(recv, 0, count, bad);
      invoke(b, c, in, out);
      for (std::size_t i = 0; i < count; ++i) expect(out, i, expected_value(n, mine + i, t, c.op));
      break;
    }
    case Collective::allgather: {
      const std::size_t total = count * static_cast<std::size_t>(n);
      fill(recv, 0, total, bad);
      void* in = in_place ? at(recv, mine, c.elem_size) : send;
      fill(in, 0, count, [&](std::size_t i) { return move_pattern(me, i, t); });
      invoke(b, c, in, recv);
      for (std::size_t j = 0; j < total; ++j)
        expect(recv, j, move_pattern(static_cast<int>(j / count), j % count, t));
      break;
    }
    case Collective::broadcast: {
      // Every rank starts from its own values; all must end with root's.
      fill(recv, 0, count, [&](std::size_t i) { return move_pattern(me, i, t); });
      invoke(b, c, recv, recv);
      for (std::size_t i = 0; i < count; ++i) expect(recv, i, move_pattern(c.root, i, t));
      break;
    }
    case Collective::alltoall:
    case Collective::alltoallv: {
      // Rank i's send element x is move_pattern(i, x): block j of my recv
      // must hold what rank j sent from its offset for me.
      const VLayout& v = c.v;
      fill(send, 0, count * static_cast<std::size_t>(n),
           [&](std::size_t i) { return move_pattern(me, i, t); });
      fill(recv, 0, count * static_cast<std::size_t>(n), bad);
      invoke(b, c, send, recv);
      for (int j = 0; j < n; ++j) {
        const auto uj = static_cast<std::size_t>(j);
        const std::size_t from =
            v_layout(c.coll, count, n, j, false).send_displs[static_cast<std::size_t>(me)];
        for (std::size_t k = 0; k < v.recv_counts[uj]; ++k)
          expect(recv, v.recv_displs[uj] + k, move_pattern(j, from + k, t));
      }
      break;
    }
    case Collective::gather: {
      // Root's recv block r must hold rank r's count elements.
      const std::size_t total = count * static_cast<std::size_t>(n);
      if (me == c.root) fill(recv, 0, total, bad);
      void* in = in_place ? at(recv, mine, c.elem_size) : send;
      fill(in, 0, count, [&](std::size_t i) { return move_pattern(me, i, t); });
      invoke(b, c, in, recv);
      if (me == c.root)
        for (std::size_t j = 0; j < total; ++j)
          expect(recv, j, move_pattern(static_cast<int>(j / count), j % count, t));
      break;
    }
    case Collective::scatter: {
      // Block r of root's send holds rank r's values; every rank checks its own.
      void* in = in_place ? recv : send;
      if (me == c.root)
        fill(in, 0, count * static_cast<std::size_t>(n), [&](std::size_t j) {
          return move_pattern(static_cast<int>(j / count), j % count, t);
        });
      void* out = in_place ? at(recv, mine, c.elem_size) : recv;
      if (!(in_place && me == c.root)) fill(out, 0, count, bad);
      invoke(b, c, in, out);
      for (std::size_t i = 0; i < count; ++i) expect(out, i, move_pattern(me, i, t));
      break;
    }
    case Collective::allgatherv: {
      const VLayout& v = c.v;
      const auto ume = static_cast<std::size_t>(me);
      fill(recv, 0, count * static_cast<std::size_t>(n), bad);
      void* in = in_place ? at(recv, v.recv_displs[ume], c.elem_size) : send;
      fill(in, 0, v.recv_counts[ume], [&](std::size_t i) { return move_pattern(me, i, t); });
      invoke(b, c, in, recv);
      for (int j = 0; j < n; ++j) {
        const auto uj = static_cast<std::size_t>(j);
        for (std::size_t k = 0; k < v.recv_counts[uj]; ++k)
          expect(recv, v.recv_displs[uj] + k, move_pattern(j, k, t));
      }
      break;
    }
  }
  return static_cast<long long>(b.sum_over_ranks(static_cast<double>(wrong)));
}

}  // namespace shmring::bench
