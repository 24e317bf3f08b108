// shmrun: start N local workers of one shmring job.
//
//   shmrun -n N [options] [--] program [args...]
//   shmrun --list | --cleanup
//   shmrun --info [--markdown] [-n N] [-x VAR=VALUE ...]
//
// Every worker gets SHMRING_RANK / SHMRING_WORLD_SIZE / SHMRING_LOCAL_RANK /
// SHMRING_LOCAL_WORLD_SIZE / SHMRING_JOB_ID (a fresh random job id unless
// --job-id is given) and torchrun's RANK / WORLD_SIZE / LOCAL_RANK /
// LOCAL_WORLD_SIZE (plus GROUP_RANK=0, ROLE_RANK...), and MASTER_ADDR=127.0.0.1
// and a free MASTER_PORT unless those are already set, so that torch scripts
// using init_method="env://" run unchanged.
//
// Workers run in a process group of their own, die with the launcher
// (PR_SET_PDEATHSIG) and are supervised from one thread: when one fails
// (non-zero exit or a signal) the others get SIGTERM, then SIGKILL after
// --grace seconds, and shmrun prints one line naming the rank and exits with
// its status (128+signal for a signal), like mpirun. SIGINT/SIGTERM/SIGHUP
// are forwarded to the workers; a second one kills them at once. --timeout
// ends the job with status 124, like timeout(1). Segments of the job left by
// workers that died before everyone attached are removed at the end.

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "base/config.hpp"
#include "shmring/version.hpp"
#include "shmrun_info.hpp"
#include "shmrun_job.hpp"
#include "shmrun_status.hpp"
#include "transport/segment.hpp"

namespace {

std::string random_job_id() {
  std::random_device rd;
  std::uint64_t x = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("{:x}-{:016x}", static_cast<unsigned>(getpid()), x);
}

// SHMRING_JOB_NONCE: fresh for every shmrun, so that two jobs given the same
// --job-id tell each other's segment from their own and both fail at once.
std::string random_nonce() {
  std::random_device rd;
  std::uint64_t x = 0;
  while (x == 0)
    x = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ (std::uint64_t(getpid()) << 16);
  return fmt::format("{:016x}", x);
}

// Variables shmrun sets per rank: a -x of one of them is a usage error, not a
// silent override in either direction.
constexpr const char* kRankVariables[] = {"SHMRING_RANK",       "SHMRING_WORLD_SIZE",
                                          "SHMRING_LOCAL_RANK", "SHMRING_LOCAL_WORLD_SIZE",
                                          "SHMRING_JOB_NONCE",  "RANK",
                                          "WORLD_SIZE",         "LOCAL_RANK",
                                          "LOCAL_WORLD_SIZE"};

bool valid_env_name(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      return false;
  return true;
}

// "VAR=VALUE" sets VAR; a bare "VAR" passes on the launcher's value (mpirun's -x).
std::pair<std::string, std::string> parse_export(const std::string& arg) {
  auto eq = arg.find('=');
  std::string name = arg.substr(0, eq);
  if (!valid_env_name(name))
    throw CLI::ValidationError(
        "-x", fmt::format("'{}': expected VAR=VALUE or VAR, VAR made of [A-Za-z0-9_]", arg));
  if (eq != std::string::npos) return {name, arg.substr(eq + 1)};
  const char* v = std::getenv(name.c_str());
  if (v == nullptr)
    throw CLI::ValidationError("-x", fmt::format("'{}' is not set in shmrun's environment", name));
  return {name, v};
}

// A segment younger than this may belong to a rank 0 that is still creating
// it (its liveness lock is taken just after the file appears).
constexpr double kMinStaleAgeS = 1.0;

double age_s(const std::string& name) {
  struct stat st {};
  if (::stat(("/dev/shm/" + name).c_str(), &st) != 0) return 0;
  return std::difftime(std::time(nullptr), st.st_ctime);
}

// With a job id, only that job's segments ("shmring-<uid>-<job id>-<host>").
int list_or_cleanup(bool cleanup, const std::string& job_id) {
  namespace d = shmring::detail;
  auto segments = d::list_segments();
  if (!job_id.empty()) {
    const std::string prefix = fmt::format("shmring-{}-{}-", getuid(), job_id);
    std::erase_if(segments, [&](const d::SegmentInfo& s) {
      return s.name.rfind(prefix, 0) != 0 || s.name.find('-', prefix.size()) != std::string::npos;
    });
  }
  if (segments.empty()) {
    std::printf("shmrun: no shmring segment of user %u%s in /dev/shm\n", getuid(),
                job_id.empty() ? "" : fmt::format(" and job {}", job_id).c_str());
    return 0;
  }
  int failed = 0;
  for (const auto& s : segments) {
    const char* state = s.creator_alive ? "alive" : "dead";
    std::string what =
        fmt::format("{}  {} bytes  creator pid {} ({})", s.name, s.bytes, s.creator_pid, state);
    if (!cleanup) {
      std::printf("%s\n", what.c_str());
    } else if (s.creator_alive) {
      std::printf("kept    %s\n", what.c_str());
    } else if (age_s(s.name) < kMinStaleAgeS) {
      std::printf("kept    %s: created under %g s ago\n", what.c_str(), kMinStaleAgeS);
    } else if (::shm_unlink(("/" + s.name).c_str()) == 0) {
      std::printf("removed %s\n", what.c_str());
    } else {
      std::fprintf(stderr, "shmrun: cannot remove %s: %s\n", s.name.c_str(), std::strerror(errno));
      ++failed;
    }
  }
  return failed ? 1 : 0;
}

// CLI11's words for an option without its value ("1 required INT:INT in
// [1 - 4096] missing") or given twice ("At Most 1 required but received
// 2"), in plain ones; every other message as CLI11 (or shmrun) wrote it.
std::string usage_error_text(const CLI::Error& e) {
  const std::string what = e.what();
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) == nullptr) return what;
  const auto colon = what.find(": ");
  if (colon == std::string::npos) return what;
  const std::string option = what.substr(0, colon);
  if (what.ends_with(" missing")) return fmt::format("{} needs a value after it", option);
  if (what.find("At Most") != std::string::npos)
    return fmt::format("{} was given more than once; give it once", option);
  return what;
}

