// ProcessGroupShmring's life (process_group.hpp): where the group's ranks
// are (host grouping and the job nonce, through the store), construction of
// its communicator or of a CrossNode across hosts, shutdown, and launch(),
// through which every operation on one host starts. The operations are in
// process_group_collectives.cpp and process_group_p2p.cpp.
#include "process_group.hpp"

#include <Python.h>
#include <pybind11/pybind11.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>

#include "convert.hpp"
#include "node_layout.hpp"
#include "process_group_args.hpp"
#include "shmring/settings.hpp"
#if SHMRING_TORCH_GLOO
#include "multi_node.hpp"
#else
namespace shmring::torch_backend {
class CrossNode {};  // groups across hosts need gloo
}  // namespace shmring::torch_backend
#endif

namespace shmring::torch_backend {
namespace {

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

// Hostname plus boot id: two containers or two boots with one name differ.
std::string host_identity() {
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return host_name() + "/" + boot_id;
}

// SHMRING_TORCH_JOB_TAG ("tag-" in every job id): lets a launcher
// (tools/fake-nodes) find the shared memory of its own run.
std::string job_tag() {
  const auto tag = settings::text("SHMRING_TORCH_JOB_TAG");
  if (!tag) return "";
  const std::string& t = *tag;
  const bool ok = t.size() <= 32 && std::all_of(t.begin(), t.end(), [](char c) {
                    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_';
                  });
  TORCH_CHECK(ok, "shmring backend: SHMRING_TORCH_JOB_TAG='", t,
              "': expected 1 to 32 characters from [A-Za-z0-9._]");
  return t + "-";
}

std::string random_nonce() {
  std::random_device device;
  const std::uint64_t value = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 0; i < 16; ++i) out[i] = kHex[(value >> (4 * i)) & 0xf];
  return out;
}

// Where a group's ranks are, agreed through its store. Each creation of a
// group on one store is a generation (several init/destroy cycles may share
// a store): every rank counts itself in, and the keys of generation g are
// under "shmring/g/". Generations cannot interleave, since a creation
// returns only once every rank of it has attached.
//
// Every rank publishes its host identity (hostname + boot id) and reads
// every other rank's: the ranks of one host form a node, nodes ordered by
// their lowest rank. The lowest rank of each node writes a fresh nonce for
// its node's communicator. A rank that never comes fails every rank, each at
// its own wait, with the same message naming the missing ranks.
struct Placement {
  Options local;       // the communicator of this rank's node
  NodeLayout layout;   // every rank's node
  std::string prefix;  // "shmring/<generation>/"
};

// A host entry of a rank whose settings were refused: this, then why.
const std::string kRefusedEntry = "refused: ";

Placement rendezvous(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout) {
  TORCH_CHECK(store, "shmring backend: no store given to the process group");
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "shmring backend: rank ", rank,
              " is not in [0, ", size, ")");
  const std::int64_t arrival = store->add("shmring/arrivals", 1);
  const std::int64_t generation = (arrival - 1) / size;
  const std::string prefix = "shmring/" + std::to_string(generation) + "/";
  auto host_key = [&](int r) { return prefix + "host/" + std::to_string(r); };
  const std::string host = host_identity();
  // The backend's own settings, checked here so that a bad value on one
  // rank is every rank's error at once: the entry carries it instead of
  // this rank's pid and host, and every rank raises it below.
  std::string refused;
  try {
    (void)settings::bytes("SHMRING_TORCH_SHARD_BYTES");
    (void)job_tag();
  } catch (const c10::Error& e) {
    refused = e.what_without_backtrace();
  } catch (const std::exception& e) {
    refused = e.what();
  }
  // "pid host": the pid lets the ranks of a node tell which one died.
  const std::string entry =
      refused.empty() ? std::to_string(getpid()) + " " + host : kRefusedEntry + refused;
  store->set(host_key(rank), std::vector<std::uint8_t>(entry.begin(), entry.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(host_key(r));
  const std::chrono::milliseconds wait_ms = timeout.count() > 0 ? timeout : store->getTimeout();
  try {
    store->wait(keys, wait_ms);
  } catch (const std::exception&) {
    std::string missing;
    for (int r = 0; r < size; ++r)
      if (!store->check({host_key(r)}))
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    TORCH_CHECK(false, "shmring backend: rank ", rank, " gave up after ", wait_ms.count(),
                " ms waiting for rank(s) ", missing.empty() ? "?" : missing,
                " to join the group (generation ", generation, " of its store)");
  }
  Placement p;
  p.prefix = prefix;
  NodeLayout& layout = p.layout;
  layout.node_of.resize(static_cast<std::size_t>(size));
  layout.local_of.resize(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    const std::vector<std::uint8_t> bytes = store->get(host_key(r));
    const std::string value(bytes.begin(), bytes.end());
    TORCH_CHECK(value.rfind(kRefusedEntry, 0) != 0, "shmring backend: rank ", r, ": ",
                value.substr(kRefusedEntry.size()));
    const auto space = value.find(' ');
    TORCH_CHECK(space != std::string::npos, "shmring backend: store key ", host_key(r), " holds '",
                value, "', not a shmring host entry");
    const std::string theirs = value.substr(space + 1);
    layout.pids.push_back(std::atoi(value.substr(0, space).c_str()));
    auto it = std::find(layout.hosts.begin(), layout.hosts.end(), theirs);
    if (it == layout.hosts.end()) {
      layout.hosts.push_back(theirs);
      layout.nodes.emplace_back();
      it = layout.hosts.end() - 1;
    }
    const auto node = static_cast<std::size_t>(it - layout.hosts.begin());
    layout.node_of[static_cast<std::size_t>(r)] = static_cast<int>(node);
    layout.local_of[static_cast<std::size_t>(r)] = static_cast<int>(layout.nodes[node].size());
    layout.nodes[node].push_back(r);
  }
  const auto node = static_cast<std::size_t>(layout.node_of[static_cast<std::size_t>(rank)]);
  const std::vector<int>& mine = layout.nodes[node];
  const std::string key = prefix + "nonce/" + std::to_string(node);
  std::string nonce;
  if (mine[0] == rank) {
    nonce = random_nonce();
    store->set(key, std::vector<std::uint8_t>(nonce.begin(), nonce.end()));
  } else {
    const std::vector<std::uint8_t> bytes = store->get(key);
    nonce.assign(bytes.begin(), bytes.end());
  }
  Options& options = p.local;
  options.rank = layout.local_of[static_cast<std::size_t>(rank)];
  options.world_size = static_cast<int>(mine.size());
  options.job_id = "torch-" + job_tag() + nonce;
  // The communicator spans one host by construction: all its ranks are local.
  options.local_rank = options.rank;
  options.local_world_size = options.world_size;
  if (!settings::text("SHMRING_TIMEOUT") && timeout.count() > 0) {
    options.timeout_s = static_cast<double>(timeout.count()) / 1000.0;
  }
  return p;
}

}  // namespace

using pg_detail::t_launched;

void ProcessGroupShmring::refuse(const char* op, const std::string& reason) noexcept {
#if SHMRING_TORCH_GLOO
  if (cross_) {
    cross_->refuse(op, reason);
    return;
  }
#endif
  try {
    std::lock_guard<std::mutex> lock(call_mutex_);
    if (!comm_) return;  // shut down: no peer is waiting for this call
    comm_->reject_call(op, reason);
  } catch (...) {
    // Published (reject_call always throws), or the group is already broken
    // and its peers know: either way the caller's error is the one to raise.
  }
}

void ProcessGroupShmring::agree_on_moved_dtype(const at::Tensor& tensor, const char* op) {
  if (!pg_detail::move_type(tensor, op).as_bytes) return;
  const at::ScalarType type = tensor.scalar_type();
  const std::int64_t mine = static_cast<std::int64_t>(type);
  std::vector<std::int64_t> all(static_cast<std::size_t>(size_));
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    TORCH_CHECK(comm_, "shmring backend: ", op,
                ": the process group was destroyed (destroy_process_group)");
    try {
      comm_->allgather(&mine, all.data(), 1, DataType::int64);
    } catch (const Error& e) {
      // Marked as launched: the peers already know (the communicator's own
      // failure), so refusing() must not tell them again.
      t_launched = true;
      TORCH_CHECK(false, "shmring backend: ", op, ": comparing every rank's dtype (",
                  dtype_name(type), " moves as bytes) failed: ", e.what());
    }
  }
  for (std::size_t r = 1; r < all.size(); ++r)
    TORCH_CHECK(all[r] == all[0], "shmring backend: ", op, ": rank 0 passed a tensor of dtype ",
                dtype_name(static_cast<at::ScalarType>(all[0])), " but rank ", r, " one of dtype ",
                dtype_name(static_cast<at::ScalarType>(all[r])),
                "; every rank must pass the same dtype (nothing was moved)");
}

