// The staged collectives themselves (staged.cpp explains their rounds):
// alltoall, alltoallv, gather, scatter, allgather, allgatherv, reduce and
// reduce_scatter_v, each a run_rounds with its own writers, readers, header
// and copies.

#include <fmt/format.h>

#include <cstring>

#include "algorithms/staged/staged.hpp"

namespace shmring::algo {

void alltoall_staged(CommState& c, const void* send, void* recv, std::size_t count,
                     DataType dtype) {
  const int n = c.size, me = c.rank;
  const std::size_t bytes = count * datatype_size(dtype);
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  // Our own block never travels. It is copied once every peer's call was
  // checked (run_rounds' `local`), so a rank that fails there returns with
  // `recv` as it was.
  auto copy_own = [&] {
    if (bytes > 0) c.copy(out + me * bytes, in + me * bytes, bytes);
  };
  if (n == 1) return copy_own();
  Rounds r(c, n - 1);
  run_rounds(
      c, r, true, true, everyone, bytes, nullptr, [&] { return bytes; },
      [&](std::byte* buf, std::uint64_t si, std::size_t lane) {
        const Slice s = slice_of(bytes, si, lane);
        if (s.bytes > 0)
          for (int j = 0; j < n; ++j)
            if (j != me)
              r.put(buf + lane_index(me, j, n) * lane, in + j * bytes + s.begin, s.bytes);
      },
      [&](std::uint64_t k, std::uint64_t si, std::size_t lane) {
        const Slice s = slice_of(bytes, si, lane);
        if (s.bytes > 0)
          for (int t = 1; t < n; ++t) {
            const int w = (me - t + n) % n;
            c.copy(out + w * bytes + s.begin, r.await(w, k) + lane_index(w, me, n) * lane, s.bytes);
          }
      },
      copy_own,
      [&] {
        for (int t = 1; t < n; ++t) {
          const int w = (me - t + n) % n;
          cma_take(c, w, me * bytes, out + w * bytes, bytes);
        }
      },
      send);
}

void alltoallv_staged(CommState& c, const void* send, void* recv, const VectorArgs& v,
                      DataType dtype) {
  const int n = c.size, me = c.rank;
  const std::size_t es = datatype_size(dtype);
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  auto copy_own = [&] {  // once the calls were checked, as alltoall_staged's
    if (v.send_counts[me] > 0)
      c.copy(out + v.recv_displs[me] * es, in + v.send_displs[me] * es, v.send_counts[me] * es);
  };
  if (n == 1) return copy_own();
  std::size_t my_largest = 0;
  for (int j = 0; j < n; ++j)
    if (j != me) my_largest = std::max(my_largest, v.send_counts[j] * es);
  Rounds r(c, n - 1, 2 * static_cast<std::size_t>(n) * sizeof(std::uint64_t));
  run_rounds(
      c, r, true, true, everyone, my_largest,
      [&](std::byte* buf) { write_header(buf, v.send_counts, &v.recv_counts); },
      [&] {
        check_pairs(c, r, v);
        std::size_t largest = 0;  // every writer's largest block, from the descriptors
        for (int q = 0; q < n; ++q)
          largest = std::max<std::size_t>(largest, desc_of(c, q).aux.load());
        return largest;
      },
      [&](std::byte* buf, std::uint64_t si, std::size_t lane) {
        for (int j = 0; j < n; ++j) {
          if (j == me) continue;
          const Slice s = slice_of(v.send_counts[j] * es, si, lane);
          if (s.bytes > 0)
            r.put(buf + lane_index(me, j, n) * lane, in + v.send_displs[j] * es + s.begin, s.bytes);
        }
      },
      [&](std::uint64_t k, std::uint64_t si, std::size_t lane) {
        for (int t = 1; t < n; ++t) {
          const int w = (me - t + n) % n;
          const Slice s = slice_of(v.recv_counts[w] * es, si, lane);
          if (s.bytes > 0)
            c.copy(out + v.recv_displs[w] * es + s.begin,
                   r.await(w, k) + lane_index(w, me, n) * lane, s.bytes);
        }
      },
      copy_own,
      [&] {
        // Writer w's block for me starts after its blocks for ranks 0..me-1:
        // their counts are in its header (send_counts first).
        for (int t = 1; t < n; ++t) {
          const int w = (me - t + n) % n;
          std::uint64_t before = 0;
          for (int j = 0; j < me; ++j) before += header_entry(r, w, static_cast<std::size_t>(j));
          cma_take(c, w, before * es, out + v.recv_displs[w] * es, v.recv_counts[w] * es);
        }
      },
      send, packed(v.send_counts, v.send_displs));
}

void gather_staged(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                   int root) {
  const int n = c.size, me = c.rank;
  const std::size_t bytes = count * datatype_size(dtype);
  auto* out = static_cast<std::byte*>(recv);
  auto copy_own = [&] {
    if (me == root && bytes > 0 && out + root * bytes != send)
      c.copy(out + root * bytes, send, bytes);
  };
  if (n == 1) return copy_own();
  // The root copies its own block once every peer's call was checked, so a
  // root that fails returns with `recv` as it was.
  if (eager_ring_fits(c, CollectiveKind::gather, bytes)) {
    gather_eager_ring(c, send, out, bytes, root);
    return copy_own();
  }
  Rounds r(c, 1);
  if (bytes <= r.lane_inline()) {
    gather_eager(c, send, out, bytes, root);
    return copy_own();
  }
  run_rounds(
      c, r, me != root, me == root, [root](int q) { return q == root; }, bytes, nullptr,
      [&] { return bytes; },
      [&](std::byte* buf, std::uint64_t si, std::size_t lane) {
        const Slice s = slice_of(bytes, si, lane);
        if (s.bytes > 0) r.put(buf, static_cast<const std::byte*>(send) + s.begin, s.bytes);
      },
      [&](std::uint64_t k, std::uint64_t si, std::size_t lane) {
        const Slice s = slice_of(bytes, si, lane);
        if (s.bytes > 0)
          for (int t = 1; t < n; ++t) {
            const int w = (me + t) % n;
            c.copy(out + w * bytes + s.begin, r.await(w, k), s.bytes);
          }
      },
      copy_own,
      [&] {
        for (int t = 1; t < n; ++t) {
          const int w = (me + t) % n;
          cma_take(c, w, 0, out + w * bytes, bytes);
        }
      },
      send);
}

void scatter_staged(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                    int root) {
  const int n = c.size, me = c.rank;
  const std::size_t bytes = count * datatype_size(dtype);
  const auto* in = static_cast<const std::byte*>(send);
  auto copy_own = [&] {
    if (me == root && bytes > 0 && recv != in + root * bytes)
      c.copy(recv, in + root * bytes, bytes);
  };
  if (n == 1) return copy_own();
  // The root's own block last, as gather_staged's: the eager root checks
  // nothing of this call, but may fail on an earlier one it confirms first.
  if (eager_ring_fits(c, CollectiveKind::scatter, bytes)) {
    scatter_eager_ring(c, in, recv, bytes, root);
    return copy_own();
  }
  Rounds r(c, n - 1);
  if (bytes <= r.lane_inline() && bytes < scatter_rounds_from(c)) {
    scatter_eager(c, in, recv, bytes, root, r.lane_inline());
    return copy_own();
  }
  run_rounds(
      c, r, me == root, me != root, [root](int q) { return q != root; }, bytes, nullptr,
      [&] { return bytes; },
      [&](std::byte* buf, std::uint64_t si, std::size_t lane) {
        const Slice s = slice_of(bytes, si, lane);
        if (s.bytes > 0)
          for (int j = 0; j < n; ++j)
            if (j != root)
              r.put(buf + lane_index(root, j, n) * lane, in + j * bytes + s.begin, s.bytes);
      },
      [&](std::uint64_t k, std::uint64_t si, std::size_t lane) {
        const Slice s = slice_of(bytes, si, lane);
        if (s.bytes > 0)
          c.copy(static_cast<std::byte*>(recv) + s.begin,
                 r.await(root, k) + lane_index(root, me, n) * lane, s.bytes);
      },
      copy_own, [&] { cma_take(c, root, me * bytes, static_cast<std::byte*>(recv), bytes); }, send);
}

void reduce_staged(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                   ReduceOp op, int root) {
  const int n = c.size, me = c.rank;
  const std::size_t es = datatype_size(dtype), bytes = count * es;
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  // In place, the root's output is its input: its own block goes through its
  // buffer too, so that no source of the reduction aliases the output.
  const bool root_stages = me == root && recv == send;
  Rounds r(c, 1);
  run_rounds(
      c, r, me != root || root_stages, me == root, [root](int q) { return q == root; }, bytes,
      nullptr, [&] { return bytes; },
      [&](std::byte* buf, std::uint64_t si, std::size_t lane) {
        const Slice s = slice_of(bytes, si, lane);
        if (s.bytes > 0) r.put(buf, in + s.begin, s.bytes, /*streamable=*/false);
      },
      [&](std::uint64_t k, std::uint64_t si, std::size_t lane) {
        const Slice s = slice_of(bytes, si, lane);
        if (s.bytes == 0) return;
        for (int t = 1; t < n; ++t) r.await((me + t) % n, k);
        reduce_in_rank_order(
            c, out + s.begin,
            [&](int q) { return q == me && !root_stages ? in + s.begin : r.buffer(q, k); }, n,
            s.bytes / es, dtype, op);
      });
}

namespace {

// allgather and allgatherv: rank w's block is bytes(w) bytes at byte at(w)
// of `recv`; `header` writes round 0's header (nullptr: none) and
// `largest(r)` checks the peers' headers and returns the largest block.
template <class Bytes, class At, class Header, class Largest>
void allgather_rounds(CommState& c, const void* send, void* recv, Bytes bytes, At at,
                      std::size_t header_bytes, Header header, Largest largest) {
  const int n = c.size, me = c.rank;
  const std::size_t my_bytes = bytes(me);
  auto* out = static_cast<std::byte*>(recv);
  auto copy_own = [&] {  // once the calls were checked, as alltoall_staged's
    if (my_bytes > 0 && out + at(me) != send) c.copy(out + at(me), send, my_bytes);
  };
  if (n == 1) return copy_own();
  Rounds r(c, 1, header_bytes);
  run_rounds(
      c, r, true, true, everyone, my_bytes, header, [&] { return largest(r); },
      [&](std::byte* buf, std::uint64_t si, std::size_t lane) {
        const Slice s = slice_of(my_bytes, si, lane);
        if (s.bytes > 0) r.put(buf, static_cast<const std::byte*>(send) + s.begin, s.bytes);
      },
      [&](std::uint64_t k, std::uint64_t si, std::size_t lane) {
        for (int t = 1; t < n; ++t) {
          const int w = (me - t + n) % n;
          const Slice s = slice_of(bytes(w), si, lane);
          if (s.bytes > 0) c.copy(out + at(w) + s.begin, r.await(w, k), s.bytes);
        }
      },
      copy_own,
      [&] {
        for (int t = 1; t < n; ++t) {
          const int w = (me - t + n) % n;
          cma_take(c, w, 0, out + at(w), bytes(w));
        }
      },
      send);
}

}  // namespace

void allgatherv_staged(CommState& c, const void* send, void* recv, const VectorArgs& v,
                       DataType dtype) {
  const std::size_t es = datatype_size(dtype);
  allgather_rounds(
      c, send, recv, [&](int w) { return v.recv_counts[w] * es; },
      [&](int w) { return v.recv_displs[w] * es; },
      static_cast<std::size_t>(c.size) * sizeof(std::uint64_t),
      [&](std::byte* buf) { write_header(buf, v.recv_counts); },
      [&](Rounds& r) {
        check_same_counts(c, r, v.recv_counts);
        return *std::max_element(v.recv_counts.begin(), v.recv_counts.end()) * es;
      });
}

void allgather_staged(CommState& c, const void* send, void* recv, std::size_t count,
                      DataType dtype) {
  // The count is in the descriptor, which check_descriptor compares: no header.
  const std::size_t bytes = count * datatype_size(dtype);
  allgather_rounds(
      c, send, recv, [bytes](int) { return bytes; },
      [bytes](int w) { return static_cast<std::size_t>(w) * bytes; }, 0, nullptr,
      [bytes](Rounds&) { return bytes; });
}

void reduce_scatter_v_staged(CommState& c, const void* send, void* recv, const VectorArgs& v,
                             DataType dtype, ReduceOp op) {
  const int n = c.size, me = c.rank;
  const std::size_t es = datatype_size(dtype);
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  std::vector<std::size_t> offset(static_cast<std::size_t>(n), 0);  // of block j, in bytes
  for (int j = 1; j < n; ++j) offset[j] = offset[j - 1] + v.recv_counts[j - 1] * es;
  if (n == 1) {
    if (v.recv_counts[0] > 0 && recv != send) c.copy(recv, send, v.recv_counts[0] * es);
    return;
  }
  const std::size_t largest = *std::max_element(v.recv_counts.begin(), v.recv_counts.end()) * es;
  Rounds r(c, n, static_cast<std::size_t>(n) * sizeof(std::uint64_t));
  run_rounds(
      c, r, true, true, everyone, largest,
      [&](std::byte* buf) { write_header(buf, v.recv_counts); },
      [&] {
        check_same_counts(c, r, v.recv_counts);
        return largest;
      },
      [&](std::byte* buf, std::uint64_t si, std::size_t lane) {
        // Every block's slice, ours too: in place, out aliases our block of
        // `send`, and the reduction must not read what it writes.
        for (int j = 0; j < n; ++j) {
          const Slice s = slice_of(v.recv_counts[j] * es, si, lane);
          if (s.bytes > 0)
            r.put(buf + j * lane, in + offset[j] + s.begin, s.bytes, /*streamable=*/false);
        }
      },
      [&](std::uint64_t k, std::uint64_t si, std::size_t lane) {
        const Slice s = slice_of(v.recv_counts[me] * es, si, lane);
        if (s.bytes == 0) return;
        for (int t = 1; t < n; ++t) r.await((me + t) % n, k);
        reduce_in_rank_order(
            c, out + s.begin, [&](int q) { return r.buffer(q, k) + me * lane; }, n, s.bytes / es,
            dtype, op);
      });
}

}  // namespace shmring::algo
