#include "store/make_store.hpp"

#include <fmt/format.h>

#include "core/url.hpp"
#include "lockwatch/errors.hpp"
#include "store/quorum_store.hpp"
#include "store/redis/keys.hpp"
#include "store/redis/node_store.hpp"
#include "store/redis/sentinel.hpp"
#include "store/redis/topology.hpp"

namespace lockwatch::detail {

namespace {

constexpr std::string_view kSupported =
    "redis://[user:password@]host:port[/db] (a comma-separated list of them for Redlock) and "
    "redis-sentinel://[user:password@]host:port[,host:port...]/master-name[/db], and the same over TLS as "
    "rediss:// and rediss-sentinel://";

enum class Scheme { kRedis, kRedisSentinel };

Scheme scheme_of(const std::string& url) {
  auto sep = url.find("://");
  std::string scheme = sep == std::string::npos ? std::string() : url.substr(0, sep);
  if (scheme == "redis" || scheme == "rediss") return Scheme::kRedis;
  if (scheme == "redis-sentinel" || scheme == "rediss-sentinel") return Scheme::kRedisSentinel;
  if (scheme.empty())
    throw InvalidArgument(fmt::format("malformed URL '{}': no scheme; lockwatch supports {}", url_for_messages(url),
                                      kSupported));
  throw InvalidArgument(fmt::format("unsupported URL scheme '{}://' in '{}': lockwatch supports {}", scheme,
                                    url_for_messages(url), kSupported));
}

}  // namespace

void check_store_options(const Options& options) {
  (void)scheme_of(options.redis_url);
  (void)Topology::parse(options.redis_url);
  if (const char* why = redis_keys::prefix_problem(options.key_prefix)) throw InvalidArgument(why);
}

std::unique_ptr<LockStore> make_store(Loop& loop, const Options& options) {
  check_store_options(options);
  Topology topology = Topology::parse(options.redis_url);
  if (!topology.sentinels.empty()) {
    auto node = std::make_unique<RedisNodeStore>(loop, topology.master, options);
    node->follow_sentinels(std::make_unique<SentinelWatcher>(loop, topology, options));
    return node;
  }
  if (topology.masters.size() == 1) return std::make_unique<RedisNodeStore>(loop, topology.masters.front(), options);
  std::vector<std::unique_ptr<LockStore>> nodes;
  std::vector<std::string> names;
  for (const auto& ep : topology.masters) {
    nodes.push_back(std::make_unique<RedisNodeStore>(loop, ep, options));
    names.push_back(ep.name());
  }
  return std::make_unique<QuorumStore>(std::move(nodes), std::move(names), options);
}

}  // namespace lockwatch::detail
