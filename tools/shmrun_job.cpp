#include "shmrun_job.hpp"
#include "shmrun_status.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "shmrun_output.hpp"
#include "transport/segment.hpp"

extern char** environ;

namespace shmring::launcher {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kNever = Clock::time_point::max();
// How long the other ranks may run on after one failed, before SIGTERM.
constexpr auto kFailureLinger = std::chrono::milliseconds(300);
// How often shmrun looks whether a rank that exited 0 left the others
// waiting for it to attach (Job::check_left_before_attaching).
constexpr auto kLeftCheck = std::chrono::milliseconds(250);

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

int status_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string status_text(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({}){}", WTERMSIG(status),
                       sigabbrev_np(WTERMSIG(status)) ? sigabbrev_np(WTERMSIG(status)) : "?",
                       WCOREDUMP(status) ? ", core dumped" : "");
  return "stopped";
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

struct Pipe {
  Fd read, write;
};

std::optional<Pipe> make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
  return Pipe{Fd(fds[0]), Fd(fds[1])};
}

struct Worker {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  std::vector<int> cpus;
};

// One tagged output stream of one rank.
struct Stream {
  int rank;
  Fd fd;
  OutputSink* sink;  // where its lines go (the launcher's stdout or stderr)
  LineTagger tagger;
};

// The environment every rank shares, as an ordered map so that overrides
// replace the inherited value instead of adding a duplicate.
std::map<std::string, std::string> common_environment(const JobSpec& spec) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : spec.env) env[k] = v;
  return env;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string s;
  for (int c : cpus) s += fmt::format("{}{}", s.empty() ? "" : ",", c);
  return s;
}

// A TCP port on loopback that is free now: bind to port 0 and ask which one
// the kernel chose. Another process may take it before torch binds it; that
// race is the same one torchrun's own free-port choice has.
int free_port() {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.get() < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return -1;
  return ntohs(addr.sin_port);
}

class Job {
 public:
  explicit Job(const JobSpec& spec) : spec_(spec), workers_(spec.np) {}
  int run();

 private:
  bool setup_signals();
  bool spawn();
  void supervise();
  void reap();
  // Of the ranks one reap() found failed, the one to name as the job's cause.
  int cause_of(const std::vector<int>& failed) const;
  void on_signal(int sig);
  void on_failure(int rank);
  void signal_workers(int sig);
  void start_teardown(int sig);
  int running() const {
    return static_cast<int>(
        std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
  }
  void kill_and_reap_all();
  void reserve_standard_fds();
  void on_output_error();
  int report_lost_output();

  void check_left_before_attaching(Clock::time_point now);

  enum class End { none, failure, signal, timeout, unattached };

  const JobSpec& spec_;
  std::vector<Worker> workers_;
  std::vector<Stream> streams_;
  pid_t pgid_ = 0;
  Fd signal_fd_;
  sigset_t blocked_{}, original_mask_{};
  struct sigaction original_sigpipe_ {};
  rlimit original_nofile_{};

  End end_ = End::none;
  int first_rank_ = -1;  // first failure (End::unattached: the rank that left)
  // Ranks that exited with status 0 while others still ran: if the job's
  // segment, once made, still misses one of them, its ranks wait for it in
  // vain (until SHMRING_TIMEOUT, 300 s by default). Checked every
  // kLeftCheck while the job runs.
  std::vector<int> left_early_;
  Clock::time_point left_check_at_ = kNever;
  int end_signal_ = 0;  // signal that ended the job
  int user_signals_ = 0;
  Clock::time_point kill_at_ = kNever;
  // After a rank fails, the others get a moment to end on their own: a bad
  // setting fails on every rank alike, and each should print its error
  // before the teardown's SIGTERM cuts it off.
  Clock::time_point term_at_ = kNever;
  Clock::time_point deadline_ = kNever;
  int spawn_exit_ = kExitLaunchFailed;
  // --tag-output: the launcher relays every line, so output it could not
  // write is lost on its watch (a plain run's workers write themselves).
  OutputSink out_sink_{STDOUT_FILENO}, err_sink_{STDERR_FILENO};
  bool epipe_handled_[2] = {false, false};
};

void Job::reserve_standard_fds() {
  // A launcher started with stdout or stderr closed (`2>&-`) would get that
  // number back from pipe2() and relay rank output into a worker's pipe.
  // /dev/null opened read-only holds the number and keeps writes failing
  // (EBADF) as on a closed descriptor, for the relay and the workers alike.
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int got = ::open("/dev/null", O_RDONLY);
    if (got >= 0 && got != fd) {
      ::dup2(got, fd);
      ::close(got);
    }
  }
}

