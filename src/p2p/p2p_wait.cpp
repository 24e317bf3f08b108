// Waiting in the P2p engine: the doorbell wait of a blocking caller or a
// request's waiter, and the progress thread (p2p.cpp, "Progress", "Waits").

#include "p2p/p2p_state.hpp"

#include <pthread.h>
#include <sched.h>

#include <thread>

#include "base/placement.hpp"

namespace shmring {
namespace detail {

void P2p::watch_entries(std::vector<Watch>& w) {
  w.clear();
  for (int p = 0; p < c_.size; ++p) {
    if (p == c_.rank) continue;
    const std::uint64_t next = peers_[static_cast<std::size_t>(p)].scanned;
    w.push_back({&channel(p, c_.rank).entry[next % kP2pEntries].seq, next + 1});
    // A send waiting for a free entry: the receiver's headers_read.
    const PeerState& ps = peers_[static_cast<std::size_t>(p)];
    if (!ps.unposted.empty() && ps.next_msg >= ps.headers_read + kP2pEntries)
      w.push_back({&channel(c_.rank, p).headers_read, ps.next_msg - kP2pEntries + 1});
  }
}

void P2p::wait_doorbell(std::uint64_t seen, const std::vector<Watch>& watch, int peer,
                        bool progress_thread, Clock::time_point since) {
  WaitPolicy policy = c_.base_policy();
  if (progress_thread) {
    // A helper thread must not hold a core a rank needs.
    policy.spin_ns = 0;
    policy.yield_ns = std::min(policy.yield_ns, kHelperMaxYieldNs);
  } else {
    policy = c_.policy_for(peer);  // yield only to a rank on our CPU
  }
  Counter& d = inbox(c_.rank).doorbell;
  // Anything to progress: a ring, or a header posted (lightly rung) since
  // the caller's last scan.
  auto ready = [&](std::memory_order order) {
    if (d.value.load(order) > seen) return true;
    for (const Watch& w : watch)
      if (w.seq->load(order) >= w.want) return true;
    return false;
  };
  if (ready(std::memory_order_acquire)) return;
  // Phases already spent in earlier slices of this wait are not repeated:
  // a recv waiting 1 s for its send yielded 2 ms of every 12 ms slice (165
  // ms of CPU; tests/core/test_idle_cpu.cpp).
  const auto call_start = Clock::now();
  const std::int64_t waited = (call_start - since).count();
  const std::int64_t full_spin = policy.spin_ns;
  policy.spin_ns = std::max<std::int64_t>(0, full_spin - waited);
  policy.yield_ns =
      std::max<std::int64_t>(0, policy.yield_ns - std::max<std::int64_t>(0, waited - full_spin));
  if (policy.spin_ns > 0) {
    // A first short round before reading the clock (32 pauses: ~1.5 us on
    // CPUs whose pause takes ~140 cycles): a ping-pong answer often comes.
    for (int i = 0; i < 32; ++i) {
      cpu_relax();
      if (ready(std::memory_order_acquire)) return;
    }
  }
  const auto start = Clock::now();
  if (policy.spin_ns > 0) {
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        cpu_relax();
        if (ready(std::memory_order_acquire)) return;
      }
      if ((Clock::now() - start).count() >= policy.spin_ns) break;
    }
  }
  // Yield the core (the peer may need it); the caller's slow checks run
  // every sleep slice.
  const std::int64_t yield_end = policy.spin_ns + policy.yield_ns;
  while ((Clock::now() - start).count() < yield_end) {
    sched_yield();
    if (ready(std::memory_order_acquire)) return;
    if (Clock::now() - call_start > std::chrono::microseconds(policy.sleep_slice_us)) return;
  }
  // One futex sleep slice (the lost-wakeup argument is p2p.cpp's header comment's).
  d.waiters.fetch_add(1, std::memory_order_seq_cst);
  asymmetric_fence_heavy();
  const std::uint32_t gen = d.futex_gen.load(std::memory_order_seq_cst);
  if (!ready(std::memory_order_seq_cst)) futex_wait(d.futex_gen, gen, policy.sleep_slice_us);
  d.waiters.fetch_sub(1, std::memory_order_seq_cst);
}

void P2p::wait(Op& op) {
  std::unique_lock lock(mutex_);
  auto last_check = Clock::now();
  // When this wait last saw the doorbell move: the phases restart there.
  auto since = last_check;
  std::uint64_t last_seen = inbox(c_.rank).doorbell.value.load(std::memory_order_acquire);
  while (!op.done) {
    const std::uint64_t seen = inbox(c_.rank).doorbell.value.load(std::memory_order_acquire);
    if (seen != last_seen) {
      last_seen = seen;
      since = Clock::now();
    }
    progress(lock);
    if (!op.done && Clock::now() - last_check > std::chrono::milliseconds(10)) {
      check_pending(lock);
      last_check = Clock::now();
    }
    deliver(lock);
    if (op.done) break;
    thread_local std::vector<Watch> watch;
    watch_entries(watch);
    ++sleepers_;
    lock.unlock();
    wait_doorbell(seen, watch, op.peer, false, since);
    lock.lock();
    --sleepers_;
  }
  if (op.error) std::rethrow_exception(op.error);
}

void P2p::start_thread() {
  thread_ = std::make_unique<std::thread>([this] { loop(); });
}

void P2p::loop() {
  pthread_setname_np(pthread_self(), "shmring-p2p");
  std::unique_lock lock(mutex_);
  auto last_check = Clock::now();
  while (!stop_) {
    if (requests_pending_ == 0) {
      cv_.wait_for(lock, std::chrono::milliseconds(100),
                   [&] { return stop_ || requests_pending_ > 0; });
      continue;
    }
    const std::uint64_t seen = inbox(c_.rank).doorbell.value.load(std::memory_order_acquire);
    progress(lock);
    if (Clock::now() - last_check > std::chrono::milliseconds(10)) {
      check_pending(lock);
      last_check = Clock::now();
    }
    deliver(lock);
    if (requests_pending_ == 0 || stop_) continue;
    std::vector<Watch>& watch = thread_watch_;
    watch_entries(watch);
    ++sleepers_;
    lock.unlock();
    wait_doorbell(seen, watch, -1, true, Clock::now());
    lock.lock();
    --sleepers_;
  }
}

}  // namespace detail
}  // namespace shmring
