// The front's argument checks (front_checks.hpp).

#include "api/front_checks.hpp"

#include <fmt/format.h>

#include <limits>

namespace shmring {

namespace front {

// Argument checks. Each throws InvalidArgumentError naming the rank, the
// collective, the value and what was expected. Shared with collective_set.cpp
// (front_checks.hpp).
void check_dtype(const Communicator::Impl& c, const char* what, DataType dtype) {
  if (static_cast<unsigned>(dtype) >= static_cast<unsigned>(kNumDataTypes))
    throw InvalidArgumentError(fmt::format("rank {}: {}: datatype {} is not a DataType (0..{})",
                                           c.rank, what, static_cast<int>(dtype),
                                           kNumDataTypes - 1));
}

void check_op(const Communicator::Impl& c, const char* what, DataType dtype, ReduceOp op) {
  if (static_cast<unsigned>(op) >= static_cast<unsigned>(kNumReduceOps))
    throw InvalidArgumentError(fmt::format("rank {}: {}: operator {} is not a ReduceOp (0..{})",
                                           c.rank, what, static_cast<int>(op), kNumReduceOps - 1));
  if (op == ReduceOp::avg && !is_floating(dtype))
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: avg needs a floating datatype, got {}; use sum and divide",
                    c.rank, what, to_string(dtype)));
}

void check_root(const Communicator::Impl& c, const char* what, int root) {
  if (root < 0 || root >= c.size)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: root {} is not a rank of this communicator (0..{})", c.rank, what,
                    root, c.size - 1));
}

// Bytes of `count` elements times `factor`, refusing overflow.
std::size_t checked_bytes(const Communicator::Impl& c, const char* what, std::size_t count,
                          DataType dtype, std::size_t factor) {
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(count, datatype_size(dtype) * factor, &bytes) ||
      bytes > (std::numeric_limits<std::size_t>::max() >> 2))
    throw InvalidArgumentError(fmt::format("rank {}: {}: count {} of {} (x{}) overflows", c.rank,
                                           what, count, to_string(dtype), factor));
  return bytes;
}

void check_pointer(const Communicator::Impl& c, const char* what, const char* name, const void* p,
                   std::size_t bytes) {
  if (bytes > 0 && p == nullptr)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: {} is null but holds {} bytes", c.rank, what, name, bytes));
}

// [a, a+a_bytes) and [b, b+b_bytes) must not overlap, except that b may be
// exactly `in_place` (the collective's in-place form).
void check_disjoint(const Communicator::Impl& c, const char* what, const void* a,
                    std::size_t a_bytes, const void* b, std::size_t b_bytes, const void* in_place,
                    const char* in_place_rule) {
  if (a_bytes == 0 || b_bytes == 0 || b == in_place) return;
  auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  if (x < y + b_bytes && y < x + a_bytes)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: send and recv overlap without being the in-place form ({})",
                    c.rank, what, in_place_rule));
}

}  // namespace front

}  // namespace shmring