void Job::on_output_error() {
  // The reader of our stdout (or stderr) is gone, as for `| head -n 1`. In
  // a plain run the workers write into that pipe themselves and die of
  // SIGPIPE at their next write, which ends the job; here they would run
  // on with every line dropped (forever, for a worker that never stops
  // writing). Close our read ends of their streams to that output: their
  // next write there meets the same SIGPIPE. Other errors (ENOSPC, EBADF)
  // do not end the job; the loss is reported when it ends.
  OutputSink* sinks[2] = {&out_sink_, &err_sink_};
  for (int i = 0; i < 2; ++i) {
    if (sinks[i]->error != EPIPE || epipe_handled_[i]) continue;
    epipe_handled_[i] = true;
    for (auto& s : streams_)
      if (s.sink == sinks[i] && s.fd.get() >= 0) {
        s.tagger.finish();
        s.fd.reset();
      }
  }
}

int Job::report_lost_output() {
  // As a plain run reports a worker killed by SIGPIPE: 128 + SIGPIPE when a
  // reader went away, 1 for any other failed write (as cat(1) on ENOSPC).
  int code = 0;
  for (const OutputSink* sink : {&out_sink_, &err_sink_}) {
    if (sink->error == 0) continue;
    std::fprintf(stderr,
                 "shmrun: --tag-output: writing the ranks' output to %s failed (%s); %zu bytes of "
                 "it were lost\n",
                 sink->fd == STDOUT_FILENO ? "stdout" : "stderr", std::strerror(sink->error),
                 sink->lost);
    if (sink->error == EPIPE)
      code = 128 + SIGPIPE;
    else if (code == 0)
      code = 1;
  }
  return code;
}

bool Job::setup_signals() {
  // Orphaned descendants of the workers are reparented to us, so they can be
  // reaped and none outlives the job unnoticed.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Writes to a closed output must not kill the launcher before it cleans up.
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGPIPE, &ign, &original_sigpipe_);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGCHLD, &dfl, nullptr);  // SIG_IGN would reap children behind our back

  // Signals arrive through a signalfd in the poll loop: no handler runs
  // concurrently with the supervision code, and none is lost between checks.
  sigemptyset(&blocked_);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&blocked_, s);
  if (sigprocmask(SIG_BLOCK, &blocked_, &original_mask_) != 0) return false;
  int fd = signalfd(-1, &blocked_, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) return false;
  signal_fd_ = Fd(fd);

  // 4 descriptors per rank can pass the default soft limit of 1024.
  getrlimit(RLIMIT_NOFILE, &original_nofile_);
  rlimit raised = original_nofile_;
  raised.rlim_cur = raised.rlim_max;
  setrlimit(RLIMIT_NOFILE, &raised);
  return true;
}

