#pragma once

// What the files of the staged collectives share (staged.cpp explains the
// rounds): slices and lanes, the Rounds of one collective, run_rounds, the
// checks and the single-copy round (staged.cpp), and the eager paths
// (staged_eager.cpp) that gather and scatter take for small blocks. Private
// to src/algorithms/staged.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "algorithms/algorithms.hpp"
#include "core/reduce_steps.hpp"
#include "core/state.hpp"

namespace shmring::algo {

// Bytes [k*lane, (k+1)*lane) of a block of `total` bytes (empty past its end).
struct Slice {
  std::size_t begin = 0, bytes = 0;
};
inline Slice slice_of(std::size_t total, std::uint64_t k, std::size_t lane) {
  if (k >= (total + lane - 1) / lane) return {};
  const std::size_t begin = static_cast<std::size_t>(k) * lane;
  return {begin, std::min(lane, total - begin)};
}

inline std::uint64_t rounds_for(std::size_t bytes, std::size_t lane) {
  return (bytes + lane - 1) / lane;
}

// Lane of reader j in writer w's buffer when the writer's own block does
// not travel: readers w+1, w+2, ... get lanes 0, 1, ...
inline std::size_t lane_index(int w, int j, int n) {
  return static_cast<std::size_t>((j - w - 1 + n) % n);
}

// The rounds of one staged collective on this rank (see the top comment).
class Rounds {
 public:
  /// `header_bytes`: round 0 starts with a header that long (v-collectives);
  /// its inline data follows at the next 64-byte boundary.
  Rounds(CommState& c, int lanes, std::size_t header_bytes = 0)
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
  /// the slot area as the ring writes its slots (copy_to_slot: plain or
  /// streaming stores, whichever this rank measures faster where streaming
  /// may pay), into a direct buffer as a broadcast root writes its own
  /// (copy_to_direct: the same, but plain where ranks share CPUs; N=2, 64
  /// KiB: allgather 17.5 -> 4.2 us, alltoall 18.2-18.5 -> 4.9-5.1, scatter
  /// 14.9-15.1 -> 2.5-2.7 on the AMD VM with the vCPUs on different L3s,
  /// level or faster on one L3). N=2, 128 KiB blocks
  /// (gather and scatter of 256 KiB): 17.8 -> 12.8 us streamed
  /// (docs/performance/notes). Ranks that share CPUs once always wrote plain,
  /// since a reader on the writer's CPU finds the slice in that CPU's cache
  /// (N=4 on 2 CPUs, alltoall of 512 KiB, always streaming: 61-90 -> 115-133
  /// us); the measured choice is level with plain stores there and 2-3x
  /// faster where the CPUs sit on different L3s
  /// (docs/performance/notes/2026-12-05-adaptive-slot-stores.md).
  /// `streamable` false (the reductions' blocks): into a direct buffer
  /// with plain stores, as the one-shot reductions write theirs (direct.cpp,
  /// publish_data: streamed, their readers were slower while the ranks
  /// shared an L3).
  void put(std::byte* dst, const void* src, std::size_t n, bool streamable = true) {
    if (big_)
      c_.copy_to_slot(dst, src, n);
    else if (streamable)
      c_.copy_to_direct(dst, src, n);
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
  CommState& c_;
  std::uint64_t base_;
  std::size_t lane_direct_, half_slots_, lane_slots_, inline_offset_, lane_inline_;
  bool big_ = false;
  std::uint64_t data_rounds_ = 0;
};

inline bool everyone(int) {
  return true;
}

// Defined in staged.cpp (see their comments there).
void announce_and_check(CommState& c);
const detail::Descriptor& desc_of(CommState& c, int q);
void write_header(std::byte* buf, const std::vector<std::size_t>& a,
                  const std::vector<std::size_t>* b = nullptr);
std::uint64_t header_entry(Rounds& r, int q, std::size_t i);
bool packed(const std::vector<std::size_t>& counts, const std::vector<std::size_t>& displs);
void check_same_counts(CommState& c, Rounds& r, const std::vector<std::size_t>& counts);
void check_pairs(CommState& c, Rounds& r, const VectorArgs& v);
std::uint64_t cma_word(CommState& c, const void* data);
void cma_take(CommState& c, int w, std::size_t offset, std::byte* dst, std::size_t bytes);
std::size_t scatter_rounds_from(const CommState& c);
bool single_copy(CommState& c, std::size_t largest);
bool leaves_inline_out(CommState& c, std::size_t local_largest);
bool someone_left_inline_out(CommState& c);

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
void run_rounds(CommState& c, Rounds& r, bool writer, bool reader, IsReader is_reader,
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

}  // namespace shmring::algo

namespace shmring {

namespace algo {

/// The eager gathers' and scatters' bookkeeping (staged_eager.cpp): calls
/// that returned before their readers were done, confirmed by later
/// collectives. Made by the first eager call (eager_state), which also
/// installs the core's pending checks (core/state.hpp PendingChecks).
struct EagerState {
  // Small gathers leave early (gather_eager). Per direct buffer parity:
  // collective + 1 of the last eager gather this rank ran on it (0: none)
  // and the rank that read our buffer then (-1: we were the root).
  std::uint64_t at[2] = {0, 0};
  int reader[2] = {-1, -1};
  // A non-root's eager gather whose root has not been confirmed yet:
  // collective + 1 (0: none) and our descriptor of it. The next collective
  // confirms it before it returns (check_eager_gather).
  std::uint64_t gather_unchecked = 0;
  CollectiveDesc gather_desc{};
  // A root's eager scatter (scatter_eager) whose non-roots it has not
  // checked: collective + 1 (0: none) and our descriptor of it. The next
  // collective's begin() checks them before we announce it.
  std::uint64_t scatter_unchecked = 0;
  CollectiveDesc scatter_desc{};
  // Eager rings: our gathers as a non-root and scatters as the root that
  // nobody has confirmed yet, at index c mod kEagerEntries: collective + 1
  // (0: none) and our descriptor of it.
  struct Pending {
    std::uint64_t coll1 = 0;
    CollectiveDesc desc{};
  };
  Pending pending[detail::kEagerEntries];
  int pending_count = 0;
  // Every peer's `done` was at least this when we last read them all.
  std::uint64_t peers_done = 0;
  // The collective in flight went through an eager ring (end() then skips
  // the confirmations that need no wait).
  bool ring_call = false;
};

}  // namespace algo

/// This communicator's eager bookkeeping, made on first use.
algo::EagerState& eager_state(CommState& c);
/// Waits until the root of our unchecked eager gather finished it (or the
/// job aborted) and compares its descriptor with ours: a rank that left a
/// gather early fails at its next collective at the latest.
void check_eager_gather(CommState& c);
/// Waits until every rank announced our unchecked eager scatter and
/// compares its descriptor with ours.
void check_eager_scatter(CommState& c);
/// Confirms our pending eager-ring collectives c with c + 1 <= `must`
/// (waiting until their readers finished (gather) or started (scatter)
/// them), and those with c + 1 <= `may` whose readers already did; compares
/// their descriptors with ours: a mismatch fails.
void confirm_eager_ring(CommState& c, std::uint64_t must, std::uint64_t may);

// Defined in staged_eager.cpp (see their comments there).
void gather_eager(CommState& c, const void* send, std::byte* out, std::size_t bytes, int root);
void scatter_eager(CommState& c, const std::byte* in, void* recv, std::size_t bytes, int root,
                   std::size_t lane);
bool eager_ring_fits(const CommState& c, CollectiveKind kind, std::size_t bytes);
void gather_eager_ring(CommState& c, const void* send, std::byte* out, std::size_t bytes, int root);
void scatter_eager_ring(CommState& c, const std::byte* in, void* recv, std::size_t bytes, int root);

}  // namespace shmring
