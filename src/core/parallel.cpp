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
  // On the 2-core Zen 4 VM (N=2, 256 KiB slots), streaming slices of 32-128
  // KiB cut the time by 20-30%; below 16 KiB the reader's trip to memory
  // costs more than a cross-core snoop. Larger slices depend on where the
  // reader runs: sharing the writer's L3, plain stores are 1.5x faster; on
  // another L3 (another CCD), plain stores are 6x slower, since each reuse
  // of a slot line takes it back from the reader's cache
  // (docs/performance/notes/2026-12-05-streaming-slots.md). The host moves
  // the VM's two vCPUs between the two, and the topology the guest sees does
  // not say which, so every slice from 16 KiB streams: 1.5x at worst, not 6x.
  // On an Intel Xeon streaming was 1.5x slower from 64 KiB and equal below
  // (docs/performance/notes): hence the vendor test in streaming_pays_off().
  constexpr std::size_t kNtMinBytes = 16 * 1024;
  const bool nt = config.nt_stores == NtStores::always ||
                  (config.nt_stores == NtStores::automatic && detail::streaming_pays_off() &&
                   bytes >= kNtMinBytes);
  if (!nt) {
    copy(slot, src, bytes);
    return;
  }
  if (bytes == 0) return;
  // copy_streaming fences its own stores, so each grain's are visible before
  // the arena joins and publish_send()'s release store follows.
  const auto* s = static_cast<const std::byte*>(src);
  detail::for_grains(arena.get(), bytes, 1, [&](std::size_t i, std::size_t n) {
    detail::copy_streaming(slot + i, s + i, n);
  });
}

}  // namespace shmring