bool Job::spawn() {
  auto env = common_environment(spec_);
  // torch's env:// rendezvous needs an address and a port; a worker that
  // never uses torch ignores them.
  if (!env.count("MASTER_ADDR")) env["MASTER_ADDR"] = "127.0.0.1";
  if (!env.count("MASTER_PORT"))
    if (int port = free_port(); port > 0) env["MASTER_PORT"] = std::to_string(port);
  const std::string np = std::to_string(spec_.np);
  env["SHMRING_WORLD_SIZE"] = np;
  env["SHMRING_LOCAL_WORLD_SIZE"] = np;
  env["SHMRING_JOB_ID"] = spec_.job_id;
  if (!spec_.job_nonce.empty()) env["SHMRING_JOB_NONCE"] = spec_.job_nonce;
  env["WORLD_SIZE"] = np;
  env["LOCAL_WORLD_SIZE"] = np;
  env["GROUP_RANK"] = "0";
  env["GROUP_WORLD_SIZE"] = "1";
  env["ROLE_WORLD_SIZE"] = np;

  std::vector<int> cpus = spec_.bind_to_core ? allowed_cpus() : std::vector<int>{};
  if (spec_.bind_to_core && cpus.empty()) {
    std::fprintf(stderr, "shmrun: --bind-to core: cannot read this process's CPU set: %s\n",
                 std::strerror(errno));
    return false;
  }

  Fd dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  // mpirun's convention: stdin goes to rank 0. Not from a terminal, though:
  // a worker outside the terminal's foreground group would stop on reading it.
  const bool stdin_to_rank0 = !::isatty(STDIN_FILENO);

  std::vector<char*> argv;
  for (const auto& a : spec_.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  const pid_t launcher = ::getpid();
  std::vector<Fd> exec_status(spec_.np);
  for (int r = 0; r < spec_.np; ++r) {
    Worker& w = workers_[r];
    auto rank_env = env;
    const std::string rs = std::to_string(r);
    for (const char* k : {"SHMRING_RANK", "SHMRING_LOCAL_RANK", "RANK", "LOCAL_RANK", "ROLE_RANK"})
      rank_env[k] = rs;
    std::vector<std::string> env_strings;
    env_strings.reserve(rank_env.size());
    for (const auto& [k, v] : rank_env) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);

    if (spec_.bind_to_core) {
      const int n = static_cast<int>(cpus.size());
      const int per = std::min(spec_.cores_per_rank, n);
      for (int j = 0; j < per; ++j) w.cpus.push_back(cpus[(static_cast<long>(r) * per + j) % n]);
    }
    cpu_set_t cpu_set;
    CPU_ZERO(&cpu_set);
    for (int c : w.cpus) CPU_SET(c, &cpu_set);

    auto status_pipe = make_pipe();
    std::optional<Pipe> out, err;
    if (spec_.tag_output) {
      out = make_pipe();
      err = make_pipe();
    }
    if (!status_pipe || (spec_.tag_output && (!out || !err))) {
      std::fprintf(stderr, "shmrun: cannot create a pipe for rank %d: %s\n", r,
                   std::strerror(errno));
      return false;
    }

    const pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "shmrun: cannot start rank %d: fork: %s\n", r, std::strerror(errno));
      return false;
    }
    if (pid == 0) {
      // Child. The launcher has no other thread, so everything here is safe.
      ::setpgid(0, pgid_);
      // Die with the launcher, even if it is SIGKILLed.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(kExitLaunchFailed);
      ::sigaction(SIGPIPE, &original_sigpipe_, nullptr);
      ::sigprocmask(SIG_SETMASK, &original_mask_, nullptr);
      ::setrlimit(RLIMIT_NOFILE, &original_nofile_);
      if (r != 0 || !stdin_to_rank0) ::dup2(dev_null.get(), STDIN_FILENO);
      if (out) ::dup2(out->write.get(), STDOUT_FILENO);
      if (err) ::dup2(err->write.get(), STDERR_FILENO);
      if (!w.cpus.empty() && ::sched_setaffinity(0, sizeof cpu_set, &cpu_set) != 0) {
        int e = errno;
        (void)!::write(status_pipe->write.get(), &e, sizeof e);
        ::_exit(kExitLaunchFailed);
      }
      ::execvpe(argv[0], argv.data(), envp.data());
      int e = errno;
      (void)!::write(status_pipe->write.get(), &e, sizeof e);
      ::_exit(kExitCannotRun);
    }
    // Both sides set the group, so it holds whichever runs first.
    if (r == 0) pgid_ = pid;
    ::setpgid(pid, pgid_);
    w.pid = pid;
    w.running = true;
    exec_status[r] = std::move(status_pipe->read);
    if (out) {
      ::fcntl(out->read.get(), F_SETFL, O_NONBLOCK);
      ::fcntl(err->read.get(), F_SETFL, O_NONBLOCK);
      streams_.push_back({r, std::move(out->read), &out_sink_, LineTagger(r, out_sink_)});
      streams_.push_back({r, std::move(err->read), &err_sink_, LineTagger(r, err_sink_)});
    }
    if (spec_.report_bindings) {
      if (w.cpus.empty())
        std::fprintf(stderr, "shmrun: rank %d (pid %d) not bound\n", r, pid);
      else
        std::fprintf(stderr, "shmrun: rank %d (pid %d) bound to core%s %s\n", r, pid,
                     w.cpus.size() > 1 ? "s" : "", cpu_list(w.cpus).c_str());
    }
  }

  // A worker's status pipe closes on exec, or carries errno when exec (or the
  // binding) failed: report that once, not once per rank.
  for (int r = 0; r < spec_.np; ++r) {
    int e = 0;
    ssize_t n;
    do n = ::read(exec_status[r].get(), &e, sizeof e);
    while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(sizeof e)) {
      const bool searched = std::strchr(argv[0], '/') == nullptr;
      std::fprintf(stderr, "shmrun: rank %d: cannot run '%s': %s%s%s%s\n", r, argv[0],
                   std::strerror(e),
                   searched && e == ENOENT ? " (a name without '/' is looked up on PATH; for a "
                                             "file in this directory, write ./"
                                           : "",
                   searched && e == ENOENT ? argv[0] : "", searched && e == ENOENT ? ")" : "");
      spawn_exit_ = kExitCannotRun;
      return false;
    }
  }
  return true;
}

