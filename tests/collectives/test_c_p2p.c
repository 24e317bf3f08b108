/* The C API's point-to-point calls, compiled as C99: a ring of 3 forked
 * ranks with shmring_isend/shmring_recv (values distinct per sender and
 * index, sizes on every path), shmring_send/shmring_irecv, argument errors
 * (self as peer, negative tag) and a count mismatch returned on both ranks.
 * Exit status 0 means every check passed. */
#define _POSIX_C_SOURCE 200809L
#include <shmring/shmring.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "c_harness.h"

enum { kRanks = 3, kMax = 300001 };

static int64_t val(int from, int i) {
  return from * 1000003LL + i * 7LL - 11;
}

static void run_rank(int rank, const char* job) {
  shmring_comm_t comm = NULL;
  CHECK_OK(shmring_comm_init(&comm, rank, kRanks, job));
  const int right = (rank + 1) % kRanks, left = (rank + kRanks - 1) % kRanks;
  static int64_t out[kMax], in[kMax];
  const size_t counts[] = {0, 1, 3, 5000, kMax};
  for (int k = 0; k < 5; ++k) {
    size_t n = counts[k];
    for (size_t i = 0; i < n; ++i) out[i] = val(rank, (int)i);
    for (size_t i = 0; i < n; ++i) in[i] = -1;
    shmring_request_t s = NULL, q = NULL;
    CHECK_OK(shmring_isend(out, n, SHMRING_INT64, right, 7, comm, &s));
    CHECK(s != NULL);
    CHECK_OK(shmring_recv(in, n, SHMRING_INT64, left, 7, comm));
    CHECK_OK(shmring_wait(&s));
    for (size_t i = 0; i < n; ++i) CHECK(in[i] == val(left, (int)i));
    /* The other way round: irecv posted first, blocking send. */
    CHECK_OK(shmring_irecv(in, n, SHMRING_INT64, right, 8, comm, &q));
    if (rank == 0) {
      CHECK_OK(shmring_send(out, n, SHMRING_INT64, left, 8, comm));
      CHECK_OK(shmring_wait(&q));
    } else {
      CHECK_OK(shmring_wait(&q));
      CHECK_OK(shmring_send(out, n, SHMRING_INT64, left, 8, comm));
    }
    for (size_t i = 0; i < n; ++i) CHECK(in[i] == val(right, (int)i));
  }
  /* Argument errors. */
  CHECK(shmring_send(out, 1, SHMRING_INT64, rank, 0, comm) == SHMRING_ERR_INVALID_ARGUMENT);
  CHECK(strstr(shmring_get_last_error(comm), "peer") != NULL);
  shmring_request_t bad = (shmring_request_t)&bad;
  CHECK(shmring_irecv(in, 1, SHMRING_INT64, right, -1, comm, &bad) == SHMRING_ERR_INVALID_ARGUMENT);
  CHECK(bad == NULL);
  CHECK(strstr(shmring_get_last_error(comm), "tag -1") != NULL);
  /* A count mismatch between ranks 0 and 1 (staged size, above the eager
     limit: the send waits for the receiver's verdict): both fail. */
  if (rank == 0) {
    CHECK(shmring_send(out, 2100, SHMRING_INT64, 1, 3, comm) == SHMRING_ERR_MISMATCH);
    CHECK(strstr(shmring_get_last_error(comm), "2101") != NULL);
  } else if (rank == 1) {
    CHECK(shmring_recv(in, 2101, SHMRING_INT64, 0, 3, comm) == SHMRING_ERR_MISMATCH);
    CHECK(strstr(shmring_get_last_error(comm), "2100") != NULL);
  }
  CHECK_OK(shmring_barrier(comm));
  CHECK_OK(shmring_comm_destroy(comm));
}

int main(void) {
  int failed = run_forked_ranks(kRanks, "c-p2p", run_rank);
  if (!failed) printf("C API, send/recv: all checks passed on %d ranks\n", kRanks);
  return failed;
}
