// Two-shot allreduce in rounds through the slot area: the large-message
// form of the two-shot path of direct.cpp (a reduce-scatter in which every
// rank reduces its own chunk from every rank's copy, then an allgather).
//
// Terms (reflected in the names below):
//   piece  - the bytes of the buffer that one round moves: piece j is
//            elements [j*P, (j+1)*P) of the count (P: half the slot area,
//            K * slot_bytes / 2, in elements; the last piece may be short).
//   part   - rank q's share of a piece, chunk_range(piece, N, q): the part
//            that q reduces and everybody else copies from q.
//   half   - round j uses half j mod 2 of every rank's slot area, so a rank
//            can fill round j+1 while its peers still read round j.
//
// Round j on rank r (every rank runs the same rounds; the counts agree,
// since every descriptor was checked first):
//   1. fill: copy piece j of the input into half j mod 2, publish
//      posted = base + 2j + 1. Half j mod 2 is rewritten only once every rank
//      has finished round j-2 (its `taken` >= base + 2j - 2).
//   2. reduce: wait until every rank posted base + 2j + 1, reduce part r of
//      piece j over every rank's half in rank order 0..N-1 into the output
//      (reduce_in_rank_order: float16 and bfloat16 combine all N inputs in
//      registers and round once, so only 16-bit bytes move and no float64
//      partial ever leaves a rank), copying each block of the result over
//      part r of our own half as it is made (only rank r reads part r of any
//      half in step 2, so nobody reads what it overwrites), and publish
//      posted = base + 2j + 2.
//   3. gather: fill round j+1 first (step 1), then for every other rank q
//      wait until q posted base + 2j + 2 and copy part q of its half into
//      the output (with a thread arena: all parts as one job once every
//      rank posted); publish taken = base + 2j + 2.
// At the end a rank waits until every rank has taken its last round: the
// ring and the staged collectives rewrite the slots without looking at
// `taken` (as Rounds::finish in staged.cpp).
//
// Bytes per rank and round (B = piece bytes): read B and write B to fill,
// read B and write 2B/N to reduce, read and write (N-1)B/N to gather: about
// 4B + 2B/N, the ring's 6B(N-1)/N at N = 4, with 2 synchronisations a round
// instead of the ring's 2(N-1) steps a slice. For the 16-bit sums at N > 2
// the ring carries float64 partials (4x the bytes in reduce-scatter); this
// path carries none. docs/design/algorithms.md compares the two.
//
// Counters: `posted` and `taken` are the staged collectives' round counters
// (staged.cpp), which only grow; a two-shot round uses two values of each,
// so base + 2R is where the next staged collective starts.

#include <algorithm>
#include <vector>

#include "algorithms/algorithms.hpp"
#include "core/chunking.hpp"
#include "core/reduce_steps.hpp"
#include "core/state.hpp"

namespace shmring::algo {

namespace {

struct Piece {
  std::size_t begin = 0, count = 0;  // elements
};

Piece piece_of(std::size_t count, std::size_t piece_elems, std::uint64_t j) {
  const std::size_t begin = static_cast<std::size_t>(j) * piece_elems;
  return {begin, std::min(piece_elems, count - begin)};
}

}  // namespace

void allreduce_two_shot_rounds(CommState& c, const void* send, void* recv, std::size_t count,
                               DataType dtype, ReduceOp op) {
  const int n = c.size, me = c.rank;
  const std::size_t es = datatype_size(dtype);
  const std::size_t half_bytes = c.seg->slots() * c.seg->slot_bytes() / 2;
  const std::size_t piece_elems = half_bytes / es;
  const std::uint64_t rounds = (count + piece_elems - 1) / piece_elems;
  const std::uint64_t base = c.staged_rounds;
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  auto half = [&](int q, std::uint64_t j) { return c.seg->slot(q, 0) + (j % 2) * half_bytes; };

  c.announce();
  c.wait_every_announced();
  // Every rank has finished the previous collective, so the right
  // neighbour has read all our ring slices (as Rounds::plan in staged.cpp).
  if (rounds > 0 && c.ring.sent > 0)
    c.wait_counter(c.area(c.right).consumed, c.ring.sent, c.right, "ring slices to be read");

  auto fill = [&](std::uint64_t j) {
    c.step = static_cast<int>(std::min<std::uint64_t>(j, 1u << 30));
    if (j >= 2)
      for (int q = 0; q < n; ++q)
        if (q != me)
          c.wait_counter(c.area(q).taken, base + 2 * j - 2, q, "a rank to finish a round");
    const Piece p = piece_of(count, piece_elems, j);
    // Written as the ring writes its slots (copy_to_slot), as the staged
    // rounds put their slices (staged.hpp, Rounds::put).
    c.copy_to_slot(half(me, j), in + p.begin * es, p.count * es);
    c.publish(c.my_area().posted, base + 2 * j + 1);
  };

  std::vector<CommState::CopyPart> parts;
  if (c.arena != nullptr) parts.reserve(static_cast<std::size_t>(n));
  if (rounds > 0) fill(0);
  for (std::uint64_t j = 0; j < rounds; ++j) {
    const Piece p = piece_of(count, piece_elems, j);
    const detail::Range mine = detail::chunk_range(p.count, n, me);
    for (int t = 1; t < n; ++t) {
      const int q = (me + t) % n;
      c.wait_counter(c.area(q).posted, base + 2 * j + 1, q, "a rank's piece");
    }
    // The reduced part goes to the output and, block by block while in
    // cache, over part r of our own half, which only we read.
    if (mine.count > 0)
      reduce_in_rank_order(
          c, out + (p.begin + mine.begin) * es, [&](int q) { return half(q, j) + mine.begin * es; },
          n, mine.count, dtype, op, half(me, j) + mine.begin * es);
    c.publish(c.my_area().posted, base + 2 * j + 2);
    if (j + 1 < rounds) fill(j + 1);
    auto their_part = [&](int q) {
      const detail::Range theirs = detail::chunk_range(p.count, n, q);
      return CommState::CopyPart{out + (p.begin + theirs.begin) * es,
                                 half(q, j) + theirs.begin * es, theirs.count * es};
    };
    if (c.arena == nullptr) {
      // One thread: copy each part as soon as its rank posts it.
      for (int t = 1; t < n; ++t) {
        const int q = (me + t) % n;  // start at different peers: spread the reads
        c.wait_counter(c.area(q).posted, base + 2 * j + 2, q, "a reduced part");
        const CommState::CopyPart part = their_part(q);
        c.copy(part.dst, part.src, part.bytes);
      }
    } else {
      // A part (a quarter of a 512 KiB piece at N=4) is too small to split
      // on its own: wait for all of them and copy them as one job over the
      // rank's threads.
      parts.clear();
      for (int t = 1; t < n; ++t) {
        const int q = (me + t) % n;
        c.wait_counter(c.area(q).posted, base + 2 * j + 2, q, "a reduced part");
        parts.push_back(their_part(q));
      }
      c.copy_parts(parts);
    }
    c.publish(c.my_area().taken, base + 2 * j + 2);
  }
  if (rounds > 0)
    for (int q = 0; q < n; ++q)
      if (q != me)
        c.wait_counter(c.area(q).taken, base + 2 * rounds, q, "a rank to finish the collective");
  c.staged_rounds = base + 2 * rounds;
}

}  // namespace shmring::algo