ProcessGroupShmring::ProcessGroupShmring(const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                         int size, std::chrono::milliseconds timeout)
    : BackendBase(rank, size) {
  Placement p = rendezvous(store, rank, size, timeout);
  if (p.layout.nodes.size() == 1) {
    // One host: one communicator, no gloo.
    comm_ = std::make_unique<Communicator>(p.local);
    job_id_ = comm_->config().job_id;
    return;
  }
#if SHMRING_TORCH_GLOO
  cross_ = std::make_unique<CrossNode>(store, p.prefix, rank, size, timeout, std::move(p.layout),
                                       std::make_unique<Communicator>(p.local));
  job_id_ = cross_->job_id();
#else
  const int other = p.layout.nodes[1][0];
  TORCH_CHECK(false, "shmring backend: rank ", other, " runs on host ", p.layout.hosts[1],
              " but rank 0 on ", p.layout.hosts[0],
              "; this build of the backend has no gloo (libgloo-dev) for groups across hosts, so "
              "every rank of a shmring group must be on one host");
#endif
}

ProcessGroupShmring::~ProcessGroupShmring() {
  release(false);
}

void ProcessGroupShmring::shutdown() {
  release(true);
}

void ProcessGroupShmring::release(bool leave) {
  // Completing what is still queued, and dropping the last reference to a
  // Work's tensors, may need the GIL on a completion thread (Python future
  // callbacks; tensors with a Python object); Python may be dropping the
  // last reference to this group with the GIL held.
  std::optional<pybind11::gil_scoped_release> no_gil;
  if (Py_IsInitialized() && PyGILState_Check()) no_gil.emplace();
#if SHMRING_TORCH_GLOO
  if (cross_) {
    cross_->shutdown(leave ? std::chrono::milliseconds(kLeaveWait) : std::chrono::milliseconds(0));
    return;
  }
#endif
  std::unique_ptr<Communicator> comm;
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    if (comm_ && leave) {
      // Queued behind the pending collectives: they complete first.
      try {
        Request left = comm_->ifinalize();
        if (!left.wait_for(kLeaveWait))
          comm_->abort("rank " + std::to_string(rank_) + " destroyed the process group after " +
                       std::to_string(kLeaveWait.count()) + " s without its peers");
      } catch (...) {
        // A broken group: its peers know, and there is nothing to wait for.
      }
    }
    comm.swap(comm_);
  }
  comm.reset();         // completes or fails every request: their Works reach the completions
  completions_.stop();  // completes those, then joins the threads
}

