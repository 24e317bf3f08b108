// Staged collectives: alltoall, alltoallv, gather, scatter, allgatherv and
// reduce_scatter_v, moved in rounds through the per-rank direct buffers.
//
// Terms (reflected in the names below):
//   writer, reader - a rank that puts data into its own direct buffer, and a
//            rank that copies (or reduces) it out of the writer's buffer.
//   block  - the elements one writer sends to one reader over the whole
//            collective (alltoall: count; gather: the writer's send; ...).
//   lane   - a fixed part of a writer's buffer that belongs to one reader
//            (the buffer cut into L equal lanes, each a multiple of 16
//            bytes); one reader: the whole buffer.
//   slice  - the part of a block that travels in one round: slice k is bytes
//            [k*lane, (k+1)*lane) of the block (empty past its end).
//   round  - every writer fills its buffer with one slice per reader,
//            publishes it (posted), and its readers copy their slices out
//            and say so (taken). Round k of collective c uses direct buffer
//            (c + k) mod 2 of every rank; a writer refills a buffer in round
//            k >= 2 only after each of its readers has taken round k-2.
//            Round 0 goes out with the descriptor (announce); round 1's
//            buffer is free once every rank has started c (and so finished
//            c-1, the last collective that may have read it).
//   header - round 0 of a v-collective: the writer's count vectors
//            (N x uint64 each), so that readers check the exact count they
//            will read against what the writer will send, and a mismatch
//            can be reported with its values on every rank.
//
// Per collective (N ranks, B = direct_bytes, e = element bytes, L lanes):
//   alltoall(count)      L = N-1; rounds ceil(count*e / lane); each round a
//                        rank writes and reads N-1 lanes: (N-1)/N of its
//                        buffer each way over the collective, once through
//                        shared memory (written once, read once).
//   alltoallv            as alltoall, per-pair slices; one header round
//                        first; rounds = the largest pair's slices (from the
//                        descriptors' aux, the max over writers).
//   gather(count)        L = 1 (only the root reads); rounds ceil(count*e/B);
//                        the root reads (N-1)*count elements.
//   scatter(count)       L = N-1 (the root writes, every other rank reads its
//                        lane); rounds ceil(count*e / lane).
//   allgatherv           L = 1 (every rank reads every buffer); header round,
//                        then ceil(max recv_counts * e / B) rounds.
//   reduce_scatter_v     L = N (the writer's own block goes through its own
//                        lane too, so that no source aliases the output); the
//                        reader of block r reduces lane r of every buffer in
//                        rank order 0..N-1 (reduce_in_rank_order: the same
//                        bits as the direct reduce_scatter, and float16 /
//                        bfloat16 accumulate wide and round once); header
//                        round, then ceil(max recv_counts * e / lane) rounds.
// A rank's own block never travels: it is copied locally (or left in place).
//
// Counters: `posted` and `taken` (RankArea) count rounds of staged
// collectives since the communicator started, the same on every rank (all
// ranks run the same rounds: the round counts follow from descriptors that
// agree), so round k of a collective is `staged_rounds + k` everywhere.
// The buffers are shared with the direct path. A staged collective c uses
// both, so the next collective to write one (direct or staged, through
// acquire_direct_buffer) first waits until every rank has finished c
// (staged_done_needed); a staged collective starts with
// acquire_direct_buffer too.
// Memory ordering: as in direct.cpp (release publish after the copies,
// acquire wait before reading; a writer reuses a buffer only after an
// acquire of every reader's `taken`).
//
// Mismatches: the descriptor carries kind, count, dtype, op and root
// (compared by every rank with every rank), plus for v-collectives a hash of
// the count vectors: allgatherv and reduce_scatter_v compare it (equal
// recv_counts); alltoallv sums every rank's term sum_j h(i, j, send[j]) -
// sum_j h(j, i, recv[j]), 0 exactly when the pairs agree (up to a 2^-64
// chance). On a difference each rank finds the offending values in the
// headers and fails with a MismatchError naming them, so every rank fails.

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "comm_impl.hpp"
#include "reduce_steps.hpp"

