#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace shmring::tools {

/// `shmrun --status [--job-id ID]`: one table per live shmring job of this
/// user on this host (of job ID only, if given), one row per rank, read from
/// the segment's flight recorders (docs/design/recorder.md). Returns the
/// exit status. `kill -USR1` on a running shmrun prints its job's table to
/// stderr (shmrun_job.cpp).
int print_status(const std::string& job_id, FILE* out = stdout);

/// The ranks that have not attached to job `job_id`'s segment while it is
/// still starting (its name in /dev/shm, some rank absent), in order; empty
/// when no such segment exists, or when the segment is another job's of the
/// same id (its header's nonce is not `job_nonce`, SHMRING_JOB_NONCE of this
/// job's ranks). Read-only, as print_status.
std::vector<int> ranks_not_attached(const std::string& job_id, std::uint64_t job_nonce);

}  // namespace shmring::tools
