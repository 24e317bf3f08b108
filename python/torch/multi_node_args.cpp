// The helpers of multi_node_args.hpp.
#include "multi_node_args.hpp"

#include <c10/util/Exception.h>

#include <cstdint>
#include <limits>

#include "convert.hpp"

namespace shmring::torch_backend::cross_detail {

bool is_16bit(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16;
}

at::Tensor bytes_of(const at::Tensor& t) {
  const auto n = static_cast<std::int64_t>(t.numel() * t.element_size());
  return at::from_blob(
      t.data_ptr(), {n}, [keep = t](void*) {}, at::TensorOptions().dtype(at::kByte));
}

::c10d::ReduceOp stage_op(const at::Tensor& t, const ::c10d::ReduceOp& op, const char* name) {
  to_datatype(t.scalar_type(), name);
  to_reduce_op(op, name);
  if (reduce_op_kind(op) == ::c10d::ReduceOp::AVG) {
    TORCH_CHECK(at::isFloatingType(t.scalar_type()), "shmring backend: ", name,
                ": AVG needs a floating dtype, got ", dtype_name(t.scalar_type()),
                "; use SUM and divide");
    return ::c10d::ReduceOp(::c10d::ReduceOp::SUM);
  }
  return op;
}

void check_list(const std::vector<at::Tensor>& list, int size, const at::Tensor& like,
                const char* op, const char* what) {
  TORCH_CHECK(static_cast<int>(list.size()) == size, "shmring backend: ", op, ": the ", what,
              " list has ", list.size(), " tensors, expected the group size ", size);
  for (const auto& t : list) {
    check_tensor(t, op, what);
    TORCH_CHECK(t.scalar_type() == like.scalar_type(), "shmring backend: ", op, ": an ", what,
                " tensor has dtype ", dtype_name(t.scalar_type()), ", expected ",
                dtype_name(like.scalar_type()));
  }
}

void check_root(int root, int size, const char* op) {
  TORCH_CHECK(root >= 0 && root < size, "shmring backend: ", op, ": root rank ", root,
              " is not in [0, ", size, ")");
}

void round_into(const at::Tensor& dst, const at::Tensor& src) {
  dst.copy_(src);
  if (is_16bit(dst.scalar_type()) && src.scalar_type() != dst.scalar_type())
    dst.masked_fill_(dst.isnan(), std::numeric_limits<float>::quiet_NaN());
}

void unflatten(const at::Tensor& src, const std::vector<at::Tensor>& outputs) {
  std::int64_t offset = 0;
  for (const auto& o : outputs) {
    round_into(o, src.narrow(0, offset, o.numel()).view(o.sizes()));
    offset += o.numel();
  }
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> views;
  for (const auto& t : tensors) views.push_back(t.reshape({-1}));
  return at::cat(views);
}
}  // namespace shmring::torch_backend::cross_detail
