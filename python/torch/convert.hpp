#pragma once

// The backend's edge: torch types in, shmring types out. Every refusal is a
// c10::Error (RuntimeError in Python) whose message names the operation, the
// value and what was expected.

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "shim.hpp"
#include "shmring/types.hpp"

namespace shmring::torch_backend {

/// shmring's datatype for a tensor element type: float32, float64, float16,
/// bfloat16, int8, uint8, int32, int64. Throws for any other, naming `op`.
DataType to_datatype(at::ScalarType type, const char* op);

/// "torch.float32", "torch.int16", ... as Python spells the dtype.
std::string dtype_name(at::ScalarType type);

/// shmring's operator for SUM, PRODUCT, MIN, MAX, AVG. Throws for BAND, BOR,
/// BXOR and PREMUL_SUM, naming the operator and `op`.
ReduceOp to_reduce_op(const ::c10d::ReduceOp& reduce_op, const char* op);

/// "SUM", "BAND", ... for messages.
std::string reduce_op_name(::c10d::ReduceOp::RedOpType kind);

/// Checks one tensor the backend can hand to shmring: defined, on the CPU,
/// strided (dense). Contiguity is not required (callers stage).
void check_tensor(const at::Tensor& tensor, const char* op, const char* what);

/// Checks a tensor the call writes its result into: no two of its elements
/// share memory (an expand()ed tensor's do), which torch's copy into it
/// would refuse only after the data moved.
void check_written(const at::Tensor& tensor, const char* op, const char* what);

/// The single tensor of a per-process list: shmring runs one process per
/// rank and no multi-device lists. Throws when the list has not exactly one.
const at::Tensor& single_tensor(const std::vector<at::Tensor>& tensors, const char* op,
                                const char* what);

/// Throws the "does not support X yet" error for an operation the core lacks.
[[noreturn]] void unsupported(const char* op);

}  // namespace shmring::torch_backend
