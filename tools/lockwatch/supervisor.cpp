#include "supervisor.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <system_error>

#include "exit_codes.hpp"

namespace lockwatch::cli {
namespace {

// One report, written with one write() (atomic on a pipe).
struct Message {
  int kind;
  int value;
};
constexpr int kMsgExecFailed = 1;
constexpr int kMsgExited = 2;
constexpr int kMsgAllGone = 3;

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Everything the supervisor needs, made before the fork: after it, no
// allocation.
struct Plan {
  const char* path;
  char* const* argv;
  char* const* envp;
  const Inherited* inherited;
  const int* keep;  // descriptors the supervisor keeps, ascending
  std::size_t keep_count;
  int life_fd;    // read end: EOF when lockwatch is done or dead
  int report_fd;  // write end
  bool take_terminal;
};

// The rest is async-signal-safe.

void report(int fd, int kind, int value) {
  Message m{kind, value};
  while (::write(fd, &m, sizeof m) < 0 && errno == EINTR) {
  }
}

// Closes every descriptor but `keep` (ascending). Without close_range
// (Linux < 5.9) lockwatch's sockets stay open in the supervisor, and the
// command inherits none of them anyway: they are close-on-exec or closed.
void close_all_but(const int* keep, std::size_t n) {
  unsigned next = 0;
  for (std::size_t i = 0; i < n; ++i) {
    auto k = static_cast<unsigned>(keep[i]);
    if (k > next) ::syscall(SYS_close_range, next, k - 1, 0u);
    next = k + 1;
  }
  ::syscall(SYS_close_range, next, ~0u, 0u);
}

// The command's process, between fork and exec.
[[noreturn]] void exec_command(const Plan& p, pid_t supervisor, int exec_report) {
  ::sigaction(SIGPIPE, &p.inherited->sigpipe, nullptr);
  // If the supervisor dies (it is killed: it never exits while the command
  // runs), so does the command. Asked before checking the parent, so a
  // supervisor that died in between is noticed.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != supervisor) ::_exit(kExitInternal);
  ::sigprocmask(SIG_SETMASK, &p.inherited->mask, nullptr);
  ::execve(p.path, p.argv, p.envp);
  int e = errno;
  while (::write(exec_report, &e, sizeof e) < 0 && errno == EINTR) {
  }
  ::_exit(e == ENOENT ? kExitNotFound : kExitCannotExecute);
}

[[noreturn]] void supervise(const Plan& p) {
  sigset_t all;
  ::sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);  // forwarded signals are for the command
  ::setpgid(0, 0);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  close_all_but(p.keep, p.keep_count);
  if (p.take_terminal) ::tcsetpgrp(STDIN_FILENO, ::getpid());  // SIGTTOU is blocked: allowed

  sigset_t chld;
  ::sigemptyset(&chld);
  ::sigaddset(&chld, SIGCHLD);
  int sigfd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  int exec_pipe[2];
  if (sigfd < 0 || ::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    report(p.report_fd, kMsgExecFailed, errno);
    ::_exit(0);  // lockwatch sees the report, then the pipe's end
  }
  const pid_t self = ::getpid();
  const pid_t command = ::_Fork();
  if (command < 0) {
    report(p.report_fd, kMsgExecFailed, errno);
    ::_exit(0);
  }
  if (command == 0) {
    ::close(exec_pipe[0]);
    exec_command(p, self, exec_pipe[1]);
  }
  ::close(exec_pipe[1]);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(exec_pipe[0], &exec_errno, sizeof exec_errno);  // EOF once exec succeeded
  } while (n < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof exec_errno)) report(p.report_fd, kMsgExecFailed, exec_errno);

  bool command_done = false;
  bool all_gone = false;
  const int wait_flags = WNOHANG | (p.take_terminal ? WUNTRACED : 0);
  pollfd fds[2] = {{p.life_fd, POLLIN, 0}, {sigfd, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) break;  // lockwatch is done, or dead
    if (fds[1].revents == 0) continue;
    signalfd_siginfo info;
    while (::read(sigfd, &info, sizeof info) > 0) {
    }
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, wait_flags);
      if (pid > 0) {
        if (WIFSTOPPED(status)) {
          if (WSTOPSIG(status) == SIGTSTP) ::kill(0, SIGCONT);  // ^Z: not while holding the lock
          continue;
        }
        if (pid == command) {
          report(p.report_fd, kMsgExited, status);
          command_done = true;
        }
        continue;
      }
      if (pid < 0 && errno == EINTR) continue;
      if (pid < 0 && errno == ECHILD && command_done && !all_gone) {
        report(p.report_fd, kMsgAllGone, 0);
        all_gone = true;
      }
      break;
    }
  }
  ::kill(0, SIGKILL);  // the whole group, this process included
  ::_exit(0);
}

int check_executable(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return (errno == ENOENT || errno == ENOTDIR) ? ENOENT : errno;
  if (S_ISDIR(st.st_mode) || ::access(path.c_str(), X_OK) != 0) return EACCES;
  return 0;
}

}  // namespace

