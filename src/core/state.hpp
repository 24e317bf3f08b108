#pragma once

// CommState: the protocol state of one rank in one communicator, and the
// core code over it (begin/announce/end, descriptors and their checks, the
// waits with their failure checks, the ring edge, the job-wide abort, the
// parallel kernels). It is all an algorithm sees: every function in
// src/algorithms/ takes a CommState&. Communicator::Impl (core/comm.hpp)
// derives from it and adds what only the front, the engine and
// point-to-point use (their scratch, the queue, the p2p channels, stats());
// tools/check-layers refuses any mention of Impl under src/algorithms/.
// docs/design/layers.md, "CommState and Communicator::Impl".

#include <tbb/task_arena.h>

#include <atomic>
#include <cassert>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/clock.hpp"
#include "base/config.hpp"
#include "base/placement.hpp"
#include "core/ops.hpp"
#include "core/recorder.hpp"
#include "core/trace.hpp"
#include "kernels/slot_stores.hpp"
#include "shmring/communicator.hpp"
#include "transport/layout.hpp"
#include "transport/segment.hpp"
#include "transport/wait.hpp"

namespace shmring {

namespace algo {
struct EagerState;
}  // namespace algo

/// Ring edge r -> r+1 (ring_edge.cpp), in slices; never reset, like the
/// shared counters it mirrors.
struct RingEdgeState {
  std::uint64_t sent = 0;      ///< slices published into my slots (== my produced)
  std::uint64_t recvd = 0;     ///< slices of my left neighbour consumed (== my consumed)
  bool left_checked = false;   ///< this collective's left descriptor was checked
  bool right_checked = false;  ///< acquire_send_slot checked right's descriptor
};

/// Single copy (process_vm_readv from a peer's memory, transport/cma.hpp):
/// the settings as the constructor resolved them (Config::cma,
/// cma_large, cma_min_bytes) and what it measured. Point-to-point messages
/// and the staged collectives' single-copy round use it.
struct SingleCopyState {
  /// SHMRING_CMA: 0 never reads a peer's memory; 1, the default, does where
  /// the kernel allows it.
  int mode = 1;
  /// SHMRING_CMA_LARGE: 1 takes the staged collectives' blocks past 256 KiB
  /// in one copy as well, 0 never; unset, the constructor decides by
  /// measuring (cma.hpp kCmaLargeMaxRatio). -1: not decided (single copy off).
  int large = -1;
  /// SHMRING_CMA_MIN_BYTES: the smallest point-to-point message read so.
  /// Messages that do not go eager (past kP2pEagerBytes, 16 KiB, or with the
  /// outbox full) were staged up to 64 KiB (an early guess): a ping-pong of
  /// 17-49 KiB (sendrecv_perf, N=2, Intel VM,
  /// docs/performance/notes/2026-12-01-intel-hierarchical-p2p.md) took
  /// 3.9-7.6 us one way staged and 1.7-2.9 us in one copy (Open MPI, which
  /// reads its large messages the same way: 1.7-2.8).
  std::size_t min_bytes = 16 * 1024;
  /// Whether this rank can read every peer's memory (staged.cpp
  /// cma_capable): -1 not probed yet, else 0 or 1.
  int probed = -1;
};

/// The one-line path's bookkeeping (algorithms/low_latency.cpp).
struct LowLatencyState {
  /// The last collective whose every peer line this rank read (+1; 0: none).
  std::uint64_t read = 0;
  /// Whether this low-latency collective published `announced` yet (it does
  /// so when a wait leaves its spin phase, or at the end).
  bool announced = false;
};

struct CommState {
  Config config;
  std::unique_ptr<detail::Segment> seg;
  std::unique_ptr<tbb::task_arena> arena;  // null when threads == 1
  detail::WaitPolicy wait_policy;
  bool spin_explicit = false;  // SHMRING_SPIN_US set: kept when crowded, as apply_placement does
  detail::Unstacker unstacker;
  int published_cpu = -1;       // what my RankInfo::cpu says
  std::vector<int> crowd_cpus;  // spread_crowded's scratch: the other ranks' CPUs
  int rank = 0, size = 1, left = 0, right = 0;

