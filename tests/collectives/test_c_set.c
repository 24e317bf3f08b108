/* The staged collectives through the C API, compiled as C99, on 3 forked
 * ranks: alltoall, alltoallv, gather, scatter, allgatherv, reduce_scatter_v,
 * blocking and non-blocking, and a NULL count array (an invalid argument on
 * every rank). Exit status 0 means every check passed. */
#define _POSIX_C_SOURCE 200809L
#include <shmring/shmring.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "c_harness.h"

enum { kRanks = 3 };

/* Distinct per (rank, index). */
static int32_t val(int rank, int i) {
  return rank * 10000 + i + 1;
}

static void run_rank(int rank, const char* job) {
  shmring_comm_t comm = NULL;
  shmring_request_t req = NULL;
  int nb, q, i;
  CHECK_OK(shmring_comm_init(&comm, rank, kRanks, job));
  for (nb = 0; nb < 2; ++nb) {
    /* alltoall: 2 elements per block. */
    int32_t in[kRanks * 2], out[kRanks * 2];
    for (i = 0; i < kRanks * 2; ++i) in[i] = val(rank, i);
    if (nb) {
      CHECK_OK(shmring_ialltoall(in, out, 2, SHMRING_INT32, comm, &req));
      CHECK_OK(shmring_wait(&req));
    } else {
      CHECK_OK(shmring_alltoall(in, out, 2, SHMRING_INT32, comm));
    }
    for (q = 0; q < kRanks; ++q)
      for (i = 0; i < 2; ++i) CHECK(out[q * 2 + i] == val(q, rank * 2 + i));

    /* alltoallv: rank i sends i + j elements to rank j, blocks packed in order. */
    {
      size_t sc[kRanks], sd[kRanks], rc[kRanks], rd[kRanks], at = 0, rat = 0;
      int32_t vin[16], vout[16];
      for (q = 0; q < kRanks; ++q) {
        sc[q] = (size_t)(rank + q);
        sd[q] = at;
        at += sc[q];
        rc[q] = (size_t)(q + rank);
        rd[q] = rat;
        rat += rc[q];
      }
      for (i = 0; i < 16; ++i) vin[i] = val(rank, i);
      if (nb) {
        CHECK_OK(shmring_ialltoallv(vin, sc, sd, vout, rc, rd, SHMRING_INT32, comm, &req));
        CHECK_OK(shmring_wait(&req));
      } else {
        CHECK_OK(shmring_alltoallv(vin, sc, sd, vout, rc, rd, SHMRING_INT32, comm));
      }
      for (q = 0; q < kRanks; ++q) {
        size_t off = 0; /* rank q's send_displs[rank] */
        int k;
        for (k = 0; k < rank; ++k) off += (size_t)(q + k);
        for (i = 0; i < (int)rc[q]; ++i) CHECK(vout[rd[q] + i] == val(q, (int)off + i));
      }
    }

    /* gather and scatter at root 1, 3 elements each. */
    {
      int32_t g[3], all[kRanks * 3], s[3];
      for (i = 0; i < 3; ++i) g[i] = val(rank, i);
      for (i = 0; i < kRanks * 3; ++i) all[i] = rank == 1 ? val(1, i) : -1;
      if (nb) {
        CHECK_OK(shmring_iscatter(all, s, 3, SHMRING_INT32, 1, comm, &req));
        CHECK_OK(shmring_wait(&req));
      } else {
        CHECK_OK(shmring_scatter(all, s, 3, SHMRING_INT32, 1, comm));
      }
      for (i = 0; i < 3; ++i) CHECK(s[i] == val(1, rank * 3 + i));
      if (nb) {
        CHECK_OK(shmring_igather(g, rank == 1 ? all : NULL, 3, SHMRING_INT32, 1, comm, &req));
        CHECK_OK(shmring_wait(&req));
      } else {
        CHECK_OK(shmring_gather(g, rank == 1 ? all : NULL, 3, SHMRING_INT32, 1, comm));
      }
      if (rank == 1)
        for (q = 0; q < kRanks; ++q)
          for (i = 0; i < 3; ++i) CHECK(all[q * 3 + i] == val(q, i));
    }

    /* allgatherv with counts {2, 0, 3} and reduce_scatter_v over them. */
    {
      size_t rc[kRanks] = {2, 0, 3}, d[kRanks] = {0, 2, 2};
      int32_t mine[3], got[5], red[3];
      int32_t full[5];
      for (i = 0; i < 3; ++i) mine[i] = val(rank, i);
      if (nb) {
        CHECK_OK(shmring_iallgatherv(mine, rc[rank], got, rc, d, SHMRING_INT32, comm, &req));
        CHECK_OK(shmring_wait(&req));
      } else {
        CHECK_OK(shmring_allgatherv(mine, rc[rank], got, rc, d, SHMRING_INT32, comm));
      }
      for (q = 0; q < kRanks; ++q)
        for (i = 0; i < (int)rc[q]; ++i) CHECK(got[d[q] + i] == val(q, i));
      for (i = 0; i < 5; ++i) full[i] = val(rank, i);
      if (nb) {
        CHECK_OK(shmring_ireduce_scatter_v(full, red, rc, SHMRING_INT32, SHMRING_SUM, comm, &req));
        CHECK_OK(shmring_wait(&req));
      } else {
        CHECK_OK(shmring_reduce_scatter_v(full, red, rc, SHMRING_INT32, SHMRING_SUM, comm));
      }
      for (i = 0; i < (int)rc[rank]; ++i)
        CHECK(red[i] ==
              val(0, (int)d[rank] + i) + val(1, (int)d[rank] + i) + val(2, (int)d[rank] + i));
    }
  }

  /* A NULL count array on every rank: an invalid argument, named, and the
   * communicator stays usable. */
  {
    int32_t x[3], y[3];
    shmring_result_t e = shmring_reduce_scatter_v(x, y, NULL, SHMRING_INT32, SHMRING_SUM, comm);
    CHECK(e == SHMRING_ERR_INVALID_ARGUMENT);
    CHECK(strstr(shmring_get_last_error(comm), "recv_counts") != NULL);
    CHECK_OK(shmring_barrier(comm));
  }
  CHECK_OK(shmring_comm_destroy(comm));
}

int main(void) {
  int failed = run_forked_ranks(kRanks, "c-set", run_rank);
  if (!failed)
    printf(
        "C API (alltoall, gather, scatter and the v-collectives): all checks passed on %d ranks\n",
        kRanks);
  return failed;
}
