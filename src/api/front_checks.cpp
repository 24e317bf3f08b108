// The front's argument checks (front_checks.hpp): the messages of a refused
// call, out of line and cold.

#include "api/front_checks.hpp"

#include <fmt/format.h>

namespace shmring::front {

// Each throws InvalidArgumentError naming the rank, the collective, the value
// and what was expected.

void refuse_dtype(const Communicator::Impl& c, const char* what, DataType dtype) {
  throw InvalidArgumentError(fmt::format("rank {}: {}: datatype {} is not a DataType (0..{})",
                                         c.rank, what, static_cast<int>(dtype), kNumDataTypes - 1));
}

void refuse_op(const Communicator::Impl& c, const char* what, DataType dtype, ReduceOp op) {
  if (static_cast<unsigned>(op) >= static_cast<unsigned>(kNumReduceOps))
    throw InvalidArgumentError(fmt::format("rank {}: {}: operator {} is not a ReduceOp (0..{})",
                                           c.rank, what, static_cast<int>(op), kNumReduceOps - 1));
  throw InvalidArgumentError(
      fmt::format("rank {}: {}: avg needs a floating datatype, got {}; use sum and divide", c.rank,
                  what, to_string(dtype)));
}

void refuse_root(const Communicator::Impl& c, const char* what, int root) {
  throw InvalidArgumentError(
      fmt::format("rank {}: {}: root {} is not a rank of this communicator (0..{})", c.rank, what,
                  root, c.size - 1));
}

void refuse_overflow(const Communicator::Impl& c, const char* what, std::size_t count,
                     DataType dtype, std::size_t factor) {
  throw InvalidArgumentError(fmt::format("rank {}: {}: count {} of {} (x{}) overflows", c.rank,
                                         what, count, to_string(dtype), factor));
}

void refuse_null(const Communicator::Impl& c, const char* what, const char* name,
                 std::size_t bytes) {
  throw InvalidArgumentError(
      fmt::format("rank {}: {}: {} is null but holds {} bytes", c.rank, what, name, bytes));
}

void refuse_overlap(const Communicator::Impl& c, const char* what, const char* in_place_rule) {
  throw InvalidArgumentError(
      fmt::format("rank {}: {}: send and recv overlap without being the in-place form ({})", c.rank,
                  what, in_place_rule));
}

}  // namespace shmring::front
