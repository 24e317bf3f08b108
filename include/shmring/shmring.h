/* shmring C API (C99). Collectives between the processes of one machine
 * over one POSIX shared-memory segment. A thin layer over the C++ API
 * (shmring/shmring.hpp): same semantics, same rules.
 *
 * Every function returns a shmring_result_t; SHMRING_SUCCESS is 0. On an
 * error, shmring_get_last_error(comm) gives the message (it names the rank,
 * the collective and the values involved). Collective-call rules: every rank
 * calls the same collectives in the same order with the same count,
 * datatype, operator and root; a disagreement returns SHMRING_ERR_MISMATCH
 * on every rank. After any error other than SHMRING_ERR_INVALID_ARGUMENT the
 * communicator refuses further collectives.
 *
 * Non-blocking forms (shmring_iallreduce, ...) start a collective and give a
 * request at once; the communicator's progress thread runs requests in call
 * order, blocking calls queue behind them. Until shmring_wait (or a
 * shmring_test that reports done) the buffers belong to the collective: do
 * not touch them, keep them alive. Argument errors are returned by the
 * i-call itself (*req is then NULL); other errors by shmring_wait/test.
 *
 * Thread safety: distinct communicators may be used from different threads
 * concurrently; threads sharing one communicator must order their calls
 * themselves (e.g. a mutex around each call). A request may be waited on
 * from any thread, one at a time.
 */
#ifndef SHMRING_SHMRING_H
#define SHMRING_SHMRING_H

#include <stddef.h>
#include <stdint.h>

#if defined(SHMRING_BUILDING_LIBRARY)
#define SHMRING_C_API __attribute__((visibility("default")))
#else
#define SHMRING_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Result codes: the values of shmring::ErrorCode. */
typedef enum {
  SHMRING_SUCCESS = 0,
  SHMRING_ERR_INVALID_ARGUMENT = 1,
  SHMRING_ERR_MISMATCH = 2,
  SHMRING_ERR_TIMEOUT = 3,
  SHMRING_ERR_PEER_FAILURE = 4,
  SHMRING_ERR_ABORTED = 5,
  SHMRING_ERR_SYSTEM = 6,
  SHMRING_ERR_OUT_OF_SHARED_MEMORY = 7,
  SHMRING_ERR_INTERNAL = 8
} shmring_result_t;

/* The values of shmring::DataType. */
typedef enum {
  SHMRING_FLOAT32 = 0,
  SHMRING_FLOAT64 = 1,
  SHMRING_FLOAT16 = 2,
  SHMRING_BFLOAT16 = 3,
  SHMRING_INT8 = 4,
  SHMRING_UINT8 = 5,
  SHMRING_INT32 = 6,
  SHMRING_INT64 = 7
} shmring_datatype_t;

/* The values of shmring::ReduceOp. SHMRING_AVG: floating types only. */
typedef enum {
  SHMRING_SUM = 0,
  SHMRING_PROD = 1,
  SHMRING_MIN = 2,
  SHMRING_MAX = 3,
  SHMRING_AVG = 4
} shmring_reduce_op_t;

/* Opaque communicator. */
typedef struct shmring_comm* shmring_comm_t;
/* Opaque handle of a non-blocking collective. */
typedef struct shmring_request* shmring_request_t;

/* Creates a communicator from the environment (shmrun's SHMRING_RANK,
 * SHMRING_WORLD_SIZE, SHMRING_JOB_ID; else torchrun's, Open MPI's or
 * Slurm's variables). Blocks until every rank has attached. On failure
 * *comm is NULL and shmring_get_last_error(NULL) tells why. */
SHMRING_C_API shmring_result_t shmring_comm_init_from_env(shmring_comm_t* comm);
/* Creates a communicator with an explicit rank in [0, size) and job id
 * (shared by all ranks; [A-Za-z0-9._-], at most 64 characters). */
SHMRING_C_API shmring_result_t shmring_comm_init(shmring_comm_t* comm, int rank, int size,
                                                 const char* job_id);
