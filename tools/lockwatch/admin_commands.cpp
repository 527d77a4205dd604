// `lockwatch status` and `lockwatch release --force`: an operator's tools,
// over Runtime::inspect and Runtime::force_release.
#include <fmt/format.h>

#include "commands.hpp"

namespace lockwatch::cli {
namespace {

Options options_for(const std::optional<std::string>& redis_url, bool verbose) {
  Options o = Options::from_env();
  if (redis_url) o.store_url = *redis_url;
  o.threads = 1;  // no locked work runs here
  o.log = library_log(verbose);
  return o;
}

}  // namespace

int status_command(const std::optional<std::string>& redis_url, const std::string& key, bool verbose) {
  Runtime rt(options_for(redis_url, verbose));
  LockState s = rt.inspect(key).get();  // bounded: every request ends by reply or command timeout
  fmt::print("key={}\nstate={}\nttl_ms={}\nfencing_token={}\n", s.key, s.held ? "held" : "free", s.ttl.count(),
             s.fencing_token);
  return 0;
}

int release_command(const std::optional<std::string>& redis_url, const std::string& key, bool verbose) {
  Runtime rt(options_for(redis_url, verbose));
  bool was_held = rt.force_release(key).get();
  fmt::print("key={}\nwas_held={}\n", key, was_held ? "yes" : "no");
  return 0;
}

}  // namespace lockwatch::cli
