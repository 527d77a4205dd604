// `lockwatch run`: takes the lock, runs the command in a process group of
// its own while the watchdog renews the lease, and gives the lock back once
// the command and everything it started have ended. With --once-per it
// first claims the current period under the lock (lockwatch/scheduler.hpp,
// claim_period), and runs the command only if the claim is its own.
//
// Everything happens on the main thread around one poll(): a signalfd for
// the signals lockwatch forwards, an eventfd the lease's stop callback
// writes when the lease is lost, and the supervisor's report pipe
// (supervisor.hpp). The library's threads never see a signal: they are
// blocked before the runtime starts them.
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stop_token>
#include <system_error>
#include <thread>

#include "commands.hpp"
#include "duration.hpp"
#include "exit_codes.hpp"
#include "lockwatch/errors.hpp"
#include "lockwatch/scheduler.hpp"

extern char** environ;

namespace lockwatch::cli {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Sent to lockwatch, passed on to the command's group.
constexpr std::initializer_list<int> kForwarded = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

// Blocks `signals` in this thread (and in the threads it starts later) and
// reads them from a descriptor instead.
class SignalFd {
 public:
  explicit SignalFd(std::initializer_list<int> signals) {
    ::sigemptyset(&set_);
    for (int s : signals) ::sigaddset(&set_, s);
    ::pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    fd_ = ::signalfd(-1, &set_, SFD_CLOEXEC | SFD_NONBLOCK);
    if (fd_ < 0) throw_errno("signalfd");
  }
  ~SignalFd() { ::close(fd_); }
  SignalFd(const SignalFd&) = delete;
  SignalFd& operator=(const SignalFd&) = delete;

  int fd() const noexcept { return fd_; }
  // The signals that arrived since the last call.
  std::vector<int> take() {
    std::vector<int> out;
    signalfd_siginfo info;
    while (::read(fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info))
      out.push_back(static_cast<int>(info.ssi_signo));
    return out;
  }

 private:
  sigset_t set_;
  int fd_ = -1;
};

// A flag another thread raises and poll() sees.
class EventFd {
 public:
  EventFd() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (fd_ < 0) throw_errno("eventfd");
  }
  ~EventFd() { ::close(fd_); }
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;

  int fd() const noexcept { return fd_; }
  void raise() noexcept {
    std::uint64_t one = 1;
    (void)!::write(fd_, &one, sizeof one);
  }
  void clear() noexcept {
    std::uint64_t n;
    (void)!::read(fd_, &n, sizeof n);
  }

 private:
  int fd_;
};

// Blocks until one of `fds` is readable or `timeout` passes (none: no
// limit); returns which are readable.
std::vector<bool> wait_readable(std::initializer_list<int> fds, std::optional<Clock::time_point> until) {
  std::vector<pollfd> p;
  for (int fd : fds) p.push_back({fd, POLLIN, 0});
  int timeout = -1;
  if (until) {
    auto left = std::chrono::ceil<milliseconds>(*until - Clock::now()).count();
    timeout = static_cast<int>(std::clamp<long long>(left, 0, 60'000));
  }
  if (::poll(p.data(), p.size(), timeout) < 0 && errno != EINTR) throw_errno("poll");
  std::vector<bool> out;
  for (const auto& e : p) out.push_back((e.revents & (POLLIN | POLLHUP | POLLERR)) != 0);
  return out;
}

// The library declares a lease lost at its local deadline, which is the
// send time of the last confirmed renewal + ttl - drift, with
// drift = ttl * drift_factor + drift_floor (Options; lib/runtime_impl.hpp
// drift_for). Redis keeps the key until at least that send time + ttl, so
// when the loss is declared the drift allowance is all the time left before
// another holder can take the lock.
milliseconds drift_allowance(const Options& o, milliseconds ttl) {
  return milliseconds(static_cast<milliseconds::rep>(static_cast<double>(ttl.count()) * o.watchdog.drift_factor)) +
         o.watchdog.drift_floor;
}

// The default --kill-grace: the SIGKILL must land before the lease can
// pass to another holder. A lease lost because no renewal was confirmed
// (or the renewals ran out) has the drift allowance left; half of it goes
// to the grace, the other half stays for what the allowance is for (clock
// rates, the watchdog's tick, signal delivery). A lease lost because the
// store said the key is someone else's has nothing left: no grace. A key
// found gone at a renewal while the holder's deadline is ahead is one an
// operator removed (`lockwatch release --force`, reported as
// LostReason::kRemoved): the operator asked for the command to stop, and
// it gets the same grace as a lease that ran out. Never more than 5 s (consul lock's
// grace).
milliseconds default_kill_grace(const Options& o, milliseconds ttl, LostReason reason) {
  if (reason == LostReason::kTakenByOther) return milliseconds(0);
  return std::min<milliseconds>(std::chrono::seconds(5), drift_allowance(o, ttl) / 2);
}

std::vector<std::string> child_environment(const std::string& key, std::uint64_t fencing_token, milliseconds ttl) {
  static constexpr std::string_view kOurs[] = {"LOCKWATCH_KEY=", "LOCKWATCH_FENCING_TOKEN=", "LOCKWATCH_TTL_MS="};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view v(*e);
    bool ours = false;
    for (auto prefix : kOurs) ours = ours || v.substr(0, prefix.size()) == prefix;
    if (!ours) env.emplace_back(v);
  }
  env.push_back("LOCKWATCH_KEY=" + key);
  env.push_back("LOCKWATCH_FENCING_TOKEN=" + std::to_string(fencing_token));
  env.push_back("LOCKWATCH_TTL_MS=" + std::to_string(ttl.count()));
  return env;
}

// "2024-05-01T03:00:00Z".
std::string period_text(std::chrono::system_clock::time_point t) {
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::chrono::system_clock::to_time_t(t)));
}

