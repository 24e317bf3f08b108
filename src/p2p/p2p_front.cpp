// The P2p engine's entry points: the blocking calls' eager fast paths,
// send/recv/isend/irecv, and Communicator's point-to-point calls with their
// argument checks.

#include "p2p/p2p_state.hpp"

#include <unistd.h>

namespace shmring {
namespace detail {

bool P2p::send_eager(const void* buf, std::uint64_t count, DataType dtype, int peer, int tag) {
  const std::uint64_t bytes = count * datatype_size(dtype);
  if (bytes > kP2pEagerBytes || broken()) return false;
  std::lock_guard lock(mutex_);
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  P2pChannel& ch = channel(c_.rank, peer);
  // What post() would do first: send the queued ones, read verdicts (one may
  // be a mismatch this send must throw).
  if (!ps.unposted.empty() || ps.deferred ||
      ch.recv.verdicts.load(std::memory_order_acquire) != ps.verdicts_read)
    return false;
  if (ps.next_msg >= ps.headers_read + kP2pEntries) {
    ps.headers_read = ch.headers_read.load(std::memory_order_acquire);
    if (ps.next_msg >= ps.headers_read + kP2pEntries) return false;
  }
  const std::uint64_t m = ps.next_msg;
  P2pEntry& e = ch.entry[m % kP2pEntries];
  auto flags = static_cast<std::uint32_t>(dtype);
  if (bytes <= kP2pInlineBytes) {
    flags |= kP2pInline;
    if (bytes) std::memcpy(e.inline_data, buf, bytes);
  } else {
    const std::int64_t out = outbox_reserve(peer, m, bytes);
    if (out < 0) return false;  // full: rendezvous
    flags |= kP2pOutbox;
    std::memcpy(outbox(c_.rank) + out, buf, bytes);
    const auto offset = static_cast<std::uint64_t>(out);
    std::memcpy(e.inline_data, &offset, sizeof offset);
  }
  ++ps.next_msg;
  publish_header(e, m, count, tag, flags);
  ps.remember_buffered(m, count, dtype, tag);
  ring_light(peer);
  record_eager(true, count, dtype, peer, tag);
  return true;
}

bool P2p::recv_eager(void* buf, std::uint64_t count, DataType dtype, int peer, int tag) {
  const std::uint64_t bytes = count * datatype_size(dtype);
  if (bytes > kP2pEagerBytes || broken()) return false;
  P2pChannel& ch = channel(peer, c_.rank);
  // The next message's entry, found without the lock: headers_read mirrors
  // ps.scanned (only we write it, under the lock, after every scan), so a
  // stale value can only fail the check under the lock below. While the
  // peer runs on another CPU, poll a while for the message (a ping-pong's
  // answer takes a few hundred ns) before the general path's Op, deadline
  // and doorbell; on our CPU, or oversubscribed, not at all.
  const std::uint64_t m = ch.headers_read.load(std::memory_order_relaxed);
  P2pEntry& e = ch.entry[m % kP2pEntries];
  if (e.seq.load(std::memory_order_acquire) != m + 1) {
    // policy_for(peer).spin_ns > 0 for a caller's thread (not the progress
    // thread's), without its thread-local read.
    const detail::WaitPolicy& w = c_.wait_policy;
    if (c_.config.oversubscribed || c_.crowded_by_job() || w.spin_ns + w.yield_ns <= 0 ||
        !c_.keep_off_cpu_of(peer))
      return false;
    constexpr int kPolls = 256;
    int i = 0;
    for (; i < kPolls && e.seq.load(std::memory_order_relaxed) != m + 1; ++i) cpu_relax();
    if (i == kPolls) return false;
  }
  std::lock_guard lock(mutex_);
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  if (!ps.recvs.empty() || !ps.unmatched.empty() || ps.scanned != m ||
      e.seq.load(std::memory_order_acquire) != m + 1)
    return false;
  const std::uint32_t flags = e.flags.load(std::memory_order_relaxed);
  if (!(flags & (kP2pInline | kP2pOutbox)) || e.tag.load(std::memory_order_relaxed) != tag ||
      e.count.load(std::memory_order_relaxed) != count ||
      (flags & kP2pDtypeMask) != static_cast<std::uint32_t>(dtype))
    return false;  // the general path scans it: another tag's, a mismatch, or rendezvous
  if (flags & kP2pInline) {
    if (bytes > kP2pInlineBytes) return false;  // a broken header: the general path says so
    if (bytes) std::memcpy(buf, e.inline_data, bytes);
  } else {
    std::uint64_t offset = 0;
    std::memcpy(&offset, e.inline_data, sizeof offset);
    if (offset > kP2pOutboxBytes - bytes) return false;  // outside the outbox: as above
    std::memcpy(buf, outbox(peer) + offset, bytes);
  }
  ps.scanned = m + 1;
  ch.headers_read.store(ps.scanned, std::memory_order_release);
  ring_light(peer);
  record_eager(false, count, dtype, peer, tag);
  return true;
}

void P2p::send(const void* buf, std::size_t count, DataType dtype, int peer, int tag) {
  if (send_eager(buf, count, dtype, peer, tag)) return;
  auto op = make_op(true, buf, count, dtype, peer, tag, false);
  post(op);
  wait(*op);
}

void P2p::recv(void* buf, std::size_t count, DataType dtype, int peer, int tag) {
  if (recv_eager(buf, count, dtype, peer, tag)) return;
  auto op = make_op(false, buf, count, dtype, peer, tag, false);
  post(op);
  wait(*op);
}

Request P2p::isend(const void* buf, std::size_t count, DataType dtype, int peer, int tag) {
  auto op = make_op(true, buf, count, dtype, peer, tag, true);
  post(op);
  return Request(op->req);
}

Request P2p::irecv(void* buf, std::size_t count, DataType dtype, int peer, int tag) {
  auto op = make_op(false, buf, count, dtype, peer, tag, true);
  post(op);
  return Request(op->req);
}

}  // namespace detail

// ---------------------------------------------------------------------------
// Communicator's point-to-point calls: argument checks, then the P2p engine.

namespace {

detail::P2p& checked_p2p(Communicator::Impl& c, bool is_send, const void* buf, std::size_t count,
                         DataType dtype, int peer, int tag) {
  c.check_owner();
  // Formatted only for an error: this runs on every message, however small.
  auto what = [&] {
    return fmt::format("{}(count={}, peer={}, tag={})", is_send ? "send" : "recv", count, peer,
                       tag);
  };
  if (static_cast<unsigned>(dtype) >= static_cast<unsigned>(kNumDataTypes))
    throw InvalidArgumentError(fmt::format("rank {}: {}: datatype {} is not a DataType (0..{})",
                                           c.rank, what(), static_cast<int>(dtype),
                                           kNumDataTypes - 1));
  if (c.size == 1)
    throw InvalidArgumentError(fmt::format(
        "rank {}: {}: peer {}: a communicator of one rank has no other rank to send to or "
        "receive from",
        c.rank, what(), peer));
  if (peer < 0 || peer >= c.size || peer == c.rank)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: peer {} is not another rank of this communicator (0..{}, not {})",
                    c.rank, what(), peer, c.size - 1, c.rank));
  if (tag < 0)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: tag {} is negative (tags are >= 0)", c.rank, what(), tag));
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(count, datatype_size(dtype), &bytes) ||
      bytes > (std::numeric_limits<std::size_t>::max() >> 2))
    throw InvalidArgumentError(fmt::format("rank {}: {}: count {} of {} overflows", c.rank, what(),
                                           count, to_string(dtype)));
  if (bytes > 0 && buf == nullptr)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: buffer is null but holds {} bytes", c.rank, what(), bytes));
  detail::P2p* p2p = c.p2p_made.load(std::memory_order_acquire);
  if (p2p == nullptr) {
    std::call_once(c.p2p_once, [&] {
      c.p2p = std::make_shared<detail::P2p>(c);
      c.p2p_made.store(c.p2p.get(), std::memory_order_release);
    });
    p2p = c.p2p.get();
  }
  if (p2p->inherited())
    throw InvalidArgumentError(fmt::format(
        "rank {}: this communicator used send/recv in its parent process; a forked child (pid "
        "{}) cannot use it",
        c.rank, getpid()));
  return *p2p;
}

}  // namespace

void Communicator::send(const void* buffer, std::size_t count, DataType dtype, int peer, int tag) {
  checked_p2p(*impl_, true, buffer, count, dtype, peer, tag).send(buffer, count, dtype, peer, tag);
}

void Communicator::recv(void* buffer, std::size_t count, DataType dtype, int peer, int tag) {
  checked_p2p(*impl_, false, buffer, count, dtype, peer, tag).recv(buffer, count, dtype, peer, tag);
}

Request Communicator::isend(const void* buffer, std::size_t count, DataType dtype, int peer,
                            int tag) {
  return checked_p2p(*impl_, true, buffer, count, dtype, peer, tag)
      .isend(buffer, count, dtype, peer, tag);
}

Request Communicator::irecv(void* buffer, std::size_t count, DataType dtype, int peer, int tag) {
  return checked_p2p(*impl_, false, buffer, count, dtype, peer, tag)
      .irecv(buffer, count, dtype, peer, tag);
}

}  // namespace shmring
