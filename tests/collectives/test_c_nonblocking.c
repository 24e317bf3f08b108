/* The C API's non-blocking forms, compiled as C99: every i-collective on 3
 * forked ranks against known values (distinct per rank and index),
 * shmring_test polling, shmring_wait freeing the request, argument errors
 * returned by the i-call (req NULL), and a mismatch returned by
 * shmring_wait on every rank; shmring_request_free returns the error of a
 * request nobody waited for. Exit status 0 means every check passed. */
#define _POSIX_C_SOURCE 200809L
#include <shmring/shmring.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "c_harness.h"

enum { kRanks = 3, kCount = 100003 };

static double val(int rank, int i) {
  return rank * 1000003.0 + i * 7.0;
}

static void run_rank(int rank, const char* job) {
  shmring_comm_t comm = NULL;
  CHECK_OK(shmring_comm_init(&comm, rank, kRanks, job));

  static double x[kCount], y[kCount];
  for (int i = 0; i < kCount; ++i) x[i] = val(rank, i);
  int64_t big[kRanks * 4], mine[4];
  for (int i = 0; i < kRanks * 4; ++i) big[i] = rank * 100 + i;
  int32_t one = rank * 10 + 1, all[kRanks];
  float b[3] = {0, 0, 0};
  if (rank == 1) b[0] = b[1] = b[2] = 42.0f;
  float s = (float)rank + 1.0f, t = 0.0f;

  shmring_request_t req[6];
  CHECK_OK(shmring_iallreduce(x, y, kCount, SHMRING_FLOAT64, SHMRING_SUM, comm, &req[0]));
  CHECK_OK(shmring_ireduce_scatter(big, mine, 4, SHMRING_INT64, SHMRING_MAX, comm, &req[1]));
  CHECK_OK(shmring_iallgather(&one, all, 1, SHMRING_INT32, comm, &req[2]));
  CHECK_OK(shmring_ibroadcast(b, 3, SHMRING_FLOAT32, 1, comm, &req[3]));
  CHECK_OK(shmring_ireduce(&s, rank == 2 ? &t : NULL, 1, SHMRING_FLOAT32, SHMRING_SUM, 2, comm,
                           &req[4]));
  CHECK_OK(shmring_ibarrier(comm, &req[5]));
  for (int k = 0; k < 6; ++k) CHECK(req[k] != NULL);

  /* Poll the last one, then wait for the others in reverse order. */
  int done = 0;
  long polls = 0;
  while (!done) {
    CHECK_OK(shmring_test(&req[5], &done));
    ++polls;
  }
  CHECK(req[5] != NULL); /* test leaves it allocated */
  CHECK_OK(shmring_request_free(req[5]));
  for (int k = 4; k >= 0; --k) {
    CHECK_OK(shmring_wait(&req[k]));
    CHECK(req[k] == NULL);
  }
  for (int i = 0; i < kCount; ++i) CHECK(y[i] == val(0, i) + val(1, i) + val(2, i));
  for (int i = 0; i < 4; ++i) CHECK(mine[i] == (kRanks - 1) * 100 + rank * 4 + i);
  for (int q = 0; q < kRanks; ++q) CHECK(all[q] == q * 10 + 1);
  CHECK(b[0] == 42.0f && b[2] == 42.0f);
  if (rank == 2) CHECK(t == 6.0f);
  shmring_request_t none = NULL;
  CHECK_OK(shmring_wait(&none));
  CHECK_OK(shmring_test(&none, &done));
  CHECK(done == 1);
  CHECK(shmring_wait(NULL) == SHMRING_ERR_INVALID_ARGUMENT);

  /* An argument error comes from the i-call; no request is made. Every
   * rank makes it, so the communicator stays usable. */
  shmring_request_t bad = (shmring_request_t)&bad;
  CHECK(shmring_iallreduce(&one, &one, 1, SHMRING_INT32, SHMRING_AVG, comm, &bad) ==
        SHMRING_ERR_INVALID_ARGUMENT);
  CHECK(bad == NULL);
  CHECK(strstr(shmring_get_last_error(comm), "avg") != NULL);
  CHECK(shmring_iallreduce(x, y, 1, SHMRING_FLOAT64, SHMRING_SUM, comm, NULL) ==
        SHMRING_ERR_INVALID_ARGUMENT);
  CHECK(shmring_ibarrier(NULL, &bad) == SHMRING_ERR_INVALID_ARGUMENT);

  /* Mismatched counts: shmring_wait returns the mismatch on every rank. */
  shmring_request_t m = NULL;
  CHECK_OK(shmring_iallreduce(x, y, rank == 0 ? 5 : 6, SHMRING_FLOAT64, SHMRING_SUM, comm, &m));
  shmring_result_t e = shmring_wait(&m);
  CHECK(e == SHMRING_ERR_MISMATCH);
  CHECK(m == NULL);
  CHECK(strstr(shmring_get_last_error(comm), "mismatch") != NULL);
  CHECK(strstr(shmring_get_last_error(NULL), "mismatch") != NULL);
  CHECK_OK(shmring_comm_destroy(comm));
}

/* shmring_request_free without a wait: a success, a result shmring_test
 * returned already, and a mismatch it must return (not drop). */
static void run_free(int rank, const char* job) {
  shmring_comm_t comm = NULL;
  shmring_request_t req = NULL;
  int32_t in[4], out[4];
  int done = 0;
  for (int i = 0; i < 4; ++i) in[i] = rank * 100 + i;
  CHECK_OK(shmring_comm_init(&comm, rank, kRanks, job));
  CHECK_OK(shmring_iallreduce(in, out, 4, SHMRING_INT32, SHMRING_SUM, comm, &req));
  CHECK_OK(shmring_request_free(req));
  for (int i = 0; i < 4; ++i) CHECK(out[i] == 100 * (0 + 1 + 2) + kRanks * i);
  CHECK_OK(shmring_iallreduce(in, out, 4, SHMRING_INT32, SHMRING_SUM, comm, &req));
  while (!done) CHECK_OK(shmring_test(&req, &done));
  CHECK_OK(shmring_request_free(req));
  CHECK_OK(shmring_iallreduce(in, out, rank == 0 ? 3 : 4, SHMRING_INT32, SHMRING_SUM, comm, &req));
  CHECK(shmring_request_free(req) == SHMRING_ERR_MISMATCH);
  CHECK(strstr(shmring_get_last_error(comm), "mismatch") != NULL);
  CHECK_OK(shmring_comm_destroy(comm));
}

int main(void) {
  int failed = run_forked_ranks(kRanks, "c-nb", run_rank);
  failed |= run_forked_ranks(kRanks, "c-nb-free", run_free);
  if (!failed) printf("C API, non-blocking: all checks passed on %d ranks\n", kRanks);
  return failed;
}
