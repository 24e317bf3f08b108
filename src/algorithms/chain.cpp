// Broadcast and reduce as pipelined chains along the ring.
//
// Broadcast from root R: position p = (rank - R) mod N. The root writes the
// buffer slice by slice into its slots; positions 1..N-2 read each slice,
// keep a copy and forward it; position N-1 only reads. Reduce to root R runs
// the other way round the same ring: position 1 (R+1) writes its input,
// positions 2..N-1 read, add their input and forward, and the root reads,
// adds its input and writes the result.
//
// Each link carries the buffer once, so large messages move at link speed
// after a pipeline fill of N-1 slices. The one rank that would write nothing
// (the broadcast's last, the reduce's root) writes an empty token that its
// right neighbour reads at the end: every rank then writes and reads at least
// one slot per collective, which keeps each rank's counters in step with its
// neighbours' and bounds how far ahead a neighbour can run.
//
// float16 / bfloat16 sum, prod and avg (reduce_steps.hpp): position 1 sends
// its raw input, positions 2..N-1 send float64 partials, and the root rounds
// once (dividing by N for avg); slices are then slice_bytes / 8 elements.

#include "algorithms/algorithms.hpp"
#include "core/chunking.hpp"
#include "core/reduce_steps.hpp"
#include "core/state.hpp"

namespace shmring::algo {

namespace {
std::size_t slices_for(std::size_t count, std::size_t slice_elems) {
  return std::max<std::size_t>(1, count / slice_elems + (count % slice_elems != 0 ? 1 : 0));
}
void write_token(CommState& c) {
  c.acquire_send_slot();
  c.publish_send();
}
void read_token(CommState& c) {
  c.wait_recv_slot();
  c.release_recv();
}
}  // namespace

void broadcast_chain(CommState& c, void* buffer, std::size_t count, DataType dtype, int root) {
  const int n = c.size;
  const int pos = detail::ring_mod(c.rank - root, n);
  const std::size_t es = datatype_size(dtype);
  const std::size_t slice_elems = c.config.slice_bytes / es;
  const std::size_t slices = slices_for(count, slice_elems);
  auto* buf = static_cast<std::byte*>(buffer);
  if (pos == n - 1) write_token(c);
  // Along a chain a rank meets only its neighbours' descriptors, so ranks
  // that agree on a root others disagree with would return its data. So
  // every rank's call is checked: by a receiver before the first slice
  // lands in its buffer (a receiver that fails returns with its buffer as
  // it was), by the root, which writes nothing, at the end.
  if (pos != 0) c.wait_every_announced();
  for (std::size_t q = 0; q < slices; ++q) {
    c.step = static_cast<int>(q);
    const std::size_t begin = std::min(count, q * slice_elems);
    const std::size_t bytes = std::min(slice_elems, count - begin) * es;
    if (pos == 0) {
      std::byte* dst = c.acquire_send_slot();
      c.copy(dst, buf + begin * es, bytes);
      c.publish_send();
    } else if (pos < n - 1) {
      const std::byte* src = c.wait_recv_slot();
      std::byte* dst = c.acquire_send_slot();
      c.copy(dst, src, bytes);
      c.copy(buf + begin * es, src, bytes);
      c.publish_send();
      c.release_recv();
    } else {
      const std::byte* src = c.wait_recv_slot();
      c.copy(buf + begin * es, src, bytes);
      c.release_recv();
    }
  }
  if (pos == 0) {
    read_token(c);
    c.wait_every_announced();
  }
}

void reduce_chain(CommState& c, const void* send, void* recv, std::size_t count, DataType dtype,
                  ReduceOp op, int root) {
  const int n = c.size;
  const int pos = detail::ring_mod(c.rank - root, n);
  const std::size_t es = datatype_size(dtype);
  const std::size_t slice_elems = reduction_slice_elems(c.config.slice_bytes, dtype, op, n);
  const std::size_t slices = slices_for(count, slice_elems);
  auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  if (pos == 0) write_token(c);
  for (std::size_t q = 0; q < slices; ++q) {
    c.step = static_cast<int>(q);
    const std::size_t begin = std::min(count, q * slice_elems);
    const std::size_t m = std::min(slice_elems, count - begin);
    if (pos == 1) {
      std::byte* dst = c.acquire_send_slot();
      c.copy(dst, in + begin * es, m * es);
      c.publish_send();
    } else if (pos > 1) {
      const std::byte* src = c.wait_recv_slot();
      std::byte* dst = c.acquire_send_slot();
      partial_step(c, dst, src, /*src_partial=*/pos > 2, in + begin * es, m, dtype, op);
      c.publish_send();
      c.release_recv();
    } else {
      const std::byte* src = c.wait_recv_slot();
      final_step(c, out + begin * es, src, /*src_partial=*/n > 2, in + begin * es, m, dtype, op, n);
      c.release_recv();
    }
  }
  if (pos == 1) read_token(c);
  // As broadcast_chain's check: ranks that agree on another root would
  // otherwise return their reduction.
  c.wait_every_announced();
}

}  // namespace shmring::algo
