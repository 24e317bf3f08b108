// The P2p engine's receiver side (p2p.cpp, steps 2 to 4): scanning headers,
// matching recvs, verdicts, single-copy reads and the staging slots.

#include "p2p/p2p_state.hpp"

#include <tbb/task_arena.h>

#include <sched.h>

#include <cerrno>

#include "transport/cma.hpp"

namespace shmring {
namespace detail {

tbb::task_arena* P2p::cma_arena(std::uint64_t bytes) {
  if (c_.arena) return c_.arena.get();  // more than one reduction thread already
  if (bytes < kCmaParallelMinBytes) return nullptr;
  if (!cma_arena_) {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    const int cpus = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : 1;
    cma_arena_ = std::make_unique<tbb::task_arena>(std::min(cpus, 2));
  }
  return cma_arena_.get();
}

void P2p::queue_verdict(int peer, const OpPtr& op, std::uint64_t code, bool complete_now,
                        std::exception_ptr error, std::optional<std::uint64_t> aux) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  const std::uint64_t word =
      ((op->hdr.msg + 1) << 8) | (static_cast<std::uint64_t>(op->dtype) << 2) | code;
  if (complete_now) finish(op, error);
  ps.verdicts.push_back({word, aux.value_or(op->count), complete_now ? nullptr : op, error});
  flush_verdicts(peer, ps);
}

bool P2p::flush_verdicts(int peer, PeerState& ps) {
  if (ps.verdicts.empty()) return false;
  P2pChannel& ch = channel(peer, c_.rank);
  const std::uint64_t read = ch.send.verdicts_read.load(std::memory_order_acquire);
  bool wrote = false;
  while (!ps.verdicts.empty() && ps.verdicts_written < read + kP2pVerdicts) {
    auto v = std::move(ps.verdicts.front());
    ps.verdicts.pop_front();
    P2pVerdict& e = ch.verdict[ps.verdicts_written % kP2pVerdicts];
    e.recv_count.store(v.recv_count, std::memory_order_relaxed);
    e.word.store(v.word, std::memory_order_relaxed);
    ch.recv.verdicts.store(++ps.verdicts_written, std::memory_order_release);
    if (v.op) finish(v.op, v.error);
    wrote = true;
  }
  if (wrote) ring(peer);
  return wrote;
}

void P2p::deliver_matched(int peer, const OpPtr& op, const std::byte* outbox_payload) {
  const Header& h = op->hdr;
  const auto sdt = static_cast<DataType>(h.flags & kP2pDtypeMask);
  const bool outbox_msg = (h.flags & kP2pOutbox) != 0;
  const bool inline_msg = (h.flags & kP2pInline) != 0 || outbox_msg;
  if (h.count != op->count || sdt != op->dtype) {
    auto err = std::make_exception_ptr(MismatchError(
        fmt::format("rank {}: {} does not match rank {}'s send(count={}, {}) (message #{})",
                    c_.rank, describe(*op), peer, h.count, to_string(sdt), h.msg)));
    // A buffered sender is not waiting: fail now. Otherwise the sender waits
    // for the verdict, so this recv ends once the verdict is published.
    queue_verdict(peer, op, kP2pVerdictMismatch, inline_msg, err);
    return;
  }
  if (inline_msg) {
    if (op->bytes)
      std::memcpy(op->buf,
                  !outbox_msg      ? reinterpret_cast<const std::byte*>(h.data)
                  : outbox_payload ? outbox_payload
                                   : h.payload.data(),
                  op->bytes);
    finish(op, nullptr);  // no verdict: the send completed when it was posted
    return;
  }
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  P2pChannel& ch = channel(peer, c_.rank);
  if (cma_ && !ps.cma_refused && (h.flags & kP2pCmaOffered)) {
    // Claim the message, then look whether the sender withdrew it; the
    // sender stores `withdrawn`, then reads `taking` (withdraw()): one of
    // the two sees the other, so a send given up on is never read.
    ch.recv.taking.store(h.msg + 1, std::memory_order_seq_cst);
    if (const std::uint64_t w = ch.send.withdrawn.load(std::memory_order_seq_cst)) {
      refuse(peer, op, w);
      return;
    }
    const int pid = c_.area(peer).info.pid.load(std::memory_order_relaxed);
    const int err = cma_read_parallel(cma_arena(op->bytes), pid, op->buf, h.addr, op->bytes);
    if (err == 0) {
      // The sender may have given the buffer back to its caller while we
      // read (a read stalled past its further deadline): our reads come
      // before this load, its caller's writes after its store, so what we
      // read is whole unless we see `released` name the message.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (ch.send.released.load(std::memory_order_seq_cst) == h.msg + 1) {
        discard_read(peer, op);
        return;
      }
      queue_verdict(peer, op, kP2pVerdictOk, false, nullptr);
      return;
    }
    // EFAULT from a peer that died, its pid taken by another process of
    // ours: the death, not a bad buffer.
    if (err == ESRCH || (err == EFAULT && !c_.seg->rank_alive(peer))) {
      auto error = std::make_exception_ptr(PeerFailureError(fmt::format(
          "rank {}: rank {} (pid {}) died during {}", c_.rank, peer, pid, describe(*op))));
      finish(op, error);
      break_job(error);
      return;
    }
    if (err == EFAULT) {
      // A bad buffer, ours or the sender's (the kernel says EFAULT for
      // both): the staged path would crash on it, in this process or in
      // the sender's. Both operations fail instead, naming the buffer.
      const bool ours = !cma_local_writable(op->buf, op->bytes);
      auto error =
          ours ? std::make_exception_ptr(InvalidArgumentError(fmt::format(
                     "rank {}: {} (message #{}): its receive buffer (address {:#x}, {} bytes) is "
                     "not writable memory of this process",
                     c_.rank, describe(*op), h.msg, reinterpret_cast<std::uintptr_t>(op->buf),
                     op->bytes)))
               : std::make_exception_ptr(SystemError(
                     fmt::format("rank {}: {} (message #{}): rank {}'s send buffer (pid {}, "
                                 "address {:#x}, {} bytes) is not valid memory of its process",
                                 c_.rank, describe(*op), h.msg, peer, pid, h.addr, op->bytes),
                     EFAULT));
      queue_verdict(peer, op, kP2pVerdictBadBuffer, false, error,
                    ours ? kP2pBadRecvBuffer : kP2pBadSendBuffer);
      return;
    }
    // EPERM (Yama, seccomp, another user), ENOSYS, or anything else: the
    // staged path works.
    // Per peer: Yama's PR_SET_PTRACER may allow one reader and not another.
    ps.cma_refused = true;
    SHMRING_LOG(info,
                "single-copy reads (process_vm_readv) from rank {} failed: {}; its messages are "
                "staged through shared memory from now on",
                peer, std::strerror(err));
  }
  // The sender copies staged slices itself and stops when it gives up; a
  // message it withdrew before we got here is refused at once.
  if (const std::uint64_t w = ch.send.withdrawn.load(std::memory_order_acquire)) {
    refuse(peer, op, w);
    return;
  }
  op->nslices = (op->bytes + stage_bytes_ - 1) / stage_bytes_;
  stage_queue_.push_back(op);
}