int status_code(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return kExitInternal;
}

}  // namespace

void say(const std::string& message) {
  fmt::print(stderr, "lockwatch: {}\n", message);
  std::fflush(stderr);
}

LogSink library_log(bool verbose) {
  if (!verbose) return [](LogLevel, std::string_view) {};
  return [](LogLevel level, std::string_view line) {
    if (level < LogLevel::kInfo) return;
    fmt::print(stderr, "lockwatch: {}: {}\n", to_string(level), line);
    std::fflush(stderr);
  };
}

int run_command(const RunArgs& a, const Inherited& inherited) {
  // The command is found before the lock is taken: a typo never takes it.
  Command command;
  if (a.shell_command) {
    command.path = "/bin/sh";
    command.argv = {"sh", "-c", *a.shell_command};
  } else {
    Resolved r = resolve_command(a.argv.front());
    if (r.error != 0) {
      say(fmt::format("{}: {}", a.argv.front(), r.error == ENOENT ? "command not found" : std::strerror(r.error)));
      return r.error == ENOENT ? kExitNotFound : kExitCannotExecute;
    }
    command.path = r.path;
    command.argv = a.argv;
  }

  // Before the runtime starts its threads, so that they inherit the mask.
  SignalFd signals(kForwarded);
  ::signal(SIGPIPE, SIG_IGN);  // a write to a Redis that went away must not end lockwatch

  Options o = Options::from_env();
  if (a.redis_url) o.store_url = *a.redis_url;
  o.runtime.threads = 1;                         // no locked work runs on the pool
  o.observability.log = library_log(a.verbose);  // a lost lease is told below, once
  auto rt = std::make_unique<Runtime>(o);
  const milliseconds margin = default_kill_grace(o, a.ttl, LostReason::kStoreUnreachable);
  if (a.kill_grace && *a.kill_grace > margin)
    say(
        fmt::format("warning: --kill-grace {} is longer than the {} a lease keeps after its loss is declared "
                    "(ttl {}): on a loss the command may still run when another holder takes the lock",
                    format_duration(*a.kill_grace), format_duration(margin), format_duration(a.ttl)));

  // Wait for the lock; a signal meanwhile gives up (the runtime's stop fails
  // the acquisition, or gives back a lock granted at that moment).
  std::future<LockHandle> acquired = rt->acquire({.key = a.key, .ttl = a.ttl, .retries = a.retries, .wait = a.wait});
  int gave_up = 0;
  {
    EventFd ready;
    std::thread waiter([&acquired, &ready] {
      acquired.wait();
      ready.raise();
    });
    try {
      for (;;) {
        auto readable = wait_readable({ready.fd(), signals.fd()}, std::nullopt);
        if (readable[0]) break;
        if (readable[1]) {
          if (auto got = signals.take(); !got.empty()) {
            gave_up = got.front();
            break;
          }
        }
      }
    } catch (...) {
      rt.reset();  // makes the future ready, so the waiter ends
      waiter.join();
      throw;
    }
    if (gave_up != 0) rt.reset();
    waiter.join();
  }
  if (gave_up != 0) return 128 + gave_up;

  LockHandle handle;
  try {
    handle = acquired.get();
  } catch (const LockNotAcquired& e) {
    if (a.quiet || a.busy_code == 0) return 0;  // -E 0 asks for a busy lock to be no failure: as -q
    say(e.what());
    return a.busy_code;
  }
  if (a.once_every || !a.once_cron.empty()) {
    // Claimed under the lock, before the command starts; a period run
    // already gives the lock back at once.
    std::optional<PeriodClaim> claim;
    try {
      claim = (a.once_every ? claim_period(*rt, handle, *a.once_every) : claim_cron_period(*rt, handle, a.once_cron))
                  .get();  // bounded: the store's clock and the claim each end by reply or command timeout
    } catch (const LeaseLost& e) {
      say(fmt::format("{}; the command was not run", e.what()));
      return kExitLeaseLost;
    }
    if (!claim->claimed && claim->last_run > claim->period + 1) {
      // The store records as run a period after the current one: it was
      // numbered by another PERIOD (a shorter one: 1h before 1d, a cron
      // expression before a duration). Every period of this one would be
      // found run already, for ever: refused, with what to do. (One period
      // ahead is let through as "run already": the nodes of a store with
      // several clocks may straddle a period's start.)
      say(fmt::format("'{}': the store records period {} as run, after the current period {} of --once-per {}: the "
                      "key's periods were claimed with another --once-per. The command was not run; use a new key "
                      "with the new period",
                      a.key, claim->last_run, claim->period, a.once_cron.empty() ? format_duration(*a.once_every)
                                                                                  : "'" + a.once_cron + "'"));
      std::future<void> released = handle.release();
      if (released.wait_for(o.connection.connect_timeout + o.connection.command_timeout + std::chrono::seconds(1)) !=
          std::future_status::ready) {
        std::fflush(stdout);
        std::_Exit(kExitUsage);  // the runtime would wait for the expiry
      }
      return kExitUsage;
    }
    if (!claim->claimed) {
      if (!a.quiet)
        say(fmt::format("'{}': the period from {} was run already; the command was not run", a.key,
                        period_text(claim->scheduled_for)));
      std::future<void> released = handle.release();
      const int code = a.quiet ? 0 : kExitAlreadyRun;
      if (released.wait_for(o.connection.connect_timeout + o.connection.command_timeout + std::chrono::seconds(1)) !=
          std::future_status::ready) {
        std::fflush(stdout);
        std::_Exit(code);  // the runtime would wait for the expiry
      }
      return code;
    }
  }

  const Lease& lease = handle.lease();
  command.env = child_environment(a.key, lease.fencing_token(), a.ttl);

  EventFd lost_event;
  std::stop_callback on_loss(lease.stop_token(), [&lost_event] { lost_event.raise(); });
  if (lease.lost()) {
    say(fmt::format("lease on '{}' lost before the command started", a.key));
    (void)handle.release();
    return kExitLeaseLost;
  }

  CommandGroup group(command, inherited);
  bool lost = false;
  bool exec_failed = false;
  bool exited = false;
  bool done = false;
  int exec_errno = 0;
  int wait_status = 0;
  std::optional<Clock::time_point> kill_at;
  while (!done) {
    auto readable = wait_readable({signals.fd(), lost_event.fd(), group.report_fd()}, kill_at);
    if (readable[0]) {
      for (int sig : signals.take()) group.signal(sig);
    }
    if (readable[1]) lost_event.clear();
    if (readable[1] && !lost) {
      lost = true;
      LostReason reason = lease.lost_reason().value_or(LostReason::kExpired);
      milliseconds grace = a.kill_grace ? *a.kill_grace : default_kill_grace(o, a.ttl, reason);
      say(fmt::format("lease on '{}' lost ({}): stopping the command (SIGTERM, then SIGKILL after {})", a.key,
                      to_string(reason), format_duration(grace)));
      group.signal(SIGTERM);
      kill_at = Clock::now() + grace;
    }
    for (const auto& r : group.read_reports()) {
      switch (r.kind) {
        case CommandGroup::Report::Kind::kExecFailed:
          exec_failed = true;
          exec_errno = r.value;
          break;
        case CommandGroup::Report::Kind::kExited:
          exited = true;
          wait_status = r.value;
          break;
        case CommandGroup::Report::Kind::kAllGone:
        case CommandGroup::Report::Kind::kSupervisorGone:
          done = true;
          break;
      }
    }
    if (kill_at && Clock::now() >= *kill_at) done = true;  // finish() sends the SIGKILL
  }
  int supervisor_status = group.finish();

  int code;
  if (exec_failed) {
    say(fmt::format("cannot run {}: {}", command.argv.front(), std::strerror(exec_errno)));
    code = exec_errno == ENOENT ? kExitNotFound : kExitCannotExecute;
  } else if (lost) {
    code = kExitLeaseLost;
  } else if (exited) {
    code = status_code(wait_status);
  } else {
    // The supervisor was killed from outside before the command ended.
    say("the command's supervisor process died before the command ended");
    code = status_code(supervisor_status);
  }

  // The lock goes back once nothing of the command runs. Its future is ready
  // when Redis confirmed, or, with Redis unreachable, once the key has surely
  // expired (up to a ttl): a job should not hang that long for it.
  std::future<void> released = handle.release();
  if (lost) {
    // Nothing is left to wait for: the key is gone, someone else's, or
    // expires on its own (the loss was declared at its local deadline), and
    // the exit code is 76 whatever the release says. It is asked for, and
    // lockwatch exits now rather than after the expiry (the runtime's
    // destructor would wait for it).
    if (released.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      std::fflush(stdout);
      std::_Exit(code);
    }
  } else if (released.wait_for(o.connection.connect_timeout + o.connection.command_timeout + std::chrono::seconds(1)) !=
             std::future_status::ready) {
    say(fmt::format("could not confirm the release of '{}'; the lock expires within {}", a.key,
                    format_duration(a.ttl)));
    std::fflush(stdout);
    std::_Exit(code);  // the runtime would wait for the expiry
  }
  try {
    released.get();
  } catch (const LeaseLost& e) {
    if (!lost && !exec_failed) {
      // The key was gone or someone else's when it was given back: the
      // command may have run alongside another holder.
      say(fmt::format("{}; the command ran to its end", e.what()));
      code = kExitLeaseLost;
    }
  }
  return code;
}

}  // namespace lockwatch::cli
