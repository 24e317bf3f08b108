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
//     error (end_early). A staged recv whose sender withdrew fails at its
//     next check instead of waiting for slices that will not come.
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

#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

#include "base/config.hpp"
#include "base/log.hpp"
#include "base/placement.hpp"
#include "transport/cma.hpp"

namespace shmring {
namespace detail {

namespace {
constexpr std::uint64_t kNoMsg = std::numeric_limits<std::uint64_t>::max();
constexpr std::size_t kRememberBuffered = 64;  // per peer, for mismatch messages
}  // namespace

struct P2p::Header {
  std::uint64_t msg = kNoMsg;
  std::uint64_t count = 0;
  std::uint64_t addr = 0;  // CMA: the send buffer's address; outbox: the payload's offset
  std::int32_t tag = 0;
  std::uint32_t flags = 0;
  unsigned char data[kP2pInlineBytes];
  // An outbox payload copied out at once because no recv was posted for it
  // (the sender's outbox space is freed with the header entry).
  std::vector<std::byte> payload;
};

struct P2p::Op {
  bool is_send = false;
  std::byte* buf = nullptr;  // const for a send
  std::uint64_t count = 0, bytes = 0;
  DataType dtype = DataType::uint8;
  int peer = 0, tag = 0;
  std::shared_ptr<RequestState> req;  // null for blocking calls
  bool done = false;
  std::exception_ptr error;
  // A posted send given up on while its receiver was reading it (end_early):
  // it completes with this error at its verdict.
  std::exception_ptr failing;
  Clock::time_point deadline;
  // Send: message number once posted; eager = inline (done at posting;
  // an outbox send is too, decided at posting: buffered below).
  std::uint64_t msg = kNoMsg;
  bool eager = false, streaming = false;
  std::uint64_t base = 0, slices = 0, nslices = 0;
  // Recv: the matched header; staged: slices copied out so far.
  Header hdr;
  bool activated = false;
};

struct P2p::PeerState {
  // As sender to this peer.
  std::uint64_t next_msg = 0;
  std::deque<OpPtr> unposted;
  std::map<std::uint64_t, OpPtr> outstanding;  // posted, not inline, no verdict read yet
  OpPtr streaming;
  std::uint64_t staged = 0;         // mirror of channel(me, peer).send.staged
  std::uint64_t headers_read = 0;   // last value read of channel(me, peer).recv.headers_read
  std::uint64_t verdicts_read = 0;  // mirror of channel(me, peer).send.verdicts_read
  std::exception_ptr deferred;      // mismatch of an inline send that had returned
  bool withdrawn = false;           // we set channel(me, peer).send.withdrawn
  // The last buffered (inline or outbox) sends, for a mismatch verdict that
  // comes after they returned: message m at m mod kRememberBuffered (a ring,
  // so that a small send allocates nothing). Older ones are described
  // without their values.
  struct Sent {
    std::uint64_t msg = kNoMsg;
    std::uint64_t count = 0;
    DataType dtype = DataType::uint8;
    int tag = 0;
  };
  std::array<Sent, kRememberBuffered> buffered;
  void remember_buffered(std::uint64_t m, std::uint64_t count, DataType dtype, int tag) {
    buffered[m % kRememberBuffered] = {m, count, dtype, tag};
  }
  const Sent* find_buffered(std::uint64_t m) const {
    const Sent& b = buffered[m % kRememberBuffered];
    return b.msg == m ? &b : nullptr;
  }
  // As receiver from this peer.
  std::uint64_t scanned = 0;  // headers copied (mirror of channel(peer, me).recv.headers_read)
  std::map<std::uint64_t, Header> unmatched;
  std::deque<OpPtr> recvs;    // posted, not matched yet
  std::uint64_t drained = 0;  // mirror of channel(peer, me).recv.drained
  bool cma_refused = false;   // process_vm_readv from this peer failed once
  struct PendingVerdict {
    std::uint64_t word, recv_count;
    OpPtr op;  // completed once the verdict is published (null: nobody waits)
    std::exception_ptr error;
  };
  std::deque<PendingVerdict> verdicts;  // waiting for a free verdict entry
  std::uint64_t verdicts_written = 0;   // mirror of channel(peer, me).recv.verdicts
};

P2p::P2p(Communicator::Impl& c)
    : c_(c),
      base_(c.seg->p2p_base()),
      cma_(c.cma_mode),                 // SHMRING_CMA and SHMRING_CMA_MIN_BYTES, parsed (and
      cma_min_bytes_(c.cma_min_bytes),  // PR_SET_PTRACER set) by the constructor
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

namespace {
std::string describe_op(bool is_send, std::uint64_t count, DataType dtype, int peer, int tag) {
  return fmt::format("{}(count={}, {}) {} rank {}, tag {}", is_send ? "send" : "recv", count,
                     to_string(dtype), is_send ? "to" : "from", peer, tag);
}
}  // namespace

std::string P2p::describe(const Op& op) const {
  return describe_op(op.is_send, op.count, op.dtype, op.peer, op.tag);
}

void P2p::finish(const OpPtr& op, std::exception_ptr error) {
  if (op->done) return;
  op->done = true;
  op->error = error;
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
    op->req = std::make_shared<RequestState>(c_.wait_policy.spin_ns, c_.wait_policy.yield_ns);
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
    // An earlier inline send to this peer was refused by its recv.
    auto e = ps.deferred;
    ps.deferred = nullptr;
    std::rethrow_exception(e);
  }
  op->deadline = c_.deadline();
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

// ---------------------------------------------------------------------------
// Sender side.

namespace {
// Step 1's last stores: the header's fields, then its `seq` (release), which
// the receiver polls. The payload (inline, outbox, or the buffer's address)
// is in place before.
void publish_header(P2pEntry& e, std::uint64_t m, std::uint64_t count, int tag,
                    std::uint32_t flags) {
  e.count.store(count, std::memory_order_relaxed);
  e.tag.store(tag, std::memory_order_relaxed);
  e.flags.store(flags, std::memory_order_relaxed);
  e.seq.store(m + 1, std::memory_order_release);
}
}  // namespace

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

// ---------------------------------------------------------------------------
// Receiver side.

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

// ---------------------------------------------------------------------------
// Faults: abort, dead peers, deadlines.

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
  // not past its death or a further SHMRING_TIMEOUT.
  for (auto& op : ops)
    if (op->failing && !op->done && (now >= op->deadline || !c_.seg->rank_alive(op->peer)))
      finish(op, op->failing);
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
      error = std::make_exception_ptr(TimeoutError(
          fmt::format("rank {}: timed out after {} s in {}: rank {} {} (SHMRING_TIMEOUT sets the "
                      "limit)",
                      c_.rank, c_.config.timeout_s, describe(*op), op->peer,
                      op->is_send ? "did not take the message" : "sent no matching message")));
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
// Ending early (the header comment's "Ending early").

void P2p::end_early(const OpPtr& op, std::exception_ptr error, std::uint64_t code) {
  if (op->done || op->failing) return;
  // A posted send without its verdict (buffered ones are done): its
  // receiver must not read it from now on.
  if (op->is_send && op->msg != kNoMsg && withdraw(op->peer, code) == op->msg + 1) {
    op->failing = error;
    op->deadline = c_.deadline();
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

// ---------------------------------------------------------------------------
// Waiting.

void P2p::watch_entries(std::vector<Watch>& w) {
  w.clear();
  for (int p = 0; p < c_.size; ++p) {
    if (p == c_.rank) continue;
    const std::uint64_t next = peers_[static_cast<std::size_t>(p)].scanned;
    w.push_back({&channel(p, c_.rank).entry[next % kP2pEntries].seq, next + 1});
    // A send waiting for a free entry: the receiver's headers_read.
    const PeerState& ps = peers_[static_cast<std::size_t>(p)];
    if (!ps.unposted.empty() && ps.next_msg >= ps.headers_read + kP2pEntries)
      w.push_back({&channel(c_.rank, p).headers_read, ps.next_msg - kP2pEntries + 1});
  }
}

void P2p::wait_doorbell(std::uint64_t seen, const std::vector<Watch>& watch, int peer,
                        bool progress_thread, Clock::time_point since) {
  WaitPolicy policy = c_.wait_policy;
  if (progress_thread) {
    // A helper thread must not hold a core a rank needs.
    policy.spin_ns = 0;
    policy.yield_ns = std::min(policy.yield_ns, kHelperMaxYieldNs);
  } else {
    policy = c_.policy_for(peer);  // yield only to a rank on our CPU
  }
  Counter& d = inbox(c_.rank).doorbell;
  // Anything to progress: a ring, or a header posted (lightly rung) since
  // the caller's last scan.
  auto ready = [&](std::memory_order order) {
    if (d.value.load(order) > seen) return true;
    for (const Watch& w : watch)
      if (w.seq->load(order) >= w.want) return true;
    return false;
  };
  if (ready(std::memory_order_acquire)) return;
  // Phases already spent in earlier slices of this wait are not repeated:
  // a recv waiting 1 s for its send yielded 2 ms of every 12 ms slice (165
  // ms of CPU; tests/core/test_idle_cpu.cpp).
  const auto call_start = Clock::now();
  const std::int64_t waited = (call_start - since).count();
  const std::int64_t full_spin = policy.spin_ns;
  policy.spin_ns = std::max<std::int64_t>(0, full_spin - waited);
  policy.yield_ns =
      std::max<std::int64_t>(0, policy.yield_ns - std::max<std::int64_t>(0, waited - full_spin));
  if (policy.spin_ns > 0) {
    // A first short round before reading the clock (32 pauses: ~1.5 us on
    // CPUs whose pause takes ~140 cycles): a ping-pong answer often comes.
    for (int i = 0; i < 32; ++i) {
      cpu_relax();
      if (ready(std::memory_order_acquire)) return;
    }
  }
  const auto start = Clock::now();
  if (policy.spin_ns > 0) {
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        cpu_relax();
        if (ready(std::memory_order_acquire)) return;
      }
      if ((Clock::now() - start).count() >= policy.spin_ns) break;
    }
  }
  // Yield the core (the peer may need it); the caller's slow checks run
  // every sleep slice.
  const std::int64_t yield_end = policy.spin_ns + policy.yield_ns;
  while ((Clock::now() - start).count() < yield_end) {
    sched_yield();
    if (ready(std::memory_order_acquire)) return;
    if (Clock::now() - call_start > std::chrono::microseconds(policy.sleep_slice_us)) return;
  }
  // One futex sleep slice (the lost-wakeup argument is the header comment's).
  d.waiters.fetch_add(1, std::memory_order_seq_cst);
  asymmetric_fence_heavy();
  const std::uint32_t gen = d.futex_gen.load(std::memory_order_seq_cst);
  if (!ready(std::memory_order_seq_cst)) futex_wait(d.futex_gen, gen, policy.sleep_slice_us);
  d.waiters.fetch_sub(1, std::memory_order_seq_cst);
}

void P2p::wait(Op& op) {
  std::unique_lock lock(mutex_);
  auto last_check = Clock::now();
  // When this wait last saw the doorbell move: the phases restart there.
  auto since = last_check;
  std::uint64_t last_seen = inbox(c_.rank).doorbell.value.load(std::memory_order_acquire);
  while (!op.done) {
    const std::uint64_t seen = inbox(c_.rank).doorbell.value.load(std::memory_order_acquire);
    if (seen != last_seen) {
      last_seen = seen;
      since = Clock::now();
    }
    progress(lock);
    if (!op.done && Clock::now() - last_check > std::chrono::milliseconds(10)) {
      check_pending(lock);
      last_check = Clock::now();
    }
    deliver(lock);
    if (op.done) break;
    thread_local std::vector<Watch> watch;
    watch_entries(watch);
    ++sleepers_;
    lock.unlock();
    wait_doorbell(seen, watch, op.peer, false, since);
    lock.lock();
    --sleepers_;
  }
  if (op.error) std::rethrow_exception(op.error);
}

void P2p::start_thread() {
  thread_ = std::make_unique<std::thread>([this] { loop(); });
}

void P2p::loop() {
  pthread_setname_np(pthread_self(), "shmring-p2p");
  std::unique_lock lock(mutex_);
  auto last_check = Clock::now();
  while (!stop_) {
    if (requests_pending_ == 0) {
      cv_.wait_for(lock, std::chrono::milliseconds(100),
                   [&] { return stop_ || requests_pending_ > 0; });
      continue;
    }
    const std::uint64_t seen = inbox(c_.rank).doorbell.value.load(std::memory_order_acquire);
    progress(lock);
    if (Clock::now() - last_check > std::chrono::milliseconds(10)) {
      check_pending(lock);
      last_check = Clock::now();
    }
    deliver(lock);
    if (requests_pending_ == 0 || stop_) continue;
    std::vector<Watch>& watch = thread_watch_;
    watch_entries(watch);
    ++sleepers_;
    lock.unlock();
    wait_doorbell(seen, watch, -1, true, Clock::now());
    lock.lock();
    --sleepers_;
  }
}

// ---------------------------------------------------------------------------
// Front: blocking and non-blocking calls.

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
    if (c_.config.oversubscribed || w.spin_ns + w.yield_ns <= 0 || !c_.keep_off_cpu_of(peer))
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