void Job::signal_workers(int sig) {
  if (pgid_ > 0) ::kill(-pgid_, sig);
  // A worker that moved to a group of its own is signalled directly.
  for (const Worker& w : workers_)
    if (w.running && ::getpgid(w.pid) != pgid_) ::kill(w.pid, sig);
}

void Job::start_teardown(int sig) {
  signal_workers(sig);
  if (kill_at_ == kNever) kill_at_ = Clock::now() + seconds(spec_.grace_s);
}

void Job::on_failure(int rank) {
  if (end_ != End::none) return;
  end_ = End::failure;
  first_rank_ = rank;
  term_at_ = Clock::now() + kFailureLinger;
}

int Job::cause_of(const std::vector<int>& failed) const {
  // Ranks found exited by one pass of waitpid come in the order they were
  // started, not the order they exited: a rank that crashed and the peers
  // that exited on seeing it die (or aborted, leaving that error uncaught:
  // SIGABRT) may all be zombies by the time the launcher looks. Among those,
  // a crash (any signal but SIGABRT) is the likeliest cause, then an exit
  // status (a rank that failed by itself), then an abort.
  const auto rank_of = [this](int r) {
    const int st = workers_[r].status;
    return !WIFSIGNALED(st) ? 1 : WTERMSIG(st) == SIGABRT ? 0 : 2;
  };
  int best = failed.front();
  for (int r : failed)
    if (rank_of(r) > rank_of(best)) best = r;
  return best;
}

void Job::check_left_before_attaching(Clock::time_point now) {
  left_check_at_ = kNever;
  if (end_ != End::none || running() == 0) return;
  const std::vector<int> absent = shmring::tools::ranks_not_attached(
      spec_.job_id, std::stoull(spec_.job_nonce.empty() ? "0" : spec_.job_nonce, nullptr, 16));
  for (int r : left_early_) {
    if (std::find(absent.begin(), absent.end(), r) == absent.end()) continue;
    // mpirun ends a job whose rank exits without MPI_Init while others are
    // in it; here the others would sit in their constructors until
    // SHMRING_TIMEOUT and then fail with "missing rank(s)".
    std::fprintf(stderr,
                 "shmrun: rank %d (pid %d) exited with status 0 without attaching to job %s, "
                 "whose other ranks wait for it to attach; ending the job\n",
                 r, workers_[r].pid, spec_.job_id.c_str());
    end_ = End::unattached;
    first_rank_ = r;
    start_teardown(SIGTERM);
    return;
  }
  left_check_at_ = now + kLeftCheck;
}

