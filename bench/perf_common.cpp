// The driver of the *_perf tools (perf_common.hpp): the size sweep, the
// buffers, the timing of each phase and the floor, one row per size.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "perf_internal.hpp"

namespace shmring::bench {

// ---- The collectives a backend does not override ----

namespace {

[[noreturn]] void missing(const PerfBackend& b, Collective c) {
  throw std::logic_error(fmt::format("backend {} has no {}", b.name(), info(c).name));
}

}  // namespace

void PerfBackend::reduce_scatter(const void*, void*, std::size_t, DataType, ReduceOp) {
  missing(*this, Collective::reduce_scatter);
}
void PerfBackend::allgather(const void*, void*, std::size_t, DataType) {
  missing(*this, Collective::allgather);
}
void PerfBackend::broadcast(void*, std::size_t, DataType, int) {
  missing(*this, Collective::broadcast);
}
void PerfBackend::reduce(const void*, void*, std::size_t, DataType, ReduceOp, int) {
  missing(*this, Collective::reduce);
}
void PerfBackend::alltoall(const void*, void*, std::size_t, DataType) {
  missing(*this, Collective::alltoall);
}
void PerfBackend::alltoallv(const void*, std::span<const std::size_t>, std::span<const std::size_t>,
                            void*, std::span<const std::size_t>, std::span<const std::size_t>,
                            DataType) {
  missing(*this, Collective::alltoallv);
}
void PerfBackend::gather(const void*, void*, std::size_t, DataType, int) {
  missing(*this, Collective::gather);
}
void PerfBackend::scatter(const void*, void*, std::size_t, DataType, int) {
  missing(*this, Collective::scatter);
}
void PerfBackend::allgatherv(const void*, std::size_t, void*, std::span<const std::size_t>,
                             std::span<const std::size_t>, DataType) {
  missing(*this, Collective::allgatherv);
}

// ---- One phase ----

namespace {

// Times `body(i)` (one call) on every rank: warm-up, then o.rounds timed
// rounds, each started by a barrier, each round's time the slowest rank's.
// Every count that more than one rank must agree on comes from a
// max_over_ranks, so the ranks always make the same number of calls.
template <class Body>
Timing time_phase(PerfBackend& b, const PerfOptions& o, std::size_t bytes, Body&& body) {
  using clock = std::chrono::steady_clock;
  auto elapsed_us = [](clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(clock::now() - t0).count();
  };
  Timing t;
  int call = 0;
  b.barrier();
  auto t0 = clock::now();
  body(call++);
  t.first_us = b.max_over_ranks(elapsed_us(t0));
  double per_call_us = t.first_us;
  if (o.warmup >= 0) {
    for (int i = 1; i < o.warmup; ++i) body(call++);
  } else {
    // Doubling batches until a tenth of --min-time has passed; the last
    // batch estimates the per-call time of the timed rounds.
    const double warm_us = std::max(1e3, o.min_time_s * 1e5);
    double spent_us = t.first_us;
    for (int batch = 1; spent_us < warm_us && batch <= (1 << 20); batch *= 2) {
      t0 = clock::now();
      for (int i = 0; i < batch; ++i) body(call++);
      const double us = b.max_over_ranks(elapsed_us(t0));
      spent_us += us;
      per_call_us = us / batch;
    }
  }
  int per_round = 0;
  if (o.iters > 0) {
    per_round = std::clamp(static_cast<int>(o.budget_bytes / static_cast<double>(bytes)), 3,
                           std::max(3, o.iters));
    per_round = std::min(per_round, o.iters);
  } else {
    const double round_us = o.min_time_s * 1e6 / o.rounds;
    per_round =
        static_cast<int>(std::clamp(std::ceil(round_us / std::max(per_call_us, 1e-3)), 1.0, 1e7));
  }
  std::vector<double> means;
  double total_us = 0;
  for (int r = 0; r < o.rounds; ++r) {
    b.barrier();
    t0 = clock::now();
    for (int i = 0; i < per_round; ++i) body(call++);
    const double us = b.max_over_ranks(elapsed_us(t0));
    total_us += us;
    means.push_back(us / per_round);
  }
  std::sort(means.begin(), means.end());
  t.calls = per_round * o.rounds;
  t.us = total_us / t.calls;
  t.min_us = means.front();
  t.med_us = means[(means.size() - 1) / 2];
  t.max_us = means.back();
  return t;
}

}  // namespace

// ---- The driver ----

// Runs `coll` over the sizes of `o` and prints one row per size on rank 0.
// Returns 0 when every checked element was right, 1 otherwise.
int run_perf(PerfBackend& b, const PerfOptions& o, Collective coll) {
  if (coll == Collective::alltoall && o.uneven) coll = Collective::alltoallv;
  const CollectiveInfo ci = info(coll);
  const TypeInfo& ti = parse_type(o.dtype);
  // Collectives without an operator move data only: any type they support
  // for a sum is fine.
  const ReduceOp op = ci.has_op ? parse_op(o.op) : ReduceOp::sum;
  if (!b.supports(ti.dtype, op))
    throw CLI::ValidationError(
        ci.has_op ? fmt::format("{} does not support datatype {} with operator {}", b.name(),
                                ti.name, o.op)
                  : fmt::format("{} does not support datatype {}", b.name(), ti.name));
  const int n = b.size();
  if (ci.has_root && (o.root < 0 || o.root >= n))
    throw CLI::ValidationError(
        "-r", fmt::format("root {}: expected a rank in [0, {}) for {} ranks", o.root, n, n));
  const bool has_oop = has_out_of_place_phase(o, coll);
  const bool has_ip = has_in_place_phase(o, coll);
  if (!has_oop && !has_ip)
    throw CLI::ValidationError(fmt::format(
        "{} has no {} form: drop {}", ci.name, o.in_place_only ? "in-place" : "out-of-place",
        o.in_place_only ? "--in-place-only" : "--out-of-place-only"));
  const bool printer = b.rank() == 0;
  if (printer) print_header(o, b.name(), n, coll);
  // --in-place-only prints zeros in the out-of-place columns (as it always
  // did); a collective without an out-of-place form prints none.
  const RowLabels labels{b.name(),
                         n,
                         ti.name,
                         ci.has_op ? op_name(op) : "none",
                         coll,
                         ci.has_root ? o.root : -1,
                         ci.has_out_of_place,
                         has_ip};

  // Sizes: the size column for a count of at least one element (per rank
  // for the collectives with ranks x count buffers).
  const std::size_t unit = ti.size * blocks(coll, n);
  std::vector<std::size_t> sizes;
  for (double s = static_cast<double>(o.min_bytes);
       s <= static_cast<double>(o.max_bytes) * 1.0000001; s *= o.factor) {
    std::size_t bytes = std::max(unit, static_cast<std::size_t>(s) / unit * unit);
    if (sizes.empty() || sizes.back() != bytes) sizes.push_back(bytes);
  }

  double busbw_sum = 0;
  long long wrong_total = 0;
  bool first = true;
  for (std::size_t bytes : sizes) {
    const std::size_t count = bytes / unit;
    const Call call{
        coll, count, ti.dtype, ti.size, op, o.root, v_layout(coll, count, n, b.rank(), o.even)};
    // Both buffers hold the size column's bytes: out of place uses the part
    // of each the call needs, in place and the floor use all of recv.
    // Cache-cold mode (-I) rotates through page-aligned buffers carved from
    // one pool per side that together exceed the caches; one allocation
    // (not one per buffer, each rounded up to pages) keeps small sizes from
    // asking for millions of pages.
    const std::size_t stride = (bytes + 4095) / 4096 * 4096;
    const std::size_t nbuf =
        o.vary ? std::max<std::size_t>(1, (4 * llc_bytes() + stride - 1) / stride) : 1;
    Buffer send_pool(nbuf * stride), recv_pool(nbuf * stride);
    std::vector<void*> send(nbuf), recv(nbuf);
    for (std::size_t k = 0; k < nbuf; ++k) {
      send[k] = at(send_pool.p, k * stride, 1);
      recv[k] = at(recv_pool.p, k * stride, 1);
      for (std::size_t i = 0; i < bytes / ti.size; ++i)
        store_value(send[k], i, ti.dtype, pattern(b.rank(), i, ti.dtype, op));
    }
    Row row;
    row.bytes = bytes;
    row.count = call.count;
    auto fill = [&](Timing t) {
      t.algbw = static_cast<double>(bytes) / t.us / 1e3;
      t.busbw = t.algbw * busbw_factor(coll, n);
      return t;
    };
    // What the timed calls reduce: the check pattern (every rank's values
    // differ, few are zero), as users' data would; or, with --zeros, zero-filled
    // buffers as the MPI benchmarks and the peers' harness time them. The
    // two can differ: on the AMD EPYC VM of
    // docs/performance/notes/2026-12-05-adaptive-slot-stores.md streaming stores of zero
    // lines made a 1 MiB allreduce 25% faster.
    auto prepare = [&](bool in_place) {
      for (std::size_t k = 0; k < nbuf; ++k) {
        if (o.zeros) {
          std::memset(send[k], 0, bytes);
          std::memset(recv[k], 0, bytes);
        } else if (in_place) {
          std::memcpy(recv[k], send[k], bytes);
        }
      }
    };
    if (has_oop) {
      prepare(false);
      row.oop = fill(time_phase(b, o, bytes, [&](int i) {
        auto k = static_cast<std::size_t>(i) % nbuf;
        invoke(b, call, send[k], recv[k]);
      }));
      if (o.check) row.oop.wrong = check_once(b, call, send[0], recv[0], false);
    }
    if (has_ip) {
      prepare(true);
      row.ip = fill(time_phase(b, o, bytes, [&](int i) {
        auto k = static_cast<std::size_t>(i) % nbuf;
        invoke_in_place(b, call, recv[k]);
      }));
      if (o.check) row.ip.wrong = check_once(b, call, send[0], recv[0], true);
    }
    row.iters = has_ip ? row.ip.calls : row.oop.calls;
    if (!o.no_floor)
      row.floor_us = time_phase(b, o, bytes, [&](int i) {
                       auto k = static_cast<std::size_t>(i) % nbuf;
                       std::memcpy(recv[k], send[k], bytes);
                       // Keep the copy from being optimised away or reordered past the clock.
                       asm volatile("" : : "r"(recv[k]) : "memory");
                     }).us;
    wrong_total += row.oop.wrong + row.ip.wrong;
    busbw_sum += has_oop && has_ip ? (row.oop.busbw + row.ip.busbw) / 2
                 : has_ip          ? row.ip.busbw
                                   : row.oop.busbw;
    if (printer) print_row(o, labels, row, first);
    first = false;
  }
  if (printer) {
    if (o.json) {
      fmt::print("{}\n", first ? "[]" : "\n]");
    } else if (!o.csv) {
      fmt::print("# Out of bounds values : {} {}\n", wrong_total, wrong_total ? "FAILED" : "OK");
      fmt::print("# Avg bus bandwidth    : {:.4f} \n#\n",
                 sizes.empty() ? 0.0 : busbw_sum / static_cast<double>(sizes.size()));
    }
  }
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace shmring::bench