namespace shmring::algo {

static_assert(sizeof(std::size_t) == sizeof(std::uint64_t), "headers carry counts as uint64");

std::size_t staged_lane_bytes(std::size_t buffer_bytes, int lanes) {
  if (lanes < 1) lanes = 1;
  return buffer_bytes / static_cast<std::size_t>(lanes) / 16 * 16;
}

namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t pair_term(int from, int to, std::size_t count) {
  return mix(mix((static_cast<std::uint64_t>(from) << 32) ^ static_cast<std::uint32_t>(to)) ^
             count);
}

}  // namespace

std::uint64_t staged_vector_hash(const std::vector<std::size_t>& counts) {
  std::uint64_t h = mix(counts.size());
  for (std::size_t i = 0; i < counts.size(); ++i) h = mix(h ^ mix(counts[i] + i));
  return h;
}

std::uint64_t staged_pair_hash(int rank, const std::vector<std::size_t>& send_counts,
                               const std::vector<std::size_t>& recv_counts) {
  std::uint64_t sum = 0;
  for (std::size_t j = 0; j < send_counts.size(); ++j) {
    if (static_cast<int>(j) == rank) continue;
    sum += pair_term(rank, static_cast<int>(j), send_counts[j]);
    sum -= pair_term(static_cast<int>(j), rank, recv_counts[j]);
  }
  return sum;
}

namespace {

// Bytes [k*lane, (k+1)*lane) of a block of `total` bytes (empty past its end).
struct Slice {
  std::size_t begin = 0, bytes = 0;
};
Slice slice_of(std::size_t total, std::uint64_t k, std::size_t lane) {
  if (k >= (total + lane - 1) / lane) return {};
  const std::size_t begin = static_cast<std::size_t>(k) * lane;
  return {begin, std::min(lane, total - begin)};
}

std::uint64_t rounds_for(std::size_t bytes, std::size_t lane) {
  return (bytes + lane - 1) / lane;
}

// Lane of reader j in writer w's buffer when the writer's own block does
// not travel: readers w+1, w+2, ... get lanes 0, 1, ...
std::size_t lane_index(int w, int j, int n) {
  return static_cast<std::size_t>((j - w - 1 + n) % n);
}

// The rounds of one staged collective on this rank.
class Rounds {
 public:
  explicit Rounds(Communicator::Impl& c) : c_(c), base_(c.staged_rounds) {}

  /// My buffer for round k, once every reader (is_reader(q)) has taken
  /// round k-2 from it.
  template <class IsReader>
  std::byte* acquire(std::uint64_t k, IsReader is_reader) {
    c_.step = static_cast<int>(std::min<std::uint64_t>(k, 1u << 30));
    if (k == 0) return c_.acquire_direct_buffer();
    if (k >= 2)
      for (int q = 0; q < c_.size; ++q)
        if (q != c_.rank && is_reader(q))
          c_.wait_counter(c_.area(q).taken, base_ + k - 1, q, "a reader to finish a round");
    return buffer(c_.rank, k);
  }
  void post(std::uint64_t k) { detail::publish(c_.my_area().posted, base_ + k + 1); }
  /// Writer w's buffer of round k, once w has posted it.
  const std::byte* await(int w, std::uint64_t k) {
    c_.step = static_cast<int>(std::min<std::uint64_t>(k, 1u << 30));
    c_.wait_counter(c_.area(w).posted, base_ + k + 1, w, "staged data");
    return buffer(w, k);
  }
  void taken(std::uint64_t k) { detail::publish(c_.my_area().taken, base_ + k + 1); }
  /// Ends the collective after `total` rounds (the same on every rank).
  void finish(std::uint64_t total) {
    c_.staged_rounds = base_ + total;
    c_.staged_done_needed = c_.collectives + 1;
  }
  std::byte* buffer(int r, std::uint64_t k) {
    return c_.seg->direct(r, (c_.collectives + k) % detail::kDirectBuffers);
  }