void Job::on_signal(int sig) {
  if (sig == SIGUSR1) {
    // `kill -USR1 <shmrun pid>`: where every rank is, as `shmrun --status
    // --job-id` prints it (docs/guide/tracing.md); the job goes on.
    std::fprintf(stderr, "shmrun: SIGUSR1: status of job %s\n", spec_.job_id.c_str());
    (void)shmring::tools::print_status(spec_.job_id, stderr);
    return;
  }
  ++user_signals_;
  if (user_signals_ == 1) {
    if (end_ == End::none) {
      end_ = End::signal;
      end_signal_ = sig;
    }
    std::fprintf(stderr,
                 "shmrun: received %s; forwarding it to %d worker(s) (send it again to kill them "
                 "at once)\n",
                 signal_name(sig).c_str(), running());
    start_teardown(sig);
  } else {
    signal_workers(SIGKILL);
  }
}

void Job::reap() {
  std::vector<int> failed;  // in this pass
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    for (int r = 0; r < spec_.np; ++r) {
      Worker& w = workers_[r];
      if (w.pid != pid) continue;
      w.running = false;
      w.status = status;
      if (status_code(status) != 0) {
        failed.push_back(r);
      } else if (running() > 0) {
        left_early_.push_back(r);
        left_check_at_ = Clock::now();
      }
    }
    // Any other pid is an orphaned descendant reparented to us: just reaped.
  }
  if (!failed.empty()) on_failure(cause_of(failed));
}

