#pragma once

// Point-to-point send/recv: the engine that moves messages between two
// ranks, independently of the collectives' call order (protocol: p2p.cpp).
//
// Threads: every operation runs under one mutex per communicator. A blocking
// send/recv progresses everything pending on the calling thread until its
// own message is done; requests (isend/irecv) are progressed by whoever
// waits, and by a progress thread of their own (started on the first request
// that does not complete at once), so that a request completes while its
// owner sits in a collective or elsewhere.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <tbb/task_arena.h>

#include "core/comm.hpp"
#include "core/request.hpp"

namespace shmring::detail {

class P2p {
 public:
  explicit P2p(Communicator::Impl& c);
  /// Fails every pending operation (AbortedError), stops the progress thread.
  ~P2p();
  P2p(const P2p&) = delete;
  P2p& operator=(const P2p&) = delete;

  /// Blocking forms: return when the message is sent (buffered, or taken by
  /// the receiver) or received; throw its error.
  void send(const void* buf, std::size_t count, DataType dtype, int peer, int tag);
  void recv(void* buf, std::size_t count, DataType dtype, int peer, int tag);
  Request isend(const void* buf, std::size_t count, DataType dtype, int peer, int tag);
  Request irecv(void* buf, std::size_t count, DataType dtype, int peer, int tag);

  /// True in a child forked after this object was made.
  bool inherited() const { return fork_gen_ != fork_generation(); }

 private:
  struct Op;
  struct Header;
  struct PeerState;
  using OpPtr = std::shared_ptr<Op>;

  /// The blocking calls' fast paths for eager messages (inline or outbox, at
  /// most kP2pEagerBytes): no Op, no allocation, no clock read. They return
  /// false, having changed nothing, where the general path must run: a send
  /// behind queued sends, unread verdicts, full entries or a full outbox; a
  /// recv behind posted recvs or unmatched messages from `peer`, or whose
  /// message is not an eager one that matches (the general path reports a
  /// mismatch). They take a third of the general path's time in an 8-byte
  /// ping-pong (docs/performance/notes/2026-12-01-early-morning.md).
  bool send_eager(const void* buf, std::uint64_t count, DataType dtype, int peer, int tag);
  bool recv_eager(void* buf, std::uint64_t count, DataType dtype, int peer, int tag);
  OpPtr make_op(bool is_send, const void* buf, std::size_t count, DataType dtype, int peer, int tag,
                bool with_request);
  /// Queues `op` and progresses once (it may complete at once).
  void post(const OpPtr& op);
  /// Progresses until `op` is done, then rethrows its error.
  void wait(Op& op);
  /// Runs every pending operation as far as it goes without waiting;
  /// `lock` (on mutex_) is held. Returns true when something moved.
  bool progress(std::unique_lock<std::mutex>& lock);
  bool progress_send(int peer, PeerState& ps);
  bool progress_recv(int peer, PeerState& ps);
  bool progress_staging();
  /// A recv matched its message: mismatch, inline, single copy, or queued
  /// for the staging slots.
  /// An outbox message matched at scan time passes `outbox_payload` (still
  /// in the sender's outbox); otherwise its copy in op->hdr is used.
  void deliver_matched(int peer, const OpPtr& op, const std::byte* outbox_payload = nullptr);
  /// Publishes the verdict on `op`'s message (queued while the sender has
  /// not read kP2pVerdicts earlier ones). `op` completes with `error` now
  /// (complete_now) or once the verdict is published. The verdict's
  /// recv_count is op's count, or `aux` when given (kP2pVerdictBadBuffer).
  void queue_verdict(int peer, const OpPtr& op, std::uint64_t code, bool complete_now,
                     std::exception_ptr error, std::optional<std::uint64_t> aux = std::nullopt);
  bool flush_verdicts(int peer, PeerState& ps);
  /// Abort, liveness and deadline checks of the pending operations (slow path).
  void check_pending(std::unique_lock<std::mutex>& lock);
  /// Ends `op` early with `error` (p2p.cpp, "Ending early"). A posted send
  /// still waiting for its verdict is withdrawn first (`code`, a
  /// kP2pWithdrawn* value); if its receiver is reading it at that moment,
  /// it completes with `error` at its verdict instead, so that the caller
  /// never gets its buffer back while the peer reads it.
  void end_early(const OpPtr& op, std::exception_ptr error, std::uint64_t code);
  /// Tells `peer` that we gave up on our unfinished sends to it (once);
  /// returns the message it is reading from our memory (+1; 0: none).
  std::uint64_t withdraw(int peer, std::uint64_t code);
  /// The recv `op` matched a message of a sender that withdrew (`code`):
  /// it fails, and the sender hears of it by a refused verdict.
  void refuse(int peer, const OpPtr& op, std::uint64_t code);
  /// The single-copy read of `op`'s message ended after its sender gave the
  /// buffer back (`released`): `op` fails, naming the sender's error.
  void discard_read(int peer, const OpPtr& op);
  /// The error of `op` ended by the job's recorded error `a`: its class,
  /// this rank and `op` in the words. `later`: `op` is a new call of a rank
  /// that has thrown an error already (AbortedError then, as collectives).
  std::exception_ptr job_error(const Op& op, const AbortInfo& a, bool later) const;
  /// Records `error` as the job's error (first one wins): every rank's
  /// communicator refuses further calls.
  void break_job(std::exception_ptr error);
  /// The job's abort word is set (one relaxed load: the fast paths' check).
  bool broken() const;
  void drop_finished();
  /// Marks `op` done; its request is completed by deliver().
  void finish(const OpPtr& op, std::exception_ptr error);
  /// Completes the requests finished so far, with `lock` released.
  void deliver(std::unique_lock<std::mutex>& lock);
  void ring(int peer);
  /// After publishing something `peer` watches while it waits (a header,
  /// headers_read): rings only when `peer` sleeps.
  void ring_light(int peer);
  /// A header `seq` to poll while waiting, and the value that means "posted".
  struct Watch {
    const std::atomic<std::uint64_t>* seq;
    std::uint64_t want;
  };
  /// The next entry of every peer, as far as we scanned, and headers_read
  /// of the peers our sends wait for (mutex_ held).
  void watch_entries(std::vector<Watch>& w);
  /// Waits for our doorbell to pass `seen` or a watched header to be
  /// posted (bounded by one sleep slice). The spin and yield phases are
  /// timed from `since`, when the caller began waiting without progress:
  /// a wait of many slices spins and yields once, then only sleeps.
  void wait_doorbell(std::uint64_t seen, const std::vector<Watch>& watch, int peer,
                     bool progress_thread, std::chrono::steady_clock::time_point since);
  void start_thread();
  void loop();
  std::size_t pending() const;

