#pragma once

// Argument checks of the front (communicator.cpp, collective_set.cpp). Each
// throws InvalidArgumentError naming the rank, the collective, the value and
// what was expected; call them inside validated() so that a refused
// call is published to the peers.
//
// The tests are inline and the messages are built out of line, in the
// cold refuse_* functions (front_checks.cpp): an accepted call pays a few
// compares, not a call per check. Every blocking and non-blocking call
// passes here, and at 8 bytes such fixed costs are most of what a call
// adds to the transfer of its line
// (docs/performance/notes/2026-12-04-small-call-costs.md).

#include <cstddef>
#include <cstdint>
#include <limits>

#include "base/element.hpp"
#include "core/comm.hpp"

namespace shmring::front {

[[noreturn]] void refuse_dtype(const Communicator::Impl& c, const char* what, DataType dtype);
[[noreturn]] void refuse_op(const Communicator::Impl& c, const char* what, DataType dtype,
                            ReduceOp op);
[[noreturn]] void refuse_root(const Communicator::Impl& c, const char* what, int root);
[[noreturn]] void refuse_overflow(const Communicator::Impl& c, const char* what, std::size_t count,
                                  DataType dtype, std::size_t factor);
[[noreturn]] void refuse_null(const Communicator::Impl& c, const char* what, const char* name,
                              std::size_t bytes);
[[noreturn]] void refuse_overlap(const Communicator::Impl& c, const char* what,
                                 const char* in_place_rule);

inline void check_dtype(const Communicator::Impl& c, const char* what, DataType dtype) {
  if (static_cast<unsigned>(dtype) >= static_cast<unsigned>(kNumDataTypes)) [[unlikely]]
    refuse_dtype(c, what, dtype);
}

/// op must be a ReduceOp, and avg needs a floating dtype (checked before).
inline void check_op(const Communicator::Impl& c, const char* what, DataType dtype, ReduceOp op) {
  if (static_cast<unsigned>(op) >= static_cast<unsigned>(kNumReduceOps) ||
      (op == ReduceOp::avg && !detail::floating(dtype))) [[unlikely]]
    refuse_op(c, what, dtype, op);
}

inline void check_root(const Communicator::Impl& c, const char* what, int root) {
  if (root < 0 || root >= c.size) [[unlikely]]
    refuse_root(c, what, root);
}

/// Bytes of `count` elements times `factor`, refusing overflow. dtype must
/// have passed check_dtype.
inline std::size_t checked_bytes(const Communicator::Impl& c, const char* what, std::size_t count,
                                 DataType dtype, std::size_t factor) {
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(count, detail::element_bytes(dtype) * factor, &bytes) ||
      bytes > (std::numeric_limits<std::size_t>::max() >> 2)) [[unlikely]]
    refuse_overflow(c, what, count, dtype, factor);
  return bytes;
}

inline void check_pointer(const Communicator::Impl& c, const char* what, const char* name,
                          const void* p, std::size_t bytes) {
  if (bytes > 0 && p == nullptr) [[unlikely]]
    refuse_null(c, what, name, bytes);
}

/// [a, a+a_bytes) and [b, b+b_bytes) must not overlap, except that b may be
/// exactly `in_place` (the collective's in-place form).
inline void check_disjoint(const Communicator::Impl& c, const char* what, const void* a,
                           std::size_t a_bytes, const void* b, std::size_t b_bytes,
                           const void* in_place, const char* in_place_rule) {
  if (a_bytes == 0 || b_bytes == 0 || b == in_place) return;
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  if (x < y + b_bytes && y < x + a_bytes) [[unlikely]]
    refuse_overlap(c, what, in_place_rule);
}

/// Runs `checks`; a refused call (InvalidArgumentError) is published to the
/// peers in call order, inline or queued behind pending requests
/// (Impl::reject, engine/engine.cpp), then thrown on this thread, so that a
/// bad argument on one rank is an error on every rank at once.
template <class F>
void validated(Communicator::Impl& c, F&& checks) {
  try {
    checks();
  } catch (const InvalidArgumentError& e) {
    c.reject(e);
  }
}

}  // namespace shmring::front
