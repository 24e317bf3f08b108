#pragma once

// One shmrun job: spawn N workers, supervise them from a single thread with
// poll(), tear the job down on the first failure, a signal or the timeout,
// and leave neither a process nor a segment behind.

#include <string>
#include <utility>
#include <vector>

namespace shmring::launcher {

struct JobSpec {
  int np = 1;
  std::vector<std::string> command;  ///< program (looked up in PATH) and its arguments
  std::string job_id;                ///< SHMRING_JOB_ID of every rank; names the segment
  std::string job_nonce;             ///< SHMRING_JOB_NONCE of every rank (hex; fresh per job)
  double grace_s = 3.0;              ///< SIGTERM -> SIGKILL delay on teardown
  double timeout_s = 0;              ///< whole-job limit; 0 = none
  bool tag_output = false;           ///< prefix each output line with "[rank] "
  bool bind_to_core = false;         ///< pin rank r to cores_per_rank cores from r*cores_per_rank
  int cores_per_rank = 1;
  bool report_bindings = false;
  /// Extra environment in order (later wins); the rank variables are set
  /// after these and always win.
  std::vector<std::pair<std::string, std::string>> env;
  /// A line for stderr once every rank's program has started (not when the
  /// program cannot run): what the launcher chose for the ranks.
  std::string notice;
};

/// Exit statuses besides a worker's own.
inline constexpr int kExitTimeout = 124;     ///< --timeout expired (as timeout(1))
inline constexpr int kExitCannotRun = 127;   ///< the program could not be executed
inline constexpr int kExitLaunchFailed = 1;  ///< fork/pipe failure in the launcher
/// A rank exited 0 without attaching while the job's other ranks waited
/// for it to attach: the job was ended.
inline constexpr int kExitUnattached = 1;

/// Runs the job and returns shmrun's exit status: 0 when every worker exited
/// 0; the first failed worker's status (128+signal for a signal); 124 on
/// timeout; 1 when a rank exited 0 without attaching while the others waited
/// for it (kExitUnattached). When the job was ended by a SIGINT/SIGTERM/SIGHUP sent to the
/// launcher, it re-raises that signal on itself after cleaning up (so a shell
/// sees "killed by SIGINT", exit 130), and returns 128+signal only if that
/// does not end the process.
int run_job(const JobSpec& spec);

/// Removes /dev/shm entries of this user's job `job_id`; returns how many.
int remove_job_segments(const std::string& job_id);

}  // namespace shmring::launcher
