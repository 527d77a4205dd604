// lockwatch: run a command under a distributed lock on Redis, and look at
// or remove a lock.
//
//   lockwatch run [--store URL] --key KEY [--ttl 30s] [--wait 0s] [--retries N|forever]
//                 [--kill-grace D] [--once-per PERIOD] [-E CODE] [-q] [-v]
//                 (-c 'shell command' | -- CMD ARGS...)
//   lockwatch status [--store URL] [-v] KEY
//   lockwatch release [--store URL] [-v] --force KEY
//
// --redis is the same option as --store (its first name, kept).
//
// The command line is defined in app.cpp (and rendered from there as the
// man page and the bash completion); the subcommands are in run.cpp and
// admin_commands.cpp; exit codes in exit_codes.hpp (and --help).
#include <fmt/format.h>

#include "app.hpp"
#include "commands.hpp"
#include "duration.hpp"
#include "exit_codes.hpp"
#include "lockwatch/errors.hpp"

namespace {

using namespace lockwatch::cli;

std::chrono::milliseconds duration_of(const std::string& text) {
  std::string error;
  return *parse_duration(text, error);  // validated while parsing
}

}  // namespace

int main(int argc, char** argv) {
  const Inherited inherited = Inherited::capture();

  CliArgs args;
  CliApp cli = make_app(args);
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
      if (cli.run_redis->count() > 0) run_args.redis_url = args.run_url;
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
    if (*cli.status)
      return status_command(cli.status_redis->count() > 0 ? std::optional(args.status_url) : std::nullopt,
                            args.status_key, args.status_verbose);
    return release_command(cli.release_redis->count() > 0 ? std::optional(args.release_url) : std::nullopt,
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
  } catch (const lockwatch::RedisError& e) {
    say(fmt::format("the store refused the request: {}", e.what()));
    return kExitUnavailable;
  } catch (const std::exception& e) {
    say(fmt::format("internal error: {}", e.what()));
    return kExitInternal;
  }
}
