#include "kernels/copy.hpp"
#include "kernels/target.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace shmring::detail {

#if defined(__x86_64__)

namespace {

// Each variant: regular stores up to the first 64-byte boundary of dst,
// streaming stores for whole lines, regular stores for the tail, then sfence
// (streaming stores are weakly ordered: without the fence a later release
// store could become visible before the data).
std::size_t head_bytes(const void* dst, std::size_t bytes) {
  const auto mis = reinterpret_cast<std::uintptr_t>(dst) & 63;
  return mis == 0 ? 0 : std::min<std::size_t>(64 - mis, bytes);
}

__attribute__((target("avx512f"))) void copy_avx512(std::byte* d, const std::byte* s,
                                                    std::size_t lines) {
  for (std::size_t i = 0; i < lines; ++i) {
    const __m512i v = _mm512_loadu_si512(s + 64 * i);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 64 * i), v);
  }
}

__attribute__((target("avx2"))) void copy_avx2(std::byte* d, const std::byte* s,
                                               std::size_t lines) {
  for (std::size_t i = 0; i < lines; ++i) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64 * i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64 * i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64 * i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64 * i + 32), b);
  }
}

void copy_sse2(std::byte* d, const std::byte* s, std::size_t lines) {
  for (std::size_t i = 0; i < 4 * lines; ++i) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16 * i));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16 * i), v);
  }
}

using LineCopy = void (*)(std::byte*, const std::byte*, std::size_t);

struct Variant {
  LineCopy fn;
  const char* name;
};

Variant pick() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {copy_avx512, "avx512"};
  if (__builtin_cpu_supports("avx2")) return {copy_avx2, "avx2"};
  return {copy_sse2, "sse2"};
}

const Variant& variant() {
  static const Variant v = pick();
  return v;
}

}  // namespace

void copy_streaming(void* dst, const void* src, std::size_t bytes) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  const std::size_t head = head_bytes(d, bytes);
  if (head > 0) std::memcpy(d, s, head);
  const std::size_t lines = (bytes - head) / 64;
  variant().fn(d + head, s + head, lines);
  const std::size_t done = head + 64 * lines;
  if (done < bytes) std::memcpy(d + done, s + done, bytes - done);
  _mm_sfence();
}

const char* copy_streaming_isa() {
  return variant().name;
}

bool streaming_pays_off() {
  return cpu_is_amd();
}

#else

void copy_streaming(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}
const char* copy_streaming_isa() {
  return "memcpy";
}
bool streaming_pays_off() {
  return false;
}

#endif

}  // namespace shmring::detail
