// tools/lockwatch/app.hpp: the command line of `lockwatch`, defined once.
// main.cpp parses with it; doc.cpp renders the same definition as the man
// page lockwatch(1) and the bash completion at build time, so that --help,
// the man page and the completion cannot disagree.
//
// It needs CLI11 and nothing of the library: the generator builds without
// it. Threading: one thread.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

namespace lockwatch::cli {

// The arguments as parsed, still text where the library or main() reads them.
struct CliArgs {
  // run
  std::string run_url;
  std::string run_redis_url;  // --redis, the deprecated name of --store
  std::string key;
  std::string ttl = "30s";
  std::string wait = "0s";
  std::string retries = "forever";
  std::string kill_grace;
  std::string once_per;
  int busy_code = 75;
  bool quiet = false;
  bool run_verbose = false;
  std::string shell_command;
  std::vector<std::string> argv;
  // status
  std::string status_url;
  std::string status_redis_url;
  std::string status_key;
  bool status_verbose = false;
  // release
  std::string release_url;
  std::string release_redis_url;
  std::string release_key;
  bool force = false;
  bool release_verbose = false;
  // ls
  std::string ls_url;
  std::string ls_prefix;
  std::size_t ls_limit = 100;
  bool ls_json = false;
  bool ls_verbose = false;
};

struct CliApp {
  std::unique_ptr<CLI::App> app;
  CLI::App* run = nullptr;
  CLI::App* status = nullptr;
  CLI::App* release = nullptr;
  CLI::App* ls = nullptr;
  // Whether they were given (count() after parsing): --store, and --redis,
  // its deprecated name.
  CLI::Option* run_store = nullptr;
  CLI::Option* status_store = nullptr;
  CLI::Option* release_store = nullptr;
  CLI::Option* ls_store = nullptr;
  CLI::Option* run_redis = nullptr;
  CLI::Option* status_redis = nullptr;
  CLI::Option* release_redis = nullptr;
  CLI::Option* shell = nullptr;
  CLI::Option* once_per = nullptr;
};

// The app, writing into `args` (which must outlive it). `store_forms`, the
// URL forms of the stores as the library lists them
// (lockwatch::store_url_forms()), close the top-level --help; the man page's
// generator, built without the library, leaves them out (--store's help
// points to docs/stores.md).
CliApp make_app(CliArgs& args, const std::vector<std::string>& store_forms = {});

// The one text of the tables --help's footers and the man page show.
std::string exit_status_text();       // "Exit status of run:" and its rows
std::string command_environment_text();  // what the command finds in its environment

}  // namespace lockwatch::cli
