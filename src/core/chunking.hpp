#pragma once

// Index arithmetic of the ring algorithms, in elements, 64-bit throughout.
//
// A buffer of `count` elements is cut into N chunks, chunk c owned by rank c,
// as evenly as possible (the first count % N chunks get one more element).
// A chunk is moved in slices of at most `slice_elems` (one slot); round q of
// an algorithm moves slice q of every chunk.

#include <algorithm>
#include <cstddef>

namespace shmring::detail {

struct Range {
  std::size_t begin = 0;
  std::size_t count = 0;
};

inline Range chunk_range(std::size_t count, int world_size, int c) {
  const auto n = static_cast<std::size_t>(world_size);
  const auto i = static_cast<std::size_t>(c);
  const std::size_t base = count / n, rem = count % n;
  return {i * base + std::min(i, rem), base + (i < rem ? 1 : 0)};
}

/// Rounds needed to move the largest chunk in slices; at least 1, so that a
/// zero-count collective still exchanges descriptors (and so detects a
/// mismatch instead of skipping it).
inline std::size_t ring_rounds(std::size_t count, int world_size, std::size_t slice_elems) {
  const auto n = static_cast<std::size_t>(world_size);
  const std::size_t largest = count / n + (count % n != 0 ? 1 : 0);
  return std::max<std::size_t>(1, largest / slice_elems + (largest % slice_elems != 0 ? 1 : 0));
}

/// Slice `round` of `chunk`; empty (at the chunk's end) past its last slice.
inline Range slice_range(Range chunk, std::size_t round, std::size_t slice_elems) {
  // round * slice_elems cannot overflow: it is below the largest chunk + slice.
  const std::size_t off = std::min(chunk.count, round * slice_elems);
  return {chunk.begin + off, std::min(slice_elems, chunk.count - off)};
}

inline int ring_mod(long long x, int n) {
  long long m = x % n;
  return static_cast<int>(m < 0 ? m + n : m);
}

}  // namespace shmring::detail
