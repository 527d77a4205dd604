// tools/lockwatch/supervisor.hpp: the command's process group, headed by a
// small supervisor process, so that nothing the command started outlives
// the lock.
//
// lockwatch forks a supervisor. The supervisor makes a process group of its
// own, becomes a child subreaper (PR_SET_CHILD_SUBREAPER), and forks and
// execs the command in that group. Then it only waits, and:
//  - reports to lockwatch when the command's process ends (its wait status),
//    and when no process the command started is left: as a subreaper it
//    inherits every orphaned descendant, also one that left the group, so
//    "no children left" means "nothing left";
//  - kills its whole group with SIGKILL, itself included, the moment
//    lockwatch's end of a pipe closes: when lockwatch is done, and when
//    lockwatch dies, however it dies (kill -9 too). A grandchild in the
//    group cannot get PR_SET_PDEATHSIG from lockwatch's death; this is what
//    reaches it. The command's own process also has PR_SET_PDEATHSIG
//    (SIGKILL) towards the supervisor, in case the supervisor is killed.
// Limits: a process that leaves the group (setsid, setpgid: a daemon) is
// waited for but is not signalled, on a lost lease nor when lockwatch dies.
//
// Signals lockwatch sends to the group reach the command and its children;
// the supervisor blocks all of them. When lockwatch is in the foreground of
// its terminal the group is given the terminal (as a shell gives a job), so
// the command can read it and gets ^C itself; a ^Z is undone (SIGCONT), as a
// suspended command would keep the lock without working.
//
// The supervisor is a fork of a multi-threaded process and never execs:
// after fork it makes only async-signal-safe system calls, on data prepared
// before the fork. Threading: a CommandGroup is used by one thread.
#pragma once

#include <errno.h>
#include <signal.h>
#include <sys/types.h>

#include <string>
#include <system_error>
#include <vector>

namespace lockwatch::cli {

// The process state lockwatch started with, handed on to the command:
// lockwatch blocks signals, ignores SIGPIPE and opens sockets of its own,
// none of which the command should see.
struct Inherited {
  sigset_t mask;             // the signal mask lockwatch was started with
  struct sigaction sigpipe;  // SIGPIPE's disposition then
  std::vector<int> fds;      // descriptors >= 3 open then, passed on (ascending)

  // Call first thing in main(), before any thread starts or file is opened.
  static Inherited capture();
};

// What to execute: a resolved path (see resolve_command), argv and envp.
struct Command {
  std::string path;
  std::vector<std::string> argv;
  std::vector<std::string> env;
};

// What execvp would run for `name`: the path, or errno ENOENT (not found)
// or EACCES (found, but not an executable file). Resolved before the lock
// is taken, so a typo never takes it.
struct Resolved {
  std::string path;
  int error = 0;
};
Resolved resolve_command(const std::string& name);

class CommandGroup {
 public:
  struct Report {
    enum class Kind {
      kExecFailed,      // value: errno of execve (or of fork)
      kExited,          // value: the command process's wait status
      kAllGone,         // the command and every process it started have ended
      kSupervisorGone,  // the supervisor died (value: its wait status, once finish() reaped it)
    } kind;
    int value = 0;
  };

  // Forks the supervisor, which starts `command`. Throws std::system_error
  // when the pipes or the fork fail.
  CommandGroup(const Command& command, const Inherited& inherited);
  // finish() if it was not called. Never throws.
  ~CommandGroup();
  CommandGroup(const CommandGroup&) = delete;
  CommandGroup& operator=(const CommandGroup&) = delete;

  // Readable (poll) when reports arrive.
  int report_fd() const noexcept { return report_fd_; }
  // The reports that arrived, without blocking.
  std::vector<Report> read_reports();
  // Sends `sig` to the whole group (the supervisor ignores it). Does nothing
  // after finish().
  void signal(int sig) noexcept;
  // SIGKILL to the group, and the supervisor is told to end (it kills what
  // is left of its group with itself); reaps it and takes the terminal
  // back. Returns the supervisor's wait status. Idempotent.
  int finish() noexcept;
  pid_t pgid() const noexcept { return pid_; }

 private:
  pid_t pid_ = -1;      // the supervisor, leader of the group
  int life_fd_ = -1;    // its end of the pipe whose closing ends the group
  int report_fd_ = -1;  // reports from the supervisor
  bool took_terminal_ = false;
  bool finished_ = false;
  int status_ = 0;
};

// A failed system call, as std::system_error with its errno.
[[noreturn]] inline void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace lockwatch::cli
