#pragma once

// `shmrun --info`: what a job started by this shmrun would run with, one
// section after another (as ompi_info and ucc_info print theirs). Each
// section is a function of its own: a new one (the collectives' algorithm
// choices for -n N) is one more function called from print_info.

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace shmring::launcher {

struct InfoRequest {
  /// Variables shmrun's command line sets for every worker (-x, --threads,
  /// --slots, --slot-bytes, --job-id), in order: a later one wins.
  std::vector<std::pair<std::string, std::string>> command_line;
  /// -n N when given, else 0 (for sections that depend on the job's size).
  int np = 0;
  bool markdown = false;
};

/// Prints every section to `out`. Returns 0, or 1 when a value in effect
/// would be refused by the workers (the message is printed with it).
int print_info(std::FILE* out, const InfoRequest& request);

/// Section (with -n N): the algorithm each collective takes at 8 B .. 64 MiB
/// for N ranks on the CPUs shmrun may use, with the measurement behind each
/// choice (src/engine/tuning.cpp). Returns 1 when a setting is refused.
int print_algorithms(std::FILE* out, const InfoRequest& request);

/// Section: every SHMRING_* variable with the value in effect, its source
/// (default, environment, command line or shmrun), its default and its
/// doc, grouped by audience. Returns the number of refused values.
int print_settings(std::FILE* out, const InfoRequest& request);

/// The settings table as Markdown (docs/reference/environment.md is this
/// output): declarations only, nothing from this environment.
void print_settings_markdown(std::FILE* out);

}  // namespace shmring::launcher