void P2p::discard_read(int peer, const OpPtr& op) {
  const auto a = read_abort(c_.seg->header());
  const std::string what = fmt::format(
      "rank {}: {} failed: rank {} gave up on message #{} while this rank was reading it{}{}; "
      "the bytes read are discarded",
      c_.rank, describe(*op), peer, op->hdr.msg, a ? ": " : "", a ? a->reason : std::string());
  std::exception_ptr error;
  try {
    throw_error(a ? static_cast<ErrorCode>(a->code) : ErrorCode::peer_failure, what);
  } catch (...) {
    error = std::current_exception();
  }
  queue_verdict(peer, op, kP2pVerdictRefused, true, error);
}

bool P2p::progress_recv(int peer, PeerState& ps) {
  P2pChannel& ch = channel(peer, c_.rank);
  bool moved = false;
  for (;; ++ps.scanned) {
    P2pEntry& e = ch.entry[ps.scanned % kP2pEntries];
    // The sender writes entry m+E only after we publish headers_read > m.
    if (e.seq.load(std::memory_order_acquire) != ps.scanned + 1) break;
    Header h;
    h.msg = ps.scanned;
    h.count = e.count.load(std::memory_order_relaxed);
    h.tag = e.tag.load(std::memory_order_relaxed);
    h.flags = e.flags.load(std::memory_order_relaxed);
    if (h.flags & kP2pInline)
      std::memcpy(h.data, e.inline_data, kP2pInlineBytes);
    else
      std::memcpy(&h.addr, e.inline_data, sizeof h.addr);
    moved = true;
    if (h.flags & kP2pOutbox) {
      // The payload must leave the sender's outbox before headers_read
      // passes this message: straight into the recv it matches when one is
      // posted (the first with its tag; none can be waiting for an earlier
      // message with it, or that message would have matched already), else
      // into the unmatched list.
      const auto dt = static_cast<DataType>(h.flags & kP2pDtypeMask);
      const std::uint64_t bytes =
          static_cast<unsigned>(dt) < kNumDataTypes ? h.count * datatype_size(dt) : 0;
      if (h.addr + bytes > kP2pOutboxBytes || bytes > kP2pEagerBytes) {
        // Not a header this implementation writes: treat it as garbage sent
        // by a broken peer rather than read outside its outbox.
        c_.fail(PeerFailureError(fmt::format(
            "rank {}: message #{} from rank {} claims {} bytes at offset {} of its outbox "
            "({} bytes)",
            c_.rank, h.msg, peer, bytes, h.addr, kP2pOutboxBytes)));
      }
      const std::byte* src = outbox(peer) + h.addr;
      const bool earlier = std::any_of(ps.unmatched.begin(), ps.unmatched.end(),
                                       [&](const auto& kv) { return kv.second.tag == h.tag; });
      auto r = earlier ? ps.recvs.end()
                       : std::find_if(ps.recvs.begin(), ps.recvs.end(),
                                      [&](const OpPtr& o) { return o->tag == h.tag; });
      if (r != ps.recvs.end()) {
        OpPtr op = *r;
        ps.recvs.erase(r);
        op->hdr = std::move(h);
        op->deadline = c_.deadline();
        deliver_matched(peer, op, src);
        continue;
      }
      h.payload.assign(src, src + bytes);
    }
    ps.unmatched.emplace(h.msg, std::move(h));
  }
  if (moved) {
    // The entries are free again. A sender waiting for one watches
    // headers_read itself (watch_entries), so a light ring is enough.
    ch.headers_read.store(ps.scanned, std::memory_order_release);
    ring_light(peer);
  }
  moved |= flush_verdicts(peer, ps);
  if (ps.recvs.empty() || ps.unmatched.empty()) return moved;
  for (auto it = ps.recvs.begin(); it != ps.recvs.end();) {
    OpPtr op = *it;
    auto m = std::find_if(ps.unmatched.begin(), ps.unmatched.end(),
                          [&](const auto& kv) { return kv.second.tag == op->tag; });
    if (m == ps.unmatched.end()) {
      ++it;
      continue;
    }
    op->hdr = std::move(m->second);
    ps.unmatched.erase(m);
    it = ps.recvs.erase(it);
    op->deadline = c_.deadline();
    deliver_matched(peer, op);
    moved = true;
  }
  return moved;
}

