// The slot FIFO of ring edge r -> r+1 (docs/design/protocols.md, "Ring"):
// the writer waits for a free slot and publishes `produced`, the reader
// waits for a full one and publishes `consumed`. Counters only grow.

#include "core/comm.hpp"

namespace shmring {

std::byte* Communicator::Impl::acquire_send_slot() {
  const std::uint64_t k = seg->slots();
  // Slot (sent mod K) is free once the right neighbour consumed slice sent-K.
  if (sent >= k) {
    const std::uint64_t need = sent - k + 1;
    if (!right_checked && area(right).consumed.value.load(std::memory_order_acquire) < need) {
      // Before waiting on the right, check that it runs this collective as
      // we do: a right that disagrees on the root of a chain believes
      // itself first and never reads our slots, so it never checks our
      // descriptor either (its wait_recv_slot does that for its left).
      wait_announced(right);
      right_checked = true;
    }
    wait_counter(area(right).consumed, need, right, "a free slot");
  }
  return seg->slot(rank, sent % k);
}

void Communicator::Impl::publish_send() {
  publish(my_area().produced, ++sent);
}

const std::byte* Communicator::Impl::wait_recv_slot() {
  if (!left_checked) {
    // Check left's descriptor before using its data (and even if it never
    // writes to us: a rank that disagrees may wait for us in turn).
    wait_announced(left);
    left_checked = true;
  }
  wait_counter(area(left).produced, recvd + 1, left, "data");
  return seg->slot(left, recvd % seg->slots());
}

void Communicator::Impl::release_recv() {
  publish(my_area().consumed, ++recvd);
}

}  // namespace shmring
