#pragma once

#if !defined(__cplusplus) || __cplusplus < 202002L
#error "shmring's C++ API needs C++20 (compile with -std=c++20); C code uses <shmring/shmring.h>"
#endif

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "shmring/error.hpp"
#include "shmring/export.hpp"
#include "shmring/request.hpp"
#include "shmring/types.hpp"

namespace shmring {

/// One collective kind's counters on this rank (Communicator::stats()).
struct CollectiveStats {
  std::string collective;   ///< "allreduce", "broadcast", ...
  std::uint64_t calls = 0;  ///< calls completed
  /// Their bytes: this rank's result buffer per call (an allgather's or
  /// alltoall's whole recv, a gather root's size() blocks), or, on a rank
  /// that receives nothing (a gather's or reduce's non-root), its send block.
  std::uint64_t bytes = 0;
  std::uint64_t time_ns = 0;  ///< time inside those calls, from start to end (steady clock)
  /// Of time_ns, the time this rank was blocked on a peer: in waits for a
  /// peer's shared counter (its arrival, its data, room in its slots) that
  /// outlasted the spin and yield phases (2 ms by default), each counted
  /// from its start (docs/design/recorder.md). The one-line and eager paths
  /// poll a peer's line during the spin phase and fall back to such a wait,
  /// so a late peer is counted there too.
  std::uint64_t wait_ns = 0;
};

/// Explicit settings for a Communicator. Every field left at its default is
/// taken from the environment (see README, "Environment variables"), then
/// from the built-in default.
struct Options {
  /// This process's rank in [0, world_size). -1 (with world_size -1): from
  /// the launcher's variables; give both or neither.
  int rank = -1;
  int world_size = -1;  ///< Number of ranks, 1..4096.
  std::string job_id;   ///< Shared by all ranks of one job; [A-Za-z0-9._-], <= 64 chars.
  int local_rank = -1;  ///< Rank among the processes on this host (defaults to rank).
  int local_world_size = -1;
  std::size_t slots = 0;       ///< Ring slots per rank (K), >= 2. SHMRING_SLOTS.
  std::size_t slot_bytes = 0;  ///< Bytes per slot, a multiple of 4096. SHMRING_SLOT_BYTES.
  /// Reduction threads per rank, 1..1024; 0: SHMRING_THREADS, else automatic.
  int threads = 0;
  /// Deadline of every wait, seconds, 0.001..1e9; 0: SHMRING_TIMEOUT, else
  /// 300. Anything else (negative, NaN) is an InvalidArgumentError.
  double timeout_s = 0;
  /// Whether the ranks share their CPUs with other busy processes, so that
  /// a wait must not spin (it yields, then sleeps): 1 yes, 0 no, -1
  /// SHMRING_OVERSUBSCRIBED, else automatic (more ranks than the CPUs their
  /// affinity masks cover together). Set it where the busy processes are
  /// outside this communicator: shmring's MPI layer does for node
  /// communicators whose machine runs more ranks, of all nodes together,
  /// than it has CPUs; Open MPI's mpi_yield_when_idle is the same idea. The
  /// job's setting: 1 when any rank asks for 1, 0 when every rank asks for
  /// 0, else automatic. Any other value is an InvalidArgumentError.
  int oversubscribed = -1;
};

/// When slot copies use non-temporal (streaming) stores. `automatic` uses
/// them for slices of 16-128 KiB on AMD CPUs, where they measured faster,
/// and not on Intel, where they measured slower (docs/performance/notes,
/// "Non-temporal slot writes").
enum class NtStores : std::uint8_t { automatic, never, always };

/// Settings in force, after explicit options, environment and defaults.
struct Config {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string job_id;
  std::size_t slots = 0;
  std::size_t slot_bytes = 0;
  /// Bytes one step of the ring and chain collectives moves through a slot:
  /// slot_bytes, or at most 64 KiB where the job is oversubscribed (ranks
  /// that share a CPU hand each other slices that stay in its cache).
  std::size_t slice_bytes = 0;
  int threads = 1;
  double timeout_s = 0;
  double spin_us = 0;  ///< Busy-wait (pause) phase of a wait, microseconds.
  /// sched_yield phase after the spin, before futex sleep, microseconds;
  /// while the awaited rank runs on another CPU (and ranks <= CPUs) a wait
  /// spins through it instead: yielding would not help that rank.
  double yield_us = 0;
  std::size_t direct_bytes = 0;  ///< Largest per-rank message of the direct (small) path.
  int job_cpus = 0;              ///< CPUs the ranks' affinity masks cover together.
  /// Waits do not spin: the job's Options::oversubscribed, or automatic
  /// (more ranks than job_cpus).
  bool oversubscribed = false;
  /// This rank's Options::oversubscribed or SHMRING_OVERSUBSCRIBED: -1
  /// automatic, 0 or 1 (combined over the ranks into `oversubscribed`).
  int oversubscribed_request = -1;
  /// Every rank registered for membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)
  /// (none set SHMRING_MEMBARRIER=0, no kernel or seccomp refused): ranks
  /// publish their counters without a fence and a rank about to sleep
  /// fences for everyone (src/transport/wait.hpp, after Linux's membarrier(2)).
  bool asymmetric_fence = false;
  std::string algorithm = "auto";            ///< SHMRING_ALGO: auto, ring, direct or two_shot.
  NtStores nt_stores = NtStores::automatic;  ///< SHMRING_NT_STORES: auto, 0 or 1.
  /// SHMRING_MIGRATE: a rank whose wait finds the awaited peer on its own CPU
  /// moves to a CPU of its mask that no rank occupies (default on).
  bool migrate = true;
  std::string segment_name;
  std::size_t segment_bytes = 0;
  int progress_cpu = -1;  ///< SHMRING_PROGRESS_CPU: CPU of the progress thread, -1 unpinned.
  /// SHMRING_CMA: 1 (default) reads peers' memory in one copy
  /// (process_vm_readv) where the kernel allows it, 0 never.
  int cma = 1;
  /// SHMRING_CMA_LARGE: 1 the staged collectives' blocks past 256 KiB go in
  /// one copy too, 0 never, -1 (default) decided by measuring at startup.
  int cma_large = -1;
  /// SHMRING_CMA_MIN_BYTES: the smallest point-to-point message read in one
  /// copy.
  std::size_t cma_min_bytes = 16 * 1024;
};

/// This host's identity as shmring sees it: a 64-bit hash of the hostname and
/// the boot id, the one in every segment name. Processes with equal values
/// can share a communicator (shmring's MPI layer groups ranks into nodes by
/// it). Not collective; thread safe.
SHMRING_API std::uint64_t host_identity();

/// A check run by the waits of this thread's calls: it returns an empty
/// string to go on waiting, or a reason, which aborts the communicator as
/// Communicator::abort(reason) does (the call and every peer's fail with
/// AbortedError carrying it). The Python binding sets one around each
/// blocking call and Request.wait() so that Ctrl-C ends a wait on a peer:
/// Python runs its signal handlers only when the waiting thread returns to
/// it.
using WaitCheck = std::string (*)();

/// Installs `check` for the calling thread (nullptr removes it) and returns
/// the one it replaces. It runs about every 10 ms once a wait on a peer, or
/// Request::wait / wait_for_seconds, has outlasted its spin and yield phases
/// (about 2 ms), on this thread only, never on the progress thread, so a
/// call that waits less never runs it.
/// It must not call into the communicator. Thread-local; no lock.
SHMRING_API WaitCheck set_wait_check(WaitCheck check) noexcept;

/// A group of `world_size` processes on one host that run collectives over one
/// shared-memory segment.
///
/// Collective-call rules (as in MPI and NCCL): every rank of the communicator
/// must call the same collectives, in the same order, with the same count,
/// datatype, operator and root. A disagreement is detected and reported as
/// MismatchError on every rank. After any error the communicator is broken:
/// every later call throws AbortedError with the first error's reason.
///
/// Non-blocking collectives (iallreduce, ...): each returns a Request at
/// once; the communicator's progress thread (started at the first i-call,
/// asleep while idle, pinned with SHMRING_PROGRESS_CPU) runs requests in call
/// order. Blocking and non-blocking calls share that order: a blocking call
/// with nothing pending runs on the caller's thread, otherwise it queues
/// behind the pending requests and waits. Ranks must agree on the order of
/// all calls, blocking or not. See Request for the buffer rules.
///
/// Thread safety: distinct Communicators may be used concurrently from
/// different threads. Several threads may use one Communicator only if they
/// order their calls themselves (a mutex around each call, as in MPI's
/// THREAD_SERIALIZED): call order is the contract between ranks. abort() is
/// safe from any thread at any time. Requests may be waited on from any
/// thread. After fork() a child must not use (nor wait on requests of) a
/// communicator it inherited: it has no progress thread and no membership.
/// Its collectives there throw InvalidArgumentError, and destroying it there
/// touches nothing: the child neither keeps the parent's rank alive nor
/// speaks for it.
class SHMRING_API Communicator {
 public:
  /// Rank, world size and job id from the environment: SHMRING_RANK,
  /// SHMRING_WORLD_SIZE, SHMRING_JOB_ID (set by shmrun), else torchrun's
  /// RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE with a job id from
  /// TORCHELASTIC_RUN_ID or MASTER_ADDR:MASTER_PORT, else Open MPI's
  /// OMPI_COMM_WORLD_*, MPICH's PMI_RANK / PMI_SIZE or Slurm's SLURM_* (the
  /// innermost launcher's; an outer set that disagrees is InvalidArgumentError).
  /// Blocks until every rank has attached (or the timeout passes).
  /// Throws InvalidArgumentError (missing/bad settings, two processes claiming
  /// one rank, two jobs sharing the job id: then every process involved throws),
  /// TimeoutError (a rank never arrived), OutOfSharedMemoryError, SystemError.
  Communicator();
  /// Explicit settings; fields left unset come from the environment.
  explicit Communicator(const Options& options);
  Communicator(int rank, int world_size, std::string job_id);
  /// Not collective. Requests still queued or running are completed first
  /// (each of their waits bounded by SHMRING_TIMEOUT; on a broken
  /// communicator they fail at once), then the progress thread is joined:
  /// no thread outlives the communicator.
  ~Communicator();
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const noexcept;
  int size() const noexcept;
  int local_rank() const noexcept;
  int local_size() const noexcept;
  const Config& config() const noexcept;
  /// Whether this rank's waits may spin now (false: they yield, then
  /// sleep). False where config().oversubscribed (unless SHMRING_SPIN_US
  /// sets a spin), and, where this rank's Options::oversubscribed /
  /// SHMRING_OVERSUBSCRIBED is automatic, while this process holds any
  /// oversubscribed communicator, also one made after this one: crowding is
  /// the job's, not one communicator's (docs/guide/tuning.md). Thread-safe.
  bool waits_may_spin() const noexcept;

