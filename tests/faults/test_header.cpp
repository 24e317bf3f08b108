// Header validation: every field a rank trusts is checked against what it
// computes itself, and a segment with a bad header is refused with a message
// naming the value and the expectation, on every rank.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>
#include <vector>

#include "base/config.hpp"
#include "faults.hpp"
#include "transport/header_check.hpp"
#include "transport/segment.hpp"

using namespace shmring;
using namespace shmring::detail;

namespace {

constexpr std::uint64_t kHost = 0x1234567890abcdefull;

// A valid header image for (n ranks, K slots, B bytes), and the file size it needs.
struct Image {
  std::vector<std::byte> bytes = std::vector<std::byte>(kHeaderBytes);
  std::uint64_t file_size = 0;
  Header& h() { return *reinterpret_cast<Header*>(bytes.data()); }
};

Image valid(int n = 3, std::uint64_t k = 4, std::uint64_t b = 8192) {
  Image im;
  auto l = compute_layout(n, k, b, 8192);
  Header& h = im.h();
  h.magic = kMagic;
  h.layout_version = kLayoutVersion;
  h.world_size = static_cast<std::uint32_t>(n);
  h.slots = k;
  h.slot_bytes = b;
  h.total_bytes = l->total_bytes;
  h.rank_area_offset = l->rank_area_offset;
  h.slot_offset = l->slot_offset;
  h.direct_bytes = 8192;
  h.direct_offset = l->direct_offset;
  h.host_hash = kHost;
  h.creator_pid = 4321;
  im.file_size = l->total_bytes;
  return im;
}

std::string check(Image& im, int n = 3, std::uint64_t host = kHost) {
  return validate_header(im.bytes.data(), im.bytes.size(), im.file_size, n, host).error;
}

bool has(const std::string& s, const std::string& needle) {
  if (s.find(needle) != std::string::npos) return true;
  MESSAGE("message was: ", s);
  return false;
}

}  // namespace

TEST_CASE("a well-formed header is accepted and its layout recomputed locally") {
  Image im = valid(3, 4, 8192);
  auto c = validate_header(im.bytes.data(), im.bytes.size(), im.file_size, 3, kHost);
  REQUIRE(c);
  CHECK(c.slots == 4);
  CHECK(c.slot_bytes == 8192);
  CHECK(c.layout.total_bytes == im.file_size);
  CHECK(c.creator_pid == 4321);
  // Only the write-once line is read: a buffer of exactly that many bytes is enough.
  CHECK(validate_header(im.bytes.data(), offsetof(Header, status), im.file_size, 3, kHost));
}

TEST_CASE("each bad field is refused with a message naming it") {
  Image im;
  im = valid();
  im.h().magic ^= 1;
  CHECK(has(check(im), "not a shmring segment"));
  im = valid();
  im.h().layout_version = 99;
  CHECK(has(check(im), "layout version is 99"));
  im = valid();
  CHECK(has(check(im, 4), "world size is 3 but this rank has world size 4"));
  CHECK(has(check(im, 0), "world size 0 is out of range"));
  im = valid();
  CHECK(has(check(im, 3, kHost + 1), "another host"));
  for (std::uint64_t k : {0ull, 1ull, 1025ull, ~0ull}) {
    im = valid();
    im.h().slots = k;
    CHECK(has(check(im), "slot count " + std::to_string(k)));
  }
  for (std::uint64_t b : {0ull, 4095ull, 4097ull, 6000ull, (1ull << 30) + 4096, ~0ull}) {
    im = valid();
    im.h().slot_bytes = b;
    CHECK(has(check(im), "slot size " + std::to_string(b)));
  }
  im = valid();
  im.h().slot_offset += 4096;
  CHECK(has(check(im), "offsets disagree"));
  im = valid();
  im.h().rank_area_offset = 0;
  CHECK(has(check(im), "offsets disagree"));
  im = valid();
  im.h().total_bytes = ~0ull;
  CHECK(has(check(im), "offsets disagree"));
  im = valid();
  im.file_size -= 1;
  CHECK(has(check(im), "the file has"));
  im = valid();
  im.file_size = 0;
  CHECK(has(check(im), "the file has 0 bytes"));
  im = valid();
  im.h().creator_pid = -5;
  CHECK(has(check(im), "creator pid -5"));
  im = valid();
  CHECK(has(validate_header(im.bytes.data(), 64, im.file_size, 3, kHost).error, "64 bytes long"));
  CHECK(has(validate_header(nullptr, 0, 0, 3, kHost).error, "0 bytes long"));
}

