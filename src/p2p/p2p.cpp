// Point-to-point send/recv between two ranks of a communicator.
//
// Terms (reflected in the names below):
//   pair (s, r)   the directed channel from sender s to receiver r
//                 (P2pChannel); its messages are numbered m = 0, 1, 2, ...
//   header        entry m mod E (E = kP2pEntries = 8) of the pair, written by
//                 s: count, datatype, tag, the send buffer's address in s,
//                 and the payload itself when it is at most kP2pInlineBytes
//                 (40 B). r copies headers out as soon as it sees them
//                 (headers_read), so a pair holds at most E unread headers.
//   verdict       entry v mod V (V = kP2pVerdicts = 8), written by r when
//                 message m is finished: ok, or mismatch with r's count and
//                 datatype; s reads them (verdicts_read) to complete sends.
//   staging slot  kP2pStageSlots (4) x kP2pStageBytes (32 KiB) per receiver
//                 r, lent to one incoming message at a time.
//   outbox        kP2pOutboxBytes (64 KiB) per sender s, a byte ring of eager
//                 payloads (outbox_reserve); a payload's space is free again
//                 once its receiver's headers_read passes its message (the
//                 receiver copies the payload out when it copies the header).
//   doorbell      one futex counter per rank (P2pInbox): whoever writes
//                 something rank x must look at rings x's doorbell; a waiting
//                 rank sleeps on its own doorbell only, whatever the peer.
//
// A message m from s to r:
//   1. s waits until m < headers_read + E (it re-reads headers_read only
//      when its last copy says the entries are full; r publishes it after
//      every batch of headers and rings s lightly), writes header m, then
//      its `seq` = m+1 (release), and rings r lightly (below).
//   2. r polls entry (scanned mod E)'s `seq` directly: the header, and an
//      inline payload with it, comes in the one line r polls (one line
//      transfer per small message). r copies the header into its local
//      list of unmatched messages and matches its posted recvs in order
//      against that list: the first
//      unmatched message with the recv's tag. Messages of one (s, r, tag)
//      arrive in order; other tags may overtake (any number of messages).
//   3. Count or datatype differ: MismatchError on r, and a mismatch verdict
//      that makes s's send throw it too, naming both sides' values.
//      Otherwise the payload moves by one of:
//      - inline (<= 40 B): copied from the header; the send completed at
//        step 1 already (buffered, so send-send / recv-recv exchanges of
//        small messages work as with MPI's eager sends). No verdict unless
//        it mismatches: that one reaches s at its next send to r.
//      - outbox (<= kP2pEagerBytes, 16 KiB, while s's outbox has room): as
//        inline, with the payload in s's outbox (the header holds its
//        offset). r copies it out as it scans the header, before
//        publishing headers_read: into the recv it matches when one is
//        posted, else into its unmatched list. One hand-off instead of the
//        staged path's three (header, active, slices; verdict).
//      - single copy (>= SHMRING_CMA_MIN_BYTES, 16 KiB by default): r reads
//        s's buffer with process_vm_readv (cross-memory attach): the bytes
//        move once (from 4 MiB split in 1 MiB reads across r's reduction
//        threads, when it has more than one). It needs ptrace access to s. When the kernel refuses
//        (EPERM: Yama ptrace_scope=1 without PR_SET_PTRACER, a seccomp filter
//        as in some containers; ENOSYS) r stages this and every later message
//        instead, and says so once at info level. SHMRING_CMA=0 turns single
//        copies off; SHMRING_CMA=1 also lets any process of this user read
//        the rank under Yama (prctl PR_SET_PTRACER_ANY).
//      - staged (the rest, or no single copy): r queues the message for its
//        staging slots; when its turn comes it publishes active = m+1 and
//        rings s; s copies slice j (32 KiB) into r's slot j mod 4 once r has
//        drained slice j-4 (the pair's staged / drained counters), and r
//        copies it out: bytes move twice, pipelined over 4 slots.
//   4. r publishes the verdict (waiting for a free entry if s has V unread
//      ones) and rings s; s's send or isend completes; so does r's recv.
//
// Progress: nothing here goes through the collective engine's queue, and no
// collective slot is used. Every pending operation of a communicator is
// progressed by any thread that waits for one of them (blocking send/recv,
// Request::wait) and by a progress thread of their own, started on the first
// isend or irecv that does not complete at once. So isend/irecv posted in any
// order on two ranks, around collectives, always complete, and a blocking
// recv completes while its sender sits in a collective after an isend.
//
// Fast paths: a blocking send of an eager message posts its header at once
// (send_eager) when nothing is queued before it, and a blocking recv takes
// the next message of its peer straight from the header entry (recv_eager)
// when no request or unmatched message of that peer comes before it. Neither
// makes an Op, reads the clock or touches another peer's channel; anything
// else (a mismatch, another tag, a full entry window, a rendezvous message,
// no message within a short poll) falls through to the general path above,
// which also copies out the headers of every other peer.
//
// Ending early, and the communicator's state afterwards. A send or recv
// ends early by a timeout, a dead peer, an abort, or the communicator's
// destruction; a dropped Request waits for its operation (request.cpp), so it
// ends in one of these or completes. Two rules:
//   - A send that ended early is never delivered: the receiver must not read
//     the sender's buffer once the sender has returned it to its caller.
//     Inline and outbox messages were copied into the segment when posted
//     (the send succeeded then), and a staged message moves only while the
//     sender copies it, so only single-copy reads need a hand-shake: the
//     sender first stores its channel's `withdrawn` word (all its unfinished
//     sends to that receiver, for good), then reads the receiver's `taking`;
//     the receiver stores `taking` = m+1, then reads `withdrawn`, before it
//     reads message m (both seq_cst: one of the two sees the other). A
//     receiver that sees `withdrawn` fails the recv and answers with a
//     refused verdict; a sender that sees `taking` name the message keeps it
//     until its verdict (the read is short; the receiver's death or a further
//     SHMRING_TIMEOUT ends that wait) and only then completes it with its
//     error (end_early). A send whose deadline passes while `taking` names
//     it is not given up on at all: the read moves, so it gets one more
//     SHMRING_TIMEOUT and completes as delivered, and exactly one of
//     "received" and "failed" happens. When that wait ends without a
//     verdict, the sender stores `released` = m+1 before its caller gets
//     the buffer back; the receiver loads it after its read (both seq_cst)
//     and, seeing it, discards what it read and fails the recv. A staged recv
//     whose sender withdrew fails at its next check instead of waiting for
//     slices that will not come.
//   - After a timeout or a dead peer the communicator is broken, on every
//     rank, as after a failed collective (README.md, "Rules"): the rank that
//     found the error records it as the job's error (break_job), its
//     operation throws it, and every pending and later send, recv or
//     collective of every rank throws it (the job's error class, naming the
//     call) or, on a rank that has thrown an error already, AbortedError
//     "communicator is unusable after an earlier error". An abort does the
//     same. MPI's default error handler and NCCL do the same for the same
//     reason: after a send gave up on a message, or a recv on its sender,
//     the two ranks disagree about which messages of their pair were taken,
//     and any later match could pair a message with the wrong recv. Errors
//     both sides see on the same message and that leave nothing behind (a
//     mismatch, a bad buffer) and argument errors (refused before anything
//     is posted) leave the communicator usable. A destroyed communicator
//     withdraws its unfinished sends (its peers' recvs of them fail, naming
//     it) without breaking the others: they see its rank as gone.
//
// Segment bytes (layout.hpp, p2p_region_bytes): N doorbells of 128 B, N^2
// channels of 1 KiB (four 128-B lines of counters and verdicts, 8 headers of
// 64 B), N x 128 KiB of staging and N x 64 KiB of outboxes: N=8: 1.6 MiB;
// N=64: 16 MiB (of 89.6 MiB in all); N=256: 112 MiB (of 406 MiB: the
// collective slots are 1.1 MiB a rank by default).
//
// Doorbells and lost wake-ups. Verdicts, slices, `active` and freed entries
// ring r's doorbell in full (ring(): seq_cst fetch_add of `value`, seq_cst
// load of `waiters`, FUTEX_WAKE when nonzero; the waiter's side is the same
// as wait.hpp's). A posted header, and a headers_read that frees entries
// for s (the same argument with the roles swapped: a sender waiting for a
// free entry watches headers_read), ring lightly (ring_light()): no store to
// the doorbell and no fence on the sender's hot path; s only reads r's
// `waiters` after its release store of `seq`, and rings in full when r said
// it is going to sleep (waiters > 0). A waiting r polls the `seq` of the
// next entry of every peer (and its doorbell) in its spin and yield phases,
// so it needs no ring there. Before a futex sleep r increments `waiters`
// (seq_cst RMW), then runs an asymmetric fence, membarrier(
// MEMBARRIER_CMD_GLOBAL_EXPEDITED) -- every rank registered for it when it
// attached to the segment, so that every thread of every rank executes a full barrier
// (or is not running) between the call's entry and return -- then reads
// `futex_gen`, re-checks every watched `seq` and the doorbell, and sleeps
// only while `futex_gen` is unchanged. Lost-wakeup argument, for s's store
// S (seq) followed in program order by its load L (waiters), and r's RMW W
// (waiters) followed by membarrier and r's load R (seq): the barrier that
// membarrier forces on s's thread falls at some point of s's program. If it
// falls after S, S is visible to every CPU before membarrier returns, so R
// sees it. If it falls before S, it is also before L, and W happened before
// the barrier, so L sees waiters > 0 and s rings in full: it bumps
// `futex_gen` after S (seq_cst), so either r's read of `futex_gen` sees the
// bump and then R sees S (acquire), or FUTEX_WAIT returns on the changed
// word or the wake. Either way r never sleeps through a posted header. The
// sender pays a compiler barrier only; the sleeper pays the IPIs, once per
// sleep slice, after its spin and yield phases (~2 ms by default). Where membarrier or its
// registration is refused to any rank (old kernel, seccomp, which is per process;
// SHMRING_MEMBARRIER=0), every s executes a seq_cst fence between S and L instead (the symmetric
// form of the same argument). The collectives' counters use the same fence and the same job-wide
// choice (wait.hpp, Config::asymmetric_fence).
//
// Waits: a blocking caller spins only when its peer does not run on its CPU
// (and never when oversubscribed), then yields, then sleeps on its doorbell;
// the progress thread never spins. Each pending operation has a deadline,
// SHMRING_TIMEOUT after it last moved; the slow path (every 10 ms) checks
// the abort word and the liveness of the operation's peer.

