// lockwatch: run a command under a distributed lock on Redis, and look at
// or remove a lock.
//
//   lockwatch run [--store URL] --key KEY [--ttl 30s] [--wait 0s] [--retries N|forever]
//                 [--kill-grace D] [-E CODE] [-q] [-v] (-c 'shell command' | -- CMD ARGS...)
//   lockwatch status [--store URL] [-v] KEY
//   lockwatch release [--store URL] [-v] --force KEY
//
// --redis is the same option as --store (its first name, kept).
//
// Arguments are parsed by CLI11; the subcommands are in run.cpp and
// admin_commands.cpp; exit codes in exit_codes.hpp (and --help).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>

#include "commands.hpp"
#include "duration.hpp"
#include "exit_codes.hpp"
#include "lockwatch/errors.hpp"

namespace {

using namespace lockwatch::cli;

constexpr const char* kExitCodes = R"(Exit status of run:
  the command's own  it ran and the lease was kept
  128+N              the command died of signal N
  75                 busy past --wait (-E CODE changes it, -q makes it 0)
  76                 the lease was lost while the command ran, and the command was stopped
  69                 the store could not be reached, or refused the credentials or the request
  64                 usage error (also a store this build left out)
  70                 internal error
  126 / 127          the command could not be executed / was not found)";

constexpr const char* kStoreOption = "--store,--redis";
constexpr const char* kStoreHelp =
    "Where the locks live (--redis is the same option): redis://[user:password@]host:port[/db], a "
    "comma-separated list of redis:// URLs (Redlock), "
    "redis-sentinel://[user:password@]host:port[,host:port...]/master-name[/db], "
    "redis-cluster://[user:password@]host:port[,host:port...], rediss://, rediss-sentinel:// and "
    "rediss-cluster:// for TLS, mysql://user:password@host[:port]/database, "
    "postgresql://user:password@host[:port]/database[?sslmode=...], or memory://[name]. Default: "
    "$LOCKWATCH_STORE_URL, else $LOCKWATCH_REDIS_URL, else redis://127.0.0.1:6379";

constexpr const char* kVerboseHelp =
    "Also print the library's log on standard error: connections lost and retried, found again, leases lost "
    "(left out by default: they are meant for long-lived services; errors are always printed)";

CLI::Validator duration_validator() {
  return CLI::Validator(
      [](std::string& text) {
        std::string error;
        return parse_duration(text, error) ? std::string() : error;
      },
      "", "duration");
}

std::chrono::milliseconds duration_of(const std::string& text) {
  std::string error;
  return *parse_duration(text, error);  // validated while parsing
}

}  // namespace