TEST_CASE("consistent but huge settings cannot overflow the layout arithmetic") {
  // The largest settings the validator allows, with the most ranks: the
  // product still fits 64 bits, and a header claiming it is refused only
  // because the file is not that large.
  Image im = valid(3, kMaxSlots, kMaxSlotBytes);
  im.file_size = 1 << 20;
  CHECK(has(check(im), "the file has 1048576 bytes"));
}

TEST_CASE("a live segment with a bad header is refused by the attaching rank") {
  // A fake rank 0: creates the file 0600, writes a header with a wrong layout
  // version or wrong offsets, marks it ready and holds the creator lock.
  for (int variant = 0; variant < 2; ++variant) {
    const std::string job = test::unique_job_id("badhdr");
    const std::string name = segment_name(job, host_hash());
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    fchmod(fd, 0600);
    auto l = compute_layout(2, 2, 4096, 4096);
    REQUIRE(ftruncate(fd, static_cast<off_t>(l->total_bytes)) == 0);
    void* p = mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(p != MAP_FAILED);
    auto* h = static_cast<Header*>(p);
    h->magic = kMagic;
    h->layout_version = variant == 0 ? kLayoutVersion + 1 : kLayoutVersion;
    h->world_size = 2;
    h->slots = 2;
    h->slot_bytes = 4096;
    h->total_bytes = l->total_bytes;
    h->rank_area_offset = l->rank_area_offset;
    h->slot_offset = variant == 1 ? l->total_bytes - 4096 : l->slot_offset;
    h->direct_bytes = 4096;
    h->direct_offset = l->direct_offset;
    h->host_hash = host_hash();
    h->creator_pid = getpid();
    h->attached.store(1);
    h->status.store(kStatusReady);
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = off_t{1} << 40;
    fl.l_len = 1;
    REQUIRE(fcntl(fd, F_OFD_SETLK, &fl) == 0);
    auto status = test::run_processes(1, [&](int) {
      Options o;
      o.rank = 1;
      o.world_size = 2;
      o.job_id = job;
      o.timeout_s = 5;
      try {
        Communicator c(o);
        SHMRING_CHILD_CHECK(false, "a bad header must be refused");
      } catch (const InvalidArgumentError& e) {
        std::printf("bad header (variant %d): %s\n", variant, e.what());
        SHMRING_CHILD_CHECK(
            std::string(e.what()).find(variant == 0 ? "layout version" : "offsets disagree") !=
                std::string::npos,
            "%s", e.what());
      }
    });
    CHECK(status[0] == 0);
    if (variant == 1) {
      // The refusal is recorded for the ranks already attached.
      CHECK(h->abort_code.load() == static_cast<std::uint32_t>(ErrorCode::invalid_argument));
    }
    munmap(p, kHeaderBytes);
    close(fd);
    shm_unlink(name.c_str());
  }
}

TEST_CASE("an abort record left half-written reads as a peer failure, not a hang") {
  // A rank claims the record, then writes its rank, reason and code: killed
  // between the claim and the code, it leaves the word claimed for good.
  // Every reader used to spin on it forever (the whole job hung); it must
  // give up after a bounded wait and still fail the job, with a reason that
  // says what happened. Without the bound this test never returns (meson's
  // timeout fails it).
  Image im = valid();
  im.h().abort_code.store(kAbortClaimed);
  auto a = read_abort(im.h());
  REQUIRE(a.has_value());
  CHECK(a->code == static_cast<std::uint32_t>(ErrorCode::peer_failure));
  CHECK(a->rank == -1);
  CHECK(has(a->reason, "did not finish"));

  // A finished record reads back as written.
  const std::string reason = "rank 1: something failed";
  std::memcpy(im.h().abort_reason, reason.c_str(), reason.size() + 1);
  im.h().abort_rank.store(1);
  im.h().abort_code.store(static_cast<std::uint32_t>(ErrorCode::timeout));
  a = read_abort(im.h());
  REQUIRE(a.has_value());
  CHECK(a->code == static_cast<std::uint32_t>(ErrorCode::timeout));
  CHECK(a->rank == 1);
  CHECK(a->reason == reason);
}
