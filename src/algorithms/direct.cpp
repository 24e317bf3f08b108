// One-shot ("direct") small-message algorithms.
//
// Collective c: every rank that contributes data copies it once into its
// direct buffer (c mod 2), then announces c (descriptor and data visible).
// Readers wait for the announcements they need, check the descriptors, and
// read the peers' buffers straight from shared memory: one synchronisation
// instead of the ring's 2(N-1) steps, at the price of reading N buffers.
// Reductions combine ranks in rank order 0, 1, ..., N-1, so every rank gets
// the same bits (reduce_in_rank_order; float16 / bfloat16 sum, prod and avg
// accumulate in float64 and round once). A buffer is reused two collectives later, once every rank
// has finished the collective that read it (the `done` counters).
//
// Why recycling is safe on a weakly ordered CPU (AArch64, POWER), where
// loads may be satisfied late and stores become visible out of order:
// reader q reads buffer (c mod 2) of rank r in collective c (on its own
// thread or on its TBB workers, whose join in parallel_for orders their
// loads before the caller's next step), then ends c with publish(done, c+1),
// a release store: all of q's earlier loads of the buffer are complete
// before that store can be seen. Rank r writes the buffer again in
// collective c+2 only after acquire_direct_buffer() saw done(q) >= c+1 for
// every q with an acquire load, so its new stores come after q's reads in
// happens-before order: no reader sees half-overwritten data (the
// load-buffering outcome is excluded by release/acquire). In the other
// direction r's copy into the buffer precedes announce()'s release store,
// and readers wait_announced() with an acquire load before reading. x86
// streaming stores (a broadcast root's copy_to_direct may choose them) are
// not ordered by a release store alone: copy_streaming() ends with sfence
// for that reason.
//
// Who checks whom (so that any disagreement is seen by someone):
//   allreduce, reduce-scatter, allgather: every rank checks every rank;
//   broadcast, reduce too: a rank that checked only the root could return
//   the data of a root that other ranks disagree with.

#include "algorithms/algorithms.hpp"
#include "core/chunking.hpp"
#include "core/reduce_steps.hpp"
#include "core/state.hpp"

