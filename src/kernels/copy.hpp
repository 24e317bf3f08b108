#pragma once

// Copies into shared memory that another core reads next.

#include <cstddef>

namespace shmring::detail {

/// memcpy with non-temporal (streaming) stores: the destination lines go to
/// memory instead of staying dirty in this core's cache, so a reader on
/// another core fetches them from memory (or the shared L3) instead of by a
/// cross-core snoop of a modified line, which on the measured machines is
/// the slower of the two (docs/performance/notes/2026-11-30-defaults.md, "Non-temporal slot
/// writes"). Ends with a store fence, so a release store that follows publishes the data. `dst` and
/// `src` need no alignment; the regions must not overlap. Falls back to memcpy where there are no
/// streaming stores (non-x86).
void copy_streaming(void* dst, const void* src, std::size_t bytes);

/// Whether streaming slot writes may pay off on this CPU
/// (SHMRING_NT_STORES=auto): then slot_stores.hpp measures them against
/// plain ones. Measured (docs/performance/notes): on AMD Zen 4 a line
/// modified in another core's L2 crosses slower than it comes from memory
/// where the reader sits on another L3, and streaming was 5-10x faster there
/// at 1-64 MiB (N=2; plain stores 1.6-2.2x faster on a shared L3,
/// docs/performance/notes/2026-12-05-adaptive-slot-stores.md); on an Intel
/// Xeon the shared L3 hands lines over faster than memory, and 64-128 KiB
/// slices were 1.5x slower streamed (16 KiB and below: equal). So: AMD yes,
/// everything else no.
bool streaming_pays_off();

/// Name of the streaming-store width used here ("avx512", "avx2", "sse2" or
/// "memcpy").
const char* copy_streaming_isa();

}  // namespace shmring::detail
