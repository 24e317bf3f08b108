/* NULL arguments of the C API's collectives, compiled as C99, on 3 forked
 * ranks: a NULL count or displacement array of a v-collective (blocking and
 * non-blocking) is SHMRING_ERR_INVALID_ARGUMENT naming the array and its
 * expected length; a NULL `req` of an i-collective, or `newcomm` of
 * shmring_comm_split, is refused likewise. Made on one rank only, the
 * peers' matching call fails at once with SHMRING_ERR_MISMATCH naming that
 * rank, instead of a wait until SHMRING_TIMEOUT. Exit status 0 means every
 * check passed. */
#define _POSIX_C_SOURCE 200809L
#include <shmring/shmring.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "c_harness.h"

enum { kRanks = 3, kBad = 1 };

/* Distinct per (rank, index). */
static int32_t val(int rank, int i) {
  return rank * 10000 + i + 1;
}

/* `r` is SHMRING_ERR_INVALID_ARGUMENT and the message says `name` is NULL. */
static void check_null_named(shmring_comm_t comm, shmring_result_t r, const char* name) {
  char want[128];
  const char* msg = shmring_get_last_error(comm);
  snprintf(want, sizeof want, "%s is NULL; expected an array of %d entries", name, kRanks);
  if (r != SHMRING_ERR_INVALID_ARGUMENT || strstr(msg, want) == NULL) {
    fprintf(stderr, "expected \"%s\" (invalid argument), got %d: %s\n", want, (int)r, msg);
    exit(1);
  }
}

/* Every rank passes the same NULL array: each gets the named error, and the
 * communicator stays usable. */
static void run_all_null(int rank, const char* job) {
  shmring_comm_t comm = NULL;
  shmring_request_t req = (shmring_request_t)&req;
  size_t n[kRanks] = {1, 1, 1}, d[kRanks] = {0, 1, 2};
  int32_t in[kRanks], out[kRanks];
  int i;
  for (i = 0; i < kRanks; ++i) in[i] = val(rank, i);
  CHECK_OK(shmring_comm_init(&comm, rank, kRanks, job));

  check_null_named(comm, shmring_alltoallv(in, NULL, d, out, n, d, SHMRING_INT32, comm),
                   "send_counts");
  check_null_named(comm, shmring_alltoallv(in, n, NULL, out, n, d, SHMRING_INT32, comm),
                   "send_displs");
  check_null_named(comm, shmring_alltoallv(in, n, d, out, NULL, d, SHMRING_INT32, comm),
                   "recv_counts");
  check_null_named(comm, shmring_ialltoallv(in, n, d, out, n, NULL, SHMRING_INT32, comm, &req),
                   "recv_displs");
  CHECK(req == NULL);
  check_null_named(comm, shmring_allgatherv(in, 1, out, NULL, d, SHMRING_INT32, comm),
                   "recv_counts");
  req = (shmring_request_t)&req;
  check_null_named(comm, shmring_iallgatherv(in, 1, out, n, NULL, SHMRING_INT32, comm, &req),
                   "displs");
  CHECK(req == NULL);
  check_null_named(comm, shmring_reduce_scatter_v(in, out, NULL, SHMRING_INT32, SHMRING_SUM, comm),
                   "recv_counts");
  req = (shmring_request_t)&req;
  check_null_named(comm,
                   shmring_ireduce_scatter_v(in, out, NULL, SHMRING_INT32, SHMRING_SUM, comm, &req),
                   "recv_counts");
  CHECK(req == NULL);
  CHECK(strstr(shmring_get_last_error(comm), "reduce_scatter_v") != NULL);

  /* Still usable: a correct alltoallv after the refusals. */
  CHECK_OK(shmring_alltoallv(in, n, d, out, n, d, SHMRING_INT32, comm));
  for (i = 0; i < kRanks; ++i) CHECK(out[i] == val(i, rank));
  CHECK_OK(shmring_comm_destroy(comm));
}

/* The peers' side of a refusal by rank kBad: `r` is a mismatch naming it. */
static void check_peer_told(shmring_comm_t comm, shmring_result_t r) {
  char want[64];
  const char* msg = shmring_get_last_error(comm);
  snprintf(want, sizeof want, "rank %d made an invalid call", kBad);
  if (r != SHMRING_ERR_MISMATCH || strstr(msg, want) == NULL) {
    fprintf(stderr, "expected a mismatch naming rank %d, got %d: %s\n", kBad, (int)r, msg);
    exit(1);
  }
}