namespace shmring::algo {

namespace {

const std::byte* buffer_of(CommState& c, int q) {
  return c.seg->direct(q, c.collectives % detail::kDirectBuffers);
}

// out[i] = op over ranks q of (buffer q + offset)[i], in rank order.
void reduce_all(CommState& c, std::byte* out, std::size_t offset_bytes, std::size_t m,
                DataType dtype, ReduceOp op) {
  reduce_in_rank_order(
      c, out, [&c, offset_bytes](int q) { return buffer_of(c, q) + offset_bytes; }, c.size, m,
      dtype, op);
}

// The one-shot reductions' copies stay plain (`streamable` false). N=2, on
// the AMD VM: streamed, a reduce-scatter ran 3x faster while the two
// vCPUs sat on different L3s (64 KiB 19.2 -> 6.3 us) but 1.3-1.6x slower
// while they shared one (16 KiB 1.46 -> 2.2-2.4 us, 64 KiB 5.6 -> 7.1-7.7),
// also out of place with the rank's own term read from `send`; a reduce
// alike. A broadcast root's copy streams where copy_to_direct says so: 64
// KiB 7.6 -> 4.5 us on one L3, 29.5 -> 4.2 apart
// (docs/performance/notes/2026-12-06-direct-buffer-stores.md).
void publish_data(CommState& c, const void* data, std::size_t bytes, bool streamable) {
  std::byte* mine = c.acquire_direct_buffer();
  if (bytes > 0) {
    if (streamable)
      c.copy_to_direct(mine, data, bytes);
    else
      c.copy(mine, data, bytes);
  }
  c.announce();
  c.step = 0;  // our data is out; what follows waits for the peers'
}

}  // namespace

void allreduce_direct(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                      ReduceOp op) {
  const std::size_t es = datatype_size(dtype);
  publish_data(c, send, count * es, /*streamable=*/false);
  c.wait_every_announced();
  if (count > 0) reduce_all(c, static_cast<std::byte*>(recv), 0, count, dtype, op);
}

void reduce_scatter_direct(CommState& c, const void* send, void* recv, std::size_t recv_count,
                           DataType dtype, ReduceOp op) {
  const std::size_t es = datatype_size(dtype);
  publish_data(c, send, static_cast<std::size_t>(c.size) * recv_count * es, /*streamable=*/false);
  c.wait_every_announced();
  if (recv_count > 0)
    reduce_all(c, static_cast<std::byte*>(recv), static_cast<std::size_t>(c.rank) * recv_count * es,
               recv_count, dtype, op);
}

void allgather_direct(CommState& c, const void* send, void* recv, std::size_t send_count,
                      DataType dtype) {
  const std::size_t bytes = send_count * datatype_size(dtype);
  publish_data(c, send, bytes, /*streamable=*/false);
  c.wait_every_announced();
  auto* out = static_cast<std::byte*>(recv);
  for (int q = 0; q < c.size; ++q) {
    std::byte* dst = out + static_cast<std::size_t>(q) * bytes;
    if (bytes > 0 && dst != send) c.copy(dst, buffer_of(c, q), bytes);
  }
}

void broadcast_direct(CommState& c, void* buffer, std::size_t count, DataType dtype, int root) {
  const std::size_t bytes = count * datatype_size(dtype);
  if (c.rank == root) {
    publish_data(c, buffer, bytes, /*streamable=*/true);
    c.wait_every_announced();
  } else {
    c.acquire_direct_buffer();  // keeps every rank's pace bounded the same way
    c.announce();
    c.step = 0;
    // Every rank, not just the root: ranks that agree with each other on a
    // root that others disagree with must fail too, not return its data.
    c.wait_every_announced();
    if (bytes > 0) c.copy(buffer, buffer_of(c, root), bytes);
  }
}

void reduce_direct(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                   ReduceOp op, int root) {
  const std::size_t es = datatype_size(dtype);
  publish_data(c, send, count * es, /*streamable=*/false);
  if (c.rank == root) {
    c.wait_every_announced();
    if (count > 0) reduce_all(c, static_cast<std::byte*>(recv), 0, count, dtype, op);
  } else {
    c.wait_every_announced();  // as in broadcast_direct: a root mismatch fails every rank
  }
}

// ---------------------------------------------------------------------------
// Two-shot allreduce: a direct reduce-scatter, then a direct allgather.
//
// Every rank publishes its whole input in its direct buffer (as the one-shot
// path does) and announces it. Rank r then reduces chunk r (chunk_range) of
// every rank's buffer, in rank order, into its output, copies that result
// back over chunk r of its own buffer (only rank r ever reads chunk r of any
// buffer in the first phase, so nobody reads what it overwrites) and
// publishes `reduced` = c+1. Last, it copies every other rank's reduced
// chunk out of that rank's buffer. Two synchronisations, and each rank reads
// 2x the buffer instead of the one-shot's N x, at the price of the second
// synchronisation: it pays from a few ranks and mid sizes on (docs/design/protocols.md, "Small
// messages"). The buffers are recycled exactly as the one-shot path's.

void allreduce_two_shot(CommState& c, const void* send, void* recv, std::size_t count,
                        DataType dtype, ReduceOp op) {
  const std::size_t es = datatype_size(dtype);
  publish_data(c, send, count * es, /*streamable=*/false);
  c.wait_every_announced();
  auto* out = static_cast<std::byte*>(recv);
  const detail::Range mine = detail::chunk_range(count, c.size, c.rank);
  if (mine.count > 0) {
    reduce_all(c, out + mine.begin * es, mine.begin * es, mine.count, dtype, op);
    c.copy(c.seg->direct(c.rank, c.collectives % detail::kDirectBuffers) + mine.begin * es,
           out + mine.begin * es, mine.count * es);
  }
  c.step = 1;  // the second phase: the peers' reduced chunks
  c.publish(c.my_area().reduced, c.collectives + 1);
  for (int k = 1; k < c.size; ++k) {
    const int q = (c.rank + k) % c.size;  // start at different peers: spread the reads
    const detail::Range theirs = detail::chunk_range(count, c.size, q);
    c.wait_counter(c.area(q).reduced, c.collectives + 1, q, "a reduced chunk");
    if (theirs.count > 0)
      c.copy(out + theirs.begin * es, buffer_of(c, q) + theirs.begin * es, theirs.count * es);
  }
}

}  // namespace shmring::algo
