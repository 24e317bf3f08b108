// One-shot ("direct") small-message algorithms.
//
// Collective c: every rank that contributes data copies it once into its
// direct buffer (c mod 2), then announces c (descriptor and data visible).
// Readers wait for the announcements they need, check the descriptors, and
// read the peers' buffers straight from shared memory: one synchronisation
// instead of the ring's 2(N-1) steps, at the price of reading N buffers.
// Reductions combine ranks in rank order 0, 1, ..., N-1, so every rank gets
// the same bits. A buffer is reused two collectives later, once every rank
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
// streaming stores in c.copy() are not ordered by a release store alone:
// copy_streaming() ends with sfence for that reason.
//
// Who checks whom (so that any disagreement is seen by someone):
//   allreduce, reduce-scatter, allgather, barrier: every rank checks every rank;
//   broadcast, reduce: the root checks every rank, the others check the root.

#include "comm_impl.hpp"

namespace shmring::algo {

namespace {

void wait_all(Communicator::Impl& c) {
  for (int q = 0; q < c.size; ++q)
    if (q != c.rank) c.wait_announced(q);
}

const std::byte* buffer_of(Communicator::Impl& c, int q) {
  return c.seg->direct(q, c.collectives % detail::kDirectBuffers);
}

// out[i] = op over ranks q of (buffer q + offset)[i], in rank order.
void reduce_all(Communicator::Impl& c, std::byte* out, std::size_t offset_bytes, std::size_t m,
                DataType dtype, ReduceOp op) {
  const int n = c.size;
  const ReduceOp step_op = op == ReduceOp::avg ? ReduceOp::sum : op;
  for (int q = 1; q < n; ++q) {
    const std::byte* a = q == 1 ? buffer_of(c, 0) + offset_bytes : out;
    const std::byte* b = buffer_of(c, q) + offset_bytes;
    if (q == n - 1 && op == ReduceOp::avg)
      c.reduce(out, a, b, m, dtype, ReduceOp::avg, n);
    else
      c.reduce(out, a, b, m, dtype, step_op);
  }
}

void publish_data(Communicator::Impl& c, const void* data, std::size_t bytes) {
  std::byte* mine = c.acquire_direct_buffer();
  if (bytes > 0) c.copy(mine, data, bytes);
  c.announce();
}

}  // namespace

void allreduce_direct(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                      DataType dtype, ReduceOp op) {
  const std::size_t es = datatype_size(dtype);
  publish_data(c, send, count * es);
  wait_all(c);
  if (count > 0) reduce_all(c, static_cast<std::byte*>(recv), 0, count, dtype, op);
}

void reduce_scatter_direct(Communicator::Impl& c, const void* send, void* recv,
                           std::size_t recv_count, DataType dtype, ReduceOp op) {
  const std::size_t es = datatype_size(dtype);
  publish_data(c, send, static_cast<std::size_t>(c.size) * recv_count * es);
  wait_all(c);
  if (recv_count > 0)
    reduce_all(c, static_cast<std::byte*>(recv), static_cast<std::size_t>(c.rank) * recv_count * es,
               recv_count, dtype, op);
}

void allgather_direct(Communicator::Impl& c, const void* send, void* recv, std::size_t send_count,
                      DataType dtype) {
  const std::size_t bytes = send_count * datatype_size(dtype);
  publish_data(c, send, bytes);
  wait_all(c);
  auto* out = static_cast<std::byte*>(recv);
  for (int q = 0; q < c.size; ++q) {
    std::byte* dst = out + static_cast<std::size_t>(q) * bytes;
    if (bytes > 0 && dst != send) c.copy(dst, buffer_of(c, q), bytes);
  }
}

void broadcast_direct(Communicator::Impl& c, void* buffer, std::size_t count, DataType dtype,
                      int root) {
  const std::size_t bytes = count * datatype_size(dtype);
  if (c.rank == root) {
    publish_data(c, buffer, bytes);
    wait_all(c);
  } else {
    c.acquire_direct_buffer();  // keeps every rank's pace bounded the same way
    c.announce();
    c.wait_announced(root);
    if (bytes > 0) c.copy(buffer, buffer_of(c, root), bytes);
  }
}

void reduce_direct(Communicator::Impl& c, const void* send, void* recv, std::size_t count,
                   DataType dtype, ReduceOp op, int root) {
  const std::size_t es = datatype_size(dtype);
  publish_data(c, send, count * es);
  if (c.rank == root) {
    wait_all(c);
    if (count > 0) reduce_all(c, static_cast<std::byte*>(recv), 0, count, dtype, op);
  } else {
    c.wait_announced(root);
  }
}

void barrier_direct(Communicator::Impl& c) {
  c.acquire_direct_buffer();
  c.announce();
  wait_all(c);
}

}  // namespace shmring::algo
