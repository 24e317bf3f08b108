// A rank's kernels split over its oneTBB arena (core/parallel.hpp).

#include <algorithm>
#include <cstring>

#include "core/parallel.hpp"
#include "core/state.hpp"
#include "kernels/copy.hpp"
#include "kernels/reduce.hpp"

namespace shmring {

void CommState::reduce(void* dst, const void* a, const void* b, std::size_t n, DataType dt,
                       ReduceOp op, int divisor) {
  const std::size_t es = datatype_size(dt);
  detail::for_grains(arena.get(), n, es, [&](std::size_t i, std::size_t k) {
    detail::reduce(static_cast<std::byte*>(dst) + i * es, static_cast<const std::byte*>(a) + i * es,
                   static_cast<const std::byte*>(b) + i * es, k, dt, op, divisor);
  });
}

void CommState::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  detail::for_grains(arena.get(), bytes, 1,
                     [&](std::size_t i, std::size_t n) { std::memcpy(d + i, s + i, n); });
}

void CommState::copy_parts(std::span<const CopyPart> parts) {
  std::size_t total = 0;
  for (const CopyPart& p : parts) total += p.bytes;
  // Every part empty (a short last piece can leave the other ranks no
  // elements): nothing to hand to the arena.
  if (total == 0) return;
  detail::for_grains(arena.get(), total, 1, [&](std::size_t i, std::size_t n) {
    // Skip to the part holding byte i of the concatenation (i < total, so
    // one has more than i bytes), then copy n bytes across as many parts
    // as they span.
    std::size_t k = 0;
    for (; k < parts.size() && i >= parts[k].bytes; ++k) i -= parts[k].bytes;
    while (n > 0 && k < parts.size()) {
      const std::size_t take = std::min(n, parts[k].bytes - i);
      std::memcpy(parts[k].dst + i, parts[k].src + i, take);
      n -= take;
      i = 0;
      ++k;
    }
  });
}

void CommState::copy_to_slot(std::byte* slot, const void* src, std::size_t bytes) {
  // Below 16 KiB plain stores: on the 2-core Zen 4 VM the reader's trip to
  // memory cost more there than a cross-core snoop. From 16 KiB on AMD, which
  // kind wins depends on where the reader runs, and the host moves the VM's
  // vCPUs during a job: sharing the writer's L3, plain slot writes ran
  // 2.5x faster than streaming ones; on another CCD, streaming ran 5-10x
  // faster than plain, since each reuse of a slot line takes it back from
  // the reader's cache (docs/performance/notes/2026-12-05-streaming-slots.md,
  // docs/performance/notes/2026-12-05-adaptive-slot-stores.md). So auto
  // measures both and takes the faster (slot_stores). On an Intel Xeon,
  // streaming was 1.5x slower from 64 KiB and equal below (docs/performance/
  // notes): hence the vendor test in streaming_pays_off().
  constexpr std::size_t kNtMinBytes = 16 * 1024;
  using Kind = detail::SlotStoreChooser::Kind;
  if (bytes == 0) return;
  const bool measured = config.nt_stores == NtStores::automatic && bytes >= kNtMinBytes &&
                        detail::streaming_pays_off();
  const std::uint64_t start = measured ? call_clock.now() : 0;
  const bool nt = config.nt_stores == NtStores::always ||
                  (measured && slot_stores.next(start) == Kind::streaming);
  if (!nt) {
    copy(slot, src, bytes);
  } else {
    // copy_streaming fences its own stores, so each grain's are visible
    // before the arena joins and publish_send()'s release store follows.
    const auto* s = static_cast<const std::byte*>(src);
    detail::for_grains(arena.get(), bytes, 1, [&](std::size_t i, std::size_t n) {
      detail::copy_streaming(slot + i, s + i, n);
    });
  }
  if (measured)
    slot_stores.record(nt ? Kind::streaming : Kind::plain, bytes, start, call_clock.now());
}

void CommState::copy_to_direct(std::byte* buffer, const void* src, std::size_t bytes) {
  // N=2 on CPUs of their own, 64 KiB, on the AMD VM with the vCPUs on
  // different L3s (docs/performance/notes/2026-12-06-direct-buffer-stores.md):
  // broadcast 29.5 -> 4.2 us, alltoall 18.0 -> 4.8, scatter 14.7 -> 2.4;
  // eager gathers / scatters of 64 KiB blocks, 7.8-10.0 / 8.7-8.8 ->
  // 5.5-5.7 / 4.5-4.6 us (Open MPI 7.6 / 7.6). Ranks sharing CPUs (N=4 on
  // 2): a direct reduce-scatter took 14.3 -> 19.0 us with the measured
  // choice, hence plain stores there unless SHMRING_NT_STORES says always.
  if (config.oversubscribed && config.nt_stores != NtStores::always)
    copy(buffer, src, bytes);
  else
    copy_to_slot(buffer, src, bytes);
}

}  // namespace shmring
