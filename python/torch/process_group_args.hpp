#pragma once

// What ProcessGroupShmring's operations on one host share
// (process_group_collectives.cpp, process_group_p2p.cpp): tensors staged as
// contiguous buffers for shmring, the datatype they move as, the checks of
// roots and lists, the counts and displacements of v-collectives, and the
// Refusal guard that tells the peers of a collective this rank refused.

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <vector>

#include "process_group.hpp"
#include "shmring/types.hpp"

namespace shmring::torch_backend {
// A namespace of their own: CrossNode's helpers (multi_node_args.hpp) have
// some of the same names and signatures (check_list, flatten).
namespace pg_detail {

// A tensor's memory as the collective sees it: the tensor itself when it is
// contiguous, else a contiguous copy that the epilogue copies back.
struct Staged {
  at::Tensor user;
  at::Tensor buffer;
  bool copied() const { return !user.is_same(buffer); }
};

Staged stage(const at::Tensor& tensor);

// Staged for an output only: the copy need not hold the old values.
Staged stage_output(const at::Tensor& tensor);

std::function<void()> copy_back(std::vector<Staged> staged);

// Data movement (broadcast, allgather) does not look at the values: a dtype
// shmring cannot reduce (bool, int16, complex...) moves as bytes.
struct Raw {
  void* data;
  std::size_t count;
  DataType dtype;
};

// The datatype a tensor's elements move as, and how many of its elements
// one tensor element is (1, or the element size when it moves as bytes).
struct MoveType {
  DataType dtype;
  std::size_t per_element;
};

MoveType move_type(const at::Tensor& tensor, const char* op);

Raw raw_of(const at::Tensor& contiguous, const char* op);

void check_root(int root, std::int64_t root_tensor, int size, const char* op);

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what,
                std::int64_t expected_numel);

// Set when launch() hands a call to shmring (whose own refusals reach the
// peers by themselves); a Refusal sees whether an error came before that.
extern thread_local bool t_launched;

// Counts and displacements (in elements of the move type) of a
// v-collective; the Start lambda holds a copy (the i-calls copy the spans).
struct Layout {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
};

std::vector<std::size_t> packed_displs(const std::vector<std::size_t>& counts);

bool all_equal(const std::vector<std::size_t>& v);

std::vector<std::size_t> numels(const std::vector<at::Tensor>& tensors, std::size_t per_element);

// The tensors of a list, in order, as one contiguous 1-D tensor (a copy).
at::Tensor flatten(const std::vector<at::Tensor>& tensors);

// Copies consecutive pieces of `flat` into `outputs`, in order.
std::function<void()> unflatten_into(at::Tensor flat, std::vector<at::Tensor> outputs);

// A list of `size` tensors of one dtype (`like`'s), each checked.
void check_list(const std::vector<at::Tensor>& list, int size, const at::Tensor& like,
                const char* op, const char* what);

// Elements (of the move type) per peer of one side of all_to_all_single:
// dim 0 split evenly over the group when `splits` is empty, else by the
// split sizes (rows of dim 0), as torch defines them.
std::vector<std::size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits,
                                      int size, std::size_t per_element, const char* op,
                                      const char* what);
}  // namespace pg_detail

// Guards one collective entry point: an exception leaving it before launch()
// reached shmring (a TORCH_CHECK refusal, an allocation failure) is told to
// the peers as this rank's refusal of the call. A guard rather than a
// try/catch around each body: the refusal must not depend on which check
// threw, and the exception itself goes on unchanged. Collectives only:
// send/recv are not in the collective order, so their refusals stay local.
class Refusal {
 public:
  Refusal(ProcessGroupShmring& pg, const char* op)
      : pg_(pg), op_(op), unwinding_(std::uncaught_exceptions()) {
    pg_detail::t_launched = false;
  }
  ~Refusal() {
    if (std::uncaught_exceptions() > unwinding_ && !pg_detail::t_launched) pg_.refuse(op_);
  }
  Refusal(const Refusal&) = delete;
  Refusal& operator=(const Refusal&) = delete;

 private:
  ProcessGroupShmring& pg_;
  const char* op_;
  const int unwinding_;
};

}  // namespace shmring::torch_backend
