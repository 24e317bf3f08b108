#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "shmring/export.hpp"

namespace shmring {

/// Element type of a collective's buffers. Values are stable (they travel in
/// shared memory and in the C API).
enum class DataType : std::uint8_t {
  float32 = 0,
  float64 = 1,
  float16 = 2,   ///< IEEE 754 binary16, stored as 16 bits.
  bfloat16 = 3,  ///< bfloat16 (8-bit exponent, 7-bit mantissa), stored as 16 bits.
  int8 = 4,
  uint8 = 5,
  int32 = 6,
  int64 = 7,
};
inline constexpr int kNumDataTypes = 8;

/// Reduction operator. Integer sum and prod wrap around (two's complement), as
/// in MPI and NCCL. `avg` is sum divided by the world size, on floating types
/// only. NaN propagates through every operator. On floating types min and
/// max are IEEE 754-2019 minimum and maximum: -0 < +0, and a NaN in any
/// input gives the default quiet NaN, so their result bits do not depend on
/// the order in which ranks are combined (the same on every path).
enum class ReduceOp : std::uint8_t {
  sum = 0,
  prod = 1,
  min = 2,
  max = 3,
  avg = 4,
};
inline constexpr int kNumReduceOps = 5;

/// 16-bit storage types for float16 and bfloat16 buffers (the bits only; no
/// arithmetic). Layout-compatible with torch.float16 / torch.bfloat16 elements.
struct float16_t {
  std::uint16_t bits;
};
struct bfloat16_t {
  std::uint16_t bits;
};

/// Size of one element in bytes. Throws InvalidArgumentError for a value that
/// is not a DataType.
SHMRING_API std::size_t datatype_size(DataType dtype);
/// True for float32, float64, float16 and bfloat16.
SHMRING_API bool is_floating(DataType dtype);
/// "float32", "bfloat16", ... ; "invalid(N)" for an out-of-range value.
SHMRING_API std::string_view to_string(DataType dtype);
/// "sum", "prod", "min", "max", "avg"; "invalid(N)" for an out-of-range value.
SHMRING_API std::string_view to_string(ReduceOp op);

/// DataType of a C++ element type, for the typed std::span overloads.
template <class T>
struct datatype_of;
template <>
struct datatype_of<float> {
  static constexpr DataType value = DataType::float32;
};
template <>
struct datatype_of<double> {
  static constexpr DataType value = DataType::float64;
};
template <>
struct datatype_of<float16_t> {
  static constexpr DataType value = DataType::float16;
};
template <>
struct datatype_of<bfloat16_t> {
  static constexpr DataType value = DataType::bfloat16;
};
template <>
struct datatype_of<std::int8_t> {
  static constexpr DataType value = DataType::int8;
};
template <>
struct datatype_of<std::uint8_t> {
  static constexpr DataType value = DataType::uint8;
};
template <>
struct datatype_of<std::int32_t> {
  static constexpr DataType value = DataType::int32;
};
template <>
struct datatype_of<std::int64_t> {
  static constexpr DataType value = DataType::int64;
};
template <class T>
inline constexpr DataType datatype_of_v = datatype_of<T>::value;

}  // namespace shmring
