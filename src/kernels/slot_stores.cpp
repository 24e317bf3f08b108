// Plain or streaming slot writes by measured rate (kernels/slot_stores.hpp).

#include "kernels/slot_stores.hpp"

#include <algorithm>

namespace shmring::detail {

SlotStoreChooser::Kind SlotStoreChooser::next(std::uint64_t now_ns) const {
  const std::uint64_t tried = 1 + kWarmupWrites;
  const int s = idx(Kind::streaming), p = idx(Kind::plain);
  // Warm-up: streaming, plain, streaming, plain.
  if (writes_[s] < tried && writes_[s] <= writes_[p]) return Kind::streaming;
  if (writes_[p] < tried) return Kind::plain;
  const Kind best = est_[p] < est_[s] ? Kind::plain : Kind::streaming;
  const int other = best == Kind::plain ? s : p;
  const bool due = total_ - last_n_[other] >= kProbeWrites && now_ns >= last_ns_[other] &&
                   now_ns - last_ns_[other] >= kProbeIntervalNs;
  return due ? static_cast<Kind>(other) : best;
}

void SlotStoreChooser::record(Kind k, std::size_t bytes, std::uint64_t start_ns,
                              std::uint64_t end_ns) {
  const int i = idx(k), j = 1 - i;
  // A write of the kind whose estimate is higher is a try (or the warm-up):
  // its one sample replaces the stale estimate.
  const bool tried = est_[i] < 0 || (est_[j] >= 0 && est_[i] >= est_[j]);
  last_ns_[i] = start_ns;
  last_n_[i] = ++total_;
  if (++writes_[i] == 1 || bytes == 0) return;  // the first write touches cold lines
  const double x =
      static_cast<double>(end_ns > start_ns ? end_ns - start_ns : 0) / static_cast<double>(bytes);
  if (tried)
    est_[i] = x;
  else
    est_[i] += (std::min(x, 4 * est_[i]) - est_[i]) / 4;
}

}  // namespace shmring::detail
