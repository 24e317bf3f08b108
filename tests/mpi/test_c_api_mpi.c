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
  /* Enum values past the 8-bit enums are refused naming the value passed,
     never wrapped (256 would run as float32, 257 as float64 over 16 bytes
     of an 8-byte buffer); a null send buffer likewise. Alike on every rank,
     the communicator stays usable. */
  const int bad_values[] = {256, 257, -3};
  char want[96];
  for (int i = 0; i < 3; ++i) {
    int x[2] = {1, 1};
    rc = shmring_mpi_allreduce(x, x, 2, (shmring_datatype_t)bad_values[i], SHMRING_SUM, comm);
    snprintf(want, sizeof want, "rank %d: allreduce: datatype %d is not a shmring_datatype_t", rank,
             bad_values[i]);
    CHECK(rc == SHMRING_ERR_INVALID_ARGUMENT && strstr(shmring_mpi_get_last_error(comm), want),
          "datatype %d: returned %d: %s", bad_values[i], (int)rc, shmring_mpi_get_last_error(comm));
    CHECK(x[0] == 1 && x[1] == 1, "datatype %d: the buffer changed", bad_values[i]);
    rc = shmring_mpi_allreduce(x, x, 2, SHMRING_INT32, (shmring_reduce_op_t)bad_values[i], comm);
    snprintf(want, sizeof want, "reduce op %d is not a shmring_reduce_op_t", bad_values[i]);
    CHECK(rc == SHMRING_ERR_INVALID_ARGUMENT && strstr(shmring_mpi_get_last_error(comm), want),
          "reduce op %d: returned %d: %s", bad_values[i], (int)rc,
          shmring_mpi_get_last_error(comm));
  }
  rc = shmring_mpi_reduce(NULL, mine, 1, SHMRING_INT32, SHMRING_SUM, 0, comm);
  CHECK(rc == SHMRING_ERR_INVALID_ARGUMENT &&
            strstr(shmring_mpi_get_last_error(comm), "reduce: send is null with count 1"),
        "reduce from NULL returned %d: %s", (int)rc, shmring_mpi_get_last_error(comm));
  rc = shmring_mpi_barrier(comm);
  CHECK(rc == SHMRING_SUCCESS, "barrier after the refused calls: %s",
        shmring_mpi_get_last_error(comm));
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