bool P2p::progress_staging() {
  bool moved = false;
  while (!stage_queue_.empty()) {
    OpPtr op = stage_queue_.front();
    if (op->done) {  // failed (dead peer) while waiting for its turn
      stage_queue_.pop_front();
      continue;
    }
    const int peer = op->peer;
    PeerState& ps = peers_[static_cast<std::size_t>(peer)];
    P2pChannel& ch = channel(peer, c_.rank);
    if (!op->activated) {
      op->activated = true;
      stage_base_ = ps.drained;
      op->slices = 0;
      ch.recv.active.store(op->hdr.msg + 1, std::memory_order_release);
      ring(peer);
      moved = true;
    }
    bool took = false;
    while (op->slices < op->nslices &&
           ch.send.staged.load(std::memory_order_acquire) > stage_base_ + op->slices) {
      const std::uint64_t off = op->slices * stage_bytes_;
      const std::uint64_t n = std::min<std::uint64_t>(stage_bytes_, op->bytes - off);
      std::memcpy(op->buf + off, stage_slot(c_.rank, op->slices), n);
      ++op->slices;
      ch.recv.drained.store(++ps.drained, std::memory_order_release);
      if (op->slices < op->nslices) ring(peer);  // a slot is free; the verdict rings below
      took = true;
    }
    if (took) {
      op->deadline = c_.deadline();
      moved = true;
    }
    if (op->slices < op->nslices) break;
    stage_queue_.pop_front();
    queue_verdict(peer, op, kP2pVerdictOk, false, nullptr);
  }
  return moved;
}

bool P2p::progress(std::unique_lock<std::mutex>&) {
  bool moved = false;
  for (int p = 0; p < c_.size; ++p) {
    if (p == c_.rank) continue;
    PeerState& ps = peers_[static_cast<std::size_t>(p)];
    if (!ps.unposted.empty() || !ps.outstanding.empty()) moved |= progress_send(p, ps);
    // Always: headers are copied out at once, so that the sender's entries
    // free up whatever we receive first.
    moved |= progress_recv(p, ps);
  }
  moved |= progress_staging();
  return moved;
}

std::size_t P2p::pending() const {
  std::size_t n = stage_queue_.size();
  for (const auto& ps : peers_) n += ps.unposted.size() + ps.outstanding.size() + ps.recvs.size();
  return n;
}

}  // namespace detail
}  // namespace shmring
