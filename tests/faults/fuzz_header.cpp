// libFuzzer target for validate_header(): the input is XORed onto a valid
// header image (so the empty input is valid and small mutations stay near the
// interesting boundary), its first bytes choose the world size and perturb
// the file size. Whatever the bytes, the validator must not read out of
// bounds (ASan), and anything it accepts must describe a layout that fits
// the file.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "transport/header_check.hpp"

using namespace shmring::detail;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::uint64_t kHost = 0x5eed5eed5eed5eedull;
  int world = 3;
  std::uint64_t file_delta = 0;
  if (size >= 1) world = 1 + data[0] % 9;
  if (size >= 9) std::memcpy(&file_delta, data + 1, 8);
  const std::uint8_t* rest = size > 9 ? data + 9 : data + size;
  const std::size_t rest_size = size > 9 ? size - 9 : 0;

  // A valid image for (world, 4 slots, 8192 bytes).
  auto l = compute_layout(world, 4, 8192, 8192);
  std::vector<std::uint8_t> img(offsetof(Header, status), 0);
  auto put = [&](std::size_t off, const void* v, std::size_t n) { std::memcpy(&img[off], v, n); };
  const std::uint64_t magic = kMagic, slots = 4, slot_bytes = 8192, direct_bytes = 8192;
  const std::uint32_t version = kLayoutVersion, w = static_cast<std::uint32_t>(world);
  const std::int32_t pid = 1234;
  put(offsetof(Header, magic), &magic, 8);
  put(offsetof(Header, layout_version), &version, 4);
  put(offsetof(Header, world_size), &w, 4);
  put(offsetof(Header, slots), &slots, 8);
  put(offsetof(Header, slot_bytes), &slot_bytes, 8);
  put(offsetof(Header, total_bytes), &l->total_bytes, 8);
  put(offsetof(Header, rank_area_offset), &l->rank_area_offset, 8);
  put(offsetof(Header, slot_offset), &l->slot_offset, 8);
  put(offsetof(Header, direct_bytes), &direct_bytes, 8);
  put(offsetof(Header, direct_offset), &l->direct_offset, 8);
  put(offsetof(Header, host_hash), &kHost, 8);
  put(offsetof(Header, creator_pid), &pid, 4);
  // The input also decides the readable length (a short buffer must be refused,
  // not over-read): a heap copy of exactly that many bytes.
  std::size_t readable = img.size();
  if (rest_size > img.size()) readable = rest[img.size()] % (img.size() + 1);
  for (std::size_t i = 0; i < rest_size && i < img.size(); ++i) img[i] ^= rest[i];
  std::vector<std::uint8_t> exact(img.begin(), img.begin() + static_cast<std::ptrdiff_t>(readable));
  const std::uint64_t file_size = l->total_bytes ^ file_delta;

  HeaderCheck c = validate_header(exact.empty() ? nullptr : exact.data(), exact.size(), file_size,
                                  world, kHost);
  if (c) {
    // Accepted: every region the rank will touch lies inside the file.
    const Layout& L = c.layout;
    bool ok =
        L.total_bytes == file_size && L.rank_area_offset >= sizeof(Header) &&
        L.rank_area_offset + std::uint64_t(world) * kRankAreaBytes <= L.slot_offset &&
        c.slots >= kMinSlots && c.slots <= kMaxSlots && c.slot_bytes >= kMinSlotBytes &&
        c.slot_bytes <= kMaxSlotBytes &&
        L.slot_offset + std::uint64_t(world) * c.slots * c.slot_bytes <= L.direct_offset &&
        L.direct_offset + std::uint64_t(world) * kDirectBuffers * c.direct_bytes <= L.total_bytes &&
        L.slot_offset % kPage == 0 && L.direct_offset % kPage == 0;
    if (!ok) std::abort();
  } else if (c.error.empty()) {
    std::abort();
  }
  return 0;
}