void Job::supervise() {
  if (spec_.timeout_s > 0) deadline_ = Clock::now() + seconds(spec_.timeout_s);
  auto drain_until = kNever;
  bool leftovers_killed = false;
  std::vector<char> buf(1 << 16);
  for (;;) {
    const auto now = Clock::now();
    const int alive = running();
    if (alive == 0) {
      if (!leftovers_killed) {
        // Every rank is gone: whatever is left in their group is an orphan.
        if (pgid_ > 0) ::kill(-pgid_, SIGKILL);
        leftovers_killed = true;
        drain_until = now + std::chrono::seconds(1);
      }
      bool open = std::any_of(streams_.begin(), streams_.end(),
                              [](const Stream& s) { return s.fd.get() >= 0; });
      if (!open || now >= drain_until) break;
    }
    if (end_ == End::none && now >= deadline_) {
      end_ = End::timeout;
      std::fprintf(stderr, "shmrun: job exceeded --timeout %g s; terminated %d worker(s)\n",
                   spec_.timeout_s, alive);
      start_teardown(SIGTERM);
    }
    if (now >= term_at_) {
      term_at_ = kNever;
      if (alive > 0) start_teardown(SIGTERM);
    }
    if (now >= kill_at_) {
      signal_workers(SIGKILL);
      kill_at_ = kNever;
    }
    if (now >= left_check_at_) check_left_before_attaching(now);

    auto next = std::min(
        {term_at_, kill_at_, end_ == End::none ? deadline_ : kNever, drain_until, left_check_at_});
    int timeout_ms = -1;
    if (next != kNever) {
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(ms, 0, 60'000));
    }
    std::vector<pollfd> fds;
    fds.push_back({signal_fd_.get(), POLLIN, 0});
    std::vector<Stream*> polled;
    for (auto& s : streams_)
      if (s.fd.get() >= 0) {
        fds.push_back({s.fd.get(), POLLIN, 0});
        polled.push_back(&s);
      }
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      std::perror("shmrun: poll");
      start_teardown(SIGKILL);
      continue;
    }
    if (n <= 0) continue;

    if (fds[0].revents & POLLIN) {
      signalfd_siginfo si;
      while (::read(signal_fd_.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
        int sig = static_cast<int>(si.ssi_signo);
        if (sig != SIGCHLD) on_signal(sig);
      }
      reap();  // SIGCHLDs coalesce: always look for every exited child
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Stream& s = *polled[i - 1];
      // A bounded number of reads per wake, so one chatty rank cannot starve
      // the signal fd or the other ranks.
      for (int k = 0; k < 4; ++k) {
        ssize_t got = ::read(s.fd.get(), buf.data(), buf.size());
        if (got > 0) {
          s.tagger.feed(buf.data(), static_cast<std::size_t>(got));
          if (alive == 0) drain_until = Clock::now() + std::chrono::seconds(1);
          if (s.sink->error == EPIPE) {
            on_output_error();  // closes s.fd among others
            break;
          }
          continue;
        }
        if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
          s.tagger.finish();
          s.fd.reset();
        }
        break;
      }
    }
  }
  // Output of a descendant that escaped the group and kept a pipe open.
  for (auto& s : streams_) s.tagger.finish();
  // Reap whatever the final SIGKILL left as zombies.
  for (int i = 0; i < 100; ++i) {
    if (::waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD) break;
    ::usleep(10'000);
  }
}

void Job::kill_and_reap_all() {
  for (const Worker& w : workers_)
    if (w.pid > 0) ::kill(w.pid, SIGKILL);
  if (pgid_ > 0) ::kill(-pgid_, SIGKILL);
  for (Worker& w : workers_)
    if (w.pid > 0 && w.running) {
      ::waitpid(w.pid, nullptr, 0);
      w.running = false;
    }
}

int Job::run() {
  reserve_standard_fds();
  if (!setup_signals()) {
    std::perror("shmrun: cannot set up signal handling");
    return kExitLaunchFailed;
  }
  if (!spawn()) {
    kill_and_reap_all();
    remove_job_segments(spec_.job_id);
    return spawn_exit_;
  }
  if (!spec_.notice.empty()) std::fprintf(stderr, "%s\n", spec_.notice.c_str());
  supervise();
  remove_job_segments(spec_.job_id);
  std::fflush(stdout);

  switch (end_) {
    case End::none:
      return report_lost_output();
    case End::timeout:
      (void)report_lost_output();
      return kExitTimeout;
    case End::unattached:
      (void)report_lost_output();
      return kExitUnattached;
    case End::failure: {
      // Workers killed by SIGPIPE after our reader left (on_output_error)
      // land here with 141, as in a plain run.
      (void)report_lost_output();
      const Worker& w = workers_[first_rank_];
      std::fprintf(stderr, "shmrun: rank %d (pid %d) %s; job terminated\n", first_rank_, w.pid,
                   status_text(w.status).c_str());
      return status_code(w.status);
    }
    case End::signal:
      // End the way the signal would have ended us, so that a calling shell
      // script stops too; 128+signal is the fallback.
      std::fflush(stderr);
      ::signal(end_signal_, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &original_mask_, nullptr);
      ::raise(end_signal_);
      return 128 + end_signal_;
  }
  return 1;
}

}  // namespace

int run_job(const JobSpec& spec) {
  Job job(spec);
  return job.run();
}

int remove_job_segments(const std::string& job_id) {
  // Segment names are "shmring-<uid>-<job id>-<host hash>". Once every
  // worker is gone, an entry of this job whose creator is dead is left over
  // from a rank that died before all had attached (after that the name is
  // already unlinked). One whose creator lives belongs to another job given
  // the same job id: it is not ours to remove (its ranks would wait for it
  // until their timeout).
  const std::string prefix = fmt::format("shmring-{}-{}-", static_cast<unsigned>(getuid()), job_id);
  int removed = 0;
  for (const auto& seg : shmring::detail::list_segments()) {
    const std::string& name = seg.name;
    if (name.rfind(prefix, 0) != 0 || name.find('-', prefix.size()) != std::string::npos) continue;
    if (seg.creator_alive) continue;
    if (::shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace shmring::launcher
