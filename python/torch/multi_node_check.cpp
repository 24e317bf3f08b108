// CrossNode's comparison of every rank's call (multi_node.hpp CallPrint),
// on when torch's debug level is DETAIL (TORCH_DISTRIBUTED_DEBUG=DETAIL):
// inside a host shmring compares each call's descriptor on every call; the
// stages between hosts go to gloo, which compares nothing, so a call whose
// arguments differ between hosts would end a process on one of gloo's
// checks or return wrong data (docs/guide/torch-multi-node.md). torch's own
// DETAIL checks (ProcessGroupWrapper) cover its built-in backends only.
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

#include "convert.hpp"
#include "multi_node.hpp"

namespace shmring::torch_backend {
namespace {

constexpr std::size_t kFixed = 6;  // op, dtype, numel, root, reduce_op, list hash

// FNV-1a over the counts, kept non-negative (-1 marks "no list").
std::int64_t hash_counts(const std::vector<std::int64_t>& counts) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::int64_t c : counts)
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<std::uint64_t>(c) >> (8 * b)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  return static_cast<std::int64_t>(h >> 1);
}

std::string describe(const std::int64_t* row) {
  std::ostringstream s;
  const auto op = static_cast<::c10d::OpType>(row[0]);
  s << ::c10d::opTypeToString(op) << "(";
  const char* sep = "";
  if (row[4] >= 0) {
    s << reduce_op_name(static_cast<::c10d::ReduceOp::RedOpType>(row[4]));
    sep = ", ";
  }
  if (row[1] >= 0) {
    s << sep << dtype_name(static_cast<at::ScalarType>(row[1]));
    sep = ", ";
  }
  if (row[2] >= 0) {
    s << sep << row[2] << " elements";
    sep = ", ";
  }
  if (row[3] >= 0) s << sep << "root " << row[3];
  s << ")";
  return s.str();
}

}  // namespace

c10::intrusive_ptr<Work> CrossNode::submit(const char* title, std::vector<at::Tensor> result,
                                           CallPrint print, Body body) {
  const ::c10d::OpType type = print.op;
  if (!check_calls_) return submit(type, title, std::move(result), std::move(body));
  return submit(type, title, std::move(result),
                [this, print = std::move(print), body = std::move(body)] {
                  check_print(print);
                  body();
                });
}

void CrossNode::check_print(const CallPrint& print) {
  const std::size_t size = static_cast<std::size_t>(size_);
  const std::size_t width = kFixed + 2 * size;
  at::Tensor mine = at::full({static_cast<std::int64_t>(width)}, -1, at::kLong);
  std::int64_t* m = mine.data_ptr<std::int64_t>();
  m[0] = static_cast<std::int64_t>(print.op);
  m[1] = print.dtype;
  m[2] = print.numel;
  m[3] = print.root;
  m[4] = print.reduce_op;
  m[5] = print.list_numels.empty() ? -1 : hash_counts(print.list_numels);
  for (std::size_t j = 0; j < print.send_bytes.size() && j < size; ++j)
    m[kFixed + j] = print.send_bytes[j];
  for (std::size_t j = 0; j < print.recv_bytes.size() && j < size; ++j)
    m[kFixed + size + j] = print.recv_bytes[j];
  at::Tensor all = at::empty({static_cast<std::int64_t>(size * width)}, at::kLong);
  std::vector<std::vector<at::Tensor>> outs(1);
  for (std::size_t r = 0; r < size; ++r)
    outs[0].push_back(
        all.narrow(0, static_cast<std::int64_t>(r * width), static_cast<std::int64_t>(width)));
  std::vector<at::Tensor> ins{mine};
  gloo_wait(world_->allgather(outs, ins));
  const std::int64_t* rows = all.data_ptr<std::int64_t>();
  auto row = [&](std::size_t r) { return rows + r * width; };
  const char* head =
      "shmring backend: collective mismatch across the group (compared because torch's debug "
      "level is DETAIL): ";
  const char* tail = "; nothing ran, and the group stays usable";
  for (std::size_t r = 1; r < size; ++r) {
    if (!std::equal(row(0), row(0) + kFixed - 1, row(r)))
      throw CallMismatch(std::string(head) + "rank 0 called " + describe(row(0)) + " but rank " +
                         std::to_string(r) + " called " + describe(row(r)) + tail);
    if (row(0)[kFixed - 1] != row(r)[kFixed - 1])
      throw CallMismatch(std::string(head) + "rank 0 and rank " + std::to_string(r) + " called " +
                         describe(row(0)) +
                         " with tensor lists whose element counts differ (the same total, in "
                         "another order or split); every rank must pass lists of the same sizes" +
                         tail);
  }
  if (print.op != ::c10d::OpType::ALLTOALL && print.op != ::c10d::OpType::ALLTOALL_BASE) return;
  // Every rank runs the same all_to_all: what i sends to j is what j
  // expects from i.
  for (std::size_t i = 0; i < size; ++i)
    for (std::size_t j = 0; j < size; ++j) {
      const std::int64_t sent = row(i)[kFixed + j], expected = row(j)[kFixed + size + i];
      if (sent != expected)
        throw CallMismatch(std::string(head) + describe(row(0)) + ": rank " + std::to_string(i) +
                           " sends " + std::to_string(sent) + " bytes to rank " +
                           std::to_string(j) + ", which expects " + std::to_string(expected) +
                           " bytes from it" + tail);
    }
}

}  // namespace shmring::torch_backend