  P2pInbox& inbox(int r);
  P2pChannel& channel(int from, int to);
  std::byte* stage_slot(int receiver, std::uint64_t slice);
  std::byte* outbox(int sender);
  /// Room for `bytes` of eager payload in our outbox for message `msg` to
  /// `peer`: its offset, or -1 when the outbox is full (the message then
  /// goes by rendezvous). Frees first what the receivers have copied out.
  std::int64_t outbox_reserve(int peer, std::uint64_t msg, std::uint64_t bytes);
  std::string describe(const Op& op) const;

  Communicator::Impl& c_;
  std::byte* base_;
  std::size_t stage_bytes_ = kP2pStageBytes;
  const int cma_;  // SHMRING_CMA: 0 off, 1 auto (falls back on EPERM/ENOSYS)
  const std::size_t cma_min_bytes_;
  const unsigned fork_gen_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;  // the progress thread sleeps here when nothing is pending
  std::vector<PeerState> peers_;
  // Messages taking turns in this rank's staging slots (receiver side):
  // the recv whose message streams now, then those waiting.
  std::deque<OpPtr> stage_queue_;
  std::uint64_t stage_base_ = 0;  // channel(sender, me).recv.drained at activation
  // Our outbox as a byte ring: [out_tail_, out_head_) in use (offsets grow
  // forever; the place is offset mod kP2pOutboxBytes). Each use is freed once
  // its receiver's headers_read passes its message, in order.
  struct OutboxUse {
    int peer;
    std::uint64_t msg, end;
  };
  std::deque<OutboxUse> out_uses_;
  std::uint64_t out_head_ = 0, out_tail_ = 0;
  bool stop_ = false;
  int sleepers_ = 0;  // threads between unlock and re-lock around a doorbell wait
  std::size_t requests_pending_ = 0;
  // Flight recorder (core/recorder.hpp): the recorder head shows this
  // rank's newest point-to-point call. Under mutex_.
  std::uint64_t rec_last_ = 0;
  void record_begin(Op& op);
  void record_end(const Op& op, bool ok);
  void record_eager(bool is_send, std::uint64_t count, DataType dtype, int peer, int tag);
  std::vector<OpPtr> completions_;  // finished requests not yet delivered
  std::unique_ptr<std::thread> thread_;
  // Splits large single-copy reads when the rank has one reduction thread
  // (made on the first such read; max_concurrency 1 where the rank may run
  // on one CPU only, which makes the split a no-op).
  std::unique_ptr<tbb::task_arena> cma_arena_;
  tbb::task_arena* cma_arena(std::uint64_t bytes);
  std::vector<Watch> thread_watch_;  // the progress thread's
};

}  // namespace shmring::detail