  /// Ring allreduce: recv[i] = op over all ranks of send[i], i < count.
  /// `send` and `recv` each hold `count` elements of `dtype` (either may be
  /// null when count is 0); `send == recv` reduces in place; otherwise they
  /// must not overlap. Any count, 64-bit. The result is bitwise identical on
  /// every rank. Throws InvalidArgumentError (avg on an integer type, bad
  /// enum, overlapping buffers), MismatchError, TimeoutError, PeerFailureError,
  /// AbortedError.
  void allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op);

  template <class T>
  void allreduce(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    // reject_call: the peers' matching call fails at once, as for the
    // pointer form's own checks.
    if (send.size() != recv.size())
      reject_call("allreduce", "send has " + std::to_string(send.size()) +
                                   " elements but recv has " + std::to_string(recv.size()));
    allreduce(send.data(), recv.data(), send.size(), datatype_of_v<std::remove_cv_t<T>>, op);
  }
  /// In place.
  template <class T>
  void allreduce(std::span<T> buffer, ReduceOp op) {
    allreduce(buffer.data(), buffer.data(), buffer.size(), datatype_of_v<std::remove_cv_t<T>>, op);
  }

  /// Reduce-scatter: rank r receives, in `recv[0..recv_count)`, the
  /// reduction over ranks of `send[r*recv_count .. (r+1)*recv_count)`.
  /// `send` holds size()*recv_count elements. In place when
  /// recv == send + rank()*recv_count; otherwise they must not overlap.
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                      ReduceOp op);

  /// Allgather: `recv` (size()*send_count elements) receives every rank's
  /// `send` (send_count elements) in rank order. In place when
  /// send == recv + rank()*send_count.
  void allgather(const void* send, void* recv, std::size_t send_count, DataType dtype);

  /// Broadcast: every rank's `buffer` (count elements) receives root's.
  /// Throws InvalidArgumentError when root is not in [0, size()).
  void broadcast(void* buffer, std::size_t count, DataType dtype, int root);

  /// Reduce: root's `recv` receives the reduction over ranks of `send`
  /// (count elements each). `recv` is ignored (may be null) on other ranks;
  /// at the root, recv == send reduces in place.
  void reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
              int root);

  /// Returns once every rank has entered the barrier.
  void barrier();
  /// The barrier of a rank about to destroy this communicator (ifinalize()
  /// explains it): returns once every rank has finished its calls before it,
  /// pending non-blocking ones included, and entered it. Errors as barrier().
  void finalize();

  /// This rank's counters per collective kind, one entry per kind called at
  /// least once (blocking and non-blocking calls alike), in a fixed order.
  /// May be called from any thread; a call still running is not counted.
  std::vector<CollectiveStats> stats() const;

  /// MPI_Comm_split: a new communicator of the ranks that pass the same
  /// `color` (>= 0), ranked by (key, rank in this communicator), with its
  /// own segment. Collective over this communicator; blocks until the new
  /// group has attached. It runs one allgather of every rank's (color, key)
  /// here: that takes a place in this communicator's collective order
  /// (collective_count()) and counts in stats() as an allgather of two
  /// int64 per rank (a trace names it split).
  Communicator split(int color, int key = 0);

  // ---- The rest of the collective set. Same collective-call
  // rules as above: every rank makes the same calls in the same order, and
  // the count vectors, displacements, roots and datatypes must agree where
  // MPI requires them to (a disagreement is MismatchError on every rank).
  // Counts and displacements are in elements of `dtype`, never bytes.
  // The count and displacement spans are read during the call (the i-forms
  // copy them), so they need not outlive it. Displacements are each rank's
  // own layout and are not compared across ranks (as in MPI).

  /// Alltoall: block j (elements [j*count, (j+1)*count)) of this rank's
  /// `send` goes to block rank() of rank j's `recv`. `send` and `recv` each
  /// hold size()*count elements and must not overlap (no in-place form).
  void alltoall(const void* send, void* recv, std::size_t count, DataType dtype);

  /// Alltoallv (MPI_Alltoallv): send_counts[j] elements at
  /// send + send_displs[j] go to rank j, which receives them at its
  /// recv + recv_displs[rank()]; recv_counts[j] must equal rank j's
  /// send_counts[rank()]. Each span has size() entries. The recv blocks must
  /// not overlap each other nor the send buffer.
  void alltoallv(const void* send, std::span<const std::size_t> send_counts,
                 std::span<const std::size_t> send_displs, void* recv,
                 std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs,
                 DataType dtype);

  /// Gather: root's `recv` (size()*count elements) receives every rank's
  /// `send` (count elements) in rank order; `recv` is ignored (may be null)
  /// elsewhere. In place at the root when send == recv + root*count. A
  /// small gather is eager: a non-root returns once its block is deposited,
  /// and learns of a disagreement (root, count) at its next call at the
  /// latest, or within 32 calls for blocks of at most 488 bytes (those may
  /// run up to 32 gathers ahead of the root).
  void gather(const void* send, void* recv, std::size_t count, DataType dtype, int root);

  /// Scatter: block r of root's `send` (size()*count elements; ignored, may
  /// be null, elsewhere) goes to rank r's `recv` (count elements). In place
  /// at the root when recv == send + root*count. A small scatter's root
  /// returns once the blocks are deposited and learns of a disagreement at
  /// its next call at the latest, or within 32 calls for blocks of at most
  /// 488 bytes at size() <= 16 (those may run up to 32 scatters ahead).
  void scatter(const void* send, void* recv, std::size_t count, DataType dtype, int root);

  /// Allgatherv (MPI_Allgatherv): every rank's `send` (send_count elements,
  /// equal to recv_counts[rank()]) lands at recv + displs[rank()] on every
  /// rank. recv_counts and displs have size() entries; blocks must not
  /// overlap. In place when send == recv + displs[rank()].
  void allgatherv(const void* send, std::size_t send_count, void* recv,
                  std::span<const std::size_t> recv_counts, std::span<const std::size_t> displs,
                  DataType dtype);

  /// Reduce-scatter with uneven blocks (MPI_Reduce_scatter): `send` holds
  /// sum(recv_counts) elements, block r starting at the sum of the counts
  /// before it; rank r receives in `recv` (recv_counts[r] elements) the
  /// reduction over ranks of block r. In place when
  /// recv == send + (offset of block rank()).
  void reduce_scatter_v(const void* send, void* recv, std::span<const std::size_t> recv_counts,
                        DataType dtype, ReduceOp op);

  // ---- Point-to-point. Not collective: only the two ranks involved take
  // part. Messages between one (sender, receiver, tag) arrive in the order
  // they were sent. A receive whose count or datatype differs from the
  // matching send is MismatchError on both ranks. tag >= 0.

  /// Sends `count` elements of `dtype` to `peer` (!= rank()). May return
  /// before the receiver has posted its recv (small messages are buffered).
  /// Messages up to 16 KiB are buffered when there is room (up to 8 per
  /// pair not yet seen by the receiver; up to 40 bytes in the message
  /// header, larger ones in this rank's 64 KiB outbox in the segment): send
  /// returns at once, and a mismatch the receiver finds is thrown by the
  /// next send to that peer. Larger ones, and buffered sizes when the
  /// outbox is full, return once the receiver has taken the data.
  /// Thread-safe: several threads may send and receive on one communicator
  /// at once. PeerFailureError, TimeoutError (SHMRING_TIMEOUT), AbortedError
  /// as collectives.
  void send(const void* buffer, std::size_t count, DataType dtype, int peer, int tag = 0);
  /// Receives `count` elements of `dtype` from `peer` (!= rank()) with `tag`.
  void recv(void* buffer, std::size_t count, DataType dtype, int peer, int tag = 0);

  template <class T>
  void broadcast(std::span<T> buffer, int root) {
    broadcast(buffer.data(), buffer.size(), datatype_of_v<std::remove_cv_t<T>>, root);
  }
  template <class T>
  void allgather(std::span<const T> send, std::span<T> recv) {
    if (recv.size() != send.size() * static_cast<std::size_t>(size()))
      reject_call("allgather", "recv has " + std::to_string(recv.size()) +
                                   " elements, expected size() x " + std::to_string(send.size()));
    allgather(send.data(), recv.data(), send.size(), datatype_of_v<std::remove_cv_t<T>>);
  }
  template <class T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    if (send.size() != recv.size() * static_cast<std::size_t>(size()))
      reject_call("reduce_scatter", "send has " + std::to_string(send.size()) +
                                        " elements, expected size() x " +
                                        std::to_string(recv.size()));
    reduce_scatter(send.data(), recv.data(), recv.size(), datatype_of_v<std::remove_cv_t<T>>, op);
  }

  // ---- Non-blocking forms. ----
  // Same arguments, checks and errors as the blocking forms. Argument errors
  // (InvalidArgumentError) are thrown at once by the i-call itself (and the
  // peers are told in call order, so they fail fast with MismatchError);
  // every other error is delivered by the Request's wait()/test(). The
  // buffers belong to the collective until the Request is complete.

  /// Non-blocking allreduce(). Throws InvalidArgumentError at once.
  Request iallreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op);
  /// Non-blocking reduce_scatter().
  Request ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                          ReduceOp op);
  /// Non-blocking allgather().
  Request iallgather(const void* send, void* recv, std::size_t send_count, DataType dtype);
  /// Non-blocking broadcast().
  Request ibroadcast(void* buffer, std::size_t count, DataType dtype, int root);
  /// Non-blocking reduce().
  Request ireduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                  int root);
  /// Non-blocking barrier(): complete once every rank has entered it.
  Request ibarrier();
  /// The barrier of a rank about to destroy this communicator (as NCCL's
  /// ncclCommFinalize, it is queued behind this rank's pending calls, which
  /// complete first): complete once every rank has finished its calls before
  /// it and entered it. A peer that meets it in another collective gets
  /// MismatchError saying that this rank is leaving, where a plain barrier
  /// would be named instead. Make no collective call after it; the torch
  /// backend calls it in destroy_process_group. Errors as ibarrier().
  Request ifinalize();
  /// Non-blocking forms of the calls above (same arguments and errors).
  Request ialltoall(const void* send, void* recv, std::size_t count, DataType dtype);
  Request ialltoallv(const void* send, std::span<const std::size_t> send_counts,
                     std::span<const std::size_t> send_displs, void* recv,
                     std::span<const std::size_t> recv_counts,
                     std::span<const std::size_t> recv_displs, DataType dtype);
  Request igather(const void* send, void* recv, std::size_t count, DataType dtype, int root);
  Request iscatter(const void* send, void* recv, std::size_t count, DataType dtype, int root);
  Request iallgatherv(const void* send, std::size_t send_count, void* recv,
                      std::span<const std::size_t> recv_counts, std::span<const std::size_t> displs,
                      DataType dtype);
  Request ireduce_scatter_v(const void* send, void* recv, std::span<const std::size_t> recv_counts,
                            DataType dtype, ReduceOp op);
  /// Non-blocking point-to-point: they progress independently of the
  /// collective queue (an isend/irecv pair posted in any order on the two
  /// ranks, around collectives, never deadlocks).
  Request isend(const void* buffer, std::size_t count, DataType dtype, int peer, int tag = 0);
  Request irecv(void* buffer, std::size_t count, DataType dtype, int peer, int tag = 0);

  /// For binding layers (Python, torch, other languages) whose own argument
  /// checks refuse a collective before calling it here: call this in its
  /// place, at the same point of the call order, and the refusal reaches
  /// the peers like the core's own argument errors. It counts as this rank's
  /// call of the collective: the peers' matching call (blocking or not)
  /// fails at once with MismatchError naming this rank and the reason ("rank
  /// R made an invalid call (it refused its arguments: rank R: <collective>:
  /// <reason>)", the reason cut to 383 bytes). Keeps the
  /// non-blocking call order: with requests pending, the refusal is queued
  /// behind them (this call still throws at once). When every rank refuses
  /// the same call, nobody waits and the communicator stays usable;
  /// otherwise it is broken on every rank (later calls throw AbortedError).
  /// Always throws: InvalidArgumentError "rank R: <collective>: <reason>"
  /// once published; AbortedError on a broken communicator (the peers know
  /// of the earlier error already); InvalidArgumentError in a forked child
  /// (nothing published). Not for point-to-point calls (send/recv are not in
  /// the collective order). Same thread rules as the collectives.
  [[noreturn]] void reject_call(const std::string& collective, const std::string& reason);

  /// Marks the job aborted: every rank's pending and later collectives throw
  /// AbortedError carrying `reason`. Safe to call from any thread.
  void abort(const std::string& reason);

  /// Collectives completed so far by this rank (the sequence number of the
  /// next one to run); requests still queued or running are not counted.
  /// A call this rank refused (InvalidArgumentError, told to the peers) is
  /// counted: it took its place in the collective order. A call that failed
  /// (any other error) is not, so after a failure the ranks' counts may
  /// differ by one: a peer that called the refused collective validly
  /// failed in it.
  std::uint64_t collective_count() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shmring