#include "p2p/p2p.hpp"

#include <thread>

#include "p2p/p2p_state.hpp"

namespace shmring {
namespace detail {

P2p::P2p(Communicator::Impl& c)
    : c_(c),
      base_(c.seg->p2p_base()),
      cma_(c.single_copy.mode),  // SHMRING_CMA and SHMRING_CMA_MIN_BYTES, parsed (and
      cma_min_bytes_(c.single_copy.min_bytes),  // PR_SET_PTRACER set) by the constructor
      fork_gen_(fork_generation()) {
  peers_.resize(static_cast<std::size_t>(c.size));
}

P2p::~P2p() {
  if (inherited()) {
    // A forked child: the thread is the parent's. Touch nothing.
    (void)thread_.release();
    return;
  }
  std::vector<OpPtr> pending_ops;
  {
    std::unique_lock lock(mutex_);
    stop_ = true;
    auto fail_all = [&](std::deque<OpPtr>& q) {
      for (auto& op : q) pending_ops.push_back(op);
    };
    for (auto& ps : peers_) {
      fail_all(ps.unposted);
      fail_all(ps.recvs);
      for (auto& [m, op] : ps.outstanding)
        if (!op->done) pending_ops.push_back(op);
      for (auto& v : ps.verdicts)
        if (v.op) pending_ops.push_back(v.op);
    }
    fail_all(stage_queue_);
    for (auto& op : pending_ops)
      if (!op->done)
        end_early(op,
                  std::make_exception_ptr(AbortedError(
                      fmt::format("rank {}: the communicator was destroyed while {} was pending",
                                  c_.rank, describe(*op)))),
                  kP2pWithdrawnDestroyed);
    // A send whose receiver was reading it when we withdrew it completes at
    // its verdict (the read is short), the receiver's death or its deadline:
    // the caller may free the buffer once we return.
    auto reading = [&] {
      return std::any_of(pending_ops.begin(), pending_ops.end(),
                         [](const OpPtr& o) { return !o->done; });
    };
    while (reading()) {
      progress(lock);
      check_pending(lock);
      if (!reading()) break;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      lock.lock();
    }
    deliver(lock);
  }
  cv_.notify_all();
  ring(c_.rank);  // the progress thread may sleep on our doorbell
  if (thread_ && thread_->joinable()) thread_->join();
}

P2pChannel& P2p::channel(int from, int to) {
  const auto n = static_cast<std::uint64_t>(c_.size);
  return reinterpret_cast<P2pChannel*>(
      base_ + p2p_channels_offset(
                  n))[static_cast<std::uint64_t>(from) * n + static_cast<std::uint64_t>(to)];
}

P2pInbox& P2p::inbox(int r) {
  return reinterpret_cast<P2pInbox*>(base_)[r];
}

std::byte* P2p::outbox(int sender) {
  return base_ + p2p_outbox_offset(static_cast<std::uint64_t>(c_.size)) +
         static_cast<std::uint64_t>(sender) * kP2pOutboxBytes;
}

std::int64_t P2p::outbox_reserve(int peer, std::uint64_t msg, std::uint64_t bytes) {
  // Free what the receivers have copied out: a receiver publishes
  // headers_read only after copying each outbox payload it scanned.
  while (!out_uses_.empty()) {
    const OutboxUse& u = out_uses_.front();
    if (channel(c_.rank, u.peer).headers_read.load(std::memory_order_acquire) <= u.msg) break;
    out_tail_ = u.end;
    out_uses_.pop_front();
  }
  if (out_uses_.empty()) out_head_ = out_tail_ = 0;   // start over at offset 0
  const std::uint64_t need = (bytes + 63) / 64 * 64;  // lines of their own
  std::uint64_t at = out_head_;
  const std::uint64_t place = at % kP2pOutboxBytes;
  if (place + need > kP2pOutboxBytes) at += kP2pOutboxBytes - place;  // no payload wraps
  if (at + need - out_tail_ > kP2pOutboxBytes) return -1;
  out_head_ = at + need;
  out_uses_.push_back({peer, msg, out_head_});
  return static_cast<std::int64_t>(at % kP2pOutboxBytes);
}

std::byte* P2p::stage_slot(int receiver, std::uint64_t slice) {
  const auto n = static_cast<std::uint64_t>(c_.size);
  return base_ + p2p_stage_offset(n) +
         (static_cast<std::uint64_t>(receiver) * kP2pStageSlots + slice % kP2pStageSlots) *
             kP2pStageBytes;
}

void P2p::ring(int peer) {
  Counter& d = inbox(peer).doorbell;
  d.value.fetch_add(1, std::memory_order_seq_cst);
  if (d.waiters.load(std::memory_order_seq_cst) != 0) wake(d);
}

void P2p::ring_light(int peer) {
  // After the release store of an entry's `seq` or of headers_read (the
  // header comment's S).
  if (c_.light_publish)                                   // every rank registered (wait.hpp)
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the sleeper's membarrier fences us
  else
    std::atomic_thread_fence(std::memory_order_seq_cst);
  if (inbox(peer).doorbell.waiters.load(std::memory_order_relaxed) != 0) ring(peer);
}

std::string P2p::describe(const Op& op) const {
  return describe_op(op.is_send, op.count, op.dtype, op.peer, op.tag);
}

void P2p::record_begin(Op& op) {
  if (c_.rec_head == nullptr) return;
  op.rec_id = ++rec_last_;
  recorder_p2p_begin(*c_.rec_head, op.is_send, op.dtype, op.peer, op.tag, op.count, mono_ns());
}

void P2p::record_end(const Op& op, bool ok) {
  if (c_.rec_head == nullptr || op.rec_id == 0 || op.rec_id != rec_last_) return;
  recorder_p2p_end(*c_.rec_head, ok ? kCallCompleted : kCallFailed, mono_ns());
}

void P2p::record_eager(bool is_send, std::uint64_t count, DataType dtype, int peer, int tag) {
  if (c_.rec_head == nullptr) return;
  ++rec_last_;
  const std::uint64_t now = mono_ns();
  recorder_p2p_begin(*c_.rec_head, is_send, dtype, peer, tag, count, now);
  recorder_p2p_end(*c_.rec_head, kCallCompleted, now);
}

void P2p::finish(const OpPtr& op, std::exception_ptr error) {
  if (op->done) return;
  op->done = true;
  op->error = error;
  record_end(*op, !error);
  // Another thread of ours may be waiting for this operation on our doorbell.
  if (sleepers_ > 0) ring(c_.rank);
  if (op->req) {
    --requests_pending_;
    completions_.push_back(op);
  }
}

void P2p::deliver(std::unique_lock<std::mutex>& lock) {
  if (completions_.empty()) return;
  auto list = std::move(completions_);
  completions_.clear();
  // Completed without our lock: a callback may call into shmring.
  lock.unlock();
  for (auto& op : list) op->req->complete(op->error);
  lock.lock();
}

P2p::OpPtr P2p::make_op(bool is_send, const void* buf, std::size_t count, DataType dtype, int peer,
                        int tag, bool with_request) {
  auto op = std::make_shared<Op>();
  op->is_send = is_send;
  op->buf = static_cast<std::byte*>(const_cast<void*>(buf));
  op->count = count;
  op->dtype = dtype;
  op->bytes = count * datatype_size(dtype);  // checked by the front
  op->peer = peer;
  op->tag = tag;
  if (with_request) {
    const WaitPolicy w = c_.base_policy();
    op->req = std::make_shared<RequestState>(w.spin_ns, w.yield_ns);
    // Waiting for the request progresses it on the waiting thread. The
    // request may outlive us only once complete, and then help is not called.
    op->req->help = [this, weak = std::weak_ptr<Op>(op)] {
      if (auto o = weak.lock()) {
        try {
          wait(*o);
        } catch (...) {
          // The error is in the request; wait_until_done rethrows it.
        }
      }
    };
  }
  return op;
}

void P2p::post(const OpPtr& op) {
  std::unique_lock lock(mutex_);
  // A broken communicator (a failed send, recv or collective, or abort(), on
  // any rank) takes no new message: see "Ending early" above.
  if (auto a = read_abort(c_.seg->header()))
    std::rethrow_exception(job_error(*op, *a, c_.p2p_failed.exchange(true)));
  PeerState& ps = peers_[static_cast<std::size_t>(op->peer)];
  if (op->is_send) progress_send(op->peer, ps);  // picks up verdicts of inline sends
  if (op->is_send && ps.deferred) {
    // An earlier inline send to this peer was refused by its recv. This send
    // throws it without starting: a call that throws sent nothing, and the
    // message says so (point-to-point.md).
    auto e = ps.deferred;
    ps.deferred = nullptr;
    try {
      std::rethrow_exception(e);
    } catch (const MismatchError& m) {
      throw MismatchError(fmt::format("{}; this {} was not started: call it again to send it",
                                      m.what(), describe(*op)));
    }
  }
  op->deadline = c_.deadline();
  record_begin(*op);
  if (op->req) ++requests_pending_;
  if (op->is_send) {
    op->eager = op->bytes <= kP2pInlineBytes;
    op->nslices = (op->bytes + stage_bytes_ - 1) / stage_bytes_;
    ps.unposted.push_back(op);
  } else {
    ps.recvs.push_back(op);
  }
  progress(lock);
  if (op->req && !op->done) {
    if (!thread_) start_thread();
    cv_.notify_all();
  }
  deliver(lock);
}

}  // namespace detail
}  // namespace shmring
