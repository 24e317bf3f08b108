// CrossNode's failure handling (multi_node.hpp, "Faults"): the first failing
// stage breaks the group, tells every rank, and names the rank that died.
#include "multi_node.hpp"

#include <c10/util/Exception.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace shmring::torch_backend {
namespace {

std::string describe(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

// False once `pid` has exited (gone, or a zombie its parent has not reaped).
bool process_alive(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return true;
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

// What a refused call queues (CrossNode::refuse): the failure it causes
// is this rank's, and its message is the one every peer should see.
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// True once every key in `keys` is in `store`, false when `within` has
// passed first. Polls, instead of calling Store::wait: torch's FileStore
// compares the time waited in whole seconds, so its wait(keys, 1 s) gives up
// only after 2 s (measured on torch 1.13, 2.00-2.01 s in three tries).
bool appear_within(::c10d::Store& store, const std::vector<std::string>& keys,
                   std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  for (;;) {
    if (store.check(keys)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool is_refusal(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Refused&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

void CrossNode::refuse(const char* op, const std::string& reason) noexcept {
  std::string what;
  try {
    what = "rank " + std::to_string(rank_) + " made an invalid call to " + op + ": " + reason;
  } catch (...) {
    return;  // out of memory: the peers fail at the timeout instead
  }
  try {
    std::uint64_t seq = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      seq = submitted_;  // this step's place in the group's call order
    }
    const std::string mark = prefix_ + "refusal/" + std::to_string(seq) + "/";
    submit(::c10d::OpType::UNKNOWN, "shmring:refused", {}, [this, what, mark] {
      // Every rank that refused this call leaves a mark; when all have,
      // no rank ran it and nothing needs undoing.
      store_->set(mark + std::to_string(rank_), std::vector<std::uint8_t>{1});
      std::vector<std::string> all;
      for (int r = 0; r < size_; ++r) all.push_back(mark + std::to_string(r));
      try {
        if (appear_within(*store_, all, kRefusalAgreement)) return;
      } catch (...) {
        // The store is gone: fail as below.
      }
      // Some rank runs the call: it must fail instead of waiting.
      throw Refused(what);
    });
  } catch (...) {
    // Broken or shut down already: the peers know, or wait for nothing.
  }
}

std::exception_ptr CrossNode::fail(const std::string& op, std::exception_ptr error) {
  const bool refused = is_refusal(error);
  const std::string mine = describe(std::move(error));
  const std::string here = "shmring backend: rank " + std::to_string(rank_) + ": " + op + ": ";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_.empty()) broken_ = here + mine;
  }
  // A refusal names its rank in the store before anyone can see the group
  // fail, so that the peers of the other nodes, who see only gloo's closed
  // connections, can say who made the invalid call.
  const std::string refused_key = prefix_ + "refused";
  if (refused) {
    try {
      store_->set(refused_key, std::vector<std::uint8_t>(mine.begin(), mine.end()));
    } catch (...) {
    }
  }
  // First tell everyone: the node's ranks through the communicator, the
  // other nodes through gloo's closed connections (now, not at their
  // timeout). Every rank that fails does the same, so the failure spreads
  // across every node in a few hops.
  try {
    comm_->abort(here + mine);
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> g(gloo_mutex_);
    leaders_.reset();
    shard_.reset();
    world_.reset();
  }
  // Then say why. A closed connection or an abort does not say which rank
  // died; the ranks of the dead one's node can see it (its process is gone
  // or a zombie) and publish it in the store for the others. A rank alone
  // on its node has no one to see it: every failing rank reports in, and
  // one that has not within kDeathNotice is named instead.
  try {
    store_->set(prefix_ + "reported/" + std::to_string(rank_), std::vector<std::uint8_t>{1});
  } catch (...) {
  }
  std::string cause;  // a peer's refusal, read back from the store
  if (!refused) {
    try {
      if (store_->check({refused_key})) {
        const auto bytes = store_->get(refused_key);
        cause.assign(bytes.begin(), bytes.end());
      }
    } catch (...) {
    }
  }
  if (refused || !cause.empty()) {
    const std::string message =
        cause.empty() ? here + mine : here + cause + " (this rank saw: " + mine + ")";
    std::lock_guard<std::mutex> lock(mutex_);
    broken_ = message;
    return std::make_exception_ptr(std::runtime_error(message));
  }
  const std::string dead_key = prefix_ + "dead";
  std::string dead;
  for (int r : layout_.nodes[static_cast<std::size_t>(node_)]) {
    const int pid = layout_.pids[static_cast<std::size_t>(r)];
    if (r == rank_ || process_alive(pid)) continue;
    dead += std::string(dead.empty() ? "" : "; ") + "rank " + std::to_string(r) + " (pid " +
            std::to_string(pid) + " on host " + layout_.hosts[static_cast<std::size_t>(node_)] +
            ") died";
  }
  try {
    if (!dead.empty()) {
      store_->set(dead_key, std::vector<std::uint8_t>(dead.begin(), dead.end()));
    } else if (appear_within(*store_, {dead_key}, kDeathNotice)) {
      const auto bytes = store_->get(dead_key);
      dead.assign(bytes.begin(), bytes.end());
    }
  } catch (...) {
    // No rank of a node with peers died (a timeout, a mismatch, or a rank
    // alone on its node), or the store is gone with it.
  }
  if (dead.empty()) {
    try {
      for (int r = 0; r < size_; ++r) {
        if (store_->check({prefix_ + "reported/" + std::to_string(r)})) continue;
        const auto node = static_cast<std::size_t>(layout_.node_of[static_cast<std::size_t>(r)]);
        dead += std::string(dead.empty() ? "" : "; ") + "rank " + std::to_string(r) + " (pid " +
                std::to_string(layout_.pids[static_cast<std::size_t>(r)]) + " on host " +
                layout_.hosts[node] + ") died or hangs: it did not report within " +
                std::to_string(kDeathNotice.count()) + " ms of the failure";
      }
    } catch (...) {
    }
  }
  const std::string message =
      dead.empty() ? here + mine : here + dead + " (this rank saw: " + mine + ")";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    broken_ = message;
  }
  return std::make_exception_ptr(std::runtime_error(message));
}

}  // namespace shmring::torch_backend
