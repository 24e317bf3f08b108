#pragma once

#include <cstdio>
#include <string>

namespace shmring::tools {

/// `shmrun --status [--job-id ID]`: one table per live shmring job of this
/// user on this host (of job ID only, if given), one row per rank, read from
/// the segment's flight recorders (docs/design/recorder.md). Returns the
/// exit status. `kill -USR1` on a running shmrun prints its job's table to
/// stderr (shmrun_job.cpp).
int print_status(const std::string& job_id, FILE* out = stdout);

}  // namespace shmring::tools
