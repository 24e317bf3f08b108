#pragma once

#include <string>

namespace shmring::tools {

/// `shmrun --status [--job-id ID]`: one table per live shmring job of this
/// user on this host (of job ID only, if given), one row per rank, read from
/// the segment's flight recorders (docs/design/recorder.md). Returns the
/// exit status.
int print_status(const std::string& job_id);

}  // namespace shmring::tools
