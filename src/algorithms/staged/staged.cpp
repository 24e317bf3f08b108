// Staged collectives: alltoall, alltoallv, gather, scatter, allgatherv,
// reduce_scatter_v and (at N=2, 4 KiB to 2 MiB blocks, 160 to 640 KiB where ranks share CPUs:
// choose()) allgather, moved in rounds through
// buffers of the writer's own in the segment: the direct buffers for small blocks, the slot area
// for big ones. Nothing grows with N beyond the per-rank areas the segment already has.
//
// Terms (reflected in the names below):
//   writer, reader - a rank that puts data into its own staging buffer, and a
//            rank that copies (or reduces) it out of the writer's buffer.
//   block  - the elements one writer sends to one reader over the whole
//            collective (alltoall: count; gather: the writer's send; ...).
//   lane   - a fixed part of a writer's buffer that belongs to one reader
//            (the buffer cut into L equal lanes, each a multiple of 16
//            bytes); with one reader or a block every reader takes, L = 1.
//   slice  - the part of a block that travels in one round: slice s is bytes
//            [s*lane, (s+1)*lane) of the block (empty past its end).
//   round  - every writer fills its buffer with one slice per reader and
//            publishes it (posted); its readers copy their slices out and
//            say so (taken). A writer refills a buffer in round k >= 2 only
//            after each of its readers has taken round k-2.
//   round 0 - goes out with the descriptor (announce), in direct buffer
//            c mod 2 (acquire_direct_buffer). It carries the header of a
//            v-collective, then the whole collective when the largest block
//            of every writer fits one lane of what is left ("inline": one
//            synchronisation, as the one-shot direct path: readers take it
//            after the writer's announcement, and neither `posted` nor
//            `taken` is published for it).
//   header - the writer's count vectors (N x uint64 each), so that readers
//            check the exact count they will read against what the writer
//            sends, and a mismatch is reported with its values on every rank.
//   data rounds k = 1..R carry slice k-1. When the largest block fits one
//            direct lane they use direct buffer (c + k) mod 2 (free once every
//            rank has started c, so finished c-1); otherwise ("big") half
//            k mod 2 of the writer's slot area (K * slot_bytes / 2 bytes, 8x
//            the direct buffer by default: 8x fewer rounds). The ring reuses
//            the slots without looking at `taken`, so a big writer waits at
//            the end until its readers have taken its last round.
//
// Per collective (N ranks, e = element bytes, L lanes; every byte is written
// once into shared memory and read once out of it):
//   alltoall(count)      L = N-1; each round a rank writes and reads N-1
//                        lanes; (N-1)*count*e bytes each way in all.
//   alltoallv            L = N-1, per-pair slices; header in round 0; R
//                        from the largest block of any writer (aux).
//   gather(count)        L = 1 (only the root reads); the root reads
//                        (N-1)*count*e bytes.
//   scatter(count)       L = N-1; the root writes (N-1)*count*e bytes, every
//                        other rank reads its count*e.
//   allgatherv           L = 1 (every rank reads every buffer); header.
//   allgather            as allgatherv with equal blocks in rank order; no
//                        header (the count is in the descriptor).
//   reduce_scatter_v     L = N (a writer's own block goes through its own
//                        lane too, so that no source aliases the output); the
//                        reader of block r reduces lane r of every buffer in
//                        rank order 0..N-1 (reduce_in_rank_order: the bits of
//                        the direct reduce_scatter, and float16 / bfloat16
//                        accumulate wide and round once); header.
// A rank's own block never travels: it is copied locally (or left in place).
//
// Single copy (alltoall, alltoallv whose send blocks are packed, gather,
// scatter, allgatherv, allgather). When the largest block is single_copy_min() to
// single_copy_max() (64-256 KiB, a scatter's to 512 KiB; where
// process_vm_readv is nearly as fast as memcpy, from 8 KiB with no upper
// bound, a gather's to 512 KiB; where ranks share CPUs, only scatter, and
// alltoall from 32 KiB) and every rank can read every other's memory with
// process_vm_readv (cma.hpp; probed once per communicator, SHMRING_CMA=0
// says no), the data rounds give way to one round with no copy into shared
// memory: each rank publishes in its descriptor (`cma`) whether it can read
// the others and the address of its data; after the announcement the
// readers copy their blocks straight from the writers' buffers, then
// publish `taken` for round 0; a writer returns once its readers have (its
// buffer must not change before).
// MPI's vader transport does the same for large messages; each byte moves
// once instead of twice. A writer that expects the round leaves its block out
// of round 0 and says so (the kCmaNoInline flag); when the round does not
// happen after all (another rank cannot read), the data rounds carry every
// block, even small ones. Errors: a reader that fails to read ends the job on
// every rank (ESRCH: the writer died; EFAULT: the writer passed memory its
// process cannot read).
//
// Exception: gather and scatter whose blocks fit round 0 do not run rounds
// (scatter only below 16 KiB blocks, 32 KiB where ranks share CPUs:
// scatter_rounds_from()); they go eager: only the rank that reads waits. Blocks of at most 488
// bytes (kEagerBytes) go through the eager rings below and may run up to 32 collectives ahead;
// bigger ones through the direct buffers (gather_eager, scatter_eager), one collective ahead
// (mismatches surface by the next call at the latest there).
//
// Eager rings (gather_eager_ring, scatter_eager_ring). Every rank owns a
// ring of E = kEagerEntries (32) entries in the segment (layout.hpp), each
// of max(1, N-1) blocks of 8 64-byte lines (the first line: seq,
// descriptor, 40 data bytes, as the low-latency line; the others 448 more
// data bytes: blocks of up to 488 bytes); collective c uses entry c mod E.
// The writer (a gather's non-root, a scatter's root) fills its block(s) (a
// gather block 0, a scatter the block lane_index(root, reader) of each
// reader), stores seq = c+1 last (release), announces and returns. The reader (the
// gather's root, the scatter's non-roots) polls the seq of the line it
// reads, as wait_low_latency does (spin only where the peer has a CPU of
// its own and the job is not oversubscribed, then the peer's `announced`
// with yield, futex sleep and the dead peer / abort / deadline checks),
// compares the descriptor in the line with its own and only then copies
// the data. A peer that announced c without writing the line took another
// path or another call: check_descriptor names the difference.
//   Reuse: an entry is rewritten in collective c only once every rank has
// finished c-E (their `done` counters; we remember the least value seen,
// so while the readers keep up they are read once per E calls): its last
// user was c-E or earlier and its readers are done with it. Only the
// reading side waits: writers run up to E collectives ahead of their
// readers, and a reader that falls behind finds its lines ready and takes
// them in a batch (MPI's eager sends queue at the receiver the same way).
//   Scatter rings need N-1 blocks per entry: N * E * (N-1) * 512 bytes in
// all (N=16: 3.75 MiB), so they stop at N = kEagerScatterMaxRanks (16);
// past it a small scatter takes the direct buffers (scatter_eager) and the
// region keeps one block per entry for gathers (N=64: 1 MiB, N=256: 4 MiB).
//   E: 32 entries measured faster than 16 and 8 for back-to-back gathers
// and scatters at N=4 on the 2-core VM (loaded; to be re-measured), while
// E + K stays below kDescRing; a larger E only delays a writer's mismatch
// report (within E calls).
//   Mismatches: a reader checks the descriptor of every line before its
// data. A writer returns unchecked, so it remembers the call
// (eager_pending, slot c mod E) and confirms it later: it waits until its
// readers finished (gather: the root, which fails the job on any bad line
// and then never finishes) or started (scatter: every non-root) c and
// compares their descriptors of c with its own (confirm_eager_ring). That
// happens when it reuses the entry, at collective c+E, or at the end of
// collective c+E whatever it is, or at the end of an earlier collective
// that is not an eager-ring one if its readers already got there (no
// wait). So a rank that disagrees fails within E calls at the latest,
// also when no rank saw itself as the reader (two ranks naming each other
// the root of a gather); a rank that stops calling sooner is not told.
//   Interplay: the rings share nothing with the direct buffers, slots or
// low-latency lines, whose reuse rules wait for every rank's `done` of
// the collective that last used them, so a collective after an eager one
// never rewrites something a slow reader still reads.
//   Descriptor ring: a peer can be at most E collectives ahead through the
// rings (the reuse rule), 2 through the direct buffers, K <= 62 through
// ring slots; each path bounds that distance by itself. A confirmation of
// c reads a reader's entry c by collective c+E, when that reader is at
// most c+E+62 = c+94 < c+128 = c+kDescRing: the entry is still c's.
//
// Counters: `posted` and `taken` (RankArea) count rounds of staged
// collectives since the communicator started, the same on every rank (all
// ranks run the same rounds: the round counts follow from descriptors that
// agree), so round k of a collective is `staged_rounds + k` everywhere.
// They only grow, and a wait needs a value at least as large as its target,
// so a round whose counter nobody waits for (an inline round 0) is skipped.
// The direct buffers are shared with the direct path. A staged collective c
// with data rounds may use both, so the next collective to write one
// (direct or staged, through acquire_direct_buffer) first waits until every
// rank has finished c (staged_done_needed). An inline one used buffer
// c mod 2 only, which the direct path's rule already covers: back-to-back
// small alltoalls meet once per call, not twice.
// Memory ordering: as in direct.cpp (release publish after the copies,
// acquire wait before reading; a writer reuses a buffer only after an
// acquire of every reader's `taken`).
//
// Mismatches: the descriptor carries kind, count, dtype, op and root
// (compared by every rank with every rank), plus for v-collectives a hash of
// the count vectors: allgatherv and reduce_scatter_v compare it (equal
// recv_counts); alltoallv sums every rank's term sum_j h(i, j, send[j]) -
// sum_j h(j, i, recv[j]), 0 when the pairs agree (a wrong sum of 0 has a
// 2^-64 chance; the two ranks of a bad pair still see it exactly in the
// headers). On a difference each rank finds the offending values in the
// headers and fails with a MismatchError naming them, so every rank fails.

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>