  RingEdgeState ring;               // ring edge r -> r+1 (ring_edge.cpp)
  std::uint64_t collectives = 0;    // sequence number of the current / next collective
  std::uint64_t staged_rounds = 0;  // rounds of staged collectives so far (== my posted)
  // done counter every rank must reach before a direct buffer is rewritten:
  // a staged collective c reads both buffers, so it sets c + 1.
  std::uint64_t staged_done_needed = 0;
  // Every rank registered for the asymmetric fence (wait.hpp,
  // Config::asymmetric_fence): publish() needs no fence. False until the
  // constructor has seen every rank attach, and where any rank's kernel
  // refused or SHMRING_MEMBARRIER=0.
  bool light_publish = false;
  SingleCopyState single_copy;  // process_vm_readv between ranks (transport/cma.hpp)
  /// Checks that a collective's path leaves to later collectives (the
  /// staged collectives' eager gathers and scatters return before their
  /// readers are done: algorithms/staged/staged_eager.cpp). begin() runs
  /// `at_begin` after writing our descriptor and before announcing; end()
  /// runs `at_end` before publishing `done`. The core knows nothing of what
  /// they check; null: nothing to check.
  struct PendingChecks {
    void (*at_begin)(CommState&) = nullptr;
    void (*at_end)(CommState&) = nullptr;
  };
  PendingChecks pending;
  /// The eager paths' bookkeeping (algorithms/staged/staged.hpp EagerState),
  /// made by the first eager call, with its deleter.
  std::unique_ptr<algo::EagerState, void (*)(algo::EagerState*)> eager{nullptr, nullptr};

  // The collective in flight, for error messages.
  std::optional<CollectiveDesc> current;
  int step = -1;
  // Bytes of the call run() is about to begin (Op::bytes), for the recorder
  // and stats().
  std::uint64_t current_bytes = 0;

  // ---- Flight recorder (core/recorder.hpp, docs/design/recorder.md): this
  // rank's head and entries in the segment; null when the job has none
  // (SHMRING_RECORDER_ENTRIES=0). ----
  detail::RecorderHead* rec_head = nullptr;
  detail::RecorderEntry* rec_entries = nullptr;
  std::uint64_t rec_n = 0;
  /// `collectives` mod rec_n, advanced by end(): the running call's entry
  /// without a 64-bit division (two per call were 2-5% of an 8-byte
  /// allreduce at N=2; docs/design/recorder.md, "Cost").
  std::uint64_t rec_index = 0;
  detail::RecorderEntry& rec_entry(std::uint64_t c) { return rec_entries[c % rec_n]; }
  detail::RecorderEntry& rec_current() {
    assert(rec_index == collectives % rec_n);
    return rec_entries[rec_index];
  }
  /// Finds this rank's recorder in the segment (after attach).
  void init_recorder();
  /// `msg` + job_summary() (+ the dump's path): a timeout's or dead peer's
  /// message.
  std::string with_diagnosis(std::string msg);
  /// Marks the call in flight failed (the failure paths).
  void record_failure();
  /// What every rank's recorder says, for a timeout or dead-peer message:
  /// who is behind, what each last did and is doing (diagnose.cpp).
  std::string job_summary();
  /// SHMRING_DUMP_DIR set: writes every rank's recorder as one JSON file
  /// there and returns its path; "" when unset or on failure (diagnose.cpp).
  std::string dump_recorders(const std::string& reason);