 private:
  Communicator::Impl& c_;
  std::uint64_t base_;
};

bool everyone(int) {
  return true;
}

// Announces (descriptor and round 0 visible), then checks every rank's
// descriptor: a root or count mismatch fails every rank.
void announce_and_check(Communicator::Impl& c) {
  c.announce();
  for (int q = 0; q < c.size; ++q)
    if (q != c.rank) c.wait_announced(q);
}

const detail::Descriptor& desc_of(Communicator::Impl& c, int q) {
  return c.area(q).desc[c.collectives % detail::kDescRing];
}

void write_header(std::byte* buf, const std::vector<std::size_t>& a,
                  const std::vector<std::size_t>* b = nullptr) {
  std::memcpy(buf, a.data(), a.size() * sizeof(std::uint64_t));
  if (b) std::memcpy(buf + a.size() * sizeof(std::uint64_t), b->data(), b->size() * 8);
}

std::uint64_t header_entry(Rounds& r, int q, std::size_t i) {
  std::uint64_t v = 0;
  std::memcpy(&v, r.buffer(q, 0) + i * sizeof(std::uint64_t), sizeof(v));
  return v;
}

// allgatherv / reduce_scatter_v: every rank's recv_counts must equal ours.
void check_same_counts(Communicator::Impl& c, Rounds& r, const std::vector<std::size_t>& counts) {
  const std::uint64_t mine = staged_vector_hash(counts);
  const auto n = static_cast<std::size_t>(c.size);
  for (int q = 0; q < c.size; ++q) {
    if (q == c.rank || desc_of(c, q).vhash.load(std::memory_order_relaxed) == mine) continue;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t theirs = header_entry(r, q, i);
      if (theirs != counts[i])
        c.fail(MismatchError(fmt::format(
            "rank {}: collective mismatch in collective #{} {}: rank {} passed recv_counts[{}]={} "
            "but rank {} passed recv_counts[{}]={}; every rank must pass the same recv_counts",
            c.rank, c.collectives, c.describe(*c.current), q, i, theirs, c.rank, i, counts[i])));
    }
    c.fail(MismatchError(fmt::format(
        "rank {}: collective mismatch in collective #{} {}: rank {} passed different recv_counts",
        c.rank, c.collectives, c.describe(*c.current), q)));
  }
}

[[noreturn]] void pair_mismatch(Communicator::Impl& c, int i, int j, std::uint64_t sent,
                                std::uint64_t expected) {
  c.fail(MismatchError(fmt::format(
      "rank {}: collective mismatch in collective #{} {}: rank {} sends {} elements to rank {} "
      "(its send_counts[{}]) but rank {} expects {} (its recv_counts[{}]); recv_counts[i] on rank "
      "j must equal send_counts[j] on rank i",
      c.rank, c.collectives, c.describe(*c.current), i, sent, j, j, j, expected, i)));
}

// alltoallv: rank i's recv_counts[j] must equal rank j's send_counts[i].
void check_pairs(Communicator::Impl& c, Rounds& r, const VectorArgs& v) {
  const int n = c.size, me = c.rank;
  // The pairs this rank is part of, exactly.
  for (int w = 0; w < n; ++w) {
    if (w == me) continue;
    const std::uint64_t to_me = header_entry(r, w, static_cast<std::size_t>(me));
    if (to_me != v.recv_counts[w]) pair_mismatch(c, w, me, to_me, v.recv_counts[w]);
    const std::uint64_t from_me = header_entry(r, w, static_cast<std::size_t>(n + me));
    if (from_me != v.send_counts[w]) pair_mismatch(c, me, w, v.send_counts[w], from_me);
  }
  // Every other pair, through the sum of the ranks' hash terms.
  std::uint64_t sum = 0;
  for (int q = 0; q < n; ++q) sum += desc_of(c, q).vhash.load(std::memory_order_relaxed);
  if (sum == 0) return;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      const std::uint64_t sent = header_entry(r, i, static_cast<std::size_t>(j));
      const std::uint64_t expected =
          header_entry(r, j, static_cast<std::size_t>(n) + static_cast<std::size_t>(i));
      if (sent != expected) pair_mismatch(c, i, j, sent, expected);
    }
  c.fail(MismatchError(fmt::format(
      "rank {}: collective mismatch in collective #{} {}: the ranks' send_counts and recv_counts "
      "do not match",
      c.rank, c.collectives, c.describe(*c.current))));
}

}  // namespace

