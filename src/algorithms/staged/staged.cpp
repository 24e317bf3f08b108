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

#include "algorithms/staged/staged.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>

#include "algorithms/algorithms.hpp"
#include "base/log.hpp"
#include "core/reduce_steps.hpp"
#include "core/state.hpp"
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

// Announces (descriptor and round 0 visible), then checks every rank's
// descriptor: a root or count mismatch fails every rank.
void announce_and_check(CommState& c) {
  c.announce();
  c.wait_every_announced();
}

const detail::Descriptor& desc_of(CommState& c, int q) {
  return c.area(q).desc[c.collectives % detail::kDescRing];
}

void write_header(std::byte* buf, const std::vector<std::size_t>& a,
                  const std::vector<std::size_t>* b) {
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
void check_same_counts(CommState& c, Rounds& r, const std::vector<std::size_t>& counts) {
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

void alltoallv_pair_mismatch(CommState& c, int i, int j, std::uint64_t sent,
                             std::uint64_t expected) {
  c.fail(MismatchError(fmt::format(
      "rank {}: collective mismatch in collective #{} {}: rank {} sends {} elements to rank {} "
      "(its send_counts[{}]) but rank {} expects {} (its recv_counts[{}]); recv_counts[i] on rank "
      "j must equal send_counts[j] on rank i",
      c.rank, c.collectives, c.describe(*c.current), i, sent, j, j, j, expected, i)));
}

// alltoallv: rank i's recv_counts[j] must equal rank j's send_counts[i].
void check_pairs(CommState& c, Rounds& r, const VectorArgs& v) {
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

namespace {

// Whether this rank may read every peer's memory: once per communicator, 8
// bytes from each peer's RankInfo::probe_addr, which must read back as its
// own address (so that a pid of another pid namespace, naming some other
// process, cannot pass).
bool cma_capable(CommState& c) {
  if (c.single_copy.probed < 0) {
    bool ok = c.single_copy.mode == 1;
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
    if (!ok && c.single_copy.mode == 1)
      SHMRING_LOG(info,
                  "single-copy reads (process_vm_readv) of rank {} refused ({}): staged "
                  "collectives copy through shared memory",
                  refused_by, err != 0 ? std::strerror(err) : "read another value");
    c.single_copy.probed = ok ? 1 : 0;
  }
  return c.single_copy.probed == 1;
}

}  // namespace

// What this rank publishes in its descriptor's `cma` word (layout.hpp).
std::uint64_t cma_word(CommState& c, const void* data) {
  if (!cma_capable(c)) return 0;
  return detail::kCmaCapable | (c.single_copy.large == 1 ? detail::kCmaLarge : 0) |
         reinterpret_cast<std::uint64_t>(data);
}

// Copies `bytes` at `offset` of writer w's published data into `dst`. A
// failure ends the job on every rank: the writer died (ESRCH), its buffer is
// not memory of its process (EFAULT: a bad pointer passed to the call), or
// the kernel refused a read it allowed at the probe.
void cma_take(CommState& c, int w, std::size_t offset, std::byte* dst, std::size_t bytes) {
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

namespace {

// The single-copy round pays for blocks of single_copy_min() and more:
// below, the two copies through the direct buffers cost less than the
// kernel's page walk. Both bounds depend on the machine (docs/performance/notes,
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
std::size_t single_copy_min(const CommState& c, bool large) {
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

}  // namespace

// Scatter blocks from this size skip the eager path for the rounds, so that
// the single-copy round can take them: each reader copies its block out of
// the root's buffer once, instead of the root copying every block into its
// direct buffer and each reader copying it out again. N=2, out of place,
// us, eager / rounds (docs/performance/notes/2026-12-01-intel-fences-eager.md, Intel VM): 16 KiB
// blocks 1.93-2.03 / 1.11-1.14 in cache, 4.60-4.67 / 3.92-3.96 with -I (cache-cold buffers); 32
// KiB 3.59-3.75 / 1.82-1.92 and 8.48-8.72 / 7.01-7.19; but 8 KiB blocks cold 2.44-2.58 / 2.91-2.97.
// N=4 on the 2 CPUs, 8 and 16 KiB blocks: 2.99-3.03 / 4.49-5.06 and 4.82-4.85 / 5.07-5.16; 32 KiB
// level. Where the round does not happen (SHMRING_CMA=0 somewhere, or blocks under
// single_copy_min()), round 0 carries the block as the eager path would
// (SHMRING_CMA_LARGE=0, N=2, 16 and 32 KiB: 1.84 / 1.91-1.94 and 3.44-3.47
// / 3.56-3.60). Both inputs are the same on every rank. Gather keeps its
// eager path up to the direct buffer: its rounds were faster in cache but
// slower cold (N=2, 32 KiB blocks: 6.57-6.62 against 4.61-4.80 us).
std::size_t scatter_rounds_from(const CommState& c) {
  return c.config.oversubscribed ? 32 * 1024 : 16 * 1024;
}

bool single_copy(CommState& c, std::size_t largest) {
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
bool leaves_inline_out(CommState& c, std::size_t local_largest) {
  return local_largest >= single_copy_min(c, c.single_copy.large == 1) && cma_capable(c);
}

bool someone_left_inline_out(CommState& c) {
  for (int q = 0; q < c.size; ++q)
    if (desc_of(c, q).cma.load(std::memory_order_relaxed) & detail::kCmaNoInline) return true;
  return false;
}

}  // namespace shmring::algo
