// shmring._torch: the Python face of ProcessGroupShmring. python/shmring/torch.py
// registers it with torch.distributed as the backend "shmring".
//
// Built against the torch that /usr/bin/python3 imports, with torch's own
// pybind11 casters (the Store argument and the ProcessGroup base class are
// torch's registered types), so it must match torch's _GLIBCXX_USE_CXX11_ABI
// (meson takes the flag from torch) and pybind11 internals (compared below,
// at import).

#include <pybind11/chrono.h>

#include <string>
#include <utility>

#include <torch/csrc/utils/pybind.h>

#include "process_group.hpp"
#include "shmring/version.hpp"
#include "work.hpp"

namespace py = pybind11;
using shmring::torch_backend::BackendBase;
using shmring::torch_backend::ProcessGroupShmring;

PYBIND11_MODULE(_torch, m) {
  m.doc() = "shmring's torch.distributed backend (import shmring.torch to register it).";
  // Registers torch's c10d types (Store, ProcessGroup) with pybind11 first.
  py::module_::import("torch.distributed");
  // Types are shared only between modules with the same pybind11 internals:
  // say so now, rather than fail to convert the store at the first group.
  py::module_ torch_c = py::module_::import("torch._C");
  const std::pair<const char*, const char*> abi[] = {
      {"_PYBIND11_COMPILER_TYPE", PYBIND11_COMPILER_TYPE},
      {"_PYBIND11_STDLIB", PYBIND11_STDLIB},
      {"_PYBIND11_BUILD_ABI", PYBIND11_BUILD_ABI},
  };
  for (const auto& [name, ours] : abi) {
    if (!py::hasattr(torch_c, name)) continue;
    const auto theirs = torch_c.attr(name).cast<std::string>();
    if (theirs != ours)
      throw py::import_error("shmring._torch was built with pybind11 " + std::string(name + 1) +
                             " '" + ours + "' but torch with '" + theirs +
                             "': rebuild shmring against this torch");
  }

  shmring::torch_backend::set_python_main_thread(
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>());

  py::class_<ProcessGroupShmring, BackendBase, c10::intrusive_ptr<ProcessGroupShmring>>(
      m, "ProcessGroupShmring", R"doc(
A torch.distributed process group over one shmring communicator.

ProcessGroupShmring(store, rank, size, timeout): collective over the `size`
ranks that share `store` (a c10d Store, as init_process_group and new_group
pass it). Rank 0 writes a fresh random nonce to the store and every rank
reads it, so the job id (and the shared-memory segment) is this group's
alone. `timeout` (datetime.timedelta) bounds every wait of a collective
unless SHMRING_TIMEOUT is set. Ranks on several hosts form one shmring
communicator per host, with torch's gloo between the hosts
(docs/guide/torch-multi-node.md). Blocks until all ranks have attached;
raises RuntimeError with shmring's message otherwise.

Supported: allreduce (SUM, PRODUCT, MIN, MAX, AVG), allreduce_coalesced,
broadcast, allgather, _allgather_base, reduce_scatter, _reduce_scatter_base,
reduce, barrier, alltoall_base, alltoall, gather, scatter, send, recv, on CPU
tensors of float32, float64, float16, bfloat16, int8, uint8, int32, int64
(the operations that only move data move any dtype). Other operations raise
RuntimeError naming them.

destroy_process_group() calls shutdown(): the group's communicator, segment
and threads go then, whatever still refers to the group.
)doc")
      .def(py::init([](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<ProcessGroupShmring>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def("shutdown", &ProcessGroupShmring::shutdown, R"doc(
Ends the group now: completes the collectives still pending, waits (at most
10 s) until every rank of the group has called shutdown(), then releases the
communicator, its shared-memory segment and its threads. Later operations
raise RuntimeError. Idempotent. destroy_process_group() calls it.
)doc",
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("job_id", &ProcessGroupShmring::job_id,
                             "The shmring job id of this group: 'torch-' and the nonce.");

  m.attr("__version__") = SHMRING_VERSION_STRING;
}
