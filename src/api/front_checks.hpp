#pragma once

// Argument checks of the front (communicator.cpp, collective_set.cpp). Each
// throws InvalidArgumentError naming the rank, the collective, the value and
// what was expected; call them inside validated() so that a refused
// call is published to the peers.

#include <cstddef>

#include "core/comm.hpp"

namespace shmring::front {

void check_dtype(const Communicator::Impl& c, const char* what, DataType dtype);
void check_op(const Communicator::Impl& c, const char* what, DataType dtype, ReduceOp op);
void check_root(const Communicator::Impl& c, const char* what, int root);
/// Bytes of `count` elements times `factor`, refusing overflow.
std::size_t checked_bytes(const Communicator::Impl& c, const char* what, std::size_t count,
                          DataType dtype, std::size_t factor);
void check_pointer(const Communicator::Impl& c, const char* what, const char* name, const void* p,
                   std::size_t bytes);
/// [a, a+a_bytes) and [b, b+b_bytes) must not overlap, except that b may be
/// exactly `in_place` (the collective's in-place form).
void check_disjoint(const Communicator::Impl& c, const char* what, const void* a,
                    std::size_t a_bytes, const void* b, std::size_t b_bytes, const void* in_place,
                    const char* in_place_rule);

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
