#pragma once

// What the files of the P2p engine share (p2p.cpp explains the protocol):
// a message's header as the receiver keeps it, an operation, and the state
// of one peer. Private to src/p2p.

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <limits>

#include "base/config.hpp"
#include "base/log.hpp"
#include "p2p/p2p.hpp"

namespace shmring::detail {

inline constexpr std::uint64_t kNoMsg = std::numeric_limits<std::uint64_t>::max();
inline constexpr std::size_t kRememberBuffered = 64;  // per peer, for mismatch messages

struct P2p::Header {
  std::uint64_t msg = kNoMsg;
  std::uint64_t count = 0;
  std::uint64_t addr = 0;  // CMA: the send buffer's address; outbox: the payload's offset
  std::int32_t tag = 0;
  std::uint32_t flags = 0;
  unsigned char data[kP2pInlineBytes];
  // An outbox payload copied out at once because no recv was posted for it
  // (the sender's outbox space is freed with the header entry).
  std::vector<std::byte> payload;
};

struct P2p::Op {
  bool is_send = false;
  std::byte* buf = nullptr;  // const for a send
  std::uint64_t count = 0, bytes = 0;
  DataType dtype = DataType::uint8;
  int peer = 0, tag = 0;
  std::shared_ptr<RequestState> req;  // null for blocking calls
  bool done = false;
  std::exception_ptr error;
  // A posted send given up on while its receiver was reading it (end_early):
  // it completes with this error at its verdict.
  std::exception_ptr failing;
  // A send whose deadline passed while its receiver was reading it: it got
  // one more SHMRING_TIMEOUT to finish (check_pending), and no more.
  bool graced = false;
  Clock::time_point deadline;
  // Send: message number once posted; eager = inline (done at posting;
  // an outbox send is too, decided at posting: buffered below).
  std::uint64_t msg = kNoMsg;
  bool eager = false, streaming = false;
  std::uint64_t base = 0, slices = 0, nslices = 0;
  // Recv: the matched header; staged: slices copied out so far.
  Header hdr;
  bool activated = false;
  // Its number among this rank's recorded point-to-point calls (the
  // recorder head shows the newest: P2p::record_begin).
  std::uint64_t rec_id = 0;
};

struct P2p::PeerState {
  // As sender to this peer.
  std::uint64_t next_msg = 0;
  std::deque<OpPtr> unposted;
  std::map<std::uint64_t, OpPtr> outstanding;  // posted, not inline, no verdict read yet
  OpPtr streaming;
  std::uint64_t staged = 0;         // mirror of channel(me, peer).send.staged
  std::uint64_t headers_read = 0;   // last value read of channel(me, peer).recv.headers_read
  std::uint64_t verdicts_read = 0;  // mirror of channel(me, peer).send.verdicts_read
  std::exception_ptr deferred;      // mismatch of an inline send that had returned
  bool withdrawn = false;           // we set channel(me, peer).send.withdrawn
  // The last buffered (inline or outbox) sends, for a mismatch verdict that
  // comes after they returned: message m at m mod kRememberBuffered (a ring,
  // so that a small send allocates nothing). Older ones are described
  // without their values.
  struct Sent {
    std::uint64_t msg = kNoMsg;
    std::uint64_t count = 0;
    DataType dtype = DataType::uint8;
    int tag = 0;
  };
  std::array<Sent, kRememberBuffered> buffered;
  void remember_buffered(std::uint64_t m, std::uint64_t count, DataType dtype, int tag) {
    buffered[m % kRememberBuffered] = {m, count, dtype, tag};
  }
  const Sent* find_buffered(std::uint64_t m) const {
    const Sent& b = buffered[m % kRememberBuffered];
    return b.msg == m ? &b : nullptr;
  }
  // As receiver from this peer.
  std::uint64_t scanned = 0;  // headers copied (mirror of channel(peer, me).recv.headers_read)
  std::map<std::uint64_t, Header> unmatched;
  std::deque<OpPtr> recvs;    // posted, not matched yet
  std::uint64_t drained = 0;  // mirror of channel(peer, me).recv.drained
  bool cma_refused = false;   // process_vm_readv from this peer failed once
  struct PendingVerdict {
    std::uint64_t word, recv_count;
    OpPtr op;  // completed once the verdict is published (null: nobody waits)
    std::exception_ptr error;
  };
  std::deque<PendingVerdict> verdicts;  // waiting for a free verdict entry
  std::uint64_t verdicts_written = 0;   // mirror of channel(peer, me).recv.verdicts
};

// Step 1's last stores (p2p.cpp): the header's fields, then its `seq`
// (release), which the receiver polls. The payload (inline, outbox, or the
// buffer's address) is in place before.
inline void publish_header(P2pEntry& e, std::uint64_t m, std::uint64_t count, int tag,
                           std::uint32_t flags) {
  e.count.store(count, std::memory_order_relaxed);
  e.tag.store(tag, std::memory_order_relaxed);
  e.flags.store(flags, std::memory_order_relaxed);
  e.seq.store(m + 1, std::memory_order_release);
}

inline std::string describe_op(bool is_send, std::uint64_t count, DataType dtype, int peer,
                               int tag) {
  return fmt::format("{}(count={}, {}) {} rank {}, tag {}", is_send ? "send" : "recv", count,
                     to_string(dtype), is_send ? "to" : "from", peer, tag);
}

}  // namespace shmring::detail