  // ---- Timing of the call in flight. Here, not in Impl with stats(),
  // because the core writes them where no caller could: begin() starts the
  // clock, wait_counter() adds its blocked time, end() and the failure paths
  // (record_failure, deep inside a wait) stamp the recorder and the trace
  // with the same clock reading. Impl::run books stats() from them. ----
  // Start and end of each call: the cycle counter on CLOCK_MONOTONIC's
  // timeline (base/clock.hpp), cheaper than two clock_gettime per call.
  detail::FastClock call_clock;
  std::uint64_t call_start_ns = 0;  // when the running call began
  /// begin() left the clock read and the recorder's "started" entry to the
  /// low-latency path, which stamps them right after publishing its line,
  /// while the peers' lines are on their way: before the line they delayed
  /// every 8-byte call (docs/design/recorder.md, "Cost"). Only where no
  /// wait can come first (the line is free at once); end() and the
  /// failure paths stamp a start left unstamped.
  bool start_deferred = false;
  /// Reads the clock into call_start_ns and writes the recorder's
  /// "started" entry for the call in flight.
  void stamp_start();
  std::uint64_t call_wait_ns = 0;    // its blocked waits so far
  std::uint64_t call_queued_ns = 0;  // when it was queued (Op::queued_ns)
  // SHMRING_TRACE (core/trace.hpp, docs/guide/tracing.md): this
  // communicator's spans; null when unset. Here because end() and the
  // failure paths add the span of the call in flight.
  std::unique_ptr<detail::TraceLog> trace;
  /// Adds the call in flight to `trace`, ended at `end_ns`.
  void trace_call(std::uint64_t end_ns, bool failed);
  // First error seen (the communicator refuses work afterwards).
  std::optional<std::string> broken;
  /// A send/recv of this rank has thrown an error that broke the
  /// communicator (p2p.cpp, "Ending early"): the job's first error was this
  /// rank's first, so later calls throw AbortedError (rethrow_abort). Set by
  /// point-to-point, read by the core's rethrow_abort, hence here.
  std::atomic<bool> p2p_failed{false};
  /// Collectives completed (mirror of `collectives` readable from any
  /// thread); end() advances both.
  std::atomic<std::uint64_t> completed{0};

  detail::RankArea& my_area() { return seg->rank_area(rank); }
  detail::RankArea& area(int r) { return seg->rank_area(r); }

  /// Marks the job aborted with "rank R: aborted the job: <reason>": every
  /// rank's pending and later collectives fail with AbortedError. Any thread.
  void abort_job(const std::string& reason);
  /// Called by every wait's slow path: throws on abort, on a dead `peer`
  /// (unless `counter` reached `target` after all: a peer may publish its
  /// last slice and exit) and past the deadline. `what` names what is
  /// awaited, for the message.
  void check_progress(int peer, const char* what, std::chrono::steady_clock::time_point deadline,
                      const detail::Counter& counter, std::uint64_t target);
  /// Waits until `counter` (owned by `peer`) reaches `target`. A wait that
  /// does not succeed at once first makes sure we do not sit on `peer`'s
  /// CPU (placement.hpp).
  void wait_counter(detail::Counter& counter, std::uint64_t target, int peer, const char* what);
  /// The same under `policy`: a caller that has already spun on a line of
  /// the peer's (the low-latency and eager lines) passes spin_ns = 0 and
  /// falls back here, so that its slow phase is timed and shown in the
  /// recorder head as every other wait's is.
  void wait_counter(detail::Counter& counter, std::uint64_t target, int peer, const char* what,
                    const detail::WaitPolicy& policy);
  /// Publishes a counter of this rank's (wait.hpp publish()).
  void publish(detail::Counter& counter, std::uint64_t v) {
    detail::publish(counter, v, light_publish);
  }
  /// Publishes the CPU we run on; if `peer` runs there too, moves to a free
  /// CPU of the job if it can. Returns false when we stay on peer's CPU.
  bool keep_off_cpu_of(int peer);
  /// More ranks than CPUs: publishes the CPU we run on and, if a CPU of our
  /// mask holds fewer of the job's ranks than ours does besides us, moves
  /// there (base/placement.hpp), one rank of the job at a time.
  void spread_crowded();
  /// How many ranks of the job other than us last published `cpu`.
  int ranks_on(int cpu);
  /// Publishes the CPU this thread runs on (RankInfo::cpu) if it changed;
  /// returns it (-1: unknown).
  int publish_cpu();
  /// Takes the job's mover claim (one rank moves at a time) and, if
  /// `still_wanted()` says so under it, moves off `cpu` as
  /// Unstacker::move_off does; publishes where we then run and releases
  /// the claim. Returns the CPU moved to, -1 when not moved, kClaimLost
  /// when another rank held the claim.
  static constexpr int kClaimLost = -2;
  int claimed_move_off(int cpu, const std::function<bool()>& still_wanted);
  /// How a blocking wait for `peer` (-1: several) goes, from wait_policy:
  /// more ranks than CPUs, or `peer` stacked on our CPU: no spin, yield
  /// (the CPU is what the awaited rank needs). Otherwise spin for the spin
  /// and yield phases together, then sleep: a yield could only hand our
  /// CPU to a task outside the job, for a whole scheduler slice.
  detail::WaitPolicy policy_for(int peer);
  /// This communicator is not oversubscribed, yet this rank's setting is
  /// automatic and its process now holds an oversubscribed communicator
  /// (made before or after this one): the job crowds the machine, so this
  /// rank's waits must not spin either (docs/guide/tuning.md,
  /// "Oversubscription"). Per rank and per wait: spinning need not agree
  /// across ranks, unlike config.oversubscribed, which chose the slicing and
  /// algorithms at creation.
  bool crowded_by_job() const {
    return !config.oversubscribed && config.oversubscribed_request < 0 &&
           detail::crowded_communicator_alive();
  }
  /// wait_policy as it stands now: without its automatic spin phase while
  /// crowded_by_job(). The base of every wait of this rank (policy_for, the
  /// requests', the progress thread's).
  detail::WaitPolicy base_policy() const {
    detail::WaitPolicy p = wait_policy;
    if (!spin_explicit && crowded_by_job()) p.spin_ns = 0;
    return p;
  }

