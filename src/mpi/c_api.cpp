// The C API of libshmring_mpi: every call forwards to
// shmring::mpi::Communicator and turns an exception into a result code plus
// a stored message.

#include "shmring/shmring_mpi.h"

#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "shmring/mpi.hpp"

struct shmring_mpi_comm {
  shmring::mpi::Communicator comm;
  std::string last_error;
};

namespace {

thread_local std::string t_last_error;

template <class F>
shmring_result_t guarded(shmring_mpi_comm_t c, F&& f) {
  try {
    f();
    return SHMRING_SUCCESS;
  } catch (const shmring::Error& e) {
    t_last_error = e.what();
    if (c) c->last_error = e.what();
    return static_cast<shmring_result_t>(e.code());
  } catch (const std::bad_alloc&) {
    t_last_error = "out of memory";
    if (c) c->last_error = t_last_error;
    return SHMRING_ERR_SYSTEM;
  } catch (const std::exception& e) {
    t_last_error = e.what();
    if (c) c->last_error = t_last_error;
    return SHMRING_ERR_INTERNAL;
  }
}

shmring_result_t invalid(shmring_mpi_comm_t c, const char* fn, const char* what) {
  t_last_error = c ? fmt::format("rank {}: {}: {}", c->comm.rank(), fn, what)
                   : fmt::format("{}: {}", fn, what);
  if (c) c->last_error = t_last_error;
  return SHMRING_ERR_INVALID_ARGUMENT;
}

#define SHMRING_MPI_REQUIRE_COMM(c) \
  if ((c) == nullptr) return invalid(nullptr, __func__, "comm is NULL")

// The int a C caller passed, whatever the enum's range (the core's C API
// has its own copy: this layer sees only the core's public headers).
template <class E>
int raw_enum(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "the C enums are passed as int");
  int v = 0;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// The C enums are ints, shmring's DataType and ReduceOp 8-bit: a plain cast
// would wrap 256 to float32 (and 257 to float64, past the caller's buffer).
// Values outside 0..255 are refused here, naming the value passed, through
// reject_call (the node's other ranks are told, as of any refused call);
// the front refuses 8..255 itself.
template <class To, class From>
To checked_enum(shmring_mpi_comm_t c, const char* collective, From value, const char* what,
                const char* c_type, int last) {
  const int v = raw_enum(value);
  if (v < 0 || v > 255)
    c->comm.reject_call(collective,
                        fmt::format("{} {} is not a {} (0..{})", what, v, c_type, last));
  return static_cast<To>(v);
}
shmring::DataType dt(shmring_mpi_comm_t c, const char* collective, shmring_datatype_t d) {
  return checked_enum<shmring::DataType>(c, collective, d, "datatype", "shmring_datatype_t",
                                         static_cast<int>(SHMRING_INT64));
}
shmring::ReduceOp rop(shmring_mpi_comm_t c, const char* collective, shmring_reduce_op_t o) {
  return checked_enum<shmring::ReduceOp>(c, collective, o, "reduce op", "shmring_reduce_op_t",
                                         static_cast<int>(SHMRING_AVG));
}

}  // namespace

extern "C" {

shmring_result_t shmring_mpi_comm_init(MPI_Comm comm, shmring_mpi_comm_t* out) {
  if (out == nullptr)
    return invalid(nullptr, __func__, "out is NULL: expected a pointer to write to");
  *out = nullptr;
  return guarded(nullptr, [&] {
    *out = new shmring_mpi_comm{shmring::mpi::Communicator(comm), {}};
  });
}

shmring_result_t shmring_mpi_comm_destroy(shmring_mpi_comm_t comm) {
  delete comm;
  return SHMRING_SUCCESS;
}

shmring_result_t shmring_mpi_comm_rank(shmring_mpi_comm_t comm, int* rank) {
  SHMRING_MPI_REQUIRE_COMM(comm);
  if (rank == nullptr) return invalid(comm, __func__, "rank is NULL");
  *rank = comm->comm.rank();
  return SHMRING_SUCCESS;
}

shmring_result_t shmring_mpi_comm_size(shmring_mpi_comm_t comm, int* size) {
  SHMRING_MPI_REQUIRE_COMM(comm);
  if (size == nullptr) return invalid(comm, __func__, "size is NULL");
  *size = comm->comm.size();
  return SHMRING_SUCCESS;
}

shmring_result_t shmring_mpi_comm_node(shmring_mpi_comm_t comm, int* node, int* num_nodes,
                                       int* local_rank, int* local_size) {
  SHMRING_MPI_REQUIRE_COMM(comm);
  if (node) *node = comm->comm.node();
  if (num_nodes) *num_nodes = comm->comm.num_nodes();
  if (local_rank) *local_rank = comm->comm.local_rank();
  if (local_size) *local_size = comm->comm.local_size();
  return SHMRING_SUCCESS;
}

shmring_result_t shmring_mpi_allreduce(const void* send, void* recv, size_t count,
                                       shmring_datatype_t dtype, shmring_reduce_op_t op,
                                       shmring_mpi_comm_t comm) {
  SHMRING_MPI_REQUIRE_COMM(comm);
  return guarded(comm, [&] {
    comm->comm.allreduce(send, recv, count, dt(comm, "allreduce", dtype),
                         rop(comm, "allreduce", op));
  });
}

shmring_result_t shmring_mpi_reduce_scatter(const void* send, void* recv, size_t recv_count,
                                            shmring_datatype_t dtype, shmring_reduce_op_t op,
                                            shmring_mpi_comm_t comm) {
  SHMRING_MPI_REQUIRE_COMM(comm);
  return guarded(comm, [&] {
    comm->comm.reduce_scatter(send, recv, recv_count, dt(comm, "reduce_scatter", dtype),
                              rop(comm, "reduce_scatter", op));
  });
}

shmring_result_t shmring_mpi_allgather(const void* send, void* recv, size_t send_count,
                                       shmring_datatype_t dtype, shmring_mpi_comm_t comm) {
  SHMRING_MPI_REQUIRE_COMM(comm);
  return guarded(
      comm, [&] { comm->comm.allgather(send, recv, send_count, dt(comm, "allgather", dtype)); });
}

shmring_result_t shmring_mpi_broadcast(void* buffer, size_t count, shmring_datatype_t dtype,
                                       int root, shmring_mpi_comm_t comm) {
  SHMRING_MPI_REQUIRE_COMM(comm);
  return guarded(comm,
                 [&] { comm->comm.broadcast(buffer, count, dt(comm, "broadcast", dtype), root); });
}

shmring_result_t shmring_mpi_reduce(const void* send, void* recv, size_t count,
                                    shmring_datatype_t dtype, shmring_reduce_op_t op, int root,
                                    shmring_mpi_comm_t comm) {
  SHMRING_MPI_REQUIRE_COMM(comm);
  return guarded(comm, [&] {
    comm->comm.reduce(send, recv, count, dt(comm, "reduce", dtype), rop(comm, "reduce", op), root);
  });
}

shmring_result_t shmring_mpi_barrier(shmring_mpi_comm_t comm) {
  SHMRING_MPI_REQUIRE_COMM(comm);
  return guarded(comm, [&] { comm->comm.barrier(); });
}

const char* shmring_mpi_get_last_error(shmring_mpi_comm_t comm) {
  return comm ? comm->last_error.c_str() : t_last_error.c_str();
}

}  // extern "C"
