#include "transport/header_check.hpp"

#include <fmt/format.h>

#include <cstring>

namespace shmring::detail {

HeaderCheck validate_header(const void* header_bytes, std::size_t header_size,
                            std::uint64_t file_size, int world_size, std::uint64_t host_hash) {
  HeaderCheck c;
  constexpr std::size_t kPlainBytes = offsetof(Header, status);
  if (header_bytes == nullptr || header_size < kPlainBytes) {
    c.error =
        fmt::format("its header is {} bytes long, expected at least {}", header_size, kPlainBytes);
    return c;
  }
  if (world_size < 1 || world_size > 65536) {
    c.error = fmt::format("world size {} is out of range", world_size);
    return c;
  }
  // Each field is copied out once and only the copies are used: the bytes may
  // change under us, and no later access may depend on a value read twice.
  const auto* b = static_cast<const std::byte*>(header_bytes);
#define SHMRING_FIELD(f) read_field<decltype(Header::f)>(b, offsetof(Header, f))
  const auto magic = SHMRING_FIELD(magic);
  const auto version = SHMRING_FIELD(layout_version);
  const auto h_world = SHMRING_FIELD(world_size);
  const auto slots = SHMRING_FIELD(slots);
  const auto slot_bytes = SHMRING_FIELD(slot_bytes);
  const auto total = SHMRING_FIELD(total_bytes);
  const auto rank_area_offset = SHMRING_FIELD(rank_area_offset);
  const auto slot_offset = SHMRING_FIELD(slot_offset);
  const auto direct_bytes = SHMRING_FIELD(direct_bytes);
  const auto direct_offset = SHMRING_FIELD(direct_offset);
  const auto h_host = SHMRING_FIELD(host_hash);
  const auto pid = SHMRING_FIELD(creator_pid);
  const auto recorder_entries = SHMRING_FIELD(recorder_entries);
#undef SHMRING_FIELD
  if (magic != kMagic) {
    c.error = fmt::format("it is not a shmring segment (magic {:#018x}, expected {:#018x})", magic,
                          kMagic);
    return c;
  }
  if (version != kLayoutVersion) {
    c.error = fmt::format(
        "its layout version is {} but this library uses version {} (mixed shmring builds?)",
        version, kLayoutVersion);
    return c;
  }
  if (h_world != static_cast<std::uint32_t>(world_size)) {
    c.error =
        fmt::format("its world size is {} but this rank has world size {}", h_world, world_size);
    return c;
  }
  if (h_host != host_hash) {
    c.error = fmt::format("it was made on another host (identity {:016x}, ours {:016x})", h_host,
                          host_hash);
    return c;
  }
  if (slots < kMinSlots || slots > kMaxSlots) {
    c.error = fmt::format("its slot count {} is outside [{}, {}]", slots, kMinSlots, kMaxSlots);
    return c;
  }
  if (slot_bytes < kMinSlotBytes || slot_bytes > kMaxSlotBytes || slot_bytes % kPage != 0) {
    c.error = fmt::format("its slot size {} bytes is not a multiple of {} in [{}, {}]", slot_bytes,
                          kPage, kMinSlotBytes, kMaxSlotBytes);
    return c;
  }
  if (direct_bytes < kMinDirectBytes || direct_bytes > kMaxDirectBytes ||
      direct_bytes % kPage != 0) {
    c.error = fmt::format("its direct buffer size {} bytes is not a multiple of {} in [{}, {}]",
                          direct_bytes, kPage, kMinDirectBytes, kMaxDirectBytes);
    return c;
  }
  if (recorder_entries > kMaxRecorderEntries) {
    c.error = fmt::format("its flight recorder has {} entries per rank, more than {}",
                          recorder_entries, kMaxRecorderEntries);
    return c;
  }
  auto l = compute_layout(static_cast<std::uint64_t>(world_size), slots, slot_bytes, direct_bytes,
                          recorder_entries);
  if (!l) {
    c.error = fmt::format("{} ranks x ({} slots x {} bytes + direct buffers) overflows", world_size,
                          slots, slot_bytes);
    return c;
  }
  if (l->rank_area_offset != rank_area_offset || l->slot_offset != slot_offset ||
      l->direct_offset != direct_offset || l->total_bytes != total) {
    c.error = fmt::format(
        "its offsets disagree with its settings: rank areas at {}, slots at {}, direct buffers "
        "at {}, {} bytes in all; expected {}, {}, {}, {}",
        rank_area_offset, slot_offset, direct_offset, total, l->rank_area_offset, l->slot_offset,
        l->direct_offset, l->total_bytes);
    return c;
  }
  if (file_size != l->total_bytes) {
    c.error =
        fmt::format("the file has {} bytes but its layout needs {}", file_size, l->total_bytes);
    return c;
  }
  if (pid <= 0) {
    c.error = fmt::format("its creator pid {} is not a process id", pid);
    return c;
  }
  c.slots = slots;
  c.slot_bytes = slot_bytes;
  c.direct_bytes = direct_bytes;
  c.layout = *l;
  c.creator_pid = pid;
  return c;
}

}  // namespace shmring::detail