int main(int argc, char** argv) {
  const Inherited inherited = Inherited::capture();

  CLI::App app{"Runs a command under a distributed lock on Redis, renewing the lease while it runs.", "lockwatch"};
  app.footer(std::string(kExitCodes) + "\nstatus and release exit 0, 69 or 64 alike.");
  // At most one, and "none" is reported after parsing, so that an unknown
  // word is named as such rather than reported as a missing subcommand.
  app.require_subcommand(0, 1);

  RunArgs run_args;
  std::string redis_url;
  std::string ttl = "30s";
  std::string wait = "0s";
  std::string retries = "forever";
  std::string kill_grace;
  std::string shell_command;

  CLI::App* run = app.add_subcommand("run", "Run a command while holding the lock on KEY");
  run->footer(kExitCodes);
  CLI::Option* run_redis = run->add_option(kStoreOption, redis_url, kStoreHelp)->type_name("URL");
  run->add_option("--key", run_args.key, "The lock's name")->required()->type_name("KEY");
  run->add_option("--ttl", ttl,
                  "Lease time-to-live, renewed by the watchdog while the command runs (500ms, 30s, 5m, 1h)")
      ->type_name("DURATION")
      ->capture_default_str()
      ->check(duration_validator());
  run->add_option("--wait", wait, "How long to wait for a busy lock; 0s tries once")
      ->type_name("DURATION")
      ->capture_default_str()
      ->check(duration_validator());
  run->add_option("--retries", retries,
                  "How many times the lease may be renewed, or forever; once they are spent the lease ends "
                  "with the ttl and the command is stopped (exit 76)")
      ->type_name("N|forever")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) {
            if (text == "forever") return std::string();
            int n = -1;
            auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
            if (ec != std::errc() || end != text.data() + text.size() || n < 0)
              return "'" + text + "' is not a number of renewals >= 0 or 'forever'";
            return std::string();
          },
          "", "retries"));
  run->add_option("--kill-grace", kill_grace,
                  "On a lost lease the command's process group gets SIGTERM, then SIGKILL after this long. "
                  "Default: what is left before another holder could take the lock, at most 5s (none when "
                  "Redis says the key is gone or someone else's); a longer one is allowed, with a warning")
      ->type_name("DURATION")
      ->check(duration_validator());
  run->add_option("-E,--conflict-exit-code", run_args.busy_code, "Exit status when the lock stays busy past --wait")
      ->type_name("CODE")
      ->capture_default_str()
      ->check(CLI::Range(0, 255));
  run->add_flag("-q,--quiet", run_args.quiet, "A busy lock exits 0, silently");
  run->add_flag("-v,--verbose", run_args.verbose, kVerboseHelp);
  CLI::Option* shell =
      run->add_option("-c,--command", shell_command, "Run this with /bin/sh -c")->type_name("'SHELL COMMAND'");
  CLI::Option* direct =
      run->add_option("command", run_args.argv, "The command and its arguments, after --")->type_name("");
  shell->excludes(direct);
  run->positionals_at_end();

  std::string status_key;
  std::string status_url;
  CLI::App* status = app.add_subcommand(
      "status", "Print what the store says of the lock on KEY: key=, state=held|free, ttl_ms=, fencing_token= lines");
  status->footer("Takes no lease. state=held over Redlock means a majority of the nodes hold it for one owner.");
  CLI::Option* status_redis = status->add_option(kStoreOption, status_url, kStoreHelp)->type_name("URL");
  status->add_option("KEY", status_key, "The lock's name")->required();
  bool status_verbose = false;
  status->add_flag("-v,--verbose", status_verbose, kVerboseHelp);

  std::string release_key;
  std::string release_url;
  bool force = false;
  CLI::App* release = app.add_subcommand(
      "release", "Remove the lock on KEY whatever its owner (an operator's tool); prints key= and was_held=yes|no");
  release->footer(
      "The holder, if any, finds its lease gone at its next renewal (a lockwatch run holding it stops its command "
      "and exits 76). The fencing counter is kept; waiters are woken.");
  CLI::Option* release_redis = release->add_option(kStoreOption, release_url, kStoreHelp)->type_name("URL");
  release->add_flag("--force", force, "Required: say that you mean to remove someone else's lock")->required();
  release->add_option("KEY", release_key, "The lock's name")->required();
  bool release_verbose = false;
  release->add_flag("-v,--verbose", release_verbose, kVerboseHelp);

  for (CLI::Option* o : {run_redis, status_redis, release_redis}) o->envname("LOCKWATCH_REDIS_URL");

  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) throw CLI::RequiredError::Subcommand(1);
    if (*run && shell->count() == 0 && run_args.argv.empty())
      throw CLI::ValidationError("run", "needs a command: -c 'shell command' or -- CMD ARGS...");
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }

  try {
    if (*run) {
      if (run_redis->count() > 0) run_args.redis_url = redis_url;
      run_args.ttl = duration_of(ttl);
      run_args.wait = duration_of(wait);
      if (retries != "forever") run_args.retries = lockwatch::Retries(std::stoi(retries));
      if (!kill_grace.empty()) run_args.kill_grace = duration_of(kill_grace);
      if (shell->count() > 0) run_args.shell_command = shell_command;
      return run_command(run_args, inherited);
    }
    if (*status)
      return status_command(status_redis->count() > 0 ? std::optional(status_url) : std::nullopt, status_key,
                            status_verbose);
    return release_command(release_redis->count() > 0 ? std::optional(release_url) : std::nullopt, release_key,
                           release_verbose);
  } catch (const lockwatch::InvalidArgument& e) {
    say(e.what());
    return kExitUsage;
  } catch (const lockwatch::Unsupported& e) {
    say(e.what());
    return kExitUsage;
  } catch (const lockwatch::AuthError& e) {
    say(fmt::format("the store refused the credentials: {}", e.what()));
    return kExitUnavailable;
  } catch (const lockwatch::ConnectionError& e) {
    say(fmt::format("cannot reach the store: {}", e.what()));
    return kExitUnavailable;
  } catch (const lockwatch::RedisError& e) {
    say(fmt::format("the store refused the request: {}", e.what()));
    return kExitUnavailable;
  } catch (const std::exception& e) {
    say(fmt::format("internal error: {}", e.what()));
    return kExitInternal;
  }
}
