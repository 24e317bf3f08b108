// The P2p engine's sender side (p2p.cpp, steps 1 and 4): posting headers,
// inline and outbox payloads, streaming staged slices, reading verdicts.

#include "p2p/p2p_state.hpp"

namespace shmring {
namespace detail {

bool P2p::progress_send(int peer, PeerState& ps) {
  P2pChannel& ch = channel(c_.rank, peer);
  bool moved = false, tell = false;
  // Verdicts the receiver published.
  const std::uint64_t nv = ch.recv.verdicts.load(std::memory_order_acquire);
  if (ps.verdicts_read < nv) {
    for (; ps.verdicts_read < nv; ++ps.verdicts_read) {
      P2pVerdict& v = ch.verdict[ps.verdicts_read % kP2pVerdicts];
      const std::uint64_t word = v.word.load(std::memory_order_relaxed);
      const std::uint64_t m = (word >> 8) - 1;
      auto it = ps.outstanding.find(m);
      OpPtr op = it == ps.outstanding.end() ? nullptr : it->second;
      if (op) ps.outstanding.erase(it);
      if (op && op->failing) {
        finish(op, op->failing);  // given up on while the receiver read it: it is done now
      } else if ((word & 3) == kP2pVerdictRefused) {
        if (op)
          finish(op, std::make_exception_ptr(PeerFailureError(fmt::format(
                         "rank {}: {} (message #{}) was not delivered: rank {} refused it because "
                         "this rank had withdrawn its unfinished sends to it",
                         c_.rank, describe(*op), m, peer))));
      } else if ((word & 3) == kP2pVerdictMismatch) {
        const auto rdt = static_cast<DataType>((word >> 2) & 0x3f);
        const std::uint64_t rcount = v.recv_count.load(std::memory_order_relaxed);
        const PeerState::Sent* b = ps.find_buffered(m);
        const std::string mine =
            op  ? describe(*op)
            : b ? fmt::format("a buffered {} (it returned before the recv)",
                              describe_op(true, b->count, b->dtype, peer, b->tag))
                : fmt::format("an earlier buffered send to rank {}", peer);
        auto err = std::make_exception_ptr(MismatchError(fmt::format(
            "rank {}: {} (message #{}) does not match rank {}'s recv(count={}, {}) for it", c_.rank,
            mine, m, peer, rcount, to_string(rdt))));
        if (op)
          finish(op, err);
        else
          ps.deferred = err;  // an inline send returned already: its next send to peer throws
      } else if ((word & 3) == kP2pVerdictBadBuffer) {
        const bool ours = v.recv_count.load(std::memory_order_relaxed) == kP2pBadSendBuffer;
        const std::string mine = op ? describe(*op) : fmt::format("a send to rank {}", peer);
        auto err =
            ours ? std::make_exception_ptr(InvalidArgumentError(fmt::format(
                       "rank {}: {} (message #{}): its send buffer is not readable memory of this "
                       "process (rank {} could not read it)",
                       c_.rank, mine, m, peer)))
                 : std::make_exception_ptr(SystemError(
                       fmt::format("rank {}: {} (message #{}) was not delivered: rank {}'s "
                                   "receive buffer for it is not writable memory of its process",
                                   c_.rank, mine, m, peer),
                       EFAULT));
        // Only a waiting single-copy send gets this verdict: op is known.
        if (op) finish(op, err);
      } else if (op) {
        finish(op, nullptr);
      }
    }
    ch.send.verdicts_read.store(ps.verdicts_read, std::memory_order_release);
    moved = tell = true;
  }
  // Post queued sends while the receiver has read enough headers. Our copy
  // of headers_read is re-read only when it says the entries are full: the
  // receiver's line moves here once per E messages, not per message.
  bool posted = false;
  while (!ps.unposted.empty()) {
    if (ps.next_msg >= ps.headers_read + kP2pEntries) {
      ps.headers_read = ch.headers_read.load(std::memory_order_acquire);
      if (ps.next_msg >= ps.headers_read + kP2pEntries) break;
    }
    const std::uint64_t m = ps.next_msg;
    OpPtr op = ps.unposted.front();
    ps.unposted.pop_front();
    P2pEntry& e = ch.entry[m % kP2pEntries];
    std::uint32_t flags = static_cast<std::uint32_t>(op->dtype);
    // Up to kP2pEagerBytes the payload goes ahead into our outbox when it
    // has room (one hand-off, as the inline case); otherwise rendezvous.
    const std::int64_t out =
        !op->eager && op->bytes <= kP2pEagerBytes ? outbox_reserve(peer, m, op->bytes) : -1;
    if (op->eager) {
      flags |= kP2pInline;
      if (op->bytes) std::memcpy(e.inline_data, op->buf, op->bytes);
    } else if (out >= 0) {
      flags |= kP2pOutbox;
      std::memcpy(outbox(c_.rank) + out, op->buf, op->bytes);
      const auto offset = static_cast<std::uint64_t>(out);
      std::memcpy(e.inline_data, &offset, sizeof offset);
    } else {
      if (cma_ && op->bytes >= cma_min_bytes_) flags |= kP2pCmaOffered;
      const std::uint64_t addr = reinterpret_cast<std::uintptr_t>(op->buf);
      std::memcpy(e.inline_data, &addr, sizeof addr);
    }
    publish_header(e, m, op->count, op->tag, flags);
    posted = true;
    op->msg = m;
    op->deadline = c_.deadline();
    ++ps.next_msg;
    if (op->eager || out >= 0) {
      finish(op, nullptr);  // buffered: a mismatch comes back as a verdict
      ps.remember_buffered(m, op->count, op->dtype, op->tag);
    } else
      ps.outstanding.emplace(m, op);
    moved = true;
  }
  if (posted && !tell) ring_light(peer);
  // Stream the message the receiver asked for into its staging slots.
  if (!ps.streaming) {
    const std::uint64_t active = ch.recv.active.load(std::memory_order_acquire);
    if (active != 0) {
      auto it = ps.outstanding.find(active - 1);
      if (it != ps.outstanding.end() && !it->second->streaming && !it->second->done) {
        ps.streaming = it->second;
        ps.streaming->streaming = true;
        ps.streaming->base = ps.staged;
      }
    }
  }
  if (OpPtr op = ps.streaming) {
    // Each slice is announced at once (a ring per 32 KiB), so that the
    // receiver copies slice j out while we copy slice j+1 in.
    while (op->slices < op->nslices &&
           op->slices <
               ch.recv.drained.load(std::memory_order_acquire) - op->base + kP2pStageSlots) {
      const std::uint64_t off = op->slices * stage_bytes_;
      const std::uint64_t n = std::min<std::uint64_t>(stage_bytes_, op->bytes - off);
      std::memcpy(stage_slot(peer, op->slices), op->buf + off, n);
      ++op->slices;
      ch.send.staged.store(++ps.staged, std::memory_order_release);
      ring(peer);
      moved = true;
    }
    if (moved) op->deadline = c_.deadline();
    if (op->slices == op->nslices) ps.streaming = nullptr;
  }
  if (tell) ring(peer);
  return moved;
}

}  // namespace detail
}  // namespace shmring
