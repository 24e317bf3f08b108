// The eager paths of gather and scatter (staged.cpp's top comment,
// "Exception" and "Eager rings"): blocks that fit a direct buffer or an
// eager ring entry leave without waiting for every rank; a later collective
// confirms them (check_eager_*, confirm_eager_ring).

#include <fmt/format.h>

#include <cstring>
#include <optional>

#include "algorithms/staged/staged.hpp"

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
std::byte* eager_buffer(CommState& c) {
  const std::uint64_t coll = c.collectives;
  const std::size_t parity = coll % detail::kDirectBuffers;
  if (coll >= detail::kDirectBuffers && eager_state(c).at[parity] == coll - 1 &&
      c.staged_done_needed <= coll - 1) {
    const int reader = eager_state(c).reader[parity];
    if (reader >= 0)
      c.wait_counter(c.area(reader).done, coll - 1, reader, "the root to finish an earlier gather");
    return c.seg->direct(c.rank, parity);
  }
  return c.acquire_direct_buffer();
}

}  // namespace

void gather_eager(CommState& c, const void* send, std::byte* out, std::size_t bytes, int root) {
  const int n = c.size, me = c.rank;
  const std::uint64_t coll = c.collectives;
  const std::size_t parity = coll % detail::kDirectBuffers;
  c.step = 0;
  if (me != root) {
    std::byte* buf = eager_buffer(c);
    if (bytes > 0) c.copy_to_direct(buf, send, bytes);
    c.announce();
    // The previous collective's gather, if it was one of ours: confirmed
    // after our block is out, so the two overlap.
    if (eager_state(c).gather_unchecked != 0) check_eager_gather(c);
    eager_state(c).gather_unchecked = coll + 1;
    eager_state(c).gather_desc = *c.current;
    eager_state(c).reader[parity] = root;
  } else {
    c.announce();
    // Every call is checked before any block is copied (as gather_eager_ring).
    for (int t = 1; t < n; ++t) c.wait_announced((me + t) % n);
    if (bytes > 0)
      for (int t = 1; t < n; ++t) {
        const int w = (me + t) % n;
        c.copy(out + w * bytes, c.seg->direct(w, parity), bytes);
      }
    eager_state(c).reader[parity] = -1;
  }
  eager_state(c).at[parity] = coll + 1;
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
void scatter_eager(CommState& c, const std::byte* in, void* recv, std::size_t bytes, int root,
                   std::size_t lane) {
  const int n = c.size, me = c.rank;
  c.step = 0;
  if (me == root) {
    std::byte* buf = c.acquire_direct_buffer();
    if (bytes > 0)
      for (int j = 0; j < n; ++j)
        if (j != root)
          c.copy_to_direct(buf + algo::lane_index(root, j, n) * lane, in + j * bytes, bytes);
    c.announce();
    eager_state(c).scatter_unchecked = c.collectives + 1;
    eager_state(c).scatter_desc = *c.current;
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

namespace {

std::uint32_t eager_pack(const CollectiveDesc& d) {
  return static_cast<std::uint32_t>(d.kind) | static_cast<std::uint32_t>(d.dtype) << 8 |
         static_cast<std::uint32_t>(d.op) << 16 | static_cast<std::uint32_t>(d.algorithm) << 24;
}

}  // namespace

bool eager_ring_fits(const CommState& c, CollectiveKind kind, std::size_t bytes) {
  return bytes <= detail::kEagerBytes &&
         (kind == CollectiveKind::gather ||
          static_cast<std::size_t>(c.size) <= detail::kEagerScatterMaxRanks);
}

namespace {

// A writer's entry for collective c (entry c mod E), once every rank has
// finished c-E: its last user was c-E or earlier, so its readers are done.
// The peers' `done` counters are read again only when what we last saw of
// them no longer proves it (once every E collectives while they keep up).
// Confirms our own collective c-E before its pending record is reused.
std::uint64_t eager_entry(CommState& c) {
  const std::uint64_t coll = c.collectives;
  constexpr std::uint64_t e = detail::kEagerEntries;
  if (coll >= e) {
    const std::uint64_t need = coll - e + 1;
    if (eager_state(c).peers_done < need) {
      std::uint64_t low = ~std::uint64_t{0};
      for (int q = 0; q < c.size; ++q) {
        if (q == c.rank) continue;
        c.wait_counter(c.area(q).done, need, q, "a rank to finish an earlier eager collective");
        low = std::min(low, c.area(q).done.value.load(std::memory_order_acquire));
      }
      eager_state(c).peers_done = low;
    }
    confirm_eager_ring(c, coll - e + 1, 0);
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

void eager_write(CommState& c, detail::EagerLine& line, const void* data, std::size_t bytes) {
  const CollectiveDesc& d = *c.current;
  line.count.store(d.count, std::memory_order_relaxed);
  line.kind_dtype_op_algorithm.store(eager_pack(d), std::memory_order_relaxed);
  line.root.store(d.root, std::memory_order_relaxed);
  if (bytes > 0) std::memcpy(eager_data(line), data, bytes);
  line.seq.store(c.collectives + 1, std::memory_order_release);
}

void eager_remember(CommState& c) {
  eager_state(c).pending[c.collectives % detail::kEagerEntries] = {c.collectives + 1, *c.current};
  ++eager_state(c).pending_count;
}

// The reader's wait for line `index` of `peer`'s entry for this collective:
// polls its seq (spinning only where wait_low_latency would), then falls back
// to the peer's `announced` counter (yield, futex sleep, dead peer, abort,
// deadline). A peer that announced the collective without writing the line
// took another path; one whose line describes another call disagrees:
// either is a mismatch, named by check_descriptor where it can.
const detail::EagerLine& wait_eager_line(CommState& c, int peer, std::uint64_t index) {
  const detail::EagerLine& line =
      c.seg->eager_line(peer, c.collectives % detail::kEagerEntries, index);
  const std::uint64_t want = c.collectives + 1;
  auto ready = [&] { return line.seq.load(std::memory_order_acquire) == want; };
  if (!ready()) {
    detail::WaitPolicy policy = c.policy_for(peer);  // as wait_low_latency
    if (!detail::spin_until(policy, ready)) {
      policy.spin_ns = 0;
      c.wait_counter(c.area(peer).announced, want, peer, "an eager block", policy);
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

}  // namespace

// Gather of blocks of at most kEagerBytes: a non-root writes line 0 of its
// entry and returns; the root reads every non-root's line.
void gather_eager_ring(CommState& c, const void* send, std::byte* out, std::size_t bytes,
                       int root) {
  const int n = c.size, me = c.rank;
  c.step = 0;
  eager_state(c).ring_call = true;
  if (me != root) {
    const std::uint64_t entry = eager_entry(c);
    eager_write(c, c.seg->eager_line(me, entry, 0), send, bytes);
    c.announce();
    eager_remember(c);
    return;
  }
  c.announce();
  // Every line is checked before any block is copied: a root that fails
  // returns with `out` as it was.
  for (int t = 1; t < n; ++t) wait_eager_line(c, (me + t) % n, 0);
  if (bytes == 0) return;
  const std::uint64_t entry = c.collectives % detail::kEagerEntries;
  for (int t = 1; t < n; ++t) {
    const int w = (me + t) % n;
    std::memcpy(out + static_cast<std::size_t>(w) * bytes,
                eager_data(c.seg->eager_line(w, entry, 0)), bytes);
  }
}

// Scatter of blocks of at most kEagerBytes (N <= kEagerScatterMaxRanks): the
// root writes reader j's block into line lane_index(root, j) of its entry
// and returns; a reader reads its line.
void scatter_eager_ring(CommState& c, const std::byte* in, void* recv, std::size_t bytes,
                        int root) {
  const int n = c.size, me = c.rank;
  c.step = 0;
  eager_state(c).ring_call = true;
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

namespace {

// What rank q published for collective `coll`, as the eager checks read it
// after an acquire of one of q's counters (the ordering of
// CommState::check_descriptor). `is_coll`: the read was not torn and the entry
// holds collective `coll` (else q is in another collective). The operator
// is not compared (gather and scatter have none) but is kept, so that a
// peer's reduction is named with its own.
struct PeerCall {
  bool is_coll;
  CollectiveDesc desc;
};

PeerCall read_peer_call(CommState& c, int q, std::uint64_t coll) {
  const std::optional<CollectiveDesc> d = c.read_descriptor(q, coll);
  return d ? PeerCall{true, *d} : PeerCall{false, CollectiveDesc{}};
}

// Kind, count, datatype, root and algorithm agree (no operator to compare).
bool same_eager_call(const PeerCall& p, const CollectiveDesc& mine) {
  return p.is_coll && p.desc.kind == mine.kind && p.desc.count == mine.count &&
         p.desc.dtype == mine.dtype && p.desc.root == mine.root &&
         p.desc.algorithm == mine.algorithm;
}

// The peer's call as a mismatch message names it.
std::string their_call(const CommState& c, const PeerCall& p, std::uint64_t coll) {
  return p.is_coll ? fmt::format("collective #{} {}", coll, c.describe(p.desc))
                   : std::string("a different collective");
}

}  // namespace

namespace {

// The core's pending checks (core/state.hpp PendingChecks), installed with
// the eager state.
void eager_at_begin(CommState& c) {
  if (c.eager->scatter_unchecked != 0) check_eager_scatter(c);
}

void eager_at_end(CommState& c) {
  algo::EagerState& e = *c.eager;
  if (e.gather_unchecked != 0 && e.gather_unchecked <= c.collectives) check_eager_gather(c);
  if (e.pending_count > 0)  // "Eager rings": a collective's confirmations
    confirm_eager_ring(
        c, c.collectives >= detail::kEagerEntries ? c.collectives - detail::kEagerEntries + 1 : 0,
        e.ring_call ? 0 : c.collectives);
  e.ring_call = false;
}

}  // namespace

algo::EagerState& eager_state(CommState& c) {
  if (!c.eager) {
    c.eager = {new algo::EagerState{}, [](algo::EagerState* e) { delete e; }};
    c.pending = {&eager_at_begin, &eager_at_end};
  }
  return *c.eager;
}

void check_eager_scatter(CommState& c) {
  algo::EagerState& e = *c.eager;
  const std::uint64_t coll = e.scatter_unchecked - 1;
  const CollectiveDesc mine = e.scatter_desc;
  e.scatter_unchecked = 0;
  for (int q = 0; q < c.size; ++q) {
    if (q == c.rank) continue;
    c.wait_counter(c.area(q).announced, coll + 1, q, "a rank to start a scatter");
    const PeerCall theirs = read_peer_call(c, q, coll);
    if (same_eager_call(theirs, mine)) continue;
    if (theirs.is_coll && theirs.desc.kind == CollectiveKind::invalid)
      c.fail(MismatchError(c.invalid_call_message(q, coll, mine)));
    c.fail(MismatchError(fmt::format(
        "rank {}: collective mismatch: rank {} called collective #{} {} (and returned: a scatter "
        "root does not wait for the others) but rank {} called {}; every rank must call the same "
        "collectives in the same order with the same count, datatype and root",
        c.rank, c.rank, coll, c.describe(mine), q, their_call(c, theirs, coll))));
  }
}

void check_eager_gather(CommState& c) {
  algo::EagerState& e = *c.eager;
  const std::uint64_t coll = e.gather_unchecked - 1;
  const CollectiveDesc mine = e.gather_desc;
  const int root = mine.root;
  e.gather_unchecked = 0;
  // Its root ends it only after checking every c.rank's descriptor; a root
  // that found a mismatch aborts the job, which this wait reports.
  c.wait_counter(c.area(root).done, coll + 1, root, "the root to finish a gather");
  const PeerCall theirs = read_peer_call(c, root, coll);
  if (same_eager_call(theirs, mine)) return;
  if (theirs.is_coll && theirs.desc.kind == CollectiveKind::invalid)
    c.fail(MismatchError(c.invalid_call_message(root, coll, mine)));
  c.fail(MismatchError(fmt::format(
      "rank {}: collective mismatch: rank {} called collective #{} {} (and returned: a non-root "
      "gather rank does not wait for the root) but its root rank {} called {}; every rank must "
      "call the same collectives in the same order with the same count, datatype and root",
      c.rank, c.rank, coll, c.describe(mine), root, their_call(c, theirs, coll))));
}

void confirm_eager_ring(CommState& c, std::uint64_t must, std::uint64_t may) {
  algo::EagerState& st = *c.eager;
  // Every collective c confirms collective c-E (in eager_entry or end()),
  // so of those up to `must` only must-1 can be pending: one slot to look
  // at, unless `may` asks for all that need no wait.
  constexpr std::uint64_t e = detail::kEagerEntries;
  const bool all = may > must;
  if (!all && must == 0) return;
  const std::uint64_t first = all ? 0 : (must - 1) % e, stop = all ? e : first + 1;
  for (std::uint64_t i = first; i < stop; ++i) {
    algo::EagerState::Pending& p = st.pending[i];
    if (p.coll1 == 0 || (p.coll1 > must && p.coll1 > may)) continue;
    const std::uint64_t coll = p.coll1 - 1;
    const CollectiveDesc mine = p.desc;
    const bool gather = mine.kind == CollectiveKind::gather;
    // A gather's root ends it only after checking every line, and aborts
    // the job on a mismatch, which the wait reports; a scatter's readers
    // need only have published their descriptors.
    auto reader_counter = [&](int q) -> detail::Counter& {
      return gather ? c.area(q).done : c.area(q).announced;
    };
    if (p.coll1 > must) {  // only if no wait is needed
      bool ready = true;
      for (int q = 0; q < c.size && ready; ++q)
        if (q != c.rank && (!gather || q == mine.root))
          ready = reader_counter(q).value.load(std::memory_order_acquire) >= coll + 1;
      if (!ready) continue;
    }
    p.coll1 = 0;
    --st.pending_count;
    for (int q = 0; q < c.size; ++q) {
      if (q == c.rank || (gather && q != mine.root)) continue;
      // Every peer finished coll (so a scatter's readers announced it)
      // when the least `done` we last saw (eager_entry) says so: then no
      // read of a counter the peer writes every collective, whose line would
      // otherwise move between the ranks on every call (N=2, back-to-back
      // 8-byte gathers: 0.118-0.128 -> 0.102-0.109 us a call).
      if (st.peers_done < coll + 1)
        c.wait_counter(
            reader_counter(q), coll + 1, q,
            gather ? "the root to finish an eager gather" : "a rank to start an eager scatter");
      const PeerCall theirs = read_peer_call(c, q, coll);
      if (same_eager_call(theirs, mine)) continue;
      if (theirs.is_coll && theirs.desc.kind == CollectiveKind::invalid)
        c.fail(MismatchError(c.invalid_call_message(q, coll, mine)));
      c.fail(MismatchError(fmt::format(
          "rank {}: collective mismatch: rank {} called collective #{} {} (and returned: {}) but "
          "{}rank {} called {}; every rank must call the same collectives in the same order with "
          "the same count, datatype and root",
          c.rank, c.rank, coll, c.describe(mine),
          gather ? "a non-root gather rank does not wait for the root"
                 : "a scatter root does not wait for the others",
          gather ? "its root " : "", q, their_call(c, theirs, coll))));
    }
  }
}

}  // namespace shmring
