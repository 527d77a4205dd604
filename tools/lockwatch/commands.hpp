// tools/lockwatch/commands.hpp: the subcommands of `lockwatch`, once their
// arguments are parsed (main.cpp). Each returns the exit status; errors of
// the library (lockwatch::Error) propagate to main(), which maps them to
// exit codes (exit_codes.hpp).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "lockwatch/runtime.hpp"
#include "supervisor.hpp"

namespace lockwatch::cli {

struct RunArgs {
  std::optional<std::string> redis_url;  // else LOCKWATCH_REDIS_URL, else the library's default
  std::string key;
  std::chrono::milliseconds ttl{30000};
  std::chrono::milliseconds wait{0};
  Retries retries = forever;
  std::optional<std::chrono::milliseconds> kill_grace;  // else the default (run.cpp)
  // --once-per: a period of every(d), or of a cron expression (non-empty).
  std::optional<std::chrono::milliseconds> once_every;
  std::string once_cron;
  int busy_code = 75;
  bool quiet = false;
  bool verbose = false;  // the library's log lines too (library_log)
  std::optional<std::string> shell_command;  // -c
  std::vector<std::string> argv;             // -- CMD ARGS...
};

// Runs the command under the lock.
int run_command(const RunArgs& args, const Inherited& inherited);
// Prints key=, state=, ttl_ms=, fencing_token= lines (and when held,
// kind=, owner=, since=, held_for_ms= and holder= lines).
int status_command(const std::optional<std::string>& redis_url, const std::string& key, bool verbose);
// `lockwatch ls`: the locks held under `prefix`, at most `limit`, in
// columns or as JSON.
int ls_command(const std::optional<std::string>& store_url, const std::string& prefix, std::size_t limit, bool json,
               bool verbose);
// Removes the lock whatever its owner; prints key= and was_held= lines.

int release_command(const std::optional<std::string>& redis_url, const std::string& key, bool verbose);

// `lockwatch: <message>` on standard error.
void say(const std::string& message);

// Options::observability.log for the subcommands. The library logs for long-lived
// services (a connection lost and being retried, a lease lost); a command
// that runs once says what matters itself, as its final error or its exit
// status, so these lines are dropped, unless `verbose` (--verbose), which
// shows them from kInfo up on standard error.
LogSink library_log(bool verbose);

}  // namespace lockwatch::cli
