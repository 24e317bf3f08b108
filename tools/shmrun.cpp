// shmrun: start N local workers of one shmring job.
//
//   shmrun -n N [options] -- program [args...]
//
// Every worker gets SHMRING_RANK / SHMRING_WORLD_SIZE / SHMRING_JOB_ID (a fresh
// random job id) and torchrun's RANK / WORLD_SIZE / LOCAL_RANK /
// LOCAL_WORLD_SIZE. The launcher waits for all of them; when one fails
// (non-zero exit or a signal) the others get SIGTERM, then SIGKILL after a
// grace period, and shmrun exits with the first failure's status (128+signal
// for a signal), like mpirun.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shmring/version.hpp"

namespace {

std::string random_job_id() {
  std::random_device rd;
  std::uint64_t x = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("{:x}-{:016x}", static_cast<unsigned>(getpid()), x);
}

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) {
  g_signal = sig;
}

int status_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string status_text(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  return "stopped";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shmrun: launch N local workers of a shmring job"};
  int np = 0;
  double grace_s = 3.0;
  std::vector<std::string> command;
  app.add_option("-n,--np", np, "Number of worker processes")
      ->required()
      ->check(CLI::Range(1, 4096));
  app.add_option("--grace", grace_s, "Seconds between SIGTERM and SIGKILL on teardown")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("command", command, "Program and its arguments (after --)")->required();
  app.set_version_flag("--version", std::string("shmrun (shmring) ") + SHMRING_VERSION_STRING);
  CLI11_PARSE(app, argc, argv);

  const std::string job_id = random_job_id();
  std::vector<pid_t> pids(np, -1);
  const pid_t launcher = getpid();

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::vector<char*> args;
  for (auto& a : command) args.push_back(a.data());
  args.push_back(nullptr);

  for (int r = 0; r < np; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("shmrun: fork");
      for (int i = 0; i < r; ++i) kill(pids[i], SIGKILL);
      return 1;
    }
    if (pid == 0) {
      // Die with the launcher, even if it is SIGKILLed.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(1);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      auto set = [](const char* k, const std::string& v) { setenv(k, v.c_str(), 1); };
      set("SHMRING_RANK", std::to_string(r));
      set("SHMRING_WORLD_SIZE", std::to_string(np));
      set("SHMRING_LOCAL_RANK", std::to_string(r));
      set("SHMRING_LOCAL_WORLD_SIZE", std::to_string(np));
      set("SHMRING_JOB_ID", job_id);
      set("RANK", std::to_string(r));
      set("WORLD_SIZE", std::to_string(np));
      set("LOCAL_RANK", std::to_string(r));
      set("LOCAL_WORLD_SIZE", std::to_string(np));
      execvp(args[0], args.data());
      std::fprintf(stderr, "shmrun: rank %d: cannot run '%s': %s\n", r, args[0],
                   std::strerror(errno));
      _exit(127);
    }
    pids[r] = pid;
  }

  int alive = np;
  int first_status = -1, first_rank = -1;
  bool terminating = false;
  auto term_deadline = std::chrono::steady_clock::time_point::max();
  auto signal_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) kill(p, sig);
  };
  while (alive > 0) {
    int status = 0;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      int r = -1;
      for (int i = 0; i < np; ++i)
        if (pids[i] == p) r = i;
      if (r < 0) continue;
      pids[r] = -1;
      --alive;
      if (status_code(status) != 0 && first_status < 0) {
        first_status = status;
        first_rank = r;
        if (!terminating && alive > 0) {
          terminating = true;
          signal_all(SIGTERM);
          term_deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(grace_s));
        }
      }
      continue;
    }
    if (g_signal != 0) {
      int sig = g_signal;
      g_signal = 0;
      signal_all(sig);
      if (terminating) signal_all(SIGKILL);  // a second signal: no more waiting
      terminating = true;
      term_deadline = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(grace_s));
    }
    if (terminating && std::chrono::steady_clock::now() >= term_deadline) signal_all(SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (first_status >= 0) {
    std::fprintf(stderr, "shmrun: rank %d (of %d) %s; job terminated\n", first_rank, np,
                 status_text(first_status).c_str());
    return status_code(first_status);
  }
  return 0;
}
