// The command line of `lockwatch` (app.hpp): subcommands, options, their
// help, and the tables of the footers.
#include "app.hpp"

#include <charconv>

#include "duration.hpp"
#include "exit_codes.hpp"

#ifndef LOCKWATCH_VERSION
#error "LOCKWATCH_VERSION is set by tools/lockwatch/meson.build from the project's version"
#endif

namespace lockwatch::cli {
namespace {

// --store is the store's URL; --redis, its first name, is kept as a
// deprecated alias (a warning when both are given and differ).
constexpr const char* kStoreOption = "--store";
constexpr const char* kRedisOption = "--redis";
constexpr const char* kRedisHelp = "Deprecated: the old name of --store (--store wins when both are given)";
constexpr const char* kStoreHelp =
    "Where the locks live: a store's URL, its scheme picking the store (redis://, redis-sentinel://, "
    "redis-cluster://, mysql://, postgresql://, zookeeper://, etcd://, memory://, ...; `lockwatch --help` lists "
    "each one's form, docs/stores.md describes them). Default: $LOCKWATCH_STORE_URL, else $LOCKWATCH_REDIS_URL "
    "(deprecated), else redis://127.0.0.1:6379";

constexpr const char* kVerboseHelp =
    "Also print the library's log on standard error: connections lost and retried, found again, leases lost "
    "(left out by default: they are meant for long-lived services; errors are always printed)";

constexpr const char* kOncePerHelp =
    "Run the command at most once per period across every host, on the store's clock: a duration (1d, 12h, "
    "30m; periods start at its multiples since the Unix epoch, so 1d at 00:00 UTC) or a 5-field cron "
    "expression in UTC ('0 3 * * *': a period from each fire time to the next). The store records the last "
    "period run with the lock KEY; a run that finds the current one run exits 79 without running the command. "
    "The period is claimed before the command starts: one that fails is not run again in its period. Pass "
    "--wait as long as the command may run so that a host that finds it running waits and exits 79 rather than "
    "75. Changing PERIOD for a KEY renumbers its periods: a longer one than the key's claims (1h, then 1d) is refused "
    "(exit 64, the command not run: use a new key); a shorter one starts its own periods at once";

CLI::Validator duration_validator() {
  return CLI::Validator(
      [](std::string& text) {
        std::string error;
        return parse_duration(text, error) ? std::string() : error;
      },
      "", "duration");
}

// A duration, or five fields: the cron parser (in the library) checks the
// fields themselves.
CLI::Validator period_validator() {
  return CLI::Validator(
      [](std::string& text) {
        if (text.find_first_of(" \t") == std::string::npos) {
          std::string error;
          if (!parse_duration(text, error)) return error + "; or a 5-field cron expression";
          if (*parse_duration(text, error) <= std::chrono::milliseconds(0)) return std::string("a period must be positive");
          return std::string();
        }
        int fields = 0;
        bool in_field = false;
        for (char c : text) {
          bool space = c == ' ' || c == '\t';
          if (!space && !in_field) fields++;
          in_field = !space;
        }
        if (fields != 5)
          return "'" + text + "' is not a cron expression: it has " + std::to_string(fields) +
                 " fields, not 5 (minute hour day-of-month month day-of-week)";
        return std::string();
      },
      "", "period");
}

}  // namespace

std::string exit_status_text() {
  std::string out = "Exit status of run:";
  for (const auto& row : kRunExitStatus) {
    std::string status = row.label ? row.label : std::to_string(row.code);
    out += "\n  " + status + std::string(status.size() < 19 ? 19 - status.size() : 1, ' ') + row.meaning;
  }
  return out;
}

std::string command_environment_text() {
  std::string out = "The command's environment, besides lockwatch's own:";
  for (const auto& row : kCommandEnvironment) {
    std::string name = row.name;
    out += "\n  " + name + std::string(name.size() < 25 ? 25 - name.size() : 1, ' ') + row.meaning;
  }
  return out;
}

CliApp make_app(CliArgs& a, const std::vector<std::string>& store_forms) {
  CliApp c;
  c.app = std::make_unique<CLI::App>(
      "Runs a command under a distributed lock (Redis, Redis Cluster, Sentinel, PostgreSQL, MariaDB, ZooKeeper, etcd), "
      "renewing the lease while it runs.", "lockwatch");
  CLI::App& app = *c.app;
  std::string footer = exit_status_text() + "\nstatus, release and ls exit 0, 69 or 64 alike.";
  if (!store_forms.empty()) {
    footer += "\n\nStore URLs (--store):";
    for (const std::string& form : store_forms) footer += "\n  " + form;
  }
  app.footer(footer);
  app.set_version_flag("--version", "lockwatch " LOCKWATCH_VERSION, "Print lockwatch's version and exit");
  // At most one, and "none" is reported after parsing, so that an unknown
  // word is named as such rather than reported as a missing subcommand.
  app.require_subcommand(0, 1);

  CLI::App* run = c.run = app.add_subcommand("run", "Run a command while holding the lock on KEY");
  run->footer(exit_status_text() + "\n\n" + command_environment_text());
  c.run_store = run->add_option(kStoreOption, a.run_url, kStoreHelp)->type_name("URL");
  c.run_redis = run->add_option(kRedisOption, a.run_redis_url, kRedisHelp)->type_name("URL");
  run->add_option("--key", a.key, "The lock's name")->required()->type_name("KEY");
  run->add_option("--ttl", a.ttl,
                  "Lease time-to-live, renewed by the watchdog while the command runs (500ms, 30s, 5m, 1h)")
      ->type_name("DURATION")
      ->capture_default_str()
      ->check(duration_validator());
  run->add_option("--wait", a.wait, "How long to wait for a busy lock; 0s tries once")
      ->type_name("DURATION")
      ->capture_default_str()
      ->check(duration_validator());
  run->add_option("--retries", a.retries,
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
  run->add_option("--kill-grace", a.kill_grace,
                  "On a lost lease the command's process group gets SIGTERM, then SIGKILL after this long. "
                  "Default: what is left before another holder could take the lock, at most 5s (none when "
                  "the store says the key is someone else's); a longer one is allowed, with a warning")
      ->type_name("DURATION")
      ->check(duration_validator());
  c.once_per = run->add_option("--once-per", a.once_per, kOncePerHelp)->type_name("PERIOD")->check(period_validator());
  run->add_option("-E,--conflict-exit-code", a.busy_code,
                  "Exit status when the lock stays busy past --wait (0: silently, as -q)")
      ->type_name("CODE")
      ->capture_default_str()
      ->check(CLI::Range(0, 255));
  run->add_flag("-q,--quiet", a.quiet, "A busy lock, or a period run already (--once-per), exits 0, silently");
  run->add_flag("-v,--verbose", a.run_verbose, kVerboseHelp);
  c.shell = run->add_option("-c,--command", a.shell_command, "Run this with /bin/sh -c")->type_name("'SHELL COMMAND'");
  CLI::Option* direct = run->add_option("command", a.argv, "The command and its arguments, after --")->type_name("");
  c.shell->excludes(direct);
  run->positionals_at_end();

  CLI::App* status = c.status = app.add_subcommand(
      "status",
      "Print what the store says of the lock on KEY: key=, state=held|free, ttl_ms=, fencing_token= lines; when "
      "held, then kind=, owner= (the holder's owner name), since= (its grant time, UTC), held_for_ms= and a holder= "
      "line per holder (held_for_ms, token, owner name: several for a shared or permit lock)");
  status->footer(
      "Takes no lease. state=held over Redlock means a majority of the nodes hold it for one owner. "
      "The times are the store's clock. The owner name is the holder's LOCKWATCH_OWNER_NAME "
      "(Options::runtime.owner_name), by default host:pid:program.");
  c.status_store = status->add_option(kStoreOption, a.status_url, kStoreHelp)->type_name("URL");
  c.status_redis = status->add_option(kRedisOption, a.status_redis_url, kRedisHelp)->type_name("URL");
  status->add_option("KEY", a.status_key, "The lock's name")->required();
  status->add_flag("-v,--verbose", a.status_verbose, kVerboseHelp);

  CLI::App* release = c.release = app.add_subcommand(
      "release", "Remove the lock on KEY whatever its owner (an operator's tool); prints key= and was_held=yes|no");
  release->footer(
      "The holder, if any, finds its lease gone at its next renewal (a lockwatch run holding it stops its command "
      "and exits 76). The fencing counter is kept; waiters are woken.");
  c.release_store = release->add_option(kStoreOption, a.release_url, kStoreHelp)->type_name("URL");
  c.release_redis = release->add_option(kRedisOption, a.release_redis_url, kRedisHelp)->type_name("URL");
  release->add_flag("--force", a.force, "Required: say that you mean to remove someone else's lock")->required();
  release->add_option("KEY", a.release_key, "The lock's name")->required();
  release->add_flag("-v,--verbose", a.release_verbose, kVerboseHelp);

  CLI::App* ls = c.ls = app.add_subcommand(
      "ls", "List the locks held whose key starts with PREFIX (all when none): key, kind, held for, ttl, fencing "
            "token and owner name, one line per holder, in columns with a header, or as JSON (--json)");
  ls->footer("Takes no lease. Bounded: the store is read in pages (SCAN on Redis and Cluster, a key range on etcd, "
             "the children of /lockwatch on ZooKeeper, a query on SQL) and the listing stops at --limit locks; "
             "a listing that reached it says so on standard error (narrow PREFIX or raise --limit).");
  c.ls_store = ls->add_option(kStoreOption, a.ls_url, kStoreHelp)->type_name("URL");
  ls->add_option("-n,--limit", a.ls_limit, "List at most this many locks (1..10000)")
      ->type_name("N")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  ls->add_flag("--json", a.ls_json, "Print one JSON array of the locks, each with its holders, instead of columns");
  ls->add_flag("-v,--verbose", a.ls_verbose, kVerboseHelp);
  ls->add_option("PREFIX", a.ls_prefix, "The keys' common start (none: every lock of the key prefix)");

  return c;
}

}  // namespace lockwatch::cli
