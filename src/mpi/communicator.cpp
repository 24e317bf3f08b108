// shmring::mpi::Communicator: construction, accessors, argument checks and
// the error policy.
//
// A failure inside one node (a rank dead or past SHMRING_TIMEOUT, a
// mismatch, a failed MPI call) cannot be repaired from the other nodes:
// their ranks may already sit in an MPI call that will never complete, and
// Open MPI 4.1 has no way to interrupt it. So by default the rank that sees
// the failure prints it, naming its rank, node and the stage, and calls
// MPI_Abort, which ends every rank of the job. The node's segment was
// unlinked once every local rank had attached, so nothing stays in /dev/shm.
// SHMRING_MPI_ON_ERROR=throw hands the error to the caller instead.

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "impl.hpp"

namespace shmring::mpi {

const char* to_string(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::automatic:
      return "auto";
    case Algorithm::leaders:
      return "leaders";
    case Algorithm::shards:
      return "shards";
    case Algorithm::flat:
      return "flat";
  }
  return "invalid";
}

void Communicator::Impl::fail(const char* stage, ErrorCode code, const std::string& what) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string msg =
      fmt::format("shmring-mpi: rank {}/{} (node {}/{} '{}', local rank {}/{}): {} failed: {}",
                  rank, size, node, num_nodes, host, local_rank, local_size, stage, what);
  if (abort_on_error && world != MPI_COMM_NULL) {
    std::fprintf(stderr, "%s; aborting the MPI job (SHMRING_MPI_ON_ERROR=throw to handle it)\n",
                 msg.c_str());
    std::fflush(stderr);
    MPI_Abort(world, 10 + static_cast<int>(code));
  }
  if (broken.empty()) broken = msg;
  throw_error(code, msg);
}

void Communicator::Impl::check_mpi(int rc, const char* stage) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(stage, ErrorCode::peer_failure, fmt::format("MPI error {}: {}", rc, text));
}

void Communicator::Impl::refuse(const char* what, const std::string& why) {
  // Told to the node's other ranks in their call order (shmring's
  // reject_call): one that made this call validly fails at once with a
  // MismatchError naming this rank and `why`, which the error policy then
  // handles as any failure in the node. When every rank refuses alike,
  // nothing moved and the communicator stays usable. Ranks on other nodes
  // are not told (docs/guide/multi-node.md, "Errors").
  if (node_comm && broken.empty()) {
    try {
      node_comm->reject_call(what, why);
    } catch (const Error&) {
      // Published (or the node communicator is broken and its ranks know).
    }
  }
  throw InvalidArgumentError(fmt::format("rank {}: {}: {}", rank, what, why));
}

void Communicator::Impl::check_dtype(const char* what, DataType dtype) {
  if (static_cast<unsigned>(dtype) >= static_cast<unsigned>(kNumDataTypes))
    refuse(what, fmt::format("datatype {} is not a DataType (0..{})", static_cast<int>(dtype),
                             kNumDataTypes - 1));
}

void Communicator::Impl::check_op(const char* what, DataType dtype, ReduceOp op) {
  check_dtype(what, dtype);
  if (static_cast<unsigned>(op) >= static_cast<unsigned>(kNumReduceOps))
    refuse(what, fmt::format("operator {} is not a ReduceOp (0..{})", static_cast<int>(op),
                             kNumReduceOps - 1));
  if (op == ReduceOp::avg && !is_floating(dtype))
    refuse(what, fmt::format("avg needs a floating datatype, got {}; use sum and divide",
                             to_string(dtype)));
}

void Communicator::Impl::check_root(const char* what, int root) {
  if (root < 0 || root >= size)
    refuse(what, fmt::format("root {} is not a rank of this communicator (0..{})", root, size - 1));
}

void Communicator::Impl::check_buffer(const char* what, const char* name, const void* p,
                                      std::size_t count) {
  if (p == nullptr && count > 0) refuse(what, fmt::format("{} is null with count {}", name, count));
}

void Communicator::reject_call(const std::string& collective, const std::string& reason) {
  Impl& c = *impl_;
  c.check_usable(collective.c_str());
  c.refuse(collective.c_str(), reason);
}

void Communicator::Impl::check_usable(const char* what) const {
  if (!broken.empty())
    throw AbortedError(fmt::format(
        "rank {}: {}: the communicator is broken by an earlier error: {}", rank, what, broken));
}

Communicator::Communicator(MPI_Comm comm, const Options& options)
    : impl_(std::make_unique<Impl>()) {
  try {
    impl_->setup(comm, options);
  } catch (...) {
    impl_->teardown();
    throw;
  }
}

Communicator::~Communicator() {
  if (impl_) impl_->teardown();
}
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->teardown();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

int Communicator::rank() const noexcept {
  return impl_->rank;
}
int Communicator::size() const noexcept {
  return impl_->size;
}
int Communicator::node() const noexcept {
  return impl_->node;
}
int Communicator::num_nodes() const noexcept {
  return impl_->num_nodes;
}
int Communicator::local_rank() const noexcept {
  return impl_->local_rank;
}
int Communicator::local_size() const noexcept {
  return impl_->local_size;
}
bool Communicator::balanced() const noexcept {
  return impl_->balanced;
}
Algorithm Communicator::algorithm() const noexcept {
  return impl_->algorithm;
}
std::size_t Communicator::shards_bytes() const noexcept {
  return impl_->shards_bytes;
}
std::size_t Communicator::piece_bytes() const noexcept {
  return impl_->piece_bytes;
}
std::size_t Communicator::call_bytes() const noexcept {
  return impl_->call_bytes;
}
shmring::Communicator& Communicator::node_communicator() noexcept {
  return *impl_->node_comm;
}
MPI_Comm Communicator::mpi_comm() const noexcept {
  return impl_->world;
}

void Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType dtype,
                             ReduceOp op) {
  Impl& c = *impl_;
  c.check_usable("allreduce");
  c.check_op("allreduce", dtype, op);
  c.check_buffer("allreduce", "send", send, count);
  c.check_buffer("allreduce", "recv", recv, count);
  c.allreduce(send, recv, count, dtype, op);
}

}  // namespace shmring::mpi
