#include "convert.hpp"

#include <ATen/MemoryOverlap.h>

#include <c10/util/Exception.h>

namespace shmring::torch_backend {

std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kHalf:
      return "torch.float16";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kChar:
      return "torch.int8";
    case at::kByte:
      return "torch.uint8";
    case at::kShort:
      return "torch.int16";
    case at::kInt:
      return "torch.int32";
    case at::kLong:
      return "torch.int64";
    case at::kBool:
      return "torch.bool";
    case at::kComplexHalf:
      return "torch.complex32";
    case at::kComplexFloat:
      return "torch.complex64";
    case at::kComplexDouble:
      return "torch.complex128";
    default:
      return c10::toString(type);
  }
}

DataType to_datatype(at::ScalarType type, const char* op) {
  switch (type) {
    case at::kFloat:
      return DataType::float32;
    case at::kDouble:
      return DataType::float64;
    case at::kHalf:
      return DataType::float16;
    case at::kBFloat16:
      return DataType::bfloat16;
    case at::kChar:
      return DataType::int8;
    case at::kByte:
      return DataType::uint8;
    case at::kInt:
      return DataType::int32;
    case at::kLong:
      return DataType::int64;
    default:
      break;
  }
  TORCH_CHECK(false, "shmring backend: ", op, " does not support tensors of dtype ",
              dtype_name(type),
              " (supported: float32, float64, float16, bfloat16, int8, uint8, int32, int64)");
}

std::string reduce_op_name(::c10d::ReduceOp::RedOpType kind) {
  using K = ::c10d::ReduceOp::RedOpType;
  switch (kind) {
    case K::SUM:
      return "SUM";
    case K::AVG:
      return "AVG";
    case K::PRODUCT:
      return "PRODUCT";
    case K::MIN:
      return "MIN";
    case K::MAX:
      return "MAX";
    case K::BAND:
      return "BAND";
    case K::BOR:
      return "BOR";
    case K::BXOR:
      return "BXOR";
    case K::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "ReduceOp(" + std::to_string(static_cast<int>(kind)) + ")";
  }
}

ReduceOp to_reduce_op(const ::c10d::ReduceOp& reduce_op, const char* op) {
  using K = ::c10d::ReduceOp::RedOpType;
  const K kind = reduce_op_kind(reduce_op);
  switch (kind) {
    case K::SUM:
      return ReduceOp::sum;
    case K::AVG:
      return ReduceOp::avg;
    case K::PRODUCT:
      return ReduceOp::prod;
    case K::MIN:
      return ReduceOp::min;
    case K::MAX:
      return ReduceOp::max;
    default:
      break;
  }
  TORCH_CHECK(false, "shmring backend: ", op, " does not support ReduceOp.", reduce_op_name(kind),
              " (supported: SUM, PRODUCT, MIN, MAX, AVG)");
}

void check_tensor(const at::Tensor& tensor, const char* op, const char* what) {
  TORCH_CHECK(tensor.defined(), "shmring backend: ", op, ": ", what, " is an undefined tensor");
  TORCH_CHECK(tensor.device().is_cpu(), "shmring backend: ", op, ": ", what, " is on ",
              tensor.device().str(),
              "; shmring moves CPU tensors only (use the nccl backend for GPU tensors)");
  TORCH_CHECK(tensor.layout() == at::kStrided, "shmring backend: ", op, ": ", what, " has layout ",
              tensor.layout(), "; only dense (strided) tensors are supported");
}

void check_written(const at::Tensor& tensor, const char* op, const char* what) {
  TORCH_CHECK(at::has_internal_overlap(tensor) != at::MemOverlap::Yes, "shmring backend: ", op,
              ": ", what,
              " has elements that share memory (an expanded tensor?), so the result "
              "cannot be written into it; pass a tensor whose elements are its own (t.clone())");
}

const at::Tensor& single_tensor(const std::vector<at::Tensor>& tensors, const char* op,
                                const char* what) {
  TORCH_CHECK(tensors.size() == 1, "shmring backend: ", op, " takes exactly one ", what,
              " tensor per process, got ", tensors.size(),
              " (shmring runs one process per rank; multi-tensor lists are not supported)");
  check_tensor(tensors[0], op, what);
  return tensors[0];
}

void unsupported(const char* op) {
  TORCH_CHECK(false, "shmring backend does not support ", op, " yet");
}

}  // namespace shmring::torch_backend
