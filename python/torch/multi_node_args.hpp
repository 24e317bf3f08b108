#pragma once

// The argument checks and tensor helpers that CrossNode's operations share
// (multi_node_reduce.cpp, multi_node_move.cpp).

#include <ATen/ATen.h>

#include <vector>

#include "shim.hpp"

// A namespace of their own: ProcessGroupShmring's helpers
// (process_group_args.hpp) have some of the same names and signatures.
namespace shmring::torch_backend::cross_detail {

bool is_16bit(at::ScalarType t);

// A uint8 tensor over the bytes of contiguous `t`, keeping `t` alive.
at::Tensor bytes_of(const at::Tensor& t);

// Checks a reduction's dtype and operator; returns the operator the stages
// run (AVG is a sum, divided by the group size at the end).
::c10d::ReduceOp stage_op(const at::Tensor& t, const ::c10d::ReduceOp& op, const char* name);

void check_list(const std::vector<at::Tensor>& list, int size, const at::Tensor& like,
                const char* op, const char* what);

void check_root(int root, int size, const char* op);

// dst.copy_(src), where `src` holds a float32 result of a 16-bit reduction
// and `dst` (same shape, any strides) is the 16-bit tensor it rounds into.
// torch rounds to nearest even, as shmring's kernels do, but keeps a NaN's
// sign and payload (-NaN becomes float16 0xfe00, bfloat16 0xffff); the
// kernels and the MPI layer write the default quiet NaN (0x7e00, 0x7fc0;
// docs/design/accuracy.md), so NaNs are set to it afterwards. Any other
// pair of dtypes is a plain copy_.
void round_into(const at::Tensor& dst, const at::Tensor& src);

// Copies consecutive pieces of flat `src` into `outputs` (round_into).
void unflatten(const at::Tensor& src, const std::vector<at::Tensor>& outputs);

at::Tensor flatten(const std::vector<at::Tensor>& tensors);

}  // namespace shmring::torch_backend::cross_detail
