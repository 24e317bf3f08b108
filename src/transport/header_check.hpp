#pragma once

// Validation of a segment header read from shared memory. Kept apart from the
// rest of the segment code (no Boost, no TBB) so that the fuzz target
// (tests/faults/fuzz_header.cpp) can build it alone.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "transport/layout.hpp"

namespace shmring::detail {

/// A copy of the T at `offset` of a shared (possibly changing) byte range:
/// one read, no reference into shared memory kept.
template <class T>
T read_field(const std::byte* base, std::size_t offset) {
  T v;
  std::memcpy(&v, base + offset, sizeof v);
  return v;
}

/// What validate_header() learnt from a header it accepted.
struct HeaderCheck {
  std::string error;  // empty when the header is acceptable
  std::uint64_t slots = 0, slot_bytes = 0, direct_bytes = 0;
  Layout layout{};
  int creator_pid = 0;
  explicit operator bool() const { return error.empty(); }
};

/// Limits on what a header may announce (the same ranges config accepts).
inline constexpr std::uint64_t kMinSlots = 2;  // kMaxSlots: layout.hpp (descriptor ring)
inline constexpr std::uint64_t kMinSlotBytes = kPage, kMaxSlotBytes = std::uint64_t{1} << 30;
inline constexpr std::uint64_t kMinDirectBytes = kPage, kMaxDirectBytes = std::uint64_t{1} << 26;

/// Validates the plain (write-once) part of a segment header found in
/// `header_bytes[0, header_size)` of a file of `file_size` bytes, for a job of
/// `world_size` ranks on host `host_hash`: magic, layout version, world size,
/// host identity, slot settings, and every offset and size recomputed locally
/// and compared with the header's and the file's. Reads nothing past
/// `header_size` and copies each field out before using it, so a buggy or
/// hostile writer cannot make a later access go out of bounds. Never throws.
HeaderCheck validate_header(const void* header_bytes, std::size_t header_size,
                            std::uint64_t file_size, int world_size, std::uint64_t host_hash);

}  // namespace shmring::detail
