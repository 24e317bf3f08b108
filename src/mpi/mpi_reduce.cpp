// The MPI side of a reduction: shmring's datatypes and operators mapped to
// MPI's, with shmring's semantics kept across nodes.
//
// - avg is MPI_SUM, then one division by the communicator's size, done by
//   whoever holds the final sum (every rank for allreduce, the root for
//   reduce).
// - float16 and bfloat16: MPI has neither. The buffer is widened to float32
//   (exact), reduced by MPI as float32 and rounded back once (to nearest
//   even), after the division for avg. This doubles the bytes on the network
//   for 16-bit types but rounds once instead of at every step of MPI's
//   algorithm, and MPI's own vectorised float32 operators do the work. (A
//   user-defined MPI_Op on MPI_UINT16_T would move half the bytes and round
//   at every combining step.)
// - min and max on floating types are IEEE 754-2019 minimum / maximum
//   (-0 < +0; any NaN gives the default quiet NaN), as shmring's kernels
//   (kernels/reduce.hpp): commutative to the bit, so the result does not
//   depend on how MPI orders the nodes. MPI_MIN/MPI_MAX promise neither, so
//   they are user-defined operators.
// - Buffers past 2^30 elements go in pieces (MPI counts are int), and every
//   stage in calls of at most call_bytes (kDefaultCallBytes: 2 MiB).

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "impl.hpp"

// The widening and narrowing loops run on every 16-bit element that crosses
// the network: F16C (x86-64-v3) converts 8 at a time where the CPU has it.
#if defined(__x86_64__)
#define SHMRING_MPI_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SHMRING_MPI_CLONES
#endif

