// The slot FIFO of ring edge r -> r+1 (docs/design/protocols.md, "Ring"):
// the writer waits for a free slot and publishes `produced`, the reader
// waits for a full one and publishes `consumed`. Counters only grow.

#include "core/state.hpp"

namespace shmring {

std::byte* CommState::acquire_send_slot() {
  const std::uint64_t k = seg->slots();
  // Slot (ring.sent mod K) is free once the right neighbour consumed slice ring.sent-K.
  if (ring.sent >= k) {
    const std::uint64_t need = ring.sent - k + 1;
    if (!ring.right_checked && area(right).consumed.value.load(std::memory_order_acquire) < need) {
      // Before waiting on the right, check that it runs this collective as
      // we do: a right that disagrees on the root of a chain believes
      // itself first and never reads our slots, so it never checks our
      // descriptor either (its wait_recv_slot does that for its left).
      wait_announced(right);
      ring.right_checked = true;
    }
    wait_counter(area(right).consumed, need, right, "a free slot");
  }
  return seg->slot(rank, ring.sent % k);
}

void CommState::publish_send() {
  publish(my_area().produced, ++ring.sent);
}

const std::byte* CommState::wait_recv_slot() {
  if (!ring.left_checked) {
    // Check left's descriptor before using its data (and even if it never
    // writes to us: a rank that disagrees may wait for us in turn).
    wait_announced(left);
    ring.left_checked = true;
  }
  wait_counter(area(left).produced, ring.recvd + 1, left, "data");
  return seg->slot(left, ring.recvd % seg->slots());
}

void CommState::release_recv() {
  publish(my_area().consumed, ++ring.recvd);
}

}  // namespace shmring