void alltoall_staged(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                     DataType dtype) {
  const int n = c.size, me = c.rank;
  const std::size_t bytes = count * datatype_size(dtype);
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  if (bytes > 0) c.copy(out + me * bytes, in + me * bytes, bytes);
  if (n == 1) return;
  Rounds r(c);
  const std::size_t lane = staged_lane_bytes(c.seg->direct_bytes(), n - 1);
  const std::uint64_t total = std::max<std::uint64_t>(1, rounds_for(bytes, lane));
  auto write = [&](std::uint64_t k) {
    std::byte* buf = r.acquire(k, everyone);
    const Slice s = slice_of(bytes, k, lane);
    if (s.bytes > 0)
      for (int j = 0; j < n; ++j)
        if (j != me) c.copy(buf + lane_index(me, j, n) * lane, in + j * bytes + s.begin, s.bytes);
    r.post(k);
  };
  auto read = [&](std::uint64_t k) {
    const Slice s = slice_of(bytes, k, lane);
    if (s.bytes > 0)
      for (int t = 1; t < n; ++t) {
        const int w = (me - t + n) % n;
        c.copy(out + w * bytes + s.begin, r.await(w, k) + lane_index(w, me, n) * lane, s.bytes);
      }
    r.taken(k);
  };
  write(0);
  announce_and_check(c);
  read(0);
  for (std::uint64_t k = 1; k < total; ++k) {
    write(k);
    read(k);
  }
  r.finish(total);
}

void alltoallv_staged(Communicator::Impl& c, const void* send, void* recv, const VectorArgs& v,
                      DataType dtype) {
  const int n = c.size, me = c.rank;
  const std::size_t es = datatype_size(dtype);
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  if (v.send_counts[me] > 0)
    c.copy(out + v.recv_displs[me] * es, in + v.send_displs[me] * es, v.send_counts[me] * es);
  if (n == 1) return;
  Rounds r(c);
  const std::size_t lane = staged_lane_bytes(c.seg->direct_bytes(), n - 1);
  write_header(r.acquire(0, everyone), v.send_counts, &v.recv_counts);
  r.post(0);
  announce_and_check(c);
  check_pairs(c, r, v);
  std::uint64_t data_rounds = 0;
  for (int q = 0; q < n; ++q)
    data_rounds = std::max<std::uint64_t>(data_rounds, desc_of(c, q).aux.load());
  r.taken(0);
  for (std::uint64_t k = 1; k <= data_rounds; ++k) {
    std::byte* buf = r.acquire(k, everyone);
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      const Slice s = slice_of(v.send_counts[j] * es, k - 1, lane);
      if (s.bytes > 0)
        c.copy(buf + lane_index(me, j, n) * lane, in + v.send_displs[j] * es + s.begin, s.bytes);
    }
    r.post(k);
    for (int t = 1; t < n; ++t) {
      const int w = (me - t + n) % n;
      const Slice s = slice_of(v.recv_counts[w] * es, k - 1, lane);
      if (s.bytes > 0)
        c.copy(out + v.recv_displs[w] * es + s.begin, r.await(w, k) + lane_index(w, me, n) * lane,
               s.bytes);
    }
    r.taken(k);
  }
  r.finish(1 + data_rounds);
}

void gather_staged(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                   DataType dtype, int root) {
  const int n = c.size, me = c.rank;
  const std::size_t bytes = count * datatype_size(dtype);
  auto* out = static_cast<std::byte*>(recv);
  if (me == root && bytes > 0 && out + root * bytes != send)
    c.copy(out + root * bytes, send, bytes);
  if (n == 1) return;
  Rounds r(c);
  const std::size_t lane = staged_lane_bytes(c.seg->direct_bytes(), 1);
  const std::uint64_t total = std::max<std::uint64_t>(1, rounds_for(bytes, lane));
  auto is_root = [root](int q) { return q == root; };
  for (std::uint64_t k = 0; k < total; ++k) {
    const Slice s = slice_of(bytes, k, lane);
    if (me != root) {
      std::byte* buf = r.acquire(k, is_root);
      if (s.bytes > 0) c.copy(buf, static_cast<const std::byte*>(send) + s.begin, s.bytes);
      r.post(k);
    }
    if (k == 0) announce_and_check(c);
    if (me == root) {
      if (s.bytes > 0)
        for (int t = 1; t < n; ++t) {
          const int w = (me + t) % n;
          c.copy(out + w * bytes + s.begin, r.await(w, k), s.bytes);
        }
      r.taken(k);
    }
  }
  r.finish(total);
}