namespace shmring::mpi {

namespace {

// --- 16-bit floats <-> float32 (round to nearest even; any NaN result is
// the default quiet NaN, as in the node's kernels: docs/design/accuracy.md) --

float bf16_to_f32(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

float f16_to_f32(std::uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, 2);
  return static_cast<float>(x);
}

std::uint16_t f32_to_f16(float f) {
  if (std::isnan(f)) return 0x7e00;
  const auto x = static_cast<_Float16>(f);  // IEEE conversion: nearest even
  std::uint16_t h;
  std::memcpy(&h, &x, 2);
  return h;
}

SHMRING_MPI_CLONES void widen(const void* src, float* dst, std::size_t n, DataType dtype) {
  auto* s = static_cast<const std::uint16_t*>(src);
  if (dtype == DataType::bfloat16)
    for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  else
    for (std::size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
}

SHMRING_MPI_CLONES void narrow(const float* src, void* dst, std::size_t n, DataType dtype) {
  auto* d = static_cast<std::uint16_t*>(dst);
  if (dtype == DataType::bfloat16)
    for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
  else
    for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
}

bool is_16bit_float(DataType t) {
  return t == DataType::float16 || t == DataType::bfloat16;
}

// --- IEEE 754-2019 minimum and maximum, for MPI_FLOAT and MPI_DOUBLE ------

template <class T, bool kMax>
void ieee_minmax(const T* in, T* inout, int n) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  for (int i = 0; i < n; ++i) {
    const T a = in[i], b = inout[i];
    T r = kMax ? (a > b ? a : b) : (a < b ? a : b);
    if (a == b) {  // equal: the same bits, or -0 and +0 (min: -0, max: +0)
      U ua, ub;
      std::memcpy(&ua, &a, sizeof a);
      std::memcpy(&ub, &b, sizeof b);
      const U u = kMax ? (ua & ub) : (ua | ub);
      std::memcpy(&r, &u, sizeof r);
    }
    if (a != a || b != b) r = std::numeric_limits<T>::quiet_NaN();
    inout[i] = r;
  }
}

template <bool kMax>
void ieee_minmax_op(void* in, void* inout, int* len, MPI_Datatype* type) {
  if (*type == MPI_DOUBLE)
    ieee_minmax<double, kMax>(static_cast<const double*>(in), static_cast<double*>(inout), *len);
  else
    ieee_minmax<float, kMax>(static_cast<const float*>(in), static_cast<float*>(inout), *len);
}

MPI_Datatype mpi_type(DataType t) {
  switch (t) {
    case DataType::float32:
    case DataType::float16:  // widened first
    case DataType::bfloat16:
      return MPI_FLOAT;
    case DataType::float64:
      return MPI_DOUBLE;
    case DataType::int8:
      return MPI_INT8_T;
    case DataType::uint8:
      return MPI_UINT8_T;
    case DataType::int32:
      return MPI_INT32_T;
    case DataType::int64:
      return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

}  // namespace

void Communicator::Impl::create_ops() {
  check_mpi(MPI_Op_create(&ieee_minmax_op<false>, 1, &nan_min), "setup: MPI_Op_create (min)");
  check_mpi(MPI_Op_create(&ieee_minmax_op<true>, 1, &nan_max), "setup: MPI_Op_create (max)");
}

void Communicator::Impl::free_ops() noexcept {
  if (nan_min != MPI_OP_NULL) MPI_Op_free(&nan_min);
  if (nan_max != MPI_OP_NULL) MPI_Op_free(&nan_max);
}

namespace {

MPI_Op mpi_op(const Communicator::Impl& c, DataType t, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return MPI_SUM;
    case ReduceOp::prod:
      return MPI_PROD;
    case ReduceOp::min:
      return is_floating(t) ? c.nan_min : MPI_MIN;
    case ReduceOp::max:
      return is_floating(t) ? c.nan_max : MPI_MAX;
  }
  return MPI_OP_NULL;
}

template <class T>
void divide(T* p, std::size_t n, int by) {
  const T d = static_cast<T>(by);
  for (std::size_t i = 0; i < n; ++i) p[i] /= d;
}

// avg's one division, on the float32 / float64 values MPI reduced.
void divide_for_avg(void* p, std::size_t n, DataType wire, int by) {
  if (wire == DataType::float64)
    divide(static_cast<double*>(p), n, by);
  else
    divide(static_cast<float*>(p), n, by);
}

}  // namespace

std::size_t Communicator::Impl::per_call(std::size_t esize) const {
  if (call_bytes == 0) return kMaxMpiCount;
  return std::clamp<std::size_t>(call_bytes / esize, 1, kMaxMpiCount);
}

void Communicator::Impl::mpi_allreduce(void* buf, std::size_t count, DataType dtype, ReduceOp op,
                                       MPI_Comm comm, const char* stage) {
  if (count == 0) return;
  const bool wide16 = is_16bit_float(dtype);
  void* data = buf;
  if (wide16) {
    auto* w = reinterpret_cast<float*>(scratch_bytes(wide, count * sizeof(float)));
    widen(buf, w, count, dtype);
    data = w;
  }
  const DataType wire = wide16 ? DataType::float32 : dtype;
  const std::size_t esize = datatype_size(wire);
  const std::size_t step = per_call(esize);
  for (std::size_t off = 0; off < count; off += step) {
    const std::size_t n = std::min(step, count - off);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, static_cast<std::byte*>(data) + off * esize,
                            static_cast<int>(n), mpi_type(dtype), mpi_op(*this, dtype, op), comm),
              stage);
  }
  if (op == ReduceOp::avg) divide_for_avg(data, count, wire, size);
  if (wide16) narrow(static_cast<const float*>(data), buf, count, dtype);
}

MpiStage Communicator::Impl::mpi_iallreduce_start(void* buf, std::size_t count, DataType dtype,
                                                  ReduceOp op, MPI_Comm comm, float* wide,
                                                  const char* stage) {
  MpiStage s;
  s.buf = buf;
  s.count = count;
  s.dtype = dtype;
  s.op = op;
  void* data = buf;
  if (is_16bit_float(dtype)) {
    widen(buf, wide, count, dtype);
    s.wide = wide;
    data = wide;
  }
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), mpi_type(dtype),
                           mpi_op(*this, dtype, op), comm, &s.request),
            stage);
  return s;
}