Inherited Inherited::capture() {
  // A closed standard stream would be reused by the next open(), and the
  // command would find, say, a Redis socket as its standard input.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0) ::open("/dev/null", O_RDWR);  // takes the lowest free number: fd
  }
  Inherited in;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &in.mask);
  ::sigaction(SIGPIPE, nullptr, &in.sigpipe);
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(dir)) {
      int fd = std::atoi(e->d_name);
      if (fd >= 3 && fd != ::dirfd(dir)) in.fds.push_back(fd);
    }
    ::closedir(dir);
  }
  std::sort(in.fds.begin(), in.fds.end());
  return in;
}

Resolved resolve_command(const std::string& name) {
  if (name.empty()) return {"", ENOENT};
  if (name.find('/') != std::string::npos) {
    int e = check_executable(name);
    return {e == 0 ? name : "", e};
  }
  // As execvp: the first executable match on PATH; EACCES if only
  // non-executable files matched.
  const char* env = std::getenv("PATH");
  std::string dirs = env != nullptr ? env : "/usr/local/bin:/usr/bin:/bin";
  int error = ENOENT;
  std::size_t begin = 0;
  while (begin <= dirs.size()) {
    std::size_t end = std::min(dirs.find(':', begin), dirs.size());
    std::string dir = dirs.substr(begin, end - begin);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    int e = check_executable(candidate);
    if (e == 0) return {candidate, 0};
    if (e == EACCES) error = EACCES;
    begin = end + 1;
  }
  return {"", error};
}

CommandGroup::CommandGroup(const Command& command, const Inherited& inherited) {
  std::vector<char*> argv = c_strings(command.argv);
  std::vector<char*> envp = c_strings(command.env);
  int life[2];
  int reports[2];
  if (::pipe2(life, O_CLOEXEC) != 0) throw_errno("pipe2");
  if (::pipe2(reports, O_CLOEXEC) != 0) {
    int e = errno;
    ::close(life[0]);
    ::close(life[1]);
    throw std::system_error(e, std::generic_category(), "pipe2");
  }
  std::vector<int> keep = {0, 1, 2, life[0], reports[1]};
  keep.insert(keep.end(), inherited.fds.begin(), inherited.fds.end());
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  Plan plan{command.path.c_str(),
            argv.data(),
            envp.data(),
            &inherited,
            keep.data(),
            keep.size(),
            life[0],
            reports[1],
            ::isatty(STDIN_FILENO) == 1 && ::tcgetpgrp(STDIN_FILENO) == ::getpgrp()};

  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {life[0], life[1], reports[0], reports[1]}) ::close(fd);
    throw std::system_error(e, std::generic_category(), "fork");
  }
  if (pid == 0) supervise(plan);
  ::close(life[0]);
  ::close(reports[1]);
  // Also done by the supervisor; whichever runs first makes the group, so a
  // signal sent right after this constructor finds it.
  ::setpgid(pid, pid);
  pid_ = pid;
  life_fd_ = life[1];
  report_fd_ = reports[0];
  took_terminal_ = plan.take_terminal;
  ::fcntl(report_fd_, F_SETFL, ::fcntl(report_fd_, F_GETFL) | O_NONBLOCK);
}

CommandGroup::~CommandGroup() { finish(); }

std::vector<CommandGroup::Report> CommandGroup::read_reports() {
  std::vector<Report> out;
  while (report_fd_ >= 0) {
    Message m{};
    ssize_t n = ::read(report_fd_, &m, sizeof m);
    if (n == static_cast<ssize_t>(sizeof m)) {
      Report::Kind kind = m.kind == kMsgExecFailed ? Report::Kind::kExecFailed
                          : m.kind == kMsgExited   ? Report::Kind::kExited
                                                   : Report::Kind::kAllGone;
      out.push_back({kind, m.value});
      continue;
    }
    if (n == 0) {
      out.push_back({Report::Kind::kSupervisorGone, 0});
      ::close(report_fd_);
      report_fd_ = -1;
      break;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EAGAIN: nothing more now
  }
  return out;
}

void CommandGroup::signal(int sig) noexcept {
  // The supervisor is not reaped before finish(), so the group's id cannot
  // have passed to another group meanwhile.
  if (!finished_) ::kill(-pid_, sig);
}

int CommandGroup::finish() noexcept {
  if (finished_ || pid_ < 0) return status_;
  ::kill(-pid_, SIGKILL);
  ::close(life_fd_);
  while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
  }
  finished_ = true;
  if (report_fd_ >= 0) ::close(report_fd_);
  report_fd_ = -1;
  if (took_terminal_) {
    // Take the terminal back; from a background group that needs SIGTTOU
    // blocked.
    sigset_t ttou;
    sigset_t old;
    ::sigemptyset(&ttou);
    ::sigaddset(&ttou, SIGTTOU);
    ::pthread_sigmask(SIG_BLOCK, &ttou, &old);
    ::tcsetpgrp(STDIN_FILENO, ::getpgrp());
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  return status_;
}

}  // namespace lockwatch::cli
