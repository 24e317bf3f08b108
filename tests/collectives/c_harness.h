/* Shared by the C API tests (C99): checks that exit the rank's process with a
 * message, and a runner that forks one process per rank. */
#ifndef SHMRING_TESTS_C_HARNESS_H
#define SHMRING_TESTS_C_HARNESS_H

#include <shmring/shmring.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)
/* `comm` must name the communicator in scope (its last error is printed). */
#define CHECK_OK(call)                                                                        \
  do {                                                                                        \
    shmring_result_t r_ = (call);                                                             \
    if (r_ != SHMRING_SUCCESS) {                                                              \
      fprintf(stderr, "%s:%d: %s returned %d (%s): %s\n", __FILE__, __LINE__, #call, (int)r_, \
              shmring_get_error_string(r_), shmring_get_last_error(comm));                    \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

/* Forks `n` processes that each call run_rank(rank, job) with a job id unique
 * to this test run ("t-<SHMRING_TEST_TAG><name>-<pid>"), waits for them and
 * returns 0 when every one exited with status 0 (else 1, naming the ranks). */
static int run_forked_ranks(int n, const char* name, void (*run_rank)(int, const char*)) {
  char job[64];
  pid_t pids[64];
  int r, failed = 0;
  const char* tag = getenv("SHMRING_TEST_TAG");
  snprintf(job, sizeof job, "t-%s%s-%d", tag ? tag : "", name, (int)getpid());
  if (n > 64) return 1;
  for (r = 0; r < n; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      run_rank(r, job);
      _exit(0);
    }
  }
  for (r = 0; r < n; ++r) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed (status %d)\n", r, st);
      failed = 1;
    }
  }
  return failed;
}

#endif