bool Communicator::Impl::mpi_iallreduce_test(MpiStage& s, const char* stage) {
  if (s.request == MPI_REQUEST_NULL) return true;
  int done = 0;
  check_mpi(MPI_Test(&s.request, &done, MPI_STATUS_IGNORE), stage);
  if (!done) return false;
  void* data = s.wide ? static_cast<void*>(s.wide) : s.buf;
  const DataType wire = s.wide ? DataType::float32 : s.dtype;
  if (s.op == ReduceOp::avg) divide_for_avg(data, s.count, wire, size);
  if (s.wide) narrow(s.wide, s.buf, s.count, s.dtype);
  return true;
}

void Communicator::Impl::mpi_reduce_scatter_block(const void* send, void* recv, std::size_t count,
                                                  DataType dtype, ReduceOp op, MPI_Comm comm,
                                                  const char* stage) {
  if (count == 0) return;
  int members = 1;
  MPI_Comm_size(comm, &members);
  const std::size_t total = count * static_cast<std::size_t>(members);
  const bool wide16 = is_16bit_float(dtype);
  const void* in = send;
  void* out = recv;
  if (wide16) {
    // [total floats in | count floats out]
    auto* w = reinterpret_cast<float*>(scratch_bytes(wide, (total + count) * sizeof(float)));
    widen(send, w, total, dtype);
    in = w;
    out = w + total;
  }
  check_mpi(MPI_Reduce_scatter_block(in, out, static_cast<int>(count), mpi_type(dtype),
                                     mpi_op(*this, dtype, op), comm),
            stage);
  const DataType wire = wide16 ? DataType::float32 : dtype;
  if (op == ReduceOp::avg) divide_for_avg(out, count, wire, size);
  if (wide16) narrow(static_cast<const float*>(out), recv, count, dtype);
}

void Communicator::Impl::mpi_reduce(void* buf, std::size_t count, DataType dtype, ReduceOp op,
                                    int root, MPI_Comm comm, const char* stage) {
  if (count == 0) return;
  int me = 0;
  MPI_Comm_rank(comm, &me);
  const bool at_root = me == root;
  const bool wide16 = is_16bit_float(dtype);
  void* data = buf;
  if (wide16) {
    auto* w = reinterpret_cast<float*>(scratch_bytes(wide, count * sizeof(float)));
    widen(buf, w, count, dtype);
    data = w;
  }
  const DataType wire = wide16 ? DataType::float32 : dtype;
  const std::size_t esize = datatype_size(wire);
  const std::size_t step = per_call(esize);
  for (std::size_t off = 0; off < count; off += step) {
    const std::size_t n = std::min(step, count - off);
    std::byte* p = static_cast<std::byte*>(data) + off * esize;
    check_mpi(MPI_Reduce(at_root ? MPI_IN_PLACE : p, at_root ? p : nullptr, static_cast<int>(n),
                         mpi_type(dtype), mpi_op(*this, dtype, op), root, comm),
              stage);
  }
  if (!at_root) return;
  if (op == ReduceOp::avg) divide_for_avg(data, count, wire, size);
  if (wide16) narrow(static_cast<const float*>(data), buf, count, dtype);
}

void Communicator::Impl::mpi_bcast(void* buf, std::size_t bytes, int root, MPI_Comm comm,
                                   const char* stage) {
  const std::size_t step = per_call(1);
  for (std::size_t off = 0; off < bytes; off += step) {
    const std::size_t n = std::min(step, bytes - off);
    check_mpi(
        MPI_Bcast(static_cast<std::byte*>(buf) + off, static_cast<int>(n), MPI_BYTE, root, comm),
        stage);
  }
}

}  // namespace shmring::mpi
