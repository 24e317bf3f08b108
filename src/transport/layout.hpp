#pragma once

// The shared segment's layout. Plain data only: offsets, never pointers, so
// every process may map it at a different address.
//
//   [Header                      ] page-aligned, kHeaderBytes
//   [RankArea x world_size       ] page-aligned, kRankAreaBytes each
//   [slots: rank 0 slot 0..K-1, rank 1 slot 0..K-1, ...] page-aligned,
//                                  slot_bytes each
//   [direct buffers: rank 0 buffer 0..1, rank 1 ...]    page-aligned,
//                                  direct_bytes each (small-message path)
//   [point-to-point region        ] page-aligned, p2p_region_bytes(N) (p2p.hpp)
//   [eager rings: rank 0 entry 0..E-1, rank 1 ...] page-aligned,
//                                  eager_region_bytes(N) (staged.cpp)
//   [flight recorders: rank 0, rank 1, ...] page-aligned,
//                                  recorder_region_bytes(N, R) (docs/design/recorder.md)
//
// Every field a rank writes in a hot loop sits on its own 128-byte line (two
// 64-byte lines: adjacent-line prefetch would otherwise couple them).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "base/config.hpp"  // kMaxSlots

namespace shmring::detail {

inline constexpr std::size_t kLine = 128;
inline constexpr std::size_t kPage = 4096;
inline constexpr std::uint64_t kMagic = 0x31474e49524d4853ull;  // "SHMRING1"
inline constexpr std::uint32_t kLayoutVersion =
    20;  // 4: low-latency lines; 5: point-to-point region; 6: p2p outboxes;
         // 7: eager rings, 128 descriptors; 8: eager blocks of 4 lines;
         // 9: single-copy words (Descriptor::cma, RankInfo::probe_addr),
         // p2p bad-buffer verdicts; 10: kCmaLarge,
         // 104-byte low-latency lines; 11: eager blocks of 8 lines;
         // 12: Counter's futex words on a line of their own,
         // RankInfo::asymmetric_fence; 13: RankInfo::oversubscribed;
         // 14: p2p withdrawn / taking words, refused verdicts;
         // 15: flight recorders (Header::recorder_entries);
         // 16: p2p released word; 17: RankArea::refusal, RecorderHead's p2p call;
         // 18: the call's purpose in Descriptor::kind's bits 16 and up;
         // 19: and in LowLatencyLine::kind_dtype_op_algorithm's top bits;
         // 20: Header::dump_claimed
inline constexpr std::size_t kReasonBytes = 1024;
/// Descriptors of the last kDescRing collectives, per rank. A peer can run
/// at most K slots (K <= kMaxSlots), 2 direct buffers or kEagerEntries eager
/// collectives ahead of a rank (each a bound on the distance itself, not
/// added up: every path waits for its readers directly), so an entry a
/// reader needs is never overwritten. An eager writer confirms its
/// collective c' up to kEagerEntries collectives later, by reading its
/// readers' entries c' while they may be up to kMaxSlots further on:
/// kEagerEntries + kMaxSlots < kDescRing keeps those too (staged.cpp).
inline constexpr std::size_t kDescRing = 128;
/// Eager rings (staged.cpp "Eager rings"): per rank, kEagerEntries entries
/// of eager_lines_per_entry(N) lines; collective c uses entry c mod
/// kEagerEntries. A block is kEagerBlockLines lines: the first holds seq,
/// descriptor and kEagerLineBytes of data, the others data only, so a block
/// carries up to kEagerBytes. Small gathers (a block of at most kEagerBytes)
/// send through block 0 of the non-root's entry; small scatters through
/// block (reader - root - 1) mod N of the root's entry, up to
/// kEagerScatterMaxRanks ranks (the region grows as N^2 up to there; past
/// it scatters take the direct buffers and the region grows as N).
/// 8 lines a block rather than 4 (docs/performance/notes/2026-12-01-intel-fences-eager.md, N=2,
/// 2-core Intel VM): gathers and scatters of 256-byte blocks took 0.19 and 0.22 us a call instead
/// of 0.24-0.27 and 0.29-0.35 through the direct buffers (Open MPI 0.15-0.17), for twice the region
/// (2 MiB more at N=256).
inline constexpr std::size_t kEagerEntries = 32;
inline constexpr std::size_t kEagerBlockLines = 8;
inline constexpr std::size_t kEagerLineBytes = 40;
inline constexpr std::size_t kEagerBytes = kEagerLineBytes + (kEagerBlockLines - 1) * 64;  // 488
inline constexpr std::size_t kEagerScatterMaxRanks = 16;
static_assert(kEagerEntries + kMaxSlots < kDescRing);
/// Direct (one-shot) buffers per rank: collective c uses buffer c mod 2.
inline constexpr std::size_t kDirectBuffers = 2;

// Header status word.
inline constexpr std::uint32_t kStatusInit = 0;
inline constexpr std::uint32_t kStatusReady = 1;
inline constexpr std::uint32_t kStatusFailed = 2;

// Rank state word.
inline constexpr std::uint32_t kRankAbsent = 0;
inline constexpr std::uint32_t kRankAttached = 1;
inline constexpr std::uint32_t kRankFinalized = 2;

// Abort word: 0 = running; kAbortClaimed while the winning rank writes its
// reason; otherwise an ErrorCode value.
inline constexpr std::uint32_t kAbortNone = 0;
inline constexpr std::uint32_t kAbortClaimed = 0xffffffffu;

/// A sequence counter with the futex word its sleepers wait on. `value` only
/// grows. The writer bumps `futex_gen` and wakes when `waiters` is non-zero.
/// `value` and the sleepers' words live on different 64-byte lines: every
/// publish stores `value` and then loads `waiters`, and with both on one line
/// that load waited for the store to own a line the readers poll (an eager
/// gather's root, N=2: end() was a sixth of its time, the load 96% of it).
struct alignas(kLine) Counter {
  std::atomic<std::uint64_t> value;
  std::byte value_line_rest[56];
  std::atomic<std::uint32_t> futex_gen;
  std::atomic<std::uint32_t> waiters;
};

/// What a rank is about to do in collective c: entry c mod kDescRing,
/// written before its first slot write (and before `announced` = c+1), and
/// compared by its readers before they use its data.
struct alignas(64) Descriptor {
  std::atomic<std::uint64_t> seq;  // collective sequence number + 1 (0 = none yet)
  std::atomic<std::uint64_t> count;
  std::atomic<std::uint32_t> kind;  // CollectiveKind; bits 16 and up: CallPurpose
  std::atomic<std::uint32_t> dtype;
  std::atomic<std::uint32_t> op;
  std::atomic<std::int32_t> root;
  std::atomic<std::uint32_t> algorithm;  // ring or direct
  // Staged collectives (staged.cpp): a 64-bit hash of the count vectors
  // (allgatherv, reduce_scatter_v: equal on every rank; alltoallv: this
  // rank's share of a sum that is 0 when the pairs agree), and `aux`, the
  // largest block in bytes this rank sends to one peer (alltoallv).
  std::atomic<std::uint64_t> vhash;
  std::atomic<std::uint64_t> aux;
  // Staged collectives' single-copy round: 0 when this rank cannot read
  // every peer with process_vm_readv; else kCmaCapable | the address of its
  // own data in its address space (0 when it sends nothing), plus
  // kCmaNoInline when it left its block out of round 0, plus kCmaLarge
  // when it takes blocks past 256 KiB in one copy too (staged.cpp).
  std::atomic<std::uint64_t> cma;
};
/// Flags in bits 63 to 61 of Descriptor::cma (never set in a Linux
/// user-space address: 47, 52 or 56 bits at most).
inline constexpr std::uint64_t kCmaCapable = std::uint64_t{1} << 63;
inline constexpr std::uint64_t kCmaNoInline = std::uint64_t{1} << 62;
inline constexpr std::uint64_t kCmaLarge = std::uint64_t{1} << 61;
inline constexpr std::uint64_t kCmaAddressMask = kCmaLarge - 1;

/// CPUs a rank's affinity mask can name here (CPU_SETSIZE).
inline constexpr std::size_t kCpuMaskWords = 1024 / 64;

struct alignas(kLine) RankInfo {
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint32_t> state;
  std::atomic<std::uint64_t> host_hash;
  // The CPU the rank last ran on when one of its waits did not succeed at
  // once (-1: unknown or asleep); see placement.hpp.
  std::atomic<std::int32_t> cpu;
  // 1 when the rank's process registered for the asymmetric fence and may
  // call it (wait.hpp); written before `state`. Counters publish without a
  // fence only when every rank's is 1.
  std::atomic<std::uint32_t> asymmetric_fence;
  // The rank's Options::oversubscribed (-1 automatic, 0, 1), written before
  // `state`; Segment::oversubscribed_request combines them.
  std::atomic<std::int32_t> oversubscribed;
  // The rank's affinity mask when it attached (bit c = CPU c), written before
  // `state` is published; the union over ranks tells oversubscription.
  std::atomic<std::uint64_t> cpus[kCpuMaskWords];
  // The address of this very field in the rank's own address space: a peer
  // that reads 8 bytes there with process_vm_readv and finds this value
  // knows it may read the rank's memory (Communicator::Impl::cma_capable).
  std::atomic<std::uint64_t> probe_addr;
};

/// Low-latency line (low_latency.cpp): a whole small collective in one
/// cache line, so a reader's poll that sees `seq` also has the descriptor and
/// the data: one line transfer per peer instead of the direct path's three
/// (announced, descriptor, data). Collective c uses line c mod 2. The fields
/// other than `seq` are written before `seq` (release) and read after it
/// (acquire). Descriptor and 40 data bytes sit in the first 64 bytes, the
/// other 64 data bytes in the second cache line of the 128-byte block.
inline constexpr std::size_t kLowLatencyBytes = 104;
struct alignas(kLine) LowLatencyLine {
  std::atomic<std::uint64_t> seq;    // collective + 1 whose data this line holds
  std::atomic<std::uint64_t> count;  // descriptor, as in Descriptor
  // One byte each; the call's purpose in the top two bits (low_latency.cpp pack)
  std::atomic<std::uint32_t> kind_dtype_op_algorithm;
  std::atomic<std::int32_t> root;
  std::byte data[kLowLatencyBytes];
};
static_assert(offsetof(LowLatencyLine, data) + kLowLatencyBytes == kLine);

/// One line of an eager ring: the descriptor, the data and the sequence
/// number in one 64-byte line, as LowLatencyLine; `seq` (collective + 1) is
/// stored last (release) and polled by the reader (acquire).
struct alignas(64) EagerLine {
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint64_t> count;
  std::atomic<std::uint32_t> kind_dtype_op_algorithm;  // one byte each
  std::atomic<std::int32_t> root;
  std::byte data[kEagerLineBytes];  // continues over the block's next lines
};
static_assert(sizeof(EagerLine) == 64);

/// Lines per eager entry: a block per scatter reader (N-1) up to
/// kEagerScatterMaxRanks ranks, else one block for gathers (a block is 512
/// bytes, so consecutive entries never share a 128-byte prefetch pair).
inline constexpr std::uint64_t eager_lines_per_entry(std::uint64_t n) {
  return (n <= kEagerScatterMaxRanks && n > 2 ? n - 1 : 1) * kEagerBlockLines;
}
/// Bytes of the eager region: N x kEagerEntries x lines x 64. Per rank
/// 16 KiB * max(1, N-1) up to N = 16 (N=16: 240 KiB, 3.75 MiB in all), 16
/// KiB past it (N=64: 1 MiB in all, N=256: 4 MiB).
inline constexpr std::uint64_t eager_region_bytes(std::uint64_t n) {
  return n * kEagerEntries * eager_lines_per_entry(n) * sizeof(EagerLine);
}

/// Why a rank refused its own arguments in collective c (its "invalid call"
/// descriptor), so that the peers' error says what was wrong, not only who.
/// A seqlock keyed by the collective: the rank stores seq = 0, the text (NUL
/// terminated, cut to fit), then seq = c + 1 (release), all before the
/// descriptor; a reader that finds seq = c + 1 before and after copying the
/// text has this call's reason. Only the rank itself writes it.
inline constexpr std::size_t kRefusalWords = 48;  // 384 bytes of text
struct alignas(kLine) Refusal {
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint64_t> text[kRefusalWords];
};

struct RankArea {
  Counter produced;   // slices this rank has published into its own slots
  Counter consumed;   // slices of its left neighbour it has finished reading
  Counter announced;  // collectives whose descriptor (and direct data) is published
  Counter done;       // collectives this rank has finished
  Counter reduced;    // two-shot: collectives whose reduced chunk this rank published
  Counter posted;     // staged: rounds this rank has published in its direct buffers
  Counter taken;      // staged: rounds this rank has finished reading from its writers
  LowLatencyLine low_latency[2];
  RankInfo info;
  Refusal refusal;
  Descriptor desc[kDescRing];
};
inline constexpr std::size_t kRankAreaBytes = sizeof(RankArea);

struct alignas(kLine) Header {
  // Written once by rank 0 before status becomes ready; read-only afterwards.
  std::uint64_t magic;
  std::uint32_t layout_version;
  std::uint32_t world_size;
  std::uint64_t slots;
  std::uint64_t slot_bytes;
  std::uint64_t total_bytes;
  std::uint64_t rank_area_offset;
  std::uint64_t slot_offset;
  std::uint64_t direct_bytes;
  std::uint64_t direct_offset;
  std::uint64_t job_nonce;
  std::uint64_t host_hash;
  std::int32_t creator_pid;
  // 1 when job_nonce is the launcher's (SHMRING_JOB_NONCE, the same on every
  // rank, so an attacher can tell another job's segment from its own); 0
  // when rank 0 made it up.
  std::uint32_t reserved;
  // CLOCK_REALTIME_COARSE when rank 0 created the file, in ns; informative
  // (the attach path uses the file's ctime, which exists before the header).
  std::uint64_t created_ns;
  // Flight recorder entries per rank (SHMRING_RECORDER_ENTRIES of rank 0;
  // the others adopt it); 0: no recorders.
  std::uint32_t recorder_entries;
  std::uint32_t reserved2;
  alignas(kLine) std::atomic<std::uint32_t> status;
  std::atomic<std::uint32_t> attached;  // futex word: ranks registered so far
  std::atomic<std::uint32_t> attach_gen;
  // placement.hpp: rank + 1 while that rank moves itself to another CPU
  // (one mover at a time, so two stacked ranks never both move to the same
  // free CPU); 0 otherwise.
  std::atomic<std::uint32_t> mover;
  // 1 once a rank writes the SHMRING_DUMP_DIR file (CommState::dump_recorders):
  // one file per segment, however many ranks time out at once.
  std::atomic<std::uint32_t> dump_claimed;
  alignas(kLine) std::atomic<std::uint32_t> abort_code;
  std::atomic<std::int32_t> abort_rank;
  char abort_reason[kReasonBytes];
};
inline constexpr std::size_t kHeaderBytes = (sizeof(Header) + kPage - 1) / kPage * kPage;

// ---- Point-to-point (send/recv; the protocol is described in p2p.cpp).
// Region: [P2pInbox x N][P2pChannel x N*N (sender-major)][staging: N x
// kP2pStageSlots x kP2pStageBytes][outboxes: N x kP2pOutboxBytes]. None of
// it is used by collectives.
inline constexpr std::size_t kP2pEntries = 8;          // headers per pair not yet read by r
inline constexpr std::size_t kP2pVerdicts = 8;         // verdicts per pair not yet read by s
inline constexpr std::size_t kP2pInlineBytes = 40;     // payloads this small travel in the header
inline constexpr std::size_t kP2pStageSlots = 4;       // staging slots per receiving rank
inline constexpr std::size_t kP2pStageBytes = 32768;   // bytes per staging slot
inline constexpr std::size_t kP2pOutboxBytes = 65536;  // per sending rank: eager payloads
inline constexpr std::size_t kP2pEagerBytes = 16384;   // payloads up to this go eager (outbox)

/// Per receiving rank: the doorbell every peer rings after writing
/// something that rank must look at (a header, a slice, a verdict).
struct P2pInbox {
  Counter doorbell;
};

/// Header of message m from s to r: entry m mod kP2pEntries of channel
/// (s, r). s writes the fields, then `seq` = m+1 (release); r polls `seq`,
/// so header and inline payload reach r in the one line it polls.
struct alignas(64) P2pEntry {
  std::atomic<std::uint64_t> seq;  // m+1 once message m's header is complete
  std::atomic<std::uint64_t> count;
  std::atomic<std::int32_t> tag;
  std::atomic<std::uint32_t> flags;  // dtype | kP2pInline | kP2pCmaOffered | kP2pOutbox
  // The payload when kP2pInline; with kP2pOutbox, the payload's offset in
  // s's outbox; otherwise the send buffer's address in s's address space
  // (single-copy reads); the last two as a uint64 in the first 8 bytes.
  unsigned char inline_data[kP2pInlineBytes];
};
inline constexpr std::uint32_t kP2pDtypeMask = 0xff;
inline constexpr std::uint32_t kP2pInline = 1u << 8;
inline constexpr std::uint32_t kP2pCmaOffered = 1u << 9;
inline constexpr std::uint32_t kP2pOutbox = 1u << 10;

/// Verdict v of channel (s, r), entry v mod kP2pVerdicts, written by r
/// before it publishes verdicts = v+1: message (word >> 8) - 1 is finished.
struct P2pVerdict {
  std::atomic<std::uint64_t> word;        // (m+1) << 8 | r's dtype << 2 | code
  std::atomic<std::uint64_t> recv_count;  // r's count, for a mismatch message
};
/// r did not read message m: s had withdrawn its unfinished sends to r
/// (P2pChannel::send.withdrawn) before r could take it.
inline constexpr std::uint64_t kP2pVerdictRefused = 0;
inline constexpr std::uint64_t kP2pVerdictOk = 1;
inline constexpr std::uint64_t kP2pVerdictMismatch = 2;
/// r's single-copy read of the message failed with EFAULT: recv_count then
/// says whose buffer is bad (r's checks its own).
inline constexpr std::uint64_t kP2pVerdictBadBuffer = 3;
inline constexpr std::uint64_t kP2pBadSendBuffer = 0;
inline constexpr std::uint64_t kP2pBadRecvBuffer = 1;

inline constexpr std::uint64_t kP2pWithdrawnFailed = 1;     // a send to r failed
inline constexpr std::uint64_t kP2pWithdrawnDestroyed = 2;  // s destroyed its communicator

/// Directed pair s -> r.
struct P2pChannel {
  struct alignas(kLine) {
    std::atomic<std::uint64_t> unused;         // was `posted`: r polls P2pEntry::seq now
    std::atomic<std::uint64_t> staged;         // slices written into r's staging slots
    std::atomic<std::uint64_t> verdicts_read;  // verdicts s has read
    // Nonzero (a kP2pWithdrawn* code) once s gave up on its unfinished sends
    // to r: r then never reads s's memory again (p2p.cpp, "Ending early").
    std::atomic<std::uint64_t> withdrawn;
    // m+1 once s gave up on message m while r was reading it (past a
    // further deadline): s's caller has the buffer back, so r discards
    // what it read and fails the recv.
    std::atomic<std::uint64_t> released;
  } send;  // written by s
  // A line of its own: r stores it after every batch of headers, and s
  // reads it only when its copy says all entries are taken, while s reads
  // `verdicts` below at every send.
  alignas(kLine) std::atomic<std::uint64_t> headers_read;  // headers r copied (entries free)
  struct alignas(kLine) {
    std::atomic<std::uint64_t> drained;   // slices of s that r has copied out
    std::atomic<std::uint64_t> active;    // m+1: message m may stream into r's slots now
    std::atomic<std::uint64_t> verdicts;  // verdicts published
    std::atomic<std::uint64_t> taking;    // m+1: r reads message m from s's memory now (or did)
  } recv;                                 // written by r
  alignas(kLine) P2pVerdict verdict[kP2pVerdicts];  // written by r
  P2pEntry entry[kP2pEntries];                      // written by s
};

inline constexpr std::uint64_t p2p_channels_offset(std::uint64_t n) {
  return (n * sizeof(P2pInbox) + kLine - 1) / kLine * kLine;
}
inline constexpr std::uint64_t p2p_stage_offset(std::uint64_t n) {
  return (p2p_channels_offset(n) + n * n * sizeof(P2pChannel) + kPage - 1) / kPage * kPage;
}
inline constexpr std::uint64_t p2p_outbox_offset(std::uint64_t n) {
  return p2p_stage_offset(n) + n * kP2pStageSlots * kP2pStageBytes;
}
/// Bytes of the point-to-point region for world size n (n <= 2^20).
inline constexpr std::uint64_t p2p_region_bytes(std::uint64_t n) {
  return p2p_outbox_offset(n) + n * kP2pOutboxBytes;
}

// ---- Flight recorder (docs/design/recorder.md). Per rank: a RecorderHead,
// then R entries; call c (collective sequence number) uses entry c mod R.
// Only the rank itself writes its recorder (its running thread; its engine
// writes `queued` entries under the engine's lock, for calls behind the
// running one, never the entry of the running call). Plain relaxed stores
// inside a seqlock: `version` is odd while the entry is being written, so a
// reader in another process that sees the same even version before and
// after copying the fields has an entry that was not torn.
inline constexpr std::uint32_t kMaxRecorderEntries = 1u << 16;
inline constexpr std::uint32_t kRecorderEntriesDefault = 64;
inline constexpr std::uint32_t kCallQueued = 1;
inline constexpr std::uint32_t kCallStarted = 2;
inline constexpr std::uint32_t kCallCompleted = 3;
inline constexpr std::uint32_t kCallFailed = 4;
struct alignas(64) RecorderEntry {
  std::atomic<std::uint64_t> version;  // seqlock: odd while written
  std::atomic<std::uint64_t> seq;      // collective sequence number + 1 (0: empty)
  std::atomic<std::uint64_t> count;
  std::atomic<std::uint64_t> bytes;
  std::atomic<std::uint64_t> start_ns;                 // CLOCK_MONOTONIC ns (queued: when queued)
  std::atomic<std::uint64_t> end_ns;                   // CLOCK_MONOTONIC ns; 0 while not ended
  std::atomic<std::uint32_t> kind_dtype_op_algorithm;  // one byte each
  std::atomic<std::int32_t> root;
  std::atomic<std::uint32_t> state;  // kCall*
  std::atomic<std::int32_t> step;    // the last step reached (-1: none)
};
struct alignas(kLine) RecorderHead {
  std::atomic<std::uint64_t> start_ns;            // CLOCK_MONOTONIC ns when the rank attached
  std::atomic<std::uint64_t> calls;               // collectives completed
  std::atomic<std::uint64_t> bytes;               // their bytes (Op::bytes)
  std::atomic<std::uint64_t> wait_since_ns;       // when the current slow wait began (0: none)
  std::atomic<std::int32_t> waiting_for;          // the rank that wait is for (-1: none or several)
  std::atomic<std::int32_t> step;                 // the current step of the running call
  std::atomic<std::uint64_t> realtime_offset_ns;  // CLOCK_REALTIME - CLOCK_MONOTONIC at attach
  // The rank's newest point-to-point call (its p2p engine writes these
  // under its lock, inside the seqlock p2p_version).
  std::atomic<std::uint64_t> p2p_version;
  std::atomic<std::uint64_t> p2p_calls;  // point-to-point calls posted
  std::atomic<std::uint64_t> p2p_count;
  std::atomic<std::uint64_t> p2p_start_ns, p2p_end_ns;  // end 0: in flight
  std::atomic<std::uint32_t> p2p_kind_dtype;            // byte 0: 1 send, 2 recv; byte 1: dtype
  std::atomic<std::int32_t> p2p_peer, p2p_tag;
  std::atomic<std::uint32_t> p2p_state;  // kCallStarted / kCallCompleted / kCallFailed
};
inline constexpr std::uint64_t recorder_rank_bytes(std::uint64_t entries) {
  return entries == 0 ? 0 : sizeof(RecorderHead) + entries * sizeof(RecorderEntry);
}
inline constexpr std::uint64_t recorder_region_bytes(std::uint64_t n, std::uint64_t entries) {
  return n * recorder_rank_bytes(entries);
}

/// Offsets of one layout, computed locally from (world_size, slots,
/// slot_bytes) and never trusted from shared memory.
struct Layout {
  std::uint64_t rank_area_offset;
  std::uint64_t slot_offset;
  std::uint64_t direct_offset;
  std::uint64_t total_bytes;
  std::uint64_t p2p_offset;       // point-to-point region (p2p_region_bytes)
  std::uint64_t eager_offset;     // eager rings (eager_region_bytes)
  std::uint64_t recorder_offset;  // flight recorders (recorder_region_bytes)
  std::uint64_t recorder_entries;
};

inline constexpr std::uint64_t round_up(std::uint64_t x, std::uint64_t a) {
  return (x + a - 1) / a * a;
}

/// nullopt if the sizes overflow 64 bits.
inline std::optional<Layout> compute_layout(std::uint64_t world_size, std::uint64_t slots,
                                            std::uint64_t slot_bytes, std::uint64_t direct_bytes,
                                            std::uint64_t recorder_entries = 0) {
  Layout l{};
  l.rank_area_offset = kHeaderBytes;
  if (world_size > (1u << 20)) return std::nullopt;
  l.slot_offset = round_up(kHeaderBytes + world_size * kRankAreaBytes, kPage);
  std::uint64_t per_rank = 0, all = 0, direct = 0;
  if (__builtin_mul_overflow(slots, slot_bytes, &per_rank)) return std::nullopt;
  if (__builtin_mul_overflow(per_rank, world_size, &all)) return std::nullopt;
  if (__builtin_add_overflow(all, l.slot_offset, &l.direct_offset)) return std::nullopt;
  if (__builtin_mul_overflow(direct_bytes, kDirectBuffers * world_size, &direct))
    return std::nullopt;
  if (__builtin_add_overflow(direct, l.direct_offset, &l.total_bytes)) return std::nullopt;
  l.p2p_offset = round_up(l.total_bytes, kPage);
  if (l.p2p_offset < l.total_bytes) return std::nullopt;
  if (__builtin_add_overflow(l.p2p_offset, p2p_region_bytes(world_size), &l.total_bytes))
    return std::nullopt;
  l.eager_offset = round_up(l.total_bytes, kPage);
  if (l.eager_offset < l.total_bytes) return std::nullopt;
  if (__builtin_add_overflow(l.eager_offset, eager_region_bytes(world_size), &l.total_bytes))
    return std::nullopt;
  if (recorder_entries > kMaxRecorderEntries) return std::nullopt;
  l.recorder_entries = recorder_entries;
  l.recorder_offset = round_up(l.total_bytes, kPage);
  if (l.recorder_offset < l.total_bytes) return std::nullopt;
  if (__builtin_add_overflow(l.recorder_offset, recorder_region_bytes(world_size, recorder_entries),
                             &l.total_bytes))
    return std::nullopt;
  return l;
}

#define SHMRING_CHECK_SHARED(T)                                               \
  static_assert(std::is_standard_layout_v<T>, #T " must be standard-layout"); \
  static_assert(std::is_trivially_destructible_v<T>, #T " must be trivially destructible")
SHMRING_CHECK_SHARED(Counter);
SHMRING_CHECK_SHARED(Descriptor);
SHMRING_CHECK_SHARED(RankInfo);
SHMRING_CHECK_SHARED(Refusal);
SHMRING_CHECK_SHARED(LowLatencyLine);
SHMRING_CHECK_SHARED(EagerLine);
SHMRING_CHECK_SHARED(RankArea);
SHMRING_CHECK_SHARED(Header);
SHMRING_CHECK_SHARED(P2pInbox);
SHMRING_CHECK_SHARED(P2pEntry);
SHMRING_CHECK_SHARED(P2pChannel);
SHMRING_CHECK_SHARED(P2pVerdict);
SHMRING_CHECK_SHARED(RecorderEntry);
SHMRING_CHECK_SHARED(RecorderHead);
#undef SHMRING_CHECK_SHARED
// std::atomic is not trivially copyable in C++20 (deleted copy), so we check
// its representation instead: same size as the value and always lock-free, so
// it works across processes.
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(std::atomic<std::int32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<std::uint32_t>) == 4, "futex words must be 32-bit");
static_assert(sizeof(std::atomic<std::uint64_t>) == 8);
static_assert(sizeof(Counter) == kLine && sizeof(Descriptor) == 64);
static_assert(offsetof(Counter, futex_gen) == 64);
static_assert(sizeof(RankArea) % kLine == 0);
static_assert(sizeof(RecorderEntry) == 64 && sizeof(RecorderHead) == kLine);
static_assert(sizeof(P2pEntry) == 64 && sizeof(P2pVerdict) == 16 && sizeof(P2pChannel) == 1024);
// The write-once part of the header fits its first line; validate_header()
// reads exactly these bytes.
static_assert(offsetof(Header, status) == kLine);

}  // namespace shmring::detail
