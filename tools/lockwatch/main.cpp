// lockwatch: run a command under a distributed lock (Redis, SQL, ZooKeeper,
// etcd), and look at
// or remove a lock.
//
//   lockwatch run [--store URL] --key KEY [--ttl 30s] [--wait 0s] [--retries N|forever]
//                 [--kill-grace D] [--once-per PERIOD] [-E CODE] [-q] [-v]
//                 (-c 'shell command' | -- CMD ARGS...)
//   lockwatch status [--store URL] [-v] KEY
//   lockwatch release [--store URL] [-v] --force KEY
//   lockwatch ls [--store URL] [--limit N] [--json] [-v] [PREFIX]
//
// --redis is the deprecated name of --store (kept; a warning when both are
// given and differ).
//
// The command line is defined in app.cpp (and rendered from there as the
// man page and the bash completion); the subcommands are in run.cpp and
// admin_commands.cpp; exit codes in exit_codes.hpp (and --help).
#include <fmt/format.h>

#include <cstdlib>
#include <optional>
#include <string_view>

#include "app.hpp"
#include "commands.hpp"
#include "duration.hpp"
#include "exit_codes.hpp"
#include "lockwatch/errors.hpp"
#include "lockwatch/options.hpp"

namespace {

using namespace lockwatch::cli;

// The store's URL from --store, else from --redis (its deprecated name),
// else none (Options::from_env: LOCKWATCH_STORE_URL, else
// LOCKWATCH_REDIS_URL). A warning when both names are given, or both
// variables set, and they differ (naming no URL: they may hold passwords).
std::optional<std::string> store_url(const CLI::Option* store, const std::string& store_url,
                                     const CLI::Option* redis, const std::string& redis_url) {
  if (store->count() > 0 && redis->count() > 0 && store_url != redis_url)
    say("warning: --redis is the deprecated name of --store; both are given, with different URLs: using --store");
  if (store->count() > 0) return store_url;
  if (redis->count() > 0) return redis_url;
  const char* store_env = std::getenv("LOCKWATCH_STORE_URL");
  const char* redis_env = std::getenv("LOCKWATCH_REDIS_URL");
  if (store_env && *store_env && redis_env && *redis_env && std::string_view(store_env) != redis_env)
    say("warning: LOCKWATCH_REDIS_URL is the deprecated name of LOCKWATCH_STORE_URL; both are set, to different "
        "URLs: using LOCKWATCH_STORE_URL");
  return std::nullopt;
}

std::chrono::milliseconds duration_of(const std::string& text) {
  std::string error;
  return *parse_duration(text, error);  // validated while parsing
}

}  // namespace

int main(int argc, char** argv) {
  const Inherited inherited = Inherited::capture();

  CliArgs args;
  CliApp cli = make_app(args, lockwatch::store_url_forms());
  CLI::App& app = *cli.app;
  RunArgs run_args;

  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) throw CLI::RequiredError::Subcommand(1);
    if (*cli.run && cli.shell->count() == 0 && args.argv.empty())
      throw CLI::ValidationError("run", "needs a command: -c 'shell command' or -- CMD ARGS...");
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }

  try {
    if (*cli.run) {
      run_args.redis_url = store_url(cli.run_store, args.run_url, cli.run_redis, args.run_redis_url);
      run_args.key = args.key;
      run_args.ttl = duration_of(args.ttl);
      run_args.wait = duration_of(args.wait);
      if (args.retries != "forever") run_args.retries = lockwatch::Retries(std::stoi(args.retries));
      if (!args.kill_grace.empty()) run_args.kill_grace = duration_of(args.kill_grace);
      if (cli.once_per->count() > 0) {
        if (args.once_per.find_first_of(" \t") == std::string::npos)
          run_args.once_every = duration_of(args.once_per);
        else
          run_args.once_cron = args.once_per;
      }
      run_args.busy_code = args.busy_code;
      run_args.quiet = args.quiet;
      run_args.verbose = args.run_verbose;
      if (cli.shell->count() > 0) run_args.shell_command = args.shell_command;
      run_args.argv = args.argv;
      return run_command(run_args, inherited);
    }
    if (*cli.ls)
      return ls_command(store_url(cli.ls_store, args.ls_url, cli.ls_store, args.ls_url), args.ls_prefix,
                        args.ls_limit, args.ls_json, args.ls_verbose);
    if (*cli.status)
      return status_command(store_url(cli.status_store, args.status_url, cli.status_redis, args.status_redis_url),
                            args.status_key, args.status_verbose);
    return release_command(store_url(cli.release_store, args.release_url, cli.release_redis, args.release_redis_url),
                           args.release_key, args.release_verbose);
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
  } catch (const lockwatch::StoreRefused& e) {
    say(fmt::format("the store refused the request: {}", e.what()));
    return kExitUnavailable;
  } catch (const std::exception& e) {
    say(fmt::format("internal error: {}", e.what()));
    return kExitInternal;
  }
}
