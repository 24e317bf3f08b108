// The P2p engine's faults (abort, dead peers, deadlines) and ending an
// operation early, with the withdraw hand-shake (p2p.cpp, "Ending early").

#include "p2p/p2p_state.hpp"

namespace shmring {
namespace detail {

void P2p::check_pending(std::unique_lock<std::mutex>& lock) {
  std::vector<OpPtr> ops;
  for (auto& ps : peers_) {
    for (auto& op : ps.unposted) ops.push_back(op);
    for (auto& [m, op] : ps.outstanding)
      if (!op->done) ops.push_back(op);
    for (auto& op : ps.recvs) ops.push_back(op);
    for (auto& v : ps.verdicts)
      if (v.op && !v.op->done) ops.push_back(v.op);
  }
  for (auto& op : stage_queue_) ops.push_back(op);
  if (ops.empty()) return;
  const auto now = Clock::now();
  // Sends given up on while their receiver read them wait for its verdict;
  // not past its death or a further SHMRING_TIMEOUT. Their buffer goes back
  // to the caller then, read or not: `released` tells the receiver to
  // discard what it read (deliver_matched).
  for (auto& op : ops)
    if (op->failing && !op->done && (now >= op->deadline || !c_.seg->rank_alive(op->peer))) {
      channel(c_.rank, op->peer).send.released.store(op->msg + 1, std::memory_order_seq_cst);
      // Before the caller's writes to the buffer (a store-release alone
      // does not order later stores on weakly ordered CPUs).
      std::atomic_thread_fence(std::memory_order_seq_cst);
      finish(op, op->failing);
    }
  if (auto a = read_abort(c_.seg->header())) {
    for (auto& op : ops)
      if (!op->done && !op->failing) end_early(op, job_error(*op, *a, false), kP2pWithdrawnFailed);
    c_.p2p_failed.store(true, std::memory_order_relaxed);
    drop_finished();
    return;
  }
  // Staged messages whose sender withdrew: their slices will not come.
  for (auto& op : stage_queue_)
    if (!op->done)
      if (const std::uint64_t w =
              channel(op->peer, c_.rank).send.withdrawn.load(std::memory_order_acquire))
        refuse(op->peer, op, w);
  bool any_dead = false;
  for (auto& op : ops)
    if (!c_.seg->rank_alive(op->peer)) any_dead = true;
  if (any_dead) progress(lock);  // a peer may have published its last words and left
  std::exception_ptr first;      // this rank's own finding: it breaks the communicator
  for (auto& op : ops) {
    if (op->done || op->failing) continue;
    std::exception_ptr error;
    if (!c_.seg->rank_alive(op->peer)) {
      const bool clean =
          c_.area(op->peer).info.state.load(std::memory_order_acquire) == kRankFinalized;
      error = std::make_exception_ptr(PeerFailureError(
          fmt::format("rank {}: rank {} (pid {}) {} while rank {} waited in {}", c_.rank, op->peer,
                      c_.area(op->peer).info.pid.load(),
                      clean ? "destroyed its communicator" : "died", c_.rank, describe(*op))));
    } else if (now >= op->deadline) {
      // A send its receiver is reading right now (it claimed the message
      // before we gave up): the read moves, so it gets one more
      // SHMRING_TIMEOUT and completes as delivered. Withdrawing it now would
      // fail a send whose bytes arrive. A claim after this load meets the
      // withdraw hand-shake in end_early instead.
      const bool reading =
          op->is_send && op->msg != kNoMsg &&
          channel(c_.rank, op->peer).recv.taking.load(std::memory_order_seq_cst) == op->msg + 1;
      if (reading && !op->graced) {
        op->graced = true;
        op->deadline = c_.deadline();
        continue;
      }
      error = std::make_exception_ptr(TimeoutError(fmt::format(
          "rank {}: timed out after {} s in {}: rank {} {} (SHMRING_TIMEOUT sets the limit)",
          c_.rank, c_.config.timeout_s, describe(*op), op->peer,
          !op->is_send ? "sent no matching message"
          : reading    ? "did not finish reading the message"
                       : "did not take the message")));
    } else {
      continue;
    }
    if (!first) first = error;
    end_early(op, error, kP2pWithdrawnFailed);
  }
  if (first) break_job(first);
  drop_finished();
}

// ---------------------------------------------------------------------------
// Ending early (p2p.cpp's header comment, "Ending early").

void P2p::end_early(const OpPtr& op, std::exception_ptr error, std::uint64_t code) {
  if (op->done || op->failing) return;
  // A posted send without its verdict (buffered ones are done): its
  // receiver must not read it from now on.
  if (op->is_send && op->msg != kNoMsg && withdraw(op->peer, code) == op->msg + 1) {
    op->failing = error;
    // A send that had its extra time already waits no longer.
    if (!op->graced) op->deadline = c_.deadline();
    return;
  }
  finish(op, error);
}

std::uint64_t P2p::withdraw(int peer, std::uint64_t code) {
  PeerState& ps = peers_[static_cast<std::size_t>(peer)];
  P2pChannel& ch = channel(c_.rank, peer);
  if (!ps.withdrawn) {
    ps.withdrawn = true;
    ch.send.withdrawn.store(code, std::memory_order_seq_cst);
    ring(peer);  // a staged recv of ours there fails now, not at its deadline
  }
  return ch.recv.taking.load(std::memory_order_seq_cst);
}

void P2p::refuse(int peer, const OpPtr& op, std::uint64_t code) {
  std::exception_ptr error;
  if (auto a = code == kP2pWithdrawnFailed ? read_abort(c_.seg->header()) : std::nullopt) {
    error = job_error(*op, *a, false);
  } else {
    error = std::make_exception_ptr(PeerFailureError(fmt::format(
        "rank {}: {} failed: rank {} gave up on message #{} before it was read ({})", c_.rank,
        describe(*op), peer, op->hdr.msg,
        code == kP2pWithdrawnDestroyed ? "it destroyed its communicator while the send was pending"
                                       : "its send failed")));
  }
  queue_verdict(peer, op, kP2pVerdictRefused, true, error);
}

std::exception_ptr P2p::job_error(const Op& op, const AbortInfo& a, bool later) const {
  const std::string what =
      fmt::format("rank {}: {}: communicator is unusable after an earlier error: {}", c_.rank,
                  describe(op), a.reason);
  try {
    throw_error(later ? ErrorCode::aborted : static_cast<ErrorCode>(a.code), what);
  } catch (...) {
    return std::current_exception();
  }
}

void P2p::break_job(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    raise_abort(*c_.seg, c_.size, static_cast<std::uint32_t>(e.code()), c_.rank, e.what());
  } catch (...) {
  }
  c_.p2p_failed.store(true, std::memory_order_relaxed);
  for (int p = 0; p < c_.size; ++p)  // their send/recv waits see it now
    if (p != c_.rank) ring(p);
}

bool P2p::broken() const {
  return c_.seg->header().abort_code.load(std::memory_order_relaxed) != kAbortNone;
}

void P2p::drop_finished() {
  // Failed operations leave the queues. A failed send that was posted keeps
  // its message number and its entry in `outstanding`, but it was withdrawn
  // (end_early): its receiver refuses it when it matches it.
  for (auto& ps : peers_) {
    std::erase_if(ps.unposted, [](const OpPtr& o) { return o->done; });
    std::erase_if(ps.recvs, [](const OpPtr& o) { return o->done; });
    if (ps.streaming && ps.streaming->done) ps.streaming = nullptr;
  }
  std::erase_if(stage_queue_, [](const OpPtr& o) { return o->done; });
}

}  // namespace detail
}  // namespace shmring
