// The helpers of process_group_args.hpp: staging, move types, checks and
// v-collective layouts of ProcessGroupShmring's operations on one host.
#include "process_group_args.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>

#include "convert.hpp"

namespace shmring::torch_backend::pg_detail {

Staged stage(const at::Tensor& tensor) {
  if (tensor.is_contiguous()) return {tensor, tensor};
  return {tensor, tensor.contiguous()};
}

Staged stage_output(const at::Tensor& tensor) {
  if (tensor.is_contiguous()) return {tensor, tensor};
  return {tensor, at::empty(tensor.sizes(), tensor.options())};
}

std::function<void()> copy_back(std::vector<Staged> staged, const char* op) {
  // A contiguous tensor is its own buffer, and none of its elements overlap.
  std::erase_if(staged, [](const Staged& s) { return !s.copied(); });
  for (const auto& s : staged) check_written(s.user, op, "the result tensor");
  if (staged.empty()) return nullptr;
  return [staged = std::move(staged)] {
    for (const auto& s : staged) s.user.copy_(s.buffer);
  };
}

MoveType move_type(const at::Tensor& tensor, const char* op) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong:
      return {to_datatype(tensor.scalar_type(), op), 1};
    default:
      return {DataType::uint8, static_cast<std::size_t>(tensor.element_size()), true};
  }
}

Raw raw_of(const at::Tensor& contiguous, const char* op) {
  const MoveType m = move_type(contiguous, op);
  return {contiguous.data_ptr(), static_cast<std::size_t>(contiguous.numel()) * m.per_element,
          m.dtype};
}

void check_root(int root, std::int64_t root_tensor, int size, const char* op) {
  TORCH_CHECK(root >= 0 && root < size, "shmring backend: ", op, ": root rank ", root,
              " is not in [0, ", size, ")");
  TORCH_CHECK(root_tensor == 0, "shmring backend: ", op, ": root tensor index ", root_tensor,
              " given, but there is one tensor per process (index 0)");
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what,
                std::int64_t expected_numel) {
  TORCH_CHECK(b.scalar_type() == a.scalar_type(), "shmring backend: ", op, ": ", what,
              " has dtype ", dtype_name(b.scalar_type()), ", expected ",
              dtype_name(a.scalar_type()));
  TORCH_CHECK(b.numel() == expected_numel, "shmring backend: ", op, ": ", what, " has ", b.numel(),
              " elements, expected ", expected_numel);
}

thread_local bool t_launched = false;

std::vector<std::size_t> packed_displs(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> displs(counts.size());
  std::size_t offset = 0;
  for (std::size_t j = 0; j < counts.size(); ++j) {
    displs[j] = offset;
    offset += counts[j];
  }
  return displs;
}

bool all_equal(const std::vector<std::size_t>& v) {
  return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<>()) == v.end();
}

std::vector<std::size_t> numels(const std::vector<at::Tensor>& tensors, std::size_t per_element) {
  std::vector<std::size_t> out;
  for (const auto& t : tensors) out.push_back(static_cast<std::size_t>(t.numel()) * per_element);
  return out;
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> views;
  for (const auto& t : tensors) views.push_back(t.reshape({-1}));
  return at::cat(views);
}

std::function<void()> unflatten_into(at::Tensor flat, std::vector<at::Tensor> outputs,
                                     const char* op) {
  for (const auto& o : outputs) check_written(o, op, "an output");
  return [flat = std::move(flat), outputs = std::move(outputs)] {
    std::int64_t offset = 0;
    for (const auto& o : outputs) {
      o.copy_(flat.narrow(0, offset, o.numel()).view(o.sizes()));
      offset += o.numel();
    }
  };
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

std::vector<std::size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits,
                                      int size, std::size_t per_element, const char* op,
                                      const char* what) {
  TORCH_CHECK(t.dim() >= 1, "shmring backend: ", op, ": the ", what,
              " tensor is 0-dimensional; its dim 0 is split over the group");
  const std::int64_t rows = t.size(0);
  const std::size_t row = rows > 0 ? static_cast<std::size_t>(t.numel() / rows) * per_element : 0;
  std::vector<std::size_t> counts(static_cast<std::size_t>(size));
  if (splits.empty()) {
    TORCH_CHECK(rows % size == 0, "shmring backend: ", op, ": the ", what, " tensor has ", rows,
                " rows (dim 0), not a multiple of the group size ", size,
                "; give split sizes for uneven splits");
    std::fill(counts.begin(), counts.end(), static_cast<std::size_t>(rows / size) * row);
    return counts;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == size, "shmring backend: ", op, ": ", what,
              " split sizes have ", splits.size(), " entries, expected the group size ", size);
  std::int64_t sum = 0;
  for (std::size_t j = 0; j < splits.size(); ++j) {
    TORCH_CHECK(splits[j] >= 0, "shmring backend: ", op, ": ", what, " split size ", j, " is ",
                splits[j], ", expected >= 0");
    sum += splits[j];
    counts[j] = static_cast<std::size_t>(splits[j]) * row;
  }
  TORCH_CHECK(sum == rows, "shmring backend: ", op, ": ", what, " split sizes sum to ", sum,
              " but the ", what, " tensor has ", rows, " rows (dim 0)");
  return counts;
}
}  // namespace shmring::torch_backend::pg_detail
