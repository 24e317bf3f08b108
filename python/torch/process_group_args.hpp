#pragma once

// What ProcessGroupShmring's operations on one host share
// (process_group_collectives.cpp, process_group_p2p.cpp): tensors staged as
// contiguous buffers for shmring, the datatype they move as, the checks of
// roots and lists, the counts and displacements of v-collectives, and the
// guard (refusing) that tells the peers of a collective this rank refused.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

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

// The epilogue that copies each staged copy back into its tensor. Throws
// c10::Error, before anything moved, when such a tensor has elements that
// share memory (an expand()ed result cannot hold one).
std::function<void()> copy_back(std::vector<Staged> staged, const char* op);

// Data movement (broadcast, allgather) does not look at the values: a dtype
// shmring cannot reduce (bool, int16, complex...) moves as bytes.
struct Raw {
  void* data;
  std::size_t count;
  DataType dtype;
};

// The datatype a tensor's elements move as, and how many of its elements
// one tensor element is (1, or the element size when it moves as bytes).
// `as_bytes`: the dtype is not one of shmring's, so the communicator sees
// only bytes and cannot tell it from another dtype of the same size
// (ProcessGroupShmring::agree_on_moved_dtype compares it instead).
struct MoveType {
  DataType dtype;
  std::size_t per_element;
  bool as_bytes = false;
};

MoveType move_type(const at::Tensor& tensor, const char* op);

Raw raw_of(const at::Tensor& contiguous, const char* op);

void check_root(int root, std::int64_t root_tensor, int size, const char* op);

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what,
                std::int64_t expected_numel);

// Set when launch() hands a call to shmring (whose own refusals reach the
// peers by themselves); refusing() sees whether an error came before that.
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

// Copies consecutive pieces of `flat` into `outputs`, in order. Throws
// c10::Error, as copy_back does, for an output whose elements share memory.
std::function<void()> unflatten_into(at::Tensor flat, std::vector<at::Tensor> outputs,
                                     const char* op);

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

// Runs one collective entry point's body (argument checks, staging,
// launch()): an exception leaving it before launch() reached shmring (a
// TORCH_CHECK refusal, an allocation failure) is told to the peers as this
// rank's refusal of the call, with the exception's message as the reason, and
// goes on unchanged. One wrapper rather than a try/catch in each body: the
// refusal must not depend on which check threw. Collectives only: send/recv
// are not in the collective order, so their refusals stay local.
template <class Body>
c10::intrusive_ptr<Work> ProcessGroupShmring::refusing(const char* op, Body&& body) {
  pg_detail::t_launched = false;
  try {
    return body();
  } catch (const c10::Error& e) {
    if (!pg_detail::t_launched) refuse(op, e.what_without_backtrace());
    throw;
  } catch (const std::exception& e) {
    if (!pg_detail::t_launched) refuse(op, e.what());
    throw;
  } catch (...) {
    if (!pg_detail::t_launched) refuse(op, "a non-standard exception");
    throw;
  }
}

}  // namespace shmring::torch_backend