#include "algorithms/algorithms.hpp"
#include "base/log.hpp"
#include "core/comm.hpp"
#include "core/reduce_steps.hpp"
#include "transport/cma.hpp"

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

// The rounds of one staged collective on this rank (see the top comment).
class Rounds {
 public:
  /// `header_bytes`: round 0 starts with a header that long (v-collectives);
  /// its inline data follows at the next 64-byte boundary.
  Rounds(Communicator::Impl& c, int lanes, std::size_t header_bytes = 0)
      : c_(c),
        base_(c.staged_rounds),
        lane_direct_(staged_lane_bytes(c.seg->direct_bytes(), lanes)),
        half_slots_(c.seg->slots() * c.seg->slot_bytes() / 2),
        lane_slots_(staged_lane_bytes(half_slots_, lanes)),
        inline_offset_(detail::round_up(header_bytes, 64)),
        lane_inline_(inline_offset_ < c.seg->direct_bytes()
                         ? staged_lane_bytes(c.seg->direct_bytes() - inline_offset_, lanes)
                         : 0) {}

  /// Lane of round 0's inline data, after the header.
  std::size_t lane_inline() const { return lane_inline_; }
  std::size_t inline_offset() const { return inline_offset_; }
  /// Writer q's header (the start of its round-0 buffer).
  const std::byte* header(int q) {
    return c_.seg->direct(q, c_.collectives % detail::kDirectBuffers);
  }
  /// Fixes the data rounds for blocks of at most `largest` bytes (the same
  /// on every rank): through the direct buffers when one direct lane holds
  /// the largest block, else through the halves of the slot area.
  void plan(std::size_t largest) {
    big_ = largest > lane_direct_ && lane_slots_ > lane_direct_;
    data_rounds_ = rounds_for(largest, lane());
    // Every rank has finished the previous collective, so the right
    // neighbour has read all our ring slices; checked, as it costs nothing.
    if (big_ && c_.ring.sent > 0)
      c_.wait_counter(c_.area(c_.right).consumed, c_.ring.sent, c_.right, "ring slices to be read");
  }
  std::size_t lane() const { return big_ ? lane_slots_ : lane_direct_; }
  /// Copies n bytes of a writer's block into its round buffer `dst`: into
  /// the slot area as the ring writes its slots (copy_to_slot: streaming
  /// stores for the slice sizes where they were measured to pay), into a
  /// direct buffer with plain stores. N=2, 128 KiB blocks (gather and
  /// scatter of 256 KiB): 17.8 -> 12.8 us (bench/README.md). Not when
  /// ranks share CPUs: a reader that runs on the writer's CPU would find
  /// the slice in that CPU's cache, which streaming stores bypass (N=4 on 2
  /// CPUs, alltoall of 512 KiB: 61-90 -> 115-133 us).
  void put(std::byte* dst, const void* src, std::size_t n) {
    if (big_ && !c_.config.oversubscribed)
      c_.copy_to_slot(dst, src, n);
    else
      c_.copy(dst, src, n);
  }
  std::uint64_t data_rounds() const { return data_rounds_; }

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
  void post(std::uint64_t k) { c_.publish(c_.my_area().posted, base_ + k + 1); }
  /// Writer w's buffer of round k, once w has posted it. Round 0 is read
  /// only after w's announcement (announce_and_check), which w publishes
  /// after round 0: no counter of its own to wait for.
  const std::byte* await(int w, std::uint64_t k) {
    c_.step = static_cast<int>(std::min<std::uint64_t>(k, 1u << 30));
    if (k > 0) c_.wait_counter(c_.area(w).posted, base_ + k + 1, w, "staged data");
    return buffer(w, k);
  }
  void taken(std::uint64_t k) { c_.publish(c_.my_area().taken, base_ + k + 1); }
  /// Ends the collective after round 0 and the data rounds (the same count
  /// on every rank). A writer whose data went through its slots waits until
  /// its readers are done with them: the next ring collective rewrites them
  /// without looking at `taken`.
  template <class IsReader>
  void finish(bool writer, IsReader is_reader) {
    const std::uint64_t total = 1 + data_rounds_;
    if (big_ && writer)
      for (int q = 0; q < c_.size; ++q)
        if (q != c_.rank && is_reader(q))
          c_.wait_counter(c_.area(q).taken, base_ + total, q, "a reader to finish the collective");
    c_.staged_rounds = base_ + total;
    // Data rounds wrote direct buffer (c+1) mod 2 or the slots, which the
    // next collective's own rules do not cover; round 0 alone used buffer
    // c mod 2, as a direct collective does (acquire_direct_buffer's rule).
    if (data_rounds_ > 0) c_.staged_done_needed = c_.collectives + 1;
  }
  /// Ends a collective whose blocks went in the single-copy round: each
  /// reader copied them straight from its writers' buffers, then says so
  /// with `taken` for round 0; a writer returns (and its caller may reuse
  /// its buffer) once every reader has.
  template <class IsReader>
  void finish_single(bool writer, bool reader, IsReader is_reader) {
    if (reader) taken(0);
    if (writer)
      for (int q = 0; q < c_.size; ++q)
        if (q != c_.rank && is_reader(q))
          c_.wait_counter(c_.area(q).taken, base_ + 1, q, "a reader to copy our data");
    c_.staged_rounds = base_ + 1;
  }
  /// Round 0: the inline data in direct buffer c mod 2, after the header.
  /// Data rounds without slots: direct buffer (c + k) mod 2; through the
  /// slots: half k mod 2 of the rank's slot area.
  std::byte* buffer(int r, std::uint64_t k) {
    if (k >= 1 && big_) return c_.seg->slot(r, 0) + (k % 2) * half_slots_;
    return c_.seg->direct(r, (c_.collectives + k) % detail::kDirectBuffers) +
           (k == 0 ? inline_offset_ : 0);
  }

