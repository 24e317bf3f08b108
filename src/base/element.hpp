#pragma once

// Bytes per element of a DataType and whether it is a floating type,
// inline: the one definition behind the public datatype_size and
// is_floating (types.cpp), for hot paths whose dtype is already checked.

#include <cstddef>
#include <cstdint>

#include "shmring/types.hpp"

namespace shmring::detail {

/// Bytes per element of `dtype`, which must be a DataType (0 ..
/// kNumDataTypes - 1; the front checks it). No throw, no call.
constexpr std::size_t element_bytes(DataType dtype) {
  constexpr std::uint8_t kBytes[kNumDataTypes] = {
      4,  // float32
      8,  // float64
      2,  // float16
      2,  // bfloat16
      1,  // int8
      1,  // uint8
      4,  // int32
      8,  // int64
  };
  return kBytes[static_cast<unsigned>(dtype)];
}

/// Whether `dtype` is float32, float64, float16 or bfloat16.
constexpr bool floating(DataType dtype) {
  return dtype == DataType::float32 || dtype == DataType::float64 || dtype == DataType::float16 ||
         dtype == DataType::bfloat16;
}

// The table against the element types themselves, entry by entry.
static_assert(element_bytes(DataType::float32) == sizeof(float) &&
              element_bytes(DataType::float64) == sizeof(double) &&
              element_bytes(DataType::float16) == sizeof(float16_t) &&
              element_bytes(DataType::bfloat16) == sizeof(bfloat16_t) &&
              element_bytes(DataType::int8) == sizeof(std::int8_t) &&
              element_bytes(DataType::uint8) == sizeof(std::uint8_t) &&
              element_bytes(DataType::int32) == sizeof(std::int32_t) &&
              element_bytes(DataType::int64) == sizeof(std::int64_t));

}  // namespace shmring::detail