/* Only rank kBad passes NULL recv_counts to allgatherv. */
static void run_one_null(int rank, const char* job) {
  shmring_comm_t comm = NULL;
  size_t n[kRanks] = {1, 1, 1}, d[kRanks] = {0, 1, 2};
  int32_t in = val(rank, 0), out[kRanks];
  shmring_result_t r;
  CHECK_OK(shmring_comm_init(&comm, rank, kRanks, job));
  r = shmring_allgatherv(&in, 1, out, rank == kBad ? NULL : n, d, SHMRING_INT32, comm);
  if (rank == kBad)
    check_null_named(comm, r, "recv_counts");
  else
    check_peer_told(comm, r);
  CHECK_OK(shmring_comm_destroy(comm));
}

/* Only rank kBad passes NULL send_counts to ialltoallv. */
static void run_one_null_nb(int rank, const char* job) {
  shmring_comm_t comm = NULL;
  shmring_request_t req = NULL;
  size_t n[kRanks] = {1, 1, 1}, d[kRanks] = {0, 1, 2};
  int32_t in[kRanks], out[kRanks];
  int i;
  for (i = 0; i < kRanks; ++i) in[i] = val(rank, i);
  CHECK_OK(shmring_comm_init(&comm, rank, kRanks, job));
  if (rank == kBad) {
    check_null_named(comm, shmring_ialltoallv(in, NULL, d, out, n, d, SHMRING_INT32, comm, &req),
                     "send_counts");
    CHECK(req == NULL);
  } else {
    CHECK_OK(shmring_ialltoallv(in, n, d, out, n, d, SHMRING_INT32, comm, &req));
    check_peer_told(comm, shmring_wait(&req));
  }
  CHECK_OK(shmring_comm_destroy(comm));
}

/* Only rank kBad passes a NULL req to iallreduce. */
static void run_one_null_req(int rank, const char* job) {
  shmring_comm_t comm = NULL;
  shmring_request_t req = NULL;
  int32_t in = val(rank, 0), out = 0;
  CHECK_OK(shmring_comm_init(&comm, rank, kRanks, job));
  if (rank == kBad) {
    shmring_result_t r = shmring_iallreduce(&in, &out, 1, SHMRING_INT32, SHMRING_SUM, comm, NULL);
    CHECK(r == SHMRING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(shmring_get_last_error(comm), "req is NULL") != NULL);
  } else {
    CHECK_OK(shmring_iallreduce(&in, &out, 1, SHMRING_INT32, SHMRING_SUM, comm, &req));
    check_peer_told(comm, shmring_wait(&req));
  }
  CHECK_OK(shmring_comm_destroy(comm));
}

/* Only rank kBad passes a NULL newcomm to shmring_comm_split. */
static void run_one_null_split(int rank, const char* job) {
  shmring_comm_t comm = NULL, half = NULL;
  CHECK_OK(shmring_comm_init(&comm, rank, kRanks, job));
  if (rank == kBad) {
    CHECK(shmring_comm_split(comm, 0, rank, NULL) == SHMRING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(shmring_get_last_error(comm), "newcomm is NULL") != NULL);
  } else {
    check_peer_told(comm, shmring_comm_split(comm, 0, rank, &half));
    CHECK(half == NULL);
  }
  CHECK_OK(shmring_comm_destroy(comm));
}

/* Enum values that an 8-bit cast would wrap to valid ones (256 -> float32 /
 * sum, 257 -> float64), and one inside 8 bits (99), named by the C type
 * alike: rank kBad passes them, one case per communicator
 * (a refusal breaks it), blocking and i-form; it gets InvalidArgumentError
 * naming the value it passed, the peers a mismatch naming it. A send's bad
 * datatype stays on the sender. */