void scatter_staged(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                    DataType dtype, int root) {
  const int n = c.size, me = c.rank;
  const std::size_t bytes = count * datatype_size(dtype);
  const auto* in = static_cast<const std::byte*>(send);
  if (me == root && bytes > 0 && recv != in + root * bytes) c.copy(recv, in + root * bytes, bytes);
  if (n == 1) return;
  Rounds r(c);
  const std::size_t lane = staged_lane_bytes(c.seg->direct_bytes(), n - 1);
  const std::uint64_t total = std::max<std::uint64_t>(1, rounds_for(bytes, lane));
  auto not_root = [root](int q) { return q != root; };
  for (std::uint64_t k = 0; k < total; ++k) {
    const Slice s = slice_of(bytes, k, lane);
    if (me == root) {
      std::byte* buf = r.acquire(k, not_root);
      if (s.bytes > 0)
        for (int j = 0; j < n; ++j)
          if (j != root)
            c.copy(buf + lane_index(root, j, n) * lane, in + j * bytes + s.begin, s.bytes);
      r.post(k);
    }
    if (k == 0) announce_and_check(c);
    if (me != root) {
      if (s.bytes > 0)
        c.copy(static_cast<std::byte*>(recv) + s.begin,
               r.await(root, k) + lane_index(root, me, n) * lane, s.bytes);
      r.taken(k);
    }
  }
  r.finish(total);
}

void allgatherv_staged(Communicator::Impl& c, const void* send, void* recv, const VectorArgs& v,
                       DataType dtype) {
  const int n = c.size, me = c.rank;
  const std::size_t es = datatype_size(dtype);
  const std::size_t my_bytes = v.recv_counts[me] * es;
  auto* out = static_cast<std::byte*>(recv);
  if (my_bytes > 0 && out + v.recv_displs[me] * es != send)
    c.copy(out + v.recv_displs[me] * es, send, my_bytes);
  if (n == 1) return;
  Rounds r(c);
  const std::size_t lane = staged_lane_bytes(c.seg->direct_bytes(), 1);
  write_header(r.acquire(0, everyone), v.recv_counts);
  r.post(0);
  announce_and_check(c);
  check_same_counts(c, r, v.recv_counts);
  r.taken(0);
  std::uint64_t data_rounds = 0;
  for (int q = 0; q < n; ++q)
    data_rounds = std::max(data_rounds, rounds_for(v.recv_counts[q] * es, lane));
  for (std::uint64_t k = 1; k <= data_rounds; ++k) {
    std::byte* buf = r.acquire(k, everyone);
    const Slice mine = slice_of(my_bytes, k - 1, lane);
    if (mine.bytes > 0) c.copy(buf, static_cast<const std::byte*>(send) + mine.begin, mine.bytes);
    r.post(k);
    for (int t = 1; t < n; ++t) {
      const int w = (me - t + n) % n;
      const Slice s = slice_of(v.recv_counts[w] * es, k - 1, lane);
      if (s.bytes > 0) c.copy(out + v.recv_displs[w] * es + s.begin, r.await(w, k), s.bytes);
    }
    r.taken(k);
  }
  r.finish(1 + data_rounds);
}

void reduce_scatter_v_staged(Communicator::Impl& c, const void* send, void* recv,
                             const VectorArgs& v, DataType dtype, ReduceOp op) {
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
  Rounds r(c);
  const std::size_t lane = staged_lane_bytes(c.seg->direct_bytes(), n);
  write_header(r.acquire(0, everyone), v.recv_counts);
  r.post(0);
  announce_and_check(c);
  check_same_counts(c, r, v.recv_counts);
  r.taken(0);
  std::uint64_t data_rounds = 0;
  for (int q = 0; q < n; ++q)
    data_rounds = std::max(data_rounds, rounds_for(v.recv_counts[q] * es, lane));
  for (std::uint64_t k = 1; k <= data_rounds; ++k) {
    std::byte* buf = r.acquire(k, everyone);
    // Every block's slice, ours too: in place, out aliases our block of
    // `send`, and the reduction must not read what it writes.
    for (int j = 0; j < n; ++j) {
      const Slice s = slice_of(v.recv_counts[j] * es, k - 1, lane);
      if (s.bytes > 0) c.copy(buf + j * lane, in + offset[j] + s.begin, s.bytes);
    }
    r.post(k);
    const Slice s = slice_of(v.recv_counts[me] * es, k - 1, lane);
    if (s.bytes > 0) {
      for (int t = 1; t < n; ++t) r.await((me + t) % n, k);
      reduce_in_rank_order(
          c, out + s.begin, [&](int q) { return r.buffer(q, k) + me * lane; }, n, s.bytes / es,
          dtype, op);
    }
    r.taken(k);
  }
  r.finish(1 + data_rounds);
}

}  // namespace shmring::algo
