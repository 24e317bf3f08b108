/* shmring over several machines, C API (C99): hierarchical collectives with
 * shmring inside each node and MPI between nodes (libshmring_mpi,
 * `pkg-config --libs shmring-mpi`). A thin layer over shmring/mpi.hpp: same
 * semantics; ranks are those of the MPI communicator. Result codes, datatypes
 * and operators are shmring.h's.
 *
 * Errors: by default a failure inside a node (a rank dead or timed out, a
 * mismatch, a failed MPI call) prints the error and MPI_Aborts the job, so no
 * rank waits forever; with SHMRING_MPI_ON_ERROR=throw the call returns the
 * code instead and shmring_mpi_get_last_error(comm) says why (then end the
 * job yourself: ranks on other nodes may be blocked in MPI).
 *
 * Thread safety: one communicator is used by one thread at a time.
 */
#ifndef SHMRING_SHMRING_MPI_H
#define SHMRING_SHMRING_MPI_H

#include <mpi.h>
#include <stddef.h>

#include "shmring/shmring.h"

#if defined(SHMRING_MPI_BUILDING_LIBRARY)
#define SHMRING_MPI_C_API __attribute__((visibility("default")))
#else
#define SHMRING_MPI_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shmring_mpi_comm* shmring_mpi_comm_t;

/* Collective over `comm` (duplicated; MPI must be initialised). Groups the
 * ranks into nodes by shmring's host identity and builds one shmring
 * communicator per node. On failure *out is NULL and
 * shmring_mpi_get_last_error(NULL) tells why. */
SHMRING_MPI_C_API shmring_result_t shmring_mpi_comm_init(MPI_Comm comm, shmring_mpi_comm_t* out);
/* Frees the communicator (NULL is accepted); before MPI_Finalize. */
SHMRING_MPI_C_API shmring_result_t shmring_mpi_comm_destroy(shmring_mpi_comm_t comm);
SHMRING_MPI_C_API shmring_result_t shmring_mpi_comm_rank(shmring_mpi_comm_t comm, int* rank);
SHMRING_MPI_C_API shmring_result_t shmring_mpi_comm_size(shmring_mpi_comm_t comm, int* size);
/* This rank's node (0..num_nodes-1) and place in it. */
SHMRING_MPI_C_API shmring_result_t shmring_mpi_comm_node(shmring_mpi_comm_t comm, int* node,
                                                         int* num_nodes, int* local_rank,
                                                         int* local_size);

/* recv[i] = op over ranks of send[i]; send == recv: in place. */
SHMRING_MPI_C_API shmring_result_t shmring_mpi_allreduce(const void* send, void* recv, size_t count,
                                                         shmring_datatype_t dtype,
                                                         shmring_reduce_op_t op,
                                                         shmring_mpi_comm_t comm);
/* Rank r receives block r of the reduction of send (size*recv_count
 * elements). In place when recv == send + rank*recv_count. */
SHMRING_MPI_C_API shmring_result_t shmring_mpi_reduce_scatter(const void* send, void* recv,
                                                              size_t recv_count,
                                                              shmring_datatype_t dtype,
                                                              shmring_reduce_op_t op,
                                                              shmring_mpi_comm_t comm);
/* recv (size*send_count elements) receives every rank's send in rank order.
 * In place when send == recv + rank*send_count. */
SHMRING_MPI_C_API shmring_result_t shmring_mpi_allgather(const void* send, void* recv,
                                                         size_t send_count,
                                                         shmring_datatype_t dtype,
                                                         shmring_mpi_comm_t comm);
/* Every rank's buffer receives root's. */
SHMRING_MPI_C_API shmring_result_t shmring_mpi_broadcast(void* buffer, size_t count,
                                                         shmring_datatype_t dtype, int root,
                                                         shmring_mpi_comm_t comm);
/* root's recv receives the reduction; recv is ignored (may be NULL) elsewhere. */
SHMRING_MPI_C_API shmring_result_t shmring_mpi_reduce(const void* send, void* recv, size_t count,
                                                      shmring_datatype_t dtype,
                                                      shmring_reduce_op_t op, int root,
                                                      shmring_mpi_comm_t comm);
SHMRING_MPI_C_API shmring_result_t shmring_mpi_barrier(shmring_mpi_comm_t comm);

/* The message of the last error on comm, or with comm NULL of the last
 * failed call on this thread. "" if none. */
SHMRING_MPI_C_API const char* shmring_mpi_get_last_error(shmring_mpi_comm_t comm);

#ifdef __cplusplus
}
#endif

#endif /* SHMRING_SHMRING_MPI_H */