 private:
  Communicator::Impl& c_;
  std::uint64_t base_;
  std::size_t lane_direct_, half_slots_, lane_slots_, inline_offset_, lane_inline_;
  bool big_ = false;
  std::uint64_t data_rounds_ = 0;
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
  std::memcpy(&v, r.header(q) + i * sizeof(std::uint64_t), sizeof(v));
  return v;
}

// Whether blocks lie back to back in rank order from displacement 0, as
// most alltoallv callers lay them out (torch's all_to_all_single always
// does): then a reader finds its block in a writer's send buffer from the
// counts in the writer's header alone (alltoallv's single-copy round).
bool packed(const std::vector<std::size_t>& counts, const std::vector<std::size_t>& displs) {
  std::size_t at = 0;
  for (std::size_t j = 0; j < counts.size(); at += counts[j], ++j)
    if (displs[j] != at) return false;
  return true;
}

// allgatherv / reduce_scatter_v: every rank's recv_counts must equal ours.
void check_same_counts(Communicator::Impl& c, Rounds& r, const std::vector<std::size_t>& counts) {
  const std::uint64_t mine = c.current->vhash;  // the front's staged_vector_hash(counts)
  const auto n = static_cast<std::size_t>(c.size);
  for (int q = 0; q < c.size; ++q) {
    if (q == c.rank) continue;
    // The entries this rank's reads depend on are compared exactly (q's own
    // block, and ours as q sees it); the hash covers the rest.
    const bool exact_ok = header_entry(r, q, static_cast<std::size_t>(q)) == counts[q] &&
                          header_entry(r, q, static_cast<std::size_t>(c.rank)) == counts[c.rank];
    if (exact_ok && desc_of(c, q).vhash.load(std::memory_order_relaxed) == mine) continue;
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

}  // namespace

void alltoallv_pair_mismatch(Communicator::Impl& c, int i, int j, std::uint64_t sent,
                             std::uint64_t expected) {
  c.fail(MismatchError(fmt::format(
      "rank {}: collective mismatch in collective #{} {}: rank {} sends {} elements to rank {} "
      "(its send_counts[{}]) but rank {} expects {} (its recv_counts[{}]); recv_counts[i] on rank "
      "j must equal send_counts[j] on rank i",
      c.rank, c.collectives, c.describe(*c.current), i, sent, j, j, j, expected, i)));
}

namespace {

// alltoallv: rank i's recv_counts[j] must equal rank j's send_counts[i].
void check_pairs(Communicator::Impl& c, Rounds& r, const VectorArgs& v) {
  const int n = c.size, me = c.rank;
  // The pairs this rank is part of, exactly.
  for (int w = 0; w < n; ++w) {
    if (w == me) continue;
    const std::uint64_t to_me = header_entry(r, w, static_cast<std::size_t>(me));
    if (to_me != v.recv_counts[w]) alltoallv_pair_mismatch(c, w, me, to_me, v.recv_counts[w]);
    const std::uint64_t from_me = header_entry(r, w, static_cast<std::size_t>(n + me));
    if (from_me != v.send_counts[w]) alltoallv_pair_mismatch(c, me, w, v.send_counts[w], from_me);
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
      if (sent != expected) alltoallv_pair_mismatch(c, i, j, sent, expected);
    }
  c.fail(MismatchError(fmt::format(
      "rank {}: collective mismatch in collective #{} {}: the ranks' send_counts and recv_counts "
      "do not match",
      c.rank, c.collectives, c.describe(*c.current))));
}

// ---- Single copy (see the top comment, "Single copy"). ----

// Whether this rank may read every peer's memory: once per communicator, 8
// bytes from each peer's RankInfo::probe_addr, which must read back as its
// own address (so that a pid of another pid namespace, naming some other
// process, cannot pass).
bool cma_capable(Communicator::Impl& c) {
  if (c.cma_probed < 0) {
    bool ok = c.cma_mode == 1;
    int refused_by = -1, err = 0;
    for (int q = 0; ok && q < c.size; ++q) {
      if (q == c.rank) continue;
      const detail::RankInfo& info = c.area(q).info;
      const std::uint64_t addr = info.probe_addr.load(std::memory_order_relaxed);
      std::uint64_t seen = 0;
      err = addr == 0 ? EINVAL
                      : detail::cma_read(info.pid.load(std::memory_order_relaxed),
                                         reinterpret_cast<std::byte*>(&seen), addr, sizeof seen);
      ok = err == 0 && seen == addr;
      if (!ok) refused_by = q;
    }
    if (!ok && c.cma_mode == 1)
      SHMRING_LOG(info,
                  "single-copy reads (process_vm_readv) of rank {} refused ({}): staged "
                  "collectives copy through shared memory",
                  refused_by, err != 0 ? std::strerror(err) : "read another value");
    c.cma_probed = ok ? 1 : 0;
  }
  return c.cma_probed == 1;
}

// What this rank publishes in its descriptor's `cma` word (layout.hpp).
std::uint64_t cma_word(Communicator::Impl& c, const void* data) {
  if (!cma_capable(c)) return 0;
  return detail::kCmaCapable | (c.cma_large == 1 ? detail::kCmaLarge : 0) |
         reinterpret_cast<std::uint64_t>(data);
}

// Copies `bytes` at `offset` of writer w's published data into `dst`. A
// failure ends the job on every rank: the writer died (ESRCH), its buffer is
// not memory of its process (EFAULT: a bad pointer passed to the call), or
// the kernel refused a read it allowed at the probe.
void cma_take(Communicator::Impl& c, int w, std::size_t offset, std::byte* dst, std::size_t bytes) {
  if (bytes == 0) return;
  const std::uint64_t base =
      desc_of(c, w).cma.load(std::memory_order_relaxed) & detail::kCmaAddressMask;
  const int pid = c.area(w).info.pid.load(std::memory_order_relaxed);
  const int err = detail::cma_read_parallel(c.arena.get(), pid, dst, base + offset, bytes);
  if (err == 0) return;
  if (err == ESRCH)
    c.fail(PeerFailureError(fmt::format("rank {}: rank {} (pid {}) died during collective #{} {}",
                                        c.rank, w, pid, c.collectives, c.describe(*c.current))));
  // EFAULT also when our own receive buffer is the bad one: name the right
  // buffer (the staged rounds would have crashed on it here).
  if (err == EFAULT && !detail::cma_local_writable(dst, bytes))
    c.fail(SystemError(
        fmt::format("rank {}: collective #{} {}: rank {}'s receive buffer (address {:#x}, {} "
                    "bytes) is not writable memory of its process",
                    c.rank, c.collectives, c.describe(*c.current), c.rank,
                    reinterpret_cast<std::uintptr_t>(dst), bytes),
        err));
  c.fail(SystemError(
      fmt::format("rank {}: collective #{} {}: reading {} bytes of rank {}'s buffer (pid {}, "
                  "address {:#x}) with process_vm_readv failed: {}{}",
                  c.rank, c.collectives, c.describe(*c.current), bytes, w, pid, base + offset,
                  std::strerror(err),
                  err == EFAULT ? "; rank " + std::to_string(w) +
                                      "'s buffer is not valid memory of its process"
                                : "; SHMRING_CMA=0 turns single-copy reads off"),
      err));
}

// The single-copy round pays for blocks of single_copy_min() and more:
// below, the two copies through the direct buffers cost less than the
// kernel's page walk. Both bounds depend on the machine (bench/README.md,
// sixth and eighth sessions, N=2 on 2-core VMs):
// - Where process_vm_readv is much slower than memcpy (an AMD EPYC VM: 512
//   KiB in 41 us against 11 in cache, cma_copy_ratio about 3.7), the slot
//   rounds, which pipeline their two copies on two CPUs (round k+1 is
//   written while round k is read), were faster from 512 KiB, except for
//   scatter, whose single slot round at 512 KiB was slower than one copy
//   (why is not known): 256 KiB, 512 KiB for scatter; from 64 KiB.
// - Where it is close, from 8 KiB (alltoall of 16-64 KiB at N=2 took
//   1.65-2.94 us in one copy against 1.92-6.01 through round 0; blocks of
//   4 KiB were faster through round 0, 1.21 us against 1.42).
// - Where it is close (an Intel Xeon VM, ratio 1.7-1.9), one copy was
//   faster at every size for alltoall, allgatherv and scatter (alltoall 1
//   MiB 46 us against 96; scatter 2 MiB 50 against 160), as for Open MPI,
//   which reads the same way; for gather only up to 512 KiB blocks (a
//   gather's root copies every block either way, and a memcpy from the
//   slots is the faster copy once the writers' rounds overlap it).
// Every rank publishes which case it is in (kCmaLarge: SHMRING_CMA_LARGE,
// or measured once per process, cma.hpp kCmaLargeMaxRatio) and the larger
// bounds apply only when every rank does. When ranks share CPUs (N=4 on
// the 2 CPUs): for scatter at the same bounds, whose root alone would copy
// every block into the slots (256 KiB and 2 MiB: 22.5-23.9 and 164 us
// through the slots, 8.2-9.9 and 64-71 in one copy, Open MPI 11.4-13.4 and
// 118); for alltoall and alltoallv from 32 KiB blocks (total 128 KiB, 256
// KiB, 2 MiB: 22.3-23.5, 42-56, 532-539 us through the slots, 16.1-20.6,
// 22.8-24.2, 429-432 in one copy, Open MPI 18.0-21.8, 27.4-28.1, 510; 8 and
// 16 KiB blocks were as often slower, 8.4-8.8 against 10.0-12.6 at 8 KiB);
// not for gather and allgatherv, as often slower as faster in one copy
// there (a reader that runs where its writer did finds the data in cache
// through the slots). Every input is the same on every rank (the
// descriptors, the kind, `largest`, the job's oversubscription), so every
// rank takes the same path.
std::size_t single_copy_min(const Communicator::Impl& c, bool large) {
  const std::size_t own_cpus = large ? 8 * 1024 : 64 * 1024;
  if (!c.config.oversubscribed) return own_cpus;
  switch (c.current->kind) {
    case CollectiveKind::scatter:
      return own_cpus;
    case CollectiveKind::alltoall:
    case CollectiveKind::alltoallv:
      return std::max<std::size_t>(own_cpus, 32 * 1024);
    default:
      return std::numeric_limits<std::size_t>::max();
  }
}

std::size_t single_copy_max(CollectiveKind kind, bool large) {
  if (!large) return kind == CollectiveKind::scatter ? 512 * 1024 : 256 * 1024;
  return kind == CollectiveKind::gather ? 512 * 1024 : std::numeric_limits<std::size_t>::max();
}

// Scatter blocks from this size skip the eager path for the rounds, so that
// the single-copy round can take them: each reader copies its block out of
// the root's buffer once, instead of the root copying every block into its
// direct buffer and each reader copying it out again. N=2, out of place,
// us, eager / rounds (ninth session, Intel VM): 16 KiB blocks 1.93-2.03 /
// 1.11-1.14 in cache, 4.60-4.67 / 3.92-3.96 with -I (cache-cold buffers);
// 32 KiB 3.59-3.75 / 1.82-1.92 and 8.48-8.72 / 7.01-7.19; but 8 KiB blocks
// cold 2.44-2.58 / 2.91-2.97. N=4 on the 2 CPUs, 8 and 16 KiB blocks:
// 2.99-3.03 / 4.49-5.06 and 4.82-4.85 / 5.07-5.16; 32 KiB level. Where the
// round does not happen (SHMRING_CMA=0 somewhere, or blocks under
// single_copy_min()), round 0 carries the block as the eager path would
// (SHMRING_CMA_LARGE=0, N=2, 16 and 32 KiB: 1.84 / 1.91-1.94 and 3.44-3.47
// / 3.56-3.60). Both inputs are the same on every rank. Gather keeps its
// eager path up to the direct buffer: its rounds were faster in cache but
// slower cold (N=2, 32 KiB blocks: 6.57-6.62 against 4.61-4.80 us).
std::size_t scatter_rounds_from(const Communicator::Impl& c) {
  return c.config.oversubscribed ? 32 * 1024 : 16 * 1024;
}

bool single_copy(Communicator::Impl& c, std::size_t largest) {
  if (largest < single_copy_min(c, true)) return false;
  bool large = true;
  for (int q = 0; q < c.size; ++q) {
    const std::uint64_t word = desc_of(c, q).cma.load(std::memory_order_relaxed);
    if ((word & detail::kCmaCapable) == 0) return false;
    large = large && (word & detail::kCmaLarge) != 0;
  }
  return largest >= single_copy_min(c, large) && largest <= single_copy_max(c.current->kind, large);
}

// A writer whose block is big enough for the single-copy round, and which
// can take it, leaves its block out of round 0 (it would be copied for
// nothing); when the round does not happen (a peer cannot read), the data
// rounds carry the blocks instead of round 0.
bool leaves_inline_out(Communicator::Impl& c, std::size_t local_largest) {
  return local_largest >= single_copy_min(c, c.cma_large == 1) && cma_capable(c);
}

bool someone_left_inline_out(Communicator::Impl& c) {
  for (int q = 0; q < c.size; ++q)
    if (desc_of(c, q).cma.load(std::memory_order_relaxed) & detail::kCmaNoInline) return true;
  return false;
}

}  // namespace

namespace {

// Runs the rounds of a staged collective. `header` writes the start of
// round 0 of a v-collective (the count vectors), or is null; `check` runs on
// every rank once the descriptors agree and returns the largest block of any
// writer in bytes (the same on every rank). A writer whose own largest block
// (`local_largest`) fits one lane of round 0 (after the header) puts its
// data there too; when every writer's fits (check() says so), readers take
// it from round 0 and no data round follows: one synchronisation. Otherwise
// the data rounds carry everything (an inline copy is ignored).
// write(buf, slice, lane) fills this writer's buffer with slice `slice` of
// its blocks; read(k, slice, lane) copies slice `slice` out of the writers'
// round-k buffers (r.await) into this reader's output.
// `single` (or null) reads this reader's blocks from the writers' buffers
// in the single-copy round, relative to their `my_data`; a rank that passes
// can_single = false (an alltoallv whose send blocks are not packed) turns
// the round off for everyone, as a rank that cannot read does.
// `local` (or null) copies this rank's own block, which never travels. It
// runs once the rank has published its first data round, or before its
// first read when it writes nothing: a gather's root copies its own block
// while the writers fill their buffers, and a scatter's root while the
// readers empty its own, instead of before it announces, which made both
// sides wait for it (N=2 gather of 256 KiB: three copies in a row instead
// of two side by side).
template <class IsReader, class Header, class Check, class Write, class Read,
          class Local = std::nullptr_t, class Single = std::nullptr_t>
void run_rounds(Communicator::Impl& c, Rounds& r, bool writer, bool reader, IsReader is_reader,
                std::size_t local_largest, Header header, Check check, Write write, Read read,
                Local local = nullptr, Single single = nullptr, const void* my_data = nullptr,
                bool can_single = true) {
  constexpr bool has_header = !std::is_same_v<Header, std::nullptr_t>;
  constexpr bool has_single = !std::is_same_v<Single, std::nullptr_t>;
  bool local_done = std::is_same_v<Local, std::nullptr_t>;
  auto copy_local = [&] {
    if constexpr (!std::is_same_v<Local, std::nullptr_t>) {
      if (!local_done) local();
      local_done = true;
    }
  };
  const std::size_t lane0 = r.lane_inline();
  bool no_inline = false;
  if constexpr (has_single) no_inline = writer && can_single && leaves_inline_out(c, local_largest);
  if (writer) {
    std::byte* buf = r.acquire(0, is_reader);
    if constexpr (has_header) header(buf);
    if (lane0 > 0 && local_largest <= lane0 && !no_inline) write(buf + r.inline_offset(), 0, lane0);
    // Round 0 needs no `posted`: readers wait for the announcement below.
  }
  if constexpr (has_single)
    c.my_area().desc[c.collectives % detail::kDescRing].cma.store(
        (can_single ? cma_word(c, writer ? my_data : nullptr) : 0) |
            (no_inline ? detail::kCmaNoInline : 0),
        std::memory_order_relaxed);
  announce_and_check(c);
  const std::size_t largest = check();
  bool one_copy = false, inline_data = lane0 > 0 && largest <= lane0;
  if constexpr (has_single) {
    one_copy = single_copy(c, largest);
    if (one_copy || someone_left_inline_out(c)) inline_data = false;
  }
  if (inline_data) {
    // One synchronisation: buffer c mod 2 is reused after every rank has
    // finished c (acquire_direct_buffer), so no `taken` either. (Counters
    // only grow: skipping a value leaves later waits unchanged.)
    copy_local();
    if (reader) read(0, 0, lane0);
  } else if (one_copy) {
    if constexpr (has_single) {
      copy_local();
      if (reader) single();
      r.finish_single(writer, reader, is_reader);
      return;
    }
  } else {
    r.plan(largest);
    // Round 2 rewrites round 0's buffer once its readers took it.
    if (reader || has_header) r.taken(0);
  }
  for (std::uint64_t k = 1; k <= r.data_rounds(); ++k) {
    if (writer) {
      write(r.acquire(k, is_reader), k - 1, r.lane());
      r.post(k);
    }
    copy_local();
    if (reader) {
      read(k, k - 1, r.lane());
      r.taken(k);
    }
  }
  copy_local();  // a collective without data rounds (every count 0)
  r.finish(writer, is_reader);
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
      nullptr,
      [&] {
        for (int t = 1; t < n; ++t) {
          const int w = (me - t + n) % n;
          cma_take(c, w, me * bytes, out + w * bytes, bytes);
        }
      },
      send);
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
      nullptr,
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

}  // namespace shmring::algo

namespace shmring {

namespace {

// Eager gather: when a block fits one direct buffer (the inline case of the
// staged gather), a non-root copies it into direct buffer c mod 2, announces
// and returns without waiting for anyone; only the root waits, for each
// announcement, checks each descriptor (a mismatch fails the root and
// aborts the job) and copies the block. Back-to-back gathers pipeline, as
// MPI's eager sends do, instead of every rank meeting every other twice per
// call (with more ranks than cores each meeting costs context switches).
//
// Buffer reuse: our buffer c mod 2 was last written in c-2 (or earlier).
// When c-2 was an eager gather of ours, its only reader was its root: wait
// until the root finished c-2. As the root of c-2 we wrote nothing and saw
// every rank announce c-2, so every earlier reader is done. Otherwise (or
// when a staged collective since needs more) the direct path's rule applies.
//
// Mismatches: the root checks every descriptor before it returns data. A
// non-root returns nothing, so it may leave unchecked; its next collective
// confirms the gather before returning (check_eager_gather: the root
// finished it and its descriptor equals ours), so a rank that disagrees
// fails at its next call at the latest, even when no rank saw itself as
// the root. Pace: every rank still waits for someone who waited for every
// rank at least every second collective, far inside the descriptor ring.
std::byte* eager_buffer(Communicator::Impl& c) {
  const std::uint64_t coll = c.collectives;
  const std::size_t parity = coll % detail::kDirectBuffers;
  if (coll >= detail::kDirectBuffers && c.eager_at[parity] == coll - 1 &&
      c.staged_done_needed <= coll - 1) {
    const int reader = c.eager_reader[parity];
    if (reader >= 0)
      c.wait_counter(c.area(reader).done, coll - 1, reader, "the root to finish an earlier gather");
    return c.seg->direct(c.rank, parity);
  }
  return c.acquire_direct_buffer();
}

// An eager block goes into its direct buffer as a slot round's does
// (Rounds::put): with streaming stores where they pay, unless ranks share
// CPUs. N=2, back-to-back gathers / scatters of 64 KiB blocks (128 KiB in
// all), 3 interleaved runs: 7.8-10.0 / 8.7-8.8 us with plain stores,
// 5.5-5.7 / 4.5-4.6 with streaming ones (Open MPI 7.6 / 7.6).
void put_eager(Communicator::Impl& c, std::byte* dst, const void* src, std::size_t bytes) {
  if (c.config.oversubscribed)
    c.copy(dst, src, bytes);
  else
    c.copy_to_slot(dst, src, bytes);
}

void gather_eager(Communicator::Impl& c, const void* send, std::byte* out, std::size_t bytes,
                  int root) {
  const int n = c.size, me = c.rank;
  const std::uint64_t coll = c.collectives;
  const std::size_t parity = coll % detail::kDirectBuffers;
  c.step = 0;
  if (me != root) {
    std::byte* buf = eager_buffer(c);
    if (bytes > 0) put_eager(c, buf, send, bytes);
    c.announce();
    // The previous collective's gather, if it was one of ours: confirmed
    // after our block is out, so the two overlap.
    if (c.eager_unchecked != 0) c.check_eager_gather();
    c.eager_unchecked = coll + 1;
    c.eager_desc = *c.current;
    c.eager_reader[parity] = root;
  } else {
    c.announce();
    for (int t = 1; t < n; ++t) {
      const int w = (me + t) % n;
      c.wait_announced(w);
      if (bytes > 0) c.copy(out + w * bytes, c.seg->direct(w, parity), bytes);
    }
    c.eager_reader[parity] = -1;
  }
  c.eager_at[parity] = coll + 1;
}

// Eager scatter: when a block fits one lane of a direct buffer, the root
// fills its buffer (lane per reader, as the staged scatter's inline round),
// announces and returns: its own block never travels. A non-root announces,
// waits for the root's announcement, checks the root's descriptor (all its
// data depends on) and copies its lane. The root's buffer is reused through
// acquire_direct_buffer (every rank finished c-2). The root checks the
// non-roots' descriptors at the start of its next collective, before it
// announces that one (check_eager_scatter): a non-root that disagrees with
// it, or a second rank that thinks itself the root, fails by its next call.
void scatter_eager(Communicator::Impl& c, const std::byte* in, void* recv, std::size_t bytes,
                   int root, std::size_t lane) {
  const int n = c.size, me = c.rank;
  c.step = 0;
  if (me == root) {
    std::byte* buf = c.acquire_direct_buffer();
    if (bytes > 0)
      for (int j = 0; j < n; ++j)
        if (j != root)
          put_eager(c, buf + algo::lane_index(root, j, n) * lane, in + j * bytes, bytes);
    c.announce();
    c.eager_scatter_unchecked = c.collectives + 1;
    c.eager_scatter_desc = *c.current;
  } else {
    c.announce();
    c.wait_announced(root);
    if (bytes > 0)
      c.copy(recv,
             c.seg->direct(root, c.collectives % detail::kDirectBuffers) +
                 algo::lane_index(root, me, n) * lane,
             bytes);
  }
}

// ---- Eager rings (see the top comment, "Eager rings"). ----

std::uint32_t eager_pack(const CollectiveDesc& d) {
  return static_cast<std::uint32_t>(d.kind) | static_cast<std::uint32_t>(d.dtype) << 8 |
         static_cast<std::uint32_t>(d.op) << 16 | static_cast<std::uint32_t>(d.algorithm) << 24;
}

bool eager_ring_fits(const Communicator::Impl& c, CollectiveKind kind, std::size_t bytes) {
  return bytes <= detail::kEagerBytes &&
         (kind == CollectiveKind::gather ||
          static_cast<std::size_t>(c.size) <= detail::kEagerScatterMaxRanks);
}

// A writer's entry for collective c (entry c mod E), once every rank has
// finished c-E: its last user was c-E or earlier, so its readers are done.
// The peers' `done` counters are read again only when what we last saw of
// them no longer proves it (once every E collectives while they keep up).
// Confirms our own collective c-E before its pending record is reused.
std::uint64_t eager_entry(Communicator::Impl& c) {
  const std::uint64_t coll = c.collectives;
  constexpr std::uint64_t e = detail::kEagerEntries;
  if (coll >= e) {
    const std::uint64_t need = coll - e + 1;
    if (c.eager_peers_done < need) {
      std::uint64_t low = ~std::uint64_t{0};
      for (int q = 0; q < c.size; ++q) {
        if (q == c.rank) continue;
        c.wait_counter(c.area(q).done, need, q, "a rank to finish an earlier eager collective");
        low = std::min(low, c.area(q).done.value.load(std::memory_order_acquire));
      }
      c.eager_peers_done = low;
    }
    c.confirm_eager_ring(coll - e + 1, 0);
  }
  return coll % e;
}

// The data of the block that starts at `line`: kEagerLineBytes in the line
// itself, then the whole of the block's next lines (contiguous in the entry).
std::byte* eager_data(detail::EagerLine& line) {
  return reinterpret_cast<std::byte*>(&line) + offsetof(detail::EagerLine, data);
}
const std::byte* eager_data(const detail::EagerLine& line) {
  return reinterpret_cast<const std::byte*>(&line) + offsetof(detail::EagerLine, data);
}

void eager_write(Communicator::Impl& c, detail::EagerLine& line, const void* data,
                 std::size_t bytes) {
  const CollectiveDesc& d = *c.current;
  line.count.store(d.count, std::memory_order_relaxed);
  line.kind_dtype_op_algorithm.store(eager_pack(d), std::memory_order_relaxed);
  line.root.store(d.root, std::memory_order_relaxed);
  if (bytes > 0) std::memcpy(eager_data(line), data, bytes);
  line.seq.store(c.collectives + 1, std::memory_order_release);
}

void eager_remember(Communicator::Impl& c) {
  c.eager_pending[c.collectives % detail::kEagerEntries] = {c.collectives + 1, *c.current};
  ++c.eager_pending_count;
}

// The reader's wait for line `index` of `peer`'s entry for this collective:
// polls its seq (spinning only where wait_low_latency would), then falls back
// to the peer's `announced` counter (yield, futex sleep, dead peer, abort,
// deadline). A peer that announced the collective without writing the line
// took another path; one whose line describes another call disagrees:
// either is a mismatch, named by check_descriptor where it can.
const detail::EagerLine& wait_eager_line(Communicator::Impl& c, int peer, std::uint64_t index) {
  const detail::EagerLine& line =
      c.seg->eager_line(peer, c.collectives % detail::kEagerEntries, index);
  const std::uint64_t want = c.collectives + 1;
  auto ready = [&] { return line.seq.load(std::memory_order_acquire) == want; };
  if (!ready()) {
    detail::WaitPolicy policy = c.policy_for(peer);  // as wait_low_latency
    if (!detail::spin_until(policy, ready)) {
      policy.spin_ns = 0;
      std::optional<detail::Clock::time_point> wait_deadline;
      detail::Counter& announced = c.area(peer).announced;
      detail::wait_at_least(announced, want, policy, [&] {
        if (!wait_deadline) wait_deadline = c.deadline();
        c.check_progress(peer, "an eager block", *wait_deadline, announced, want);
      });
      if (!ready()) {
        c.check_descriptor(peer);
        c.fail(MismatchError(fmt::format(
            "rank {}: collective mismatch: collective #{} {}: rank {} started it on another path "
            "(its block does not fit the eager line it expects)",
            c.rank, c.collectives, c.describe(*c.current), peer)));
      }
    }
  }
  const CollectiveDesc& mine = *c.current;
  if (line.kind_dtype_op_algorithm.load(std::memory_order_relaxed) != eager_pack(mine) ||
      line.count.load(std::memory_order_relaxed) != mine.count ||
      line.root.load(std::memory_order_relaxed) != mine.root) {
    c.check_descriptor(peer);  // names the difference and throws
    c.fail(
        MismatchError(fmt::format("rank {}: collective mismatch: collective #{} {}: rank {} "
                                  "disagrees (its eager line describes another call)",
                                  c.rank, c.collectives, c.describe(mine), peer)));
  }
  return line;
}

// Gather of blocks of at most kEagerBytes: a non-root writes line 0 of its
// entry and returns; the root reads every non-root's line.
void gather_eager_ring(Communicator::Impl& c, const void* send, std::byte* out, std::size_t bytes,
                       int root) {
  const int n = c.size, me = c.rank;
  c.step = 0;
  c.eager_ring_call = true;
  if (me != root) {
    const std::uint64_t entry = eager_entry(c);
    eager_write(c, c.seg->eager_line(me, entry, 0), send, bytes);
    c.announce();
    eager_remember(c);
    return;
  }
  c.announce();
  for (int t = 1; t < n; ++t) {
    const int w = (me + t) % n;
    const detail::EagerLine& line = wait_eager_line(c, w, 0);
    if (bytes > 0) std::memcpy(out + static_cast<std::size_t>(w) * bytes, eager_data(line), bytes);
  }
}

// Scatter of blocks of at most kEagerBytes (N <= kEagerScatterMaxRanks): the
// root writes reader j's block into line lane_index(root, j) of its entry
// and returns; a reader reads its line.
void scatter_eager_ring(Communicator::Impl& c, const std::byte* in, void* recv, std::size_t bytes,
                        int root) {
  const int n = c.size, me = c.rank;
  c.step = 0;
  c.eager_ring_call = true;
  if (me == root) {
    const std::uint64_t entry = eager_entry(c);
    for (int j = 0; j < n; ++j)
      if (j != root)
        eager_write(
            c,
            c.seg->eager_line(me, entry, algo::lane_index(root, j, n) * detail::kEagerBlockLines),
            in + static_cast<std::size_t>(j) * bytes, bytes);
    c.announce();
    eager_remember(c);
    return;
  }
  c.announce();
  const detail::EagerLine& line =
      wait_eager_line(c, root, algo::lane_index(root, me, n) * detail::kEagerBlockLines);
  if (bytes > 0) std::memcpy(recv, eager_data(line), bytes);
}

// Peer q's descriptor of collective `coll`, or nullopt when the entry holds
// another collective (or was being rewritten while we read it).
std::optional<CollectiveDesc> eager_desc_of(Communicator::Impl& c, int q, std::uint64_t coll) {
  auto& desc = c.area(q).desc[coll % detail::kDescRing];
  const std::uint64_t seq = desc.seq.load(std::memory_order_acquire);
  const CollectiveDesc theirs{
      static_cast<CollectiveKind>(desc.kind.load(std::memory_order_relaxed)),
      desc.count.load(std::memory_order_relaxed),
      static_cast<DataType>(desc.dtype.load(std::memory_order_relaxed)),
      static_cast<ReduceOp>(desc.op.load(std::memory_order_relaxed)),
      desc.root.load(std::memory_order_relaxed),
      static_cast<Algorithm>(desc.algorithm.load(std::memory_order_relaxed))};
  std::atomic_thread_fence(std::memory_order_acquire);
  if (seq != coll + 1 || desc.seq.load(std::memory_order_relaxed) != seq) return std::nullopt;
  return theirs;
}

}  // namespace

namespace {

// What rank q published for collective `coll`, as the eager checks read it
// after an acquire of one of q's counters (the ordering of
// Impl::check_descriptor). `is_coll`: the read was not torn and the entry
// holds collective `coll` (else q is in another collective). The operator
// is not read: gather and scatter have none (sum).
struct PeerCall {
  bool is_coll;
  CollectiveDesc desc;
};

PeerCall read_peer_call(Communicator::Impl& c, int q, std::uint64_t coll) {
  std::optional<CollectiveDesc> d = eager_desc_of(c, q, coll);
  if (!d) return {false, CollectiveDesc{}};
  d->op = ReduceOp::sum;  // gather and scatter have none: describe() shows sum
  return {true, *d};
}

// Kind, count, datatype, root and algorithm agree (no operator to compare).
bool same_eager_call(const PeerCall& p, const CollectiveDesc& mine) {
  return p.is_coll && p.desc.kind == mine.kind && p.desc.count == mine.count &&
         p.desc.dtype == mine.dtype && p.desc.root == mine.root &&
         p.desc.algorithm == mine.algorithm;
}

// The peer's call as a mismatch message names it.
std::string their_call(const Communicator::Impl& c, const PeerCall& p, std::uint64_t coll) {
  return p.is_coll ? fmt::format("collective #{} {}", coll, c.describe(p.desc))
                   : std::string("a different collective");
}

}  // namespace

void Communicator::Impl::check_eager_scatter() {
  const std::uint64_t coll = eager_scatter_unchecked - 1;
  const CollectiveDesc mine = eager_scatter_desc;
  eager_scatter_unchecked = 0;
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    wait_counter(area(q).announced, coll + 1, q, "a rank to start a scatter");
    const PeerCall theirs = read_peer_call(*this, q, coll);
    if (same_eager_call(theirs, mine)) continue;
    fail(MismatchError(fmt::format(
        "rank {}: collective mismatch: rank {} called collective #{} {} (and returned: a scatter "
        "root does not wait for the others) but rank {} called {}; every rank must call the same "
        "collectives in the same order with the same count, datatype and root",
        rank, rank, coll, describe(mine), q, their_call(*this, theirs, coll))));
  }
}

void Communicator::Impl::check_eager_gather() {
  const std::uint64_t coll = eager_unchecked - 1;
  const CollectiveDesc mine = eager_desc;
  const int root = mine.root;
  eager_unchecked = 0;
  // Its root ends it only after checking every rank's descriptor; a root
  // that found a mismatch aborts the job, which this wait reports.
  wait_counter(area(root).done, coll + 1, root, "the root to finish a gather");
  const PeerCall theirs = read_peer_call(*this, root, coll);
  if (same_eager_call(theirs, mine)) return;
  if (theirs.is_coll && theirs.desc.kind == CollectiveKind::invalid)
    fail(MismatchError(fmt::format(  // the words check_descriptor uses
        "rank {}: collective mismatch: collective #{} {} cannot run: rank {} made an invalid call "
        "(it refused its arguments; its own error says why)",
        rank, coll, describe(mine), root)));
  fail(MismatchError(fmt::format(
      "rank {}: collective mismatch: rank {} called collective #{} {} (and returned: a non-root "
      "gather rank does not wait for the root) but its root rank {} called {}; every rank must "
      "call the same collectives in the same order with the same count, datatype and root",
      rank, rank, coll, describe(mine), root, their_call(*this, theirs, coll))));
}

void Communicator::Impl::confirm_eager_ring(std::uint64_t must, std::uint64_t may) {
  // Every collective c confirms collective c-E (in eager_entry or end()),
  // so of those up to `must` only must-1 can be pending: one slot to look
  // at, unless `may` asks for all that need no wait.
  constexpr std::uint64_t e = detail::kEagerEntries;
  const bool all = may > must;
  if (!all && must == 0) return;
  const std::uint64_t first = all ? 0 : (must - 1) % e, stop = all ? e : first + 1;
  for (std::uint64_t i = first; i < stop; ++i) {
    EagerPending& p = eager_pending[i];
    if (p.coll1 == 0 || (p.coll1 > must && p.coll1 > may)) continue;
    const std::uint64_t coll = p.coll1 - 1;
    const CollectiveDesc mine = p.desc;
    const bool gather = mine.kind == CollectiveKind::gather;
    // A gather's root ends it only after checking every line, and aborts
    // the job on a mismatch, which the wait reports; a scatter's readers
    // need only have published their descriptors.
    auto reader_counter = [&](int q) -> detail::Counter& {
      return gather ? area(q).done : area(q).announced;
    };
    if (p.coll1 > must) {  // only if no wait is needed
      bool ready = true;
      for (int q = 0; q < size && ready; ++q)
        if (q != rank && (!gather || q == mine.root))
          ready = reader_counter(q).value.load(std::memory_order_acquire) >= coll + 1;
      if (!ready) continue;
    }
    p.coll1 = 0;
    --eager_pending_count;
    for (int q = 0; q < size; ++q) {
      if (q == rank || (gather && q != mine.root)) continue;
      // Every peer finished coll (so a scatter's readers announced it)
      // when the least `done` we last saw (eager_entry) says so: then no
      // read of a counter the peer writes every collective, whose line would
      // otherwise move between the ranks on every call (N=2, back-to-back
      // 8-byte gathers: 0.118-0.128 -> 0.102-0.109 us a call).
      if (eager_peers_done < coll + 1)
        wait_counter(
            reader_counter(q), coll + 1, q,
            gather ? "the root to finish an eager gather" : "a rank to start an eager scatter");
      const std::optional<CollectiveDesc> theirs = eager_desc_of(*this, q, coll);
      if (theirs && theirs->kind == mine.kind && theirs->count == mine.count &&
          theirs->dtype == mine.dtype && theirs->root == mine.root &&
          theirs->algorithm == mine.algorithm)
        continue;
      if (theirs && theirs->kind == CollectiveKind::invalid)
        fail(MismatchError(fmt::format(  // the words check_descriptor uses
            "rank {}: collective mismatch: collective #{} {} cannot run: rank {} made an invalid "
            "call (it refused its arguments; its own error says why)",
            rank, coll, describe(mine), q)));
      const std::string their_call = theirs
                                         ? fmt::format("collective #{} {}", coll, describe(*theirs))
                                         : std::string("a different collective");
      fail(MismatchError(fmt::format(
          "rank {}: collective mismatch: rank {} called collective #{} {} (and returned: {}) but "
          "{}rank {} called {}; every rank must call the same collectives in the same order with "
          "the same count, datatype and root",
          rank, rank, coll, describe(mine),
          gather ? "a non-root gather rank does not wait for the root"
                 : "a scatter root does not wait for the others",
          gather ? "its root " : "", q, their_call)));
    }
  }
}

namespace algo {

void gather_staged(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                   DataType dtype, int root) {
  const int n = c.size, me = c.rank;
  const std::size_t bytes = count * datatype_size(dtype);
  auto* out = static_cast<std::byte*>(recv);
  auto copy_own = [&] {
    if (me == root && bytes > 0 && out + root * bytes != send)
      c.copy(out + root * bytes, send, bytes);
  };
  if (n == 1) return copy_own();
  if (eager_ring_fits(c, CollectiveKind::gather, bytes)) {
    copy_own();
    gather_eager_ring(c, send, out, bytes, root);
    return;
  }
  Rounds r(c, 1);
  if (bytes <= r.lane_inline()) {
    copy_own();
    gather_eager(c, send, out, bytes, root);
    return;
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

void scatter_staged(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                    DataType dtype, int root) {
  const int n = c.size, me = c.rank;
  const std::size_t bytes = count * datatype_size(dtype);
  const auto* in = static_cast<const std::byte*>(send);
  auto copy_own = [&] {
    if (me == root && bytes > 0 && recv != in + root * bytes)
      c.copy(recv, in + root * bytes, bytes);
  };
  if (n == 1) return copy_own();
  if (eager_ring_fits(c, CollectiveKind::scatter, bytes)) {
    copy_own();
    scatter_eager_ring(c, in, recv, bytes, root);
    return;
  }
  Rounds r(c, n - 1);
  if (bytes <= r.lane_inline() && bytes < scatter_rounds_from(c)) {
    copy_own();
    scatter_eager(c, in, recv, bytes, root, r.lane_inline());
    return;
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

namespace {

// allgather and allgatherv: rank w's block is bytes(w) bytes at byte at(w)
// of `recv`; `header` writes round 0's header (nullptr: none) and
// `largest(r)` checks the peers' headers and returns the largest block.
template <class Bytes, class At, class Header, class Largest>
void allgather_rounds(Communicator::Impl& c, const void* send, void* recv, Bytes bytes, At at,
                      std::size_t header_bytes, Header header, Largest largest) {
  const int n = c.size, me = c.rank;
  const std::size_t my_bytes = bytes(me);
  auto* out = static_cast<std::byte*>(recv);
  if (my_bytes > 0 && out + at(me) != send) c.copy(out + at(me), send, my_bytes);
  if (n == 1) return;
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
      nullptr,
      [&] {
        for (int t = 1; t < n; ++t) {
          const int w = (me - t + n) % n;
          cma_take(c, w, 0, out + at(w), bytes(w));
        }
      },
      send);
}

}  // namespace

void allgatherv_staged(Communicator::Impl& c, const void* send, void* recv, const VectorArgs& v,
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

void allgather_staged(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                      DataType dtype) {
  // The count is in the descriptor, which check_descriptor compares: no header.
  const std::size_t bytes = count * datatype_size(dtype);
  allgather_rounds(
      c, send, recv, [bytes](int) { return bytes; },
      [bytes](int w) { return static_cast<std::size_t>(w) * bytes; }, 0, nullptr,
      [bytes](Rounds&) { return bytes; });
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
          if (s.bytes > 0) r.put(buf + j * lane, in + offset[j] + s.begin, s.bytes);
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

}  // namespace algo

}  // namespace shmring