static void run_one_bad_enum(int rank, const char* job) {
  float in[4] = {1, 2, 3, 4}, out[4] = {0};
  int k;
  for (k = 0; k < 5; ++k) {
    shmring_comm_t comm = NULL;
    shmring_request_t req = NULL;
    shmring_result_t r = SHMRING_SUCCESS;
    char id[96];
    const char* want = NULL;
    snprintf(id, sizeof id, "%s-%d", job, k);
    CHECK_OK(shmring_comm_init(&comm, rank, kRanks, id));
    if (rank == kBad) {
      if (k == 0) {
        r = shmring_allreduce(in, out, 4, (shmring_datatype_t)256, SHMRING_SUM, comm);
        want = "datatype 256 is not a shmring_datatype_t";
      } else if (k == 1) {
        r = shmring_iallreduce(in, out, 4, SHMRING_FLOAT32, (shmring_reduce_op_t)256, comm, &req);
        CHECK(req == NULL);
        want = "reduce op 256 is not a shmring_reduce_op_t";
      } else if (k == 2) {
        r = shmring_broadcast(in, 4, (shmring_datatype_t)-1, 0, comm);
        want = "datatype -1 is not";
      } else if (k == 3) {
        r = shmring_send(in, 4, (shmring_datatype_t)257, 0, 0, comm);
        want = "send: datatype 257 is not";
      } else {
        r = shmring_allreduce(in, out, 4, (shmring_datatype_t)99, SHMRING_SUM, comm);
        want = "datatype 99 is not a shmring_datatype_t (0..7)";
      }
      CHECK(r == SHMRING_ERR_INVALID_ARGUMENT);
      CHECK(strstr(shmring_get_last_error(comm), want) != NULL);
    } else if (k == 0) {
      check_peer_told(comm, shmring_allreduce(in, out, 4, SHMRING_FLOAT32, SHMRING_SUM, comm));
    } else if (k == 1) {
      CHECK_OK(shmring_iallreduce(in, out, 4, SHMRING_FLOAT32, SHMRING_SUM, comm, &req));
      check_peer_told(comm, shmring_wait(&req));
    } else if (k == 2) {
      check_peer_told(comm, shmring_broadcast(in, 4, SHMRING_FLOAT32, 0, comm));
    } else if (k == 4) {
      check_peer_told(comm, shmring_allreduce(in, out, 4, SHMRING_FLOAT32, SHMRING_SUM, comm));
    }
    /* k == 3: the send was refused locally; every rank is still usable. */
    if (k == 3) CHECK_OK(shmring_allreduce(in, out, 4, SHMRING_FLOAT32, SHMRING_SUM, comm));
    CHECK_OK(shmring_comm_destroy(comm));
  }
}

/* shmring_comm_init's explicit rank and size: -1 is no "from the
 * environment" there, and every bad pair names both values. */
static int check_bad_init(int rank, int size) {
  shmring_comm_t comm = (shmring_comm_t)&comm;
  char want[64];
  const char* msg;
  shmring_result_t r = shmring_comm_init(&comm, rank, size, "c-bad-init");
  msg = shmring_get_last_error(NULL);
  snprintf(want, sizeof want, "rank=%d, size=%d: expected", rank, size);
  if (r != SHMRING_ERR_INVALID_ARGUMENT || comm != NULL || strstr(msg, want) == NULL) {
    fprintf(stderr, "shmring_comm_init(%d, %d): expected \"%s\" (invalid argument), got %d: %s\n",
            rank, size, want, (int)r, msg);
    return 1;
  }
  return 0;
}

int main(void) {
  int failed = check_bad_init(-1, 2) | check_bad_init(-1, -1) | check_bad_init(0, 0) |
               check_bad_init(2, 2) | check_bad_init(-5, 3);
  failed |= run_forked_ranks(kRanks, "c-null-all", run_all_null);
  failed |= run_forked_ranks(kRanks, "c-null-one", run_one_null);
  failed |= run_forked_ranks(kRanks, "c-null-one-nb", run_one_null_nb);
  failed |= run_forked_ranks(kRanks, "c-null-req", run_one_null_req);
  failed |= run_forked_ranks(kRanks, "c-null-split", run_one_null_split);
  failed |= run_forked_ranks(kRanks, "c-bad-enum", run_one_bad_enum);
  if (!failed) printf("C API, NULL arguments: all checks passed on %d ranks\n", kRanks);
  return failed;
}