c10::intrusive_ptr<Work> ProcessGroupShmring::launch(::c10d::OpType type, const char* title,
                                                     std::vector<at::Tensor> result,
                                                     std::vector<at::Tensor> keep_alive,
                                                     std::function<void()> epilogue,
                                                     const Start& start) {
  auto work = c10::make_intrusive<WorkShmring>(rank_, type, title, std::move(result));
  work->prepare(std::move(keep_alive), std::move(epilogue));
  {
    std::lock_guard<std::mutex> lock(call_mutex_);
    TORCH_CHECK(comm_, "shmring backend: ", title,
                ": the process group was destroyed (destroy_process_group)");
    try {
      t_launched = true;
      work->set_request(start(*comm_));
    } catch (const Error& e) {
      TORCH_CHECK(false, e.what());  // argument errors, or a broken group refusing
    }
  }
  // The callback runs on the progress thread (or here, if already complete):
  // it only hands the Work over, moving its reference out so the Work (and
  // its Request) is never destroyed on the progress thread.
  // A Work that a thread already wait()s for is completed by that thread
  // (a blocking dist.all_reduce): waking a completion thread for it would
  // cost a context switch per call on a busy core.
  work->request().on_complete([this, w = work](std::exception_ptr error) mutable {
    if (w->waited()) return;
    completions_.push(std::move(w), error);
  });
  return work;
}

}  // namespace shmring::torch_backend
