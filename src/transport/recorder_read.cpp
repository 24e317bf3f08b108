#include "transport/recorder_read.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "shmring/types.hpp"

namespace shmring::detail {

std::optional<RecordedCall> RankRecord::latest() const {
  if (history.empty()) return std::nullopt;
  return history.back();
}

std::optional<RecordedCall> RankRecord::last_completed() const {
  for (auto it = history.rbegin(); it != history.rend(); ++it)
    if (it->state == kCallCompleted) return *it;
  return std::nullopt;
}

const char* call_state_name(std::uint32_t state) {
  switch (state) {
    case kCallQueued:
      return "queued";
    case kCallStarted:
      return "started";
    case kCallCompleted:
      return "completed";
    case kCallFailed:
      return "failed";
  }
  return "unknown";
}

std::string describe_p2p(const RecordedP2p& p) {
  return fmt::format("{} rank {} (tag {}, {} {})", p.is_send ? "send to" : "recv from", p.peer,
                     p.tag, p.count, to_string(static_cast<DataType>(p.dtype)));
}

namespace {

// One seqlock read: the same even version before and after the copy.
// 1: read; 0: empty; -1: changed while read (try again).
int read_entry(const RecorderEntry& e, RecordedCall& out) {
  const std::uint64_t v = e.version.load(std::memory_order_acquire);
  if (v % 2 != 0) return -1;
  const std::uint64_t seq = e.seq.load(std::memory_order_relaxed);
  out.count = e.count.load(std::memory_order_relaxed);
  out.bytes = e.bytes.load(std::memory_order_relaxed);
  out.start_ns = e.start_ns.load(std::memory_order_relaxed);
  out.end_ns = e.end_ns.load(std::memory_order_relaxed);
  const std::uint32_t packed = e.kind_dtype_op_algorithm.load(std::memory_order_relaxed);
  out.root = e.root.load(std::memory_order_relaxed);
  out.state = e.state.load(std::memory_order_relaxed);
  out.step = e.step.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (e.version.load(std::memory_order_relaxed) != v) return -1;
  if (seq == 0) return 0;
  out.seq = seq == 0 ? 0 : seq - 1;
  out.kind = packed & 0xff;
  out.dtype = (packed >> 8) & 0xff;
  out.op = (packed >> 16) & 0xff;
  out.algorithm = packed >> 24;
  return 1;
}

}  // namespace

RankRecord read_rank_record(const std::byte* base, const Layout& l, int r) {
  RankRecord rec;
  rec.rank = r;
  const auto& area = *reinterpret_cast<const RankArea*>(
      base + l.rank_area_offset + static_cast<std::uint64_t>(r) * kRankAreaBytes);
  rec.pid = area.info.pid.load(std::memory_order_relaxed);
  rec.rank_state = area.info.state.load(std::memory_order_acquire);
  rec.announced = area.announced.value.load(std::memory_order_acquire);
  rec.done = area.done.value.load(std::memory_order_acquire);
  if (l.recorder_entries == 0) return rec;
  const auto* head = reinterpret_cast<const RecorderHead*>(
      base + l.recorder_offset +
      static_cast<std::uint64_t>(r) * recorder_rank_bytes(l.recorder_entries));
  rec.has_recorder = true;
  rec.start_ns = head->start_ns.load(std::memory_order_acquire);
  rec.calls = head->calls.load(std::memory_order_relaxed);
  rec.bytes = head->bytes.load(std::memory_order_relaxed);
  rec.wait_since_ns = head->wait_since_ns.load(std::memory_order_relaxed);
  rec.waiting_for = head->waiting_for.load(std::memory_order_relaxed);
  rec.step = head->step.load(std::memory_order_relaxed);
  rec.realtime_offset_ns = head->realtime_offset_ns.load(std::memory_order_relaxed);
  const auto* entries = reinterpret_cast<const RecorderEntry*>(head + 1);
  for (std::uint64_t i = 0; i < l.recorder_entries; ++i) {
    RecordedCall c;
    for (int attempt = 0; attempt < 16; ++attempt) {
      const int got = read_entry(entries[i], c);
      if (got < 0) continue;
      if (got > 0) rec.history.push_back(c);
      break;
    }
  }
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::uint64_t v = head->p2p_version.load(std::memory_order_acquire);
    if (v % 2 != 0) continue;
    RecordedP2p p;
    const std::uint64_t calls = head->p2p_calls.load(std::memory_order_relaxed);
    p.count = head->p2p_count.load(std::memory_order_relaxed);
    p.start_ns = head->p2p_start_ns.load(std::memory_order_relaxed);
    p.end_ns = head->p2p_end_ns.load(std::memory_order_relaxed);
    const std::uint32_t kd = head->p2p_kind_dtype.load(std::memory_order_relaxed);
    p.peer = head->p2p_peer.load(std::memory_order_relaxed);
    p.tag = head->p2p_tag.load(std::memory_order_relaxed);
    p.state = head->p2p_state.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (head->p2p_version.load(std::memory_order_relaxed) != v) continue;
    rec.p2p_calls = calls;
    if (calls != 0) {
      p.is_send = (kd & 0xff) == 1;
      p.dtype = (kd >> 8) & 0xff;
      rec.p2p = p;
    }
    break;
  }
  std::sort(rec.history.begin(), rec.history.end(),
            [](const RecordedCall& a, const RecordedCall& b) { return a.seq < b.seq; });
  return rec;
}

}  // namespace shmring::detail