/* Frees the communicator (NULL is accepted). Not collective. */
SHMRING_C_API shmring_result_t shmring_comm_destroy(shmring_comm_t comm);
/* The barrier of a rank about to destroy its communicator (as NCCL's
 * ncclCommFinalize): returns once every rank has finished its calls before
 * it, pending non-blocking ones included, and entered it. A peer that meets
 * it in another collective gets SHMRING_ERR_MISMATCH saying that this rank
 * is leaving. Collective; make no collective call after it. */
SHMRING_C_API shmring_result_t shmring_comm_finalize(shmring_comm_t comm);

SHMRING_C_API shmring_result_t shmring_comm_rank(shmring_comm_t comm, int* rank);
SHMRING_C_API shmring_result_t shmring_comm_size(shmring_comm_t comm, int* size);
/* Sets *may_spin to 1 when this rank's blocking waits may spin now, else 0:
   0 where the job is oversubscribed, or while any other communicator of
   this process is (Communicator::waits_may_spin() in
   shmring/communicator.hpp; docs/guide/tuning.md, "Oversubscription").
   Not collective. */
SHMRING_C_API shmring_result_t shmring_comm_waits_may_spin(shmring_comm_t comm, int* may_spin);

/* One collective kind's counters on this rank (Communicator::stats() in
   shmring/communicator.hpp says what each counts). */
typedef struct shmring_collective_stats {
  const char* collective; /* "allreduce", ...: a static string */
  uint64_t calls;
  uint64_t bytes;
  uint64_t time_ns;
  uint64_t wait_ns;
} shmring_collective_stats_t;
/* Writes up to `max` entries into `out`, one per collective kind called at
   least once, and sets *n to how many kinds there are (may exceed max).
   Not collective. */
SHMRING_C_API shmring_result_t shmring_comm_stats(shmring_comm_t comm,
                                                  shmring_collective_stats_t* out, int max, int* n);

/* recv[i] = op over ranks of send[i], i < count. send == recv: in place. */
SHMRING_C_API shmring_result_t shmring_allreduce(const void* send, void* recv, size_t count,
                                                 shmring_datatype_t dtype, shmring_reduce_op_t op,
                                                 shmring_comm_t comm);
/* send holds size*recv_count elements; rank r receives the reduction of
 * block r. In place when recv == send + rank*recv_count. */
SHMRING_C_API shmring_result_t shmring_reduce_scatter(const void* send, void* recv,
                                                      size_t recv_count, shmring_datatype_t dtype,
                                                      shmring_reduce_op_t op, shmring_comm_t comm);
/* recv (size*send_count elements) receives every rank's send in rank
 * order. In place when send == recv + rank*send_count. */
SHMRING_C_API shmring_result_t shmring_allgather(const void* send, void* recv, size_t send_count,
                                                 shmring_datatype_t dtype, shmring_comm_t comm);
/* Every rank's buffer receives root's. */
SHMRING_C_API shmring_result_t shmring_broadcast(void* buffer, size_t count,
                                                 shmring_datatype_t dtype, int root,
                                                 shmring_comm_t comm);
/* root's recv receives the reduction of every rank's send; recv is ignored
 * (may be NULL) elsewhere. */
SHMRING_C_API shmring_result_t shmring_reduce(const void* send, void* recv, size_t count,
                                              shmring_datatype_t dtype, shmring_reduce_op_t op,
                                              int root, shmring_comm_t comm);
SHMRING_C_API shmring_result_t shmring_barrier(shmring_comm_t comm);
/* Non-blocking forms: same arguments and rules as the blocking ones, plus
 * `req`, which receives the request (NULL when the call itself fails, e.g.
 * SHMRING_ERR_INVALID_ARGUMENT). Every request must be finished with
 * shmring_wait, or with shmring_test reporting done then
 * shmring_request_free. A NULL `req` is refused as by shmring_reject: the
 * peers' matching call fails at once. */
SHMRING_C_API shmring_result_t shmring_iallreduce(const void* send, void* recv, size_t count,
                                                  shmring_datatype_t dtype, shmring_reduce_op_t op,
                                                  shmring_comm_t comm, shmring_request_t* req);