  // ---- Ring edge r -> r+1 (docs/design/protocols.md, "Ring"). ----
  /// Waits until slot (sent mod K) is free, i.e. right's consumed >= sent-K+1.
  std::byte* acquire_send_slot();
  /// Publishes the slot just filled: produced = ++sent.
  void publish_send();
  /// Waits until left's produced > recvd; returns left's slot (recvd mod K).
  /// The first call of a collective also checks left's descriptor.
  const std::byte* wait_recv_slot();
  /// Frees the slot just read: consumed = ++recvd.
  void release_recv();

  // ---- Collective framing. ----
  /// Throws InvalidArgumentError in a process forked (without exec) from the
  /// one that attached: only that process may use the rank.
  void check_owner() const {
    if (seg->forked_away()) [[unlikely]]
      refuse_forked();
  }
  [[noreturn]] void refuse_forked() const;
  /// "rank R: communicator is unusable after an earlier error: <first error>".
  std::string unusable_message() const;
  /// Throws the job's recorded error: as itself if it is this rank's first
  /// error, else as AbortedError(unusable_message()). Marks the communicator broken.
  [[noreturn]] void rethrow_abort(const detail::AbortInfo& a);
  /// Starts a collective: refuses a broken communicator, writes our
  /// descriptor into its ring entry. The ring path announces at once; the
  /// direct path after writing its data.
  void begin(const CollectiveDesc& d);
  /// Publishes announced = collective + 1 (descriptor and direct data visible).
  void announce();
  /// Compares peer's descriptor for this collective with ours; raises a
  /// mismatch on every rank when they differ.
  /// Fails the job: `peer` passed recv_counts other than ours (their hash,
  /// CollectiveDesc::vhash, differs).
  [[noreturn]] void fail_recv_counts(int peer);
  void check_descriptor(int peer);
  /// Waits for peer's announcement of this collective, then checks it.
  void wait_announced(int peer);
  /// wait_announced for every peer: once it returns, every rank runs this
  /// collective as we do (else it threw, on every rank in time).
  void wait_every_announced();
  /// Direct path: waits until every rank finished collective-2, so that our
  /// direct buffer (collective mod 2) may be overwritten; returns it.
  std::byte* acquire_direct_buffer();
  /// Low-latency path: waits until every rank finished collective-2 unless
  /// the previous collective was a low-latency one (whose lines prove it);
  /// returns our line for this collective.
  detail::LowLatencyLine& acquire_low_latency_line();
  /// Waits for peer's low-latency line of this collective and checks the
  /// descriptor in it; a peer that announced this collective by another path
  /// (a mismatch) is reported as such. Returns peer's line.
  const detail::LowLatencyLine& wait_low_latency(int peer);
  LowLatencyState low_latency;  // the one-line path (algorithms/low_latency.cpp)
  /// Ends a collective: done = collective + 1. Returns the clock reading
  /// (call_clock) that ended the call in flight, for Impl::run's stats();
  /// 0 when none was in flight.
  std::uint64_t end();

