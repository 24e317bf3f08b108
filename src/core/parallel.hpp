#pragma once

// One rank's share of a kernel, split over the rank's oneTBB arena: the one
// rule for when splitting pays, used by CommState::reduce/copy
// (parallel.cpp) and the reduction steps (reduce_steps.cpp).

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstddef>

namespace shmring::detail {

/// Below this many bytes a kernel runs on the calling thread: splitting costs
/// more than it gains (about 100k cycles of work per task, as oneTBB advises).
inline constexpr std::size_t kParallelMinBytes = 256 * 1024;
/// Bytes per task above it.
inline constexpr std::size_t kGrainBytes = 64 * 1024;

/// Runs f(begin, count) over [0, m) elements of `elem_bytes` bytes each: at
/// once on the calling thread when there is no arena or the work is under
/// kParallelMinBytes, else in grains of kGrainBytes across `arena` (a static
/// partition, so each grain's thread is the same from call to call). Every
/// grain has finished, its stores included, when this returns. A step that
/// touches more bytes per element than it counts (16-bit steps with float64
/// partials) passes those bytes as `elem_bytes`.
template <class F>
void for_grains(tbb::task_arena* arena, std::size_t m, std::size_t elem_bytes, F&& f) {
  if (arena == nullptr || m * elem_bytes < kParallelMinBytes) {
    f(std::size_t{0}, m);
    return;
  }
  arena->execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, m, std::max<std::size_t>(1, kGrainBytes / elem_bytes)),
        [&](const tbb::blocked_range<std::size_t>& r) { f(r.begin(), r.size()); },
        tbb::static_partitioner());
  });
}

}  // namespace shmring::detail