SHMRING_C_API shmring_result_t shmring_ireduce_scatter(const void* send, void* recv,
                                                       size_t recv_count, shmring_datatype_t dtype,
                                                       shmring_reduce_op_t op, shmring_comm_t comm,
                                                       shmring_request_t* req);
SHMRING_C_API shmring_result_t shmring_iallgather(const void* send, void* recv, size_t send_count,
                                                  shmring_datatype_t dtype, shmring_comm_t comm,
                                                  shmring_request_t* req);
SHMRING_C_API shmring_result_t shmring_ibroadcast(void* buffer, size_t count,
                                                  shmring_datatype_t dtype, int root,
                                                  shmring_comm_t comm, shmring_request_t* req);
SHMRING_C_API shmring_result_t shmring_ireduce(const void* send, void* recv, size_t count,
                                               shmring_datatype_t dtype, shmring_reduce_op_t op,
                                               int root, shmring_comm_t comm,
                                               shmring_request_t* req);
SHMRING_C_API shmring_result_t shmring_ibarrier(shmring_comm_t comm, shmring_request_t* req);
/* The staged collectives: the C++ API's alltoall, alltoallv, gather,
 * scatter, allgatherv, reduce_scatter_v, send and recv (same semantics;
 * counts and displacements in elements, arrays of size entries). A NULL
 * array is SHMRING_ERR_INVALID_ARGUMENT naming it; the peers' matching call
 * fails at once with SHMRING_ERR_MISMATCH, as for shmring_reject. */
SHMRING_C_API shmring_result_t shmring_alltoall(const void* send, void* recv, size_t count,
                                                shmring_datatype_t dtype, shmring_comm_t comm);
SHMRING_C_API shmring_result_t shmring_alltoallv(const void* send, const size_t* send_counts,
                                                 const size_t* send_displs, void* recv,
                                                 const size_t* recv_counts,
                                                 const size_t* recv_displs,
                                                 shmring_datatype_t dtype, shmring_comm_t comm);
SHMRING_C_API shmring_result_t shmring_gather(const void* send, void* recv, size_t count,
                                              shmring_datatype_t dtype, int root,
                                              shmring_comm_t comm);
SHMRING_C_API shmring_result_t shmring_scatter(const void* send, void* recv, size_t count,
                                               shmring_datatype_t dtype, int root,
                                               shmring_comm_t comm);
SHMRING_C_API shmring_result_t shmring_allgatherv(const void* send, size_t send_count, void* recv,
                                                  const size_t* recv_counts, const size_t* displs,
                                                  shmring_datatype_t dtype, shmring_comm_t comm);
SHMRING_C_API shmring_result_t shmring_reduce_scatter_v(const void* send, void* recv,
                                                        const size_t* recv_counts,
                                                        shmring_datatype_t dtype,
                                                        shmring_reduce_op_t op,
                                                        shmring_comm_t comm);
/* Non-blocking forms of the six above (req as for shmring_iallreduce). The
 * count and displacement arrays are copied at the call; the data buffers
 * belong to the request until it is finished. */
SHMRING_C_API shmring_result_t shmring_ialltoall(const void* send, void* recv, size_t count,
                                                 shmring_datatype_t dtype, shmring_comm_t comm,
                                                 shmring_request_t* req);
SHMRING_C_API shmring_result_t shmring_ialltoallv(const void* send, const size_t* send_counts,
                                                  const size_t* send_displs, void* recv,
                                                  const size_t* recv_counts,
                                                  const size_t* recv_displs,
                                                  shmring_datatype_t dtype, shmring_comm_t comm,
                                                  shmring_request_t* req);
SHMRING_C_API shmring_result_t shmring_igather(const void* send, void* recv, size_t count,
                                               shmring_datatype_t dtype, int root,
                                               shmring_comm_t comm, shmring_request_t* req);
SHMRING_C_API shmring_result_t shmring_iscatter(const void* send, void* recv, size_t count,
                                                shmring_datatype_t dtype, int root,
                                                shmring_comm_t comm, shmring_request_t* req);