  /// Records `e` as the job's abort reason (first error wins), marks this
  /// communicator broken, rethrows the job's first error.
  [[noreturn]] void fail(const Error& e);

  std::string describe(const CollectiveDesc& d) const;

  // ---- Refused calls (engine.cpp Impl::reject publishes them). ----
  /// Publishes an "invalid call" descriptor for collective #collectives,
  /// with `reason` (this rank's own error) in its RankArea::refusal, and
  /// ends it (nothing when the communicator is broken).
  void publish_rejected(const std::string& reason);
  /// The collective this rank last refused (publish_rejected), plus one,
  /// until its next call settles it (settle_refusal); 0 when none.
  std::uint64_t refused = 0;
  std::string refused_reason;  ///< its error, as publish_rejected told it
  /// Settles the refused call at this rank's next call, before anything of
  /// that call is published: waits until every peer started it; when every
  /// rank refused it, the communicator stays usable; when some peer called
  /// it validly, fails the job (that peer may have returned without waiting:
  /// an eager scatter root or gather non-root, staged_eager.cpp) and throws
  /// AbortedError, this rank's first error having been its own refusal.
  void settle_refusal();
  /// At destruction: settles a refused call that some peer already ran (an
  /// eager root that returned), without waiting, so that the peer's next
  /// call names the refusal rather than a departed rank.
  void settle_refusal_at_exit() noexcept;
  /// The abort reason when peer `q` called collective `coll`, which this
  /// rank refused; nullopt when q refused it too.
  std::optional<std::string> refusal_conflict(int q, std::uint64_t coll);
  /// Peer's descriptor of collective `coll`, or nullopt when its entry holds
  /// another collective or was torn by a rewrite. Call after an acquire of
  /// one of peer's counters that follows its announcement of `coll`.
  std::optional<CollectiveDesc> read_descriptor(int peer, std::uint64_t coll);
  /// The mismatch a peer reports when `peer` published "invalid call" for
  /// collective `coll`: names `peer` and, when it could be read, its reason.
  std::string invalid_call_message(int peer, std::uint64_t coll, const CollectiveDesc& mine);

  // Parallel kernels inside this rank's arena.
  void reduce(void* dst, const void* a, const void* b, std::size_t n, DataType dt, ReduceOp op,
              int divisor = 1);
  void copy(void* dst, const void* src, std::size_t bytes);
  /// One copy of several disjoint pieces: a piece is (dst, src, bytes).
  struct CopyPart {
    std::byte* dst;
    const std::byte* src;
    std::size_t bytes;
  };
  /// copy() of every part as one job: the arena splits their total, so
  /// parts each too small to split (the two-shot gather's N-1 parts) still
  /// share the rank's threads.
  void copy_parts(std::span<const CopyPart> parts);
  /// copy() into a slot that the right neighbour reads next: streaming
  /// stores when config.nt_stores says always, plain ones when never; with
  /// auto on AMD, slices of 16 KiB and more take the kind that slot_stores
  /// measures faster for this rank now (kernels/slot_stores.hpp). Fenced.
  void copy_to_slot(std::byte* slot, const void* src, std::size_t bytes);
  /// copy() into one of our direct buffers for peers to read (a broadcast
  /// root's data, the staged rounds' blocks but the reductions', eager
  /// blocks): copy_to_slot's rule where the ranks have CPUs of their own,
  /// plain stores where they share CPUs unless config.nt_stores says always
  /// (a reader on the writer's CPU finds the data in that CPU's cache).
  /// Fenced.
  void copy_to_direct(std::byte* buffer, const void* src, std::size_t bytes);
  /// The chooser behind copy_to_slot's auto rule (one per communicator; the
  /// running thread's).
  detail::SlotStoreChooser slot_stores;

  std::chrono::steady_clock::time_point deadline() const {
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               std::chrono::duration<double>(config.timeout_s));
  }
};

}  // namespace shmring
