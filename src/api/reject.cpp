// Communicator::reject_call: a binding layer's refusal of a collective, told
// to the peers in call order like the front's own argument checks
// (communicator.cpp, Impl::validated), so that a bad argument on one rank is
// an error on every rank at once instead of a wait until SHMRING_TIMEOUT.

#include <fmt/format.h>

#include "core/comm.hpp"

namespace shmring {

void Communicator::reject_call(const std::string& collective, const std::string& reason) {
  Impl& c = *impl_;
  // Impl::reject checks the owner (a forked child publishes nothing), refuses
  // a broken communicator with AbortedError, and otherwise publishes "invalid
  // call" inline or queued behind the pending requests; then throws this.
  c.reject(InvalidArgumentError(
      fmt::format("rank {}: {}: {}", c.rank,
                  collective.empty() ? std::string("collective") : collective, reason)));
}

}  // namespace shmring