// mpirun users type "-np 4", which CLI11 would read as "-n p". Rewrite it to
// "--np" among shmrun's own options only, never in the program's arguments.
void accept_mpirun_np(int argc, char** argv) {
  static char long_np[] = "--np";
  const std::vector<std::string> with_value = {
      "-n",      "--np", "--nproc-per-node", "--nproc_per_node", "--bind-to",    "--timeout",
      "--grace", "-x",   "--threads",        "--slots",          "--slot-bytes", "--job-id"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") return;
    if (a == "-np") {
      argv[i] = long_np;
    } else if (std::find(with_value.begin(), with_value.end(), a) != with_value.end()) {
      ++i;  // its value
    } else if (a.empty() || a[0] != '-') {
      return;  // the program
    }
  }
}

// CLI::Range's check, with a message that tells a value that is not a
// number ("abc") from one out of range: "'abc': expected an integer from 1
// to 4096". `multiple_of` (integers): the value must be a multiple of it.
template <class T>
CLI::Validator in_range(T lo, T hi, T multiple_of = T{}) {
  const std::string kind = std::is_integral_v<T> ? "an integer" : "a number";
  const std::string want =
      multiple_of != T{}
          ? fmt::format("expected a multiple of {} from {} to {}", multiple_of, lo, hi)
          : fmt::format("expected {} from {} to {}", kind, lo, hi);
  return CLI::Validator(
      [lo, hi, multiple_of, want](std::string& v) -> std::string {
        T x{};
        bool ok;
        if constexpr (std::is_integral_v<T>) {
          // Decimal only ("010" is ten, not CLI11's octal eight): the value
          // is handed on in canonical form.
          const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
          ok = ec == std::errc() && end == v.data() + v.size() && x >= lo && x <= hi;
          if (ok) v = std::to_string(x);
        } else {
          ok = CLI::detail::lexical_cast(v, x) && x >= lo && x <= hi;
        }
        if constexpr (std::is_integral_v<T>)
          ok = ok && (multiple_of == T{} || x % multiple_of == 0);
        return ok ? "" : fmt::format("'{}': {}", v, want);
      },
      multiple_of != T{}
          ? fmt::format("MULTIPLE OF {} in [{} - {}]", multiple_of, lo, hi)
          : fmt::format("{} in [{} - {}]", std::is_integral_v<T> ? "INT" : "FLOAT", lo, hi));
}

}  // namespace

