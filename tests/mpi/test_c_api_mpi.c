/* The C API of libshmring_mpi from C99: init, allreduce in and out of place,
 * allgather, broadcast, an invalid call that must fail alike on every rank,
 * destroy. Run under tools/fake-nodes; exits 1 on any failure. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "shmring/shmring_mpi.h"

static int failures = 0;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fputc('\n', stderr);                                 \
      ++failures;                                          \
    }                                                      \
  } while (0)

enum { kCount = 1009 };

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  shmring_mpi_comm_t comm = NULL;
  shmring_result_t rc = shmring_mpi_comm_init(MPI_COMM_WORLD, &comm);
  CHECK(rc == SHMRING_SUCCESS, "init: %s", shmring_mpi_get_last_error(NULL));
  if (rc != SHMRING_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 1);
  int rank = -1, size = -1, node = -1, nodes = -1, lrank = -1, lsize = -1;
  shmring_mpi_comm_rank(comm, &rank);
  shmring_mpi_comm_size(comm, &size);
  shmring_mpi_comm_node(comm, &node, &nodes, &lrank, &lsize);
  CHECK(rank >= 0 && rank < size && node >= 0 && node < nodes && lrank < lsize,
        "rank %d/%d node %d/%d local %d/%d", rank, size, node, nodes, lrank, lsize);

  static double send[kCount], recv[kCount];
  for (int i = 0; i < kCount; ++i) send[i] = 1000.0 * rank + i;
  rc = shmring_mpi_allreduce(send, recv, kCount, SHMRING_FLOAT64, SHMRING_SUM, comm);
  CHECK(rc == SHMRING_SUCCESS, "allreduce: %s", shmring_mpi_get_last_error(comm));
  for (int i = 0; i < kCount; ++i) {
    const double want = 1000.0 * size * (size - 1) / 2 + (double)i * size;
    if (recv[i] != want) {
      CHECK(0, "allreduce: element %d is %g, expected %g", i, recv[i], want);
      break;
    }
  }
  rc = shmring_mpi_allreduce(send, send, kCount, SHMRING_FLOAT64, SHMRING_MAX, comm);
  CHECK(rc == SHMRING_SUCCESS && send[7] == 1000.0 * (size - 1) + 7, "allreduce max in place");

  static int gathered[64 * 3];
  int mine[3] = {rank, 10 * rank, 100 * rank};
  CHECK(size <= 64, "size %d", size);
  rc = shmring_mpi_allgather(mine, gathered, 3, SHMRING_INT32, comm);
  CHECK(rc == SHMRING_SUCCESS, "allgather: %s", shmring_mpi_get_last_error(comm));
  for (int r = 0; r < size; ++r)
    CHECK(gathered[3 * r] == r && gathered[3 * r + 2] == 100 * r, "allgather block %d", r);

  long long v = rank == size - 1 ? 42 : -1;
  rc = shmring_mpi_broadcast(&v, 1, SHMRING_INT64, size - 1, comm);
  CHECK(rc == SHMRING_SUCCESS && v == 42, "broadcast: %lld", v);

  /* avg on an integer type: refused on every rank, the communicator stays usable. */
  rc = shmring_mpi_allreduce(mine, mine, 1, SHMRING_INT32, SHMRING_AVG, comm);
  CHECK(rc == SHMRING_ERR_INVALID_ARGUMENT, "avg on int32 returned %d", (int)rc);
  CHECK(strstr(shmring_mpi_get_last_error(comm), "avg") != NULL, "message: %s",
        shmring_mpi_get_last_error(comm));
  rc = shmring_mpi_barrier(comm);
  CHECK(rc == SHMRING_SUCCESS, "barrier after an invalid call");
  CHECK(shmring_mpi_allreduce(NULL, NULL, 1, SHMRING_INT32, SHMRING_SUM, NULL) ==
            SHMRING_ERR_INVALID_ARGUMENT,
        "NULL comm");

  shmring_mpi_comm_destroy(comm);
  int total = failures;
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("C API: %d failures\n", total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
