#pragma once

// Everything in the backend that depends on the torch version lives here, so
// that porting to another torch is this one file.
//
// torch 1.13 (Debian 12): a backend derives from c10d::ProcessGroup and is
// registered with Backend.register_backend(name, creator); its Work type is
// c10d::Work (Work.hpp).
// torch >= 2.0: a backend derives from c10d::Backend (ProcessGroup became a
// dispatcher in front of one Backend per device type), register_backend
// takes `devices=`, and the Python side wraps the Backend (python/shmring/torch.py
// handles that part). The collective signatures, Work and the option structs
// kept their 1.13 shape.

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace shmring::torch_backend {

#if TORCH_VERSION_MAJOR >= 2
/// The class a device backend derives from.
using BackendBase = ::c10d::Backend;
#else
using BackendBase = ::c10d::ProcessGroup;
#endif

using Work = ::c10d::Work;

/// The reduction of a ReduceOp option, as the enum the switch statements use.
inline ::c10d::ReduceOp::RedOpType reduce_op_kind(const ::c10d::ReduceOp& op) {
  return static_cast<::c10d::ReduceOp::RedOpType>(op);
}

}  // namespace shmring::torch_backend