SHMRING_C_API shmring_result_t shmring_iallgatherv(const void* send, size_t send_count, void* recv,
                                                   const size_t* recv_counts, const size_t* displs,
                                                   shmring_datatype_t dtype, shmring_comm_t comm,
                                                   shmring_request_t* req);
SHMRING_C_API shmring_result_t shmring_ireduce_scatter_v(
    const void* send, void* recv, const size_t* recv_counts, shmring_datatype_t dtype,
    shmring_reduce_op_t op, shmring_comm_t comm, shmring_request_t* req);
SHMRING_C_API shmring_result_t shmring_send(const void* buffer, size_t count,
                                            shmring_datatype_t dtype, int peer, int tag,
                                            shmring_comm_t comm);
SHMRING_C_API shmring_result_t shmring_recv(void* buffer, size_t count, shmring_datatype_t dtype,
                                            int peer, int tag, shmring_comm_t comm);
SHMRING_C_API shmring_result_t shmring_isend(const void* buffer, size_t count,
                                             shmring_datatype_t dtype, int peer, int tag,
                                             shmring_comm_t comm, shmring_request_t* req);
SHMRING_C_API shmring_result_t shmring_irecv(void* buffer, size_t count, shmring_datatype_t dtype,
                                             int peer, int tag, shmring_comm_t comm,
                                             shmring_request_t* req);
/* Blocks until *req is complete, frees it and sets *req to NULL; returns
 * the collective's result (message: shmring_get_last_error(comm), and
 * shmring_get_last_error(NULL) on this thread). A NULL *req returns
 * SHMRING_SUCCESS at once. */
SHMRING_C_API shmring_result_t shmring_wait(shmring_request_t* req);
/* Non-blocking: *done = 1 when *req is complete (the result is then the
 * collective's; the request stays allocated: free it), else 0 and
 * SHMRING_SUCCESS. */
SHMRING_C_API shmring_result_t shmring_test(shmring_request_t* req, int* done);
/* Frees a request (NULL is accepted); a pending one is waited for first.
 * Returns the collective's result unless shmring_test returned it already
 * (SHMRING_SUCCESS then), so that an error is never dropped. */
SHMRING_C_API shmring_result_t shmring_request_free(shmring_request_t req);
/* MPI_Comm_split: ranks passing the same color (>= 0) form *newcomm,
 * ordered by (key, rank). */
SHMRING_C_API shmring_result_t shmring_comm_split(shmring_comm_t comm, int color, int key,
                                                  shmring_comm_t* newcomm);
/* For bindings over this API whose own checks refuse a collective before
 * calling it: call this in its place, at the same point of the call order.
 * It counts as this rank's call of the collective (queued behind pending
 * requests): the peers' matching call fails at once with
 * SHMRING_ERR_MISMATCH naming this rank and `reason` instead of waiting
 * until the timeout. Returns SHMRING_ERR_INVALID_ARGUMENT with the message
 * "rank R: <collective>: <reason>" (shmring_get_last_error), or
 * SHMRING_ERR_ABORTED on a broken communicator. When every rank refuses the
 * same call the communicator stays usable. Not for send/recv. */
SHMRING_C_API shmring_result_t shmring_reject(shmring_comm_t comm, const char* collective,
                                              const char* reason);
/* Aborts the job: every rank's collectives fail with SHMRING_ERR_ABORTED. */
SHMRING_C_API shmring_result_t shmring_comm_abort(shmring_comm_t comm, const char* reason);

/* A static description of a result code ("peer failure", ...). */
SHMRING_C_API const char* shmring_get_error_string(shmring_result_t result);
/* The message of the last error on comm, or, with comm NULL, of the last
 * failed call on this thread (e.g. a failed init). "" if none. Valid until
 * the next call on the same communicator / thread. */
SHMRING_C_API const char* shmring_get_last_error(shmring_comm_t comm);

#ifdef __cplusplus
}
#endif

#endif /* SHMRING_SHMRING_H */