int main(int argc, char** argv) {
  accept_mpirun_np(argc, argv);
  namespace l = shmring::launcher;
  CLI::App app{
      "shmrun: launch N local workers of a shmring job\n\n"
      "  shmrun -n N [options] [--] program [args...]\n"
      "  shmrun --list | --cleanup\n"
      "  shmrun --info [--markdown] [-n N]\n"
      "  shmrun --status [--job-id ID]\n"};
  app.get_formatter()->column_width(32);
  l::JobSpec spec;
  std::string bind_to = "none";
  std::vector<std::string> exports;
  int threads = 0;
  std::size_t slots = 0, slot_bytes = 0;
  bool list = false, cleanup = false, info = false, markdown = false;

  // --nproc_per_node: torchrun takes both spellings, so users type both.
  auto* np = app.add_option("-n,--np,--nproc-per-node,--nproc_per_node", spec.np,
                            "Number of worker processes (ranks); mpirun's -np works too")
                 ->transform(in_range(1, 4096));
  app.add_flag("--tag-output", spec.tag_output,
               "Prefix every line of stdout and stderr with '[rank] '");
  app.add_option("--bind-to", bind_to,
                 "core: pin rank r to core r mod cores (r*T.. with --threads T); none: no pinning")
      ->check(CLI::IsMember({"core", "none"}))
      ->capture_default_str();
  app.add_flag("--report-bindings", spec.report_bindings,
               "Print each rank's pid and cores to stderr");
  app.add_option("--timeout", spec.timeout_s,
                 "Seconds the whole job may run; then it is terminated and shmrun exits 124")
      ->transform(in_range(0.001, 1e9));
  app.add_option("--grace", spec.grace_s, "Seconds between SIGTERM and SIGKILL on teardown")
      ->transform(in_range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("-x", exports,
                 "VAR=VALUE (or VAR: its current value) for every worker; repeatable")
      ->allow_extra_args(false)
      ->type_name("VAR=VALUE");
  app.add_option("--threads", threads, "Reduction threads per rank (SHMRING_THREADS)")
      ->transform(in_range(1, 1024));
  app.add_option("--slots", slots, "Ring slots per rank (SHMRING_SLOTS)")
      ->transform(in_range(2, 62));  // the library's range (its descriptor ring holds 64)
  app.add_option("--slot-bytes", slot_bytes,
                 "Bytes per slot, a multiple of 4096 (SHMRING_SLOT_BYTES)")
      ->transform(in_range(std::size_t{4096}, std::size_t{1} << 30, std::size_t{4096}));
  app.add_option("--job-id", spec.job_id,
                 "Job id shared by the ranks (default: random); names the segment")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            return shmring::detail::valid_job_id(v)
                       ? ""
                       : fmt::format("'{}': expected 1 to 64 characters from [A-Za-z0-9._-]", v);
          },
          "ID"));
  app.add_flag("--list", list,
               "List this user's shmring segments in /dev/shm (of job --job-id if given), exit");
  app.add_flag("--cleanup", cleanup,
               "Remove this user's shmring segments (of job --job-id if given) whose creator is "
               "dead, and exit");
  auto* info_opt = app.add_flag(
      "--info", info,
      "Print every SHMRING_* setting a job would run with (value, source, default, doc), "
      "with -x and the other options applied, and exit (1 if a value would be refused)");
  app.add_flag("--markdown", markdown,
               "With --info: print the settings table as Markdown "
               "(docs/reference/environment.md)")
      ->needs(info_opt);
  bool status = false;
  app.add_flag("--status", status,
               "Show what every rank of this user's running shmring jobs (of job --job-id if "
               "given) is doing, read-only, and exit");
  app.set_version_flag("--version", std::string("shmrun (shmring) ") + SHMRING_VERSION_STRING);
  // Everything from the program name on belongs to the program, with or
  // without "--": `shmrun -n 2 prog -n 5` passes "-n 5" to prog.
  app.prefix_command();
  app.footer(
      "Environment of each worker: SHMRING_RANK, SHMRING_WORLD_SIZE, SHMRING_LOCAL_RANK,\n"
      "SHMRING_LOCAL_WORLD_SIZE, SHMRING_JOB_ID, SHMRING_JOB_NONCE; torchrun's RANK,\n"
      "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK,\n"
      "ROLE_WORLD_SIZE; MASTER_ADDR=127.0.0.1 and a free MASTER_PORT unless set;\n"
      "OMP_NUM_THREADS and MKL_NUM_THREADS = CPUs / ranks unless set. -x SHMRING_JOB_ID=ID\n"
      "is the same as --job-id ID.\n"
      "Exit status: 0, or the first failed rank's (128+signal), 124 on --timeout, 1 if a\n"
      "rank exited 0 without attaching while the others waited for it, 127 if the program\n"
      "cannot be run, 2 for a usage error.");

  // Usage errors look like the launcher's other errors: "shmrun: ...".
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("shmrun: {}\nRun 'shmrun --help' for the options.\n", usage_error_text(e));
  });
  try {
    app.parse(argc, argv);
    if (int(list) + int(cleanup) + int(info) + int(status) > 1)
      throw CLI::ValidationError("--list, --cleanup, --info and --status: give only one");
    if (info && !app.remaining().empty())
      throw CLI::ValidationError(
          fmt::format("--info starts no program: '{}' is left over", app.remaining().front()));
    if (list || cleanup || status) {
      // They read or remove segments and start nothing: an option of a
      // launch given with them is a mistake, not something to ignore.
      const char* mode = list ? "--list" : cleanup ? "--cleanup" : "--status";
      for (const char* name : {"-n", "--tag-output", "--bind-to", "--report-bindings", "--timeout",
                               "--grace", "-x", "--threads", "--slots", "--slot-bytes"})
        if (app.get_option(name)->count() > 0)
          throw CLI::ValidationError(fmt::format("{} applies to a launch; {} takes only --job-id",
                                                 app.get_option(name)->get_name(), mode));
      std::vector<std::string> left = app.remaining();
      if (!left.empty() && left.front() == "--") left.erase(left.begin());
      if (!left.empty())
        throw CLI::ValidationError(
            fmt::format("{} starts no program: '{}' is left over", mode, left.front()));
    }
    if (!list && !cleanup && !info && !status) {
      spec.command = app.remaining();
      if (!spec.command.empty() && spec.command.front() == "--") {
        spec.command.erase(spec.command.begin());
      } else if (!spec.command.empty() && spec.command.front().size() > 1 &&
                 spec.command.front()[0] == '-') {
        // CLI11 stops at the first word it does not know and hands the rest
        // to the program; a dash there is a mistyped option, not a program.
        throw CLI::ParseError(
            fmt::format("unknown option '{}' (a program whose name starts with '-' goes "
                        "after --)",
                        spec.command.front()),
            2);
      }
      if (np->count() == 0) throw CLI::RequiredError("-n,--np");
      if (spec.command.empty())
        throw CLI::RequiredError("program (give it after the options, e.g. -- ./prog args)");
    }
    for (const auto& x : exports) {
      auto kv = parse_export(x);
      for (const char* v : kRankVariables)
        if (kv.first == v)
          throw CLI::ValidationError(
              "-x",
              fmt::format("{}: shmrun sets {} for each rank itself; -n sets the world size", x, v));
      if (kv.first == "SHMRING_JOB_ID") {
        // The job id names the segment: take it as --job-id would.
        if (!shmring::detail::valid_job_id(kv.second))
          throw CLI::ValidationError(
              "-x", fmt::format("SHMRING_JOB_ID='{}': expected 1 to 64 characters from "
                                "[A-Za-z0-9._-]",
                                kv.second));
        if (!spec.job_id.empty() && spec.job_id != kv.second)
          throw CLI::ValidationError(
              "-x", fmt::format("SHMRING_JOB_ID={} disagrees with --job-id {}; give one", kv.second,
                                spec.job_id));
        spec.job_id = kv.second;
        continue;
      }
      // A flag and -x for the same setting: the same value is fine, two
      // values are a mistake to name, as for the job id above.
      const struct {
        const char* flag;
        const char* variable;
        std::uint64_t value;
      } flags[] = {{"--threads", "SHMRING_THREADS", static_cast<std::uint64_t>(threads)},
                   {"--slots", "SHMRING_SLOTS", slots},
                   {"--slot-bytes", "SHMRING_SLOT_BYTES", slot_bytes}};
      for (const auto& f : flags) {
        if (f.value == 0 || kv.first != f.variable) continue;
        std::uint64_t v = 0;
        const char* end = kv.second.data() + kv.second.size();
        const auto [at, ec] = std::from_chars(kv.second.data(), end, v);
        if (ec != std::errc() || at != end || v != f.value)
          throw CLI::ValidationError("-x", fmt::format("{}={} disagrees with {} {}; give one",
                                                       kv.first, kv.second, f.flag, f.value));
      }
      spec.env.push_back(std::move(kv));
    }
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error exits 2, as most tools do.
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (status) return shmring::tools::print_status(spec.job_id);
  if (list || cleanup) return list_or_cleanup(cleanup, spec.job_id);

  // After -x, which may repeat these settings only with the same values.
  if (threads > 0) spec.env.emplace_back("SHMRING_THREADS", std::to_string(threads));
  if (slots > 0) spec.env.emplace_back("SHMRING_SLOTS", std::to_string(slots));
  if (slot_bytes > 0) spec.env.emplace_back("SHMRING_SLOT_BYTES", std::to_string(slot_bytes));
  if (info) {
    l::InfoRequest request;
    request.command_line = spec.env;
    if (!spec.job_id.empty()) request.command_line.emplace_back("SHMRING_JOB_ID", spec.job_id);
    request.np = np->count() > 0 ? spec.np : 0;
    request.markdown = markdown;
    return l::print_info(stdout, request);
  }
  spec.bind_to_core = bind_to == "core";
  spec.cores_per_rank = threads > 0 ? threads : 1;
  if (spec.job_id.empty()) {
    if (const char* inherited = std::getenv("SHMRING_JOB_ID"); inherited && *inherited)
      std::fprintf(stderr,
                   "shmrun: note: SHMRING_JOB_ID=%s in the environment is replaced by a fresh "
                   "job id; use --job-id (or -x SHMRING_JOB_ID=...) to choose one\n",
                   inherited);
    spec.job_id = random_job_id();
  }
  spec.job_nonce = random_nonce();
  // One OpenMP (and MKL) pool per rank of the rank's share of the CPUs, as
  // torchrun does: N ranks each starting a pool of every CPU is the commonest
  // way CPU trainers lose their speed. The user's own setting wins.
  {
    const int cpus = shmring::detail::affinity_cpus();
    const int per_rank =
        spec.bind_to_core ? std::min(spec.cores_per_rank, cpus) : std::max(1, cpus / spec.np);
    std::vector<std::string> set;
    for (const char* v : {"OMP_NUM_THREADS", "MKL_NUM_THREADS"}) {
      const bool by_x = std::any_of(spec.env.begin(), spec.env.end(),
                                    [&](const auto& kv) { return kv.first == v; });
      const char* inherited = std::getenv(v);
      if (by_x || (inherited != nullptr && *inherited != '\0')) continue;
      spec.env.insert(spec.env.begin(), {v, std::to_string(per_rank)});
      set.push_back(v);
    }
    // Bound ranks get their own cores' worth, even where the ranks
    // outnumber the cores and share them.
    const std::string why = spec.bind_to_core
                                ? fmt::format("--bind-to core: {} core(s) per rank", per_rank)
                                : fmt::format("{} CPU{} / {} rank{}", cpus, cpus == 1 ? "" : "s",
                                              spec.np, spec.np == 1 ? "" : "s");
    // Said once the ranks run (run_job), not for a program that cannot.
    if (!set.empty())
      spec.notice =
          fmt::format("shmrun: setting {}={} for each rank ({}); set {} yourself to choose",
                      set.size() == 2 ? "OMP_NUM_THREADS and MKL_NUM_THREADS" : set[0], per_rank,
                      why, set.size() == 2 ? "them" : "it");
  }
  return l::run_job(spec);
}
