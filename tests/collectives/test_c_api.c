/* The C API, compiled as C99: every collective on 3 forked ranks, error
 * codes and messages. Exit status 0 means every check passed. */
#define _POSIX_C_SOURCE 200809L
#include <shmring/shmring.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "c_harness.h"

enum { kRanks = 3, kCount = 1001 };

static void run_rank(int rank, const char* job) {
  shmring_comm_t comm = NULL;
  CHECK_OK(shmring_comm_init(&comm, rank, kRanks, job));
  int r = -1, n = -1;
  CHECK_OK(shmring_comm_rank(comm, &r));
  CHECK_OK(shmring_comm_size(comm, &n));
  CHECK(r == rank && n == kRanks);

  double x[kCount], y[kCount];
  for (int i = 0; i < kCount; ++i) x[i] = rank * 1000.0 + i;
  CHECK_OK(shmring_allreduce(x, y, kCount, SHMRING_FLOAT64, SHMRING_SUM, comm));
  for (int i = 0; i < kCount; ++i) CHECK(y[i] == 3000.0 + 3.0 * i);
  shmring_collective_stats_t st[2];
  int kinds = -1;
  CHECK_OK(shmring_comm_stats(comm, st, 2, &kinds));
  CHECK(kinds == 1 && strcmp(st[0].collective, "allreduce") == 0);
  CHECK(st[0].calls == 1 && st[0].bytes == sizeof x && st[0].wait_ns <= st[0].time_ns);

  int64_t big[kRanks * 4], mine[4];
  for (int i = 0; i < kRanks * 4; ++i) big[i] = rank + i;
  CHECK_OK(shmring_reduce_scatter(big, mine, 4, SHMRING_INT64, SHMRING_MAX, comm));
  for (int i = 0; i < 4; ++i) CHECK(mine[i] == (kRanks - 1) + rank * 4 + i);

  int32_t one = rank, all[kRanks];
  CHECK_OK(shmring_allgather(&one, all, 1, SHMRING_INT32, comm));
  for (int q = 0; q < kRanks; ++q) CHECK(all[q] == q);

  float b[3] = {0, 0, 0};
  if (rank == 1) b[0] = b[1] = b[2] = 42.0f;
  CHECK_OK(shmring_broadcast(b, 3, SHMRING_FLOAT32, 1, comm));
  CHECK(b[0] == 42.0f && b[2] == 42.0f);

  float s = 1.0f, t = 0.0f;
  CHECK_OK(shmring_reduce(&s, rank == 2 ? &t : NULL, 1, SHMRING_FLOAT32, SHMRING_SUM, 2, comm));
  if (rank == 2) CHECK(t == 3.0f);
  CHECK_OK(shmring_barrier(comm));

  shmring_comm_t half = NULL;
  CHECK_OK(shmring_comm_split(comm, rank == 0, 0, &half));
  CHECK_OK(shmring_comm_size(half, &n));
  CHECK(n == (rank == 0 ? 1 : 2));
  CHECK_OK(shmring_comm_destroy(half));

  /* Every rank passes avg on int32: an invalid argument, with a message
   * naming it, and the communicator stays usable. */
  shmring_result_t e = shmring_allreduce(&one, &one, 1, SHMRING_INT32, SHMRING_AVG, comm);
  CHECK(e == SHMRING_ERR_INVALID_ARGUMENT);
  CHECK(strstr(shmring_get_last_error(comm), "avg") != NULL);
  CHECK(strcmp(shmring_get_error_string(e), "invalid argument") == 0);
  CHECK(shmring_broadcast(b, 3, SHMRING_FLOAT32, 7, comm) == SHMRING_ERR_INVALID_ARGUMENT);
  CHECK(strstr(shmring_get_last_error(comm), "root 7") != NULL);
  CHECK_OK(shmring_barrier(comm));
  CHECK(shmring_barrier(NULL) == SHMRING_ERR_INVALID_ARGUMENT);

  /* finalize waits for the rank's pending request, which completes first. */
  float f = 1.0f;
  shmring_request_t req = NULL;
  CHECK_OK(shmring_iallreduce(&f, &f, 1, SHMRING_FLOAT32, SHMRING_SUM, comm, &req));
  CHECK_OK(shmring_comm_finalize(comm));
  int done = 0;
  CHECK_OK(shmring_test(&req, &done));
  CHECK(done == 1 && f == (float)kRanks);
  CHECK_OK(shmring_request_free(req));
  CHECK(shmring_comm_finalize(NULL) == SHMRING_ERR_INVALID_ARGUMENT);
  CHECK_OK(shmring_comm_destroy(comm));
}

int main(void) {
  /* A bad job id fails before anything is created, with a message. */
  shmring_comm_t bad = NULL;
  CHECK(shmring_comm_init(&bad, 0, 1, "no/slash") == SHMRING_ERR_INVALID_ARGUMENT);
  CHECK(bad == NULL && strstr(shmring_get_last_error(NULL), "no/slash") != NULL);
  /* waits_may_spin follows SHMRING_OVERSUBSCRIBED (one rank, one at a time:
     a crowded communicator alive in the process would stop the other's). */
  char job[64];
  for (int crowded = 0; crowded <= 1; ++crowded) {
    setenv("SHMRING_OVERSUBSCRIBED", crowded ? "1" : "0", 1);
    snprintf(job, sizeof job, "c-api-spin-%d-%ld", crowded, (long)getpid());
    shmring_comm_t comm = NULL; /* the name CHECK_OK reports */
    CHECK_OK(shmring_comm_init(&comm, 0, 1, job));
    int may_spin = -1;
    CHECK_OK(shmring_comm_waits_may_spin(comm, &may_spin));
    CHECK(may_spin == !crowded);
    CHECK(shmring_comm_waits_may_spin(comm, NULL) == SHMRING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(shmring_get_last_error(comm), "may_spin") != NULL);
    CHECK_OK(shmring_comm_destroy(comm));
  }
  unsetenv("SHMRING_OVERSUBSCRIBED");
  int failed = run_forked_ranks(kRanks, "c-api", run_rank);
  if (!failed) printf("C API: all checks passed on %d ranks\n", kRanks);
  return failed;
}
