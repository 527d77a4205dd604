#include "store/redis/redis_kinds.hpp"

#include <fmt/format.h>

#include "core/url.hpp"
#include "lockwatch/errors.hpp"
#include "store/quorum_store.hpp"
#include "store/redis/cluster_store.hpp"
#include "store/redis/keys.hpp"
#include "store/redis/layout.hpp"
#include "store/redis/node_store.hpp"
#include "store/redis/redisson_store.hpp"
#include "store/redis/sentinel.hpp"
#include "store/redis/tls.hpp"
#include "store/redis/topology.hpp"

namespace lockwatch::detail {

namespace {

// What every Redis URL's store checks beyond its URL.
void check_redis_settings(const std::string& url, const Options& options) {
  if (options.min_replicas < 0) throw InvalidArgument("Options::min_replicas must not be negative");
  if (options.replica_ack_timeout.count() <= 0) throw InvalidArgument("Options::replica_ack_timeout must be positive");
  if (const char* why = redis_keys::prefix_problem(options.key_prefix)) throw InvalidArgument(why);
  // The files are read now, so that a wrong path fails here and not at
  // every connection attempt.
  if (url_wants_tls(url)) check_tls_options(options);
}

// The URL's topology, its layout checked against it.
Topology redis_topology(const std::string& url, RedisLayout& layout) {
  LayoutUrl split = split_layout(url);
  Topology topology = Topology::parse(split.url);
  layout = split.layout;
  if (layout == RedisLayout::kRedisson && topology.sentinels.empty() && topology.masters.size() > 1)
    throw Unsupported(fmt::format("'{}': the redisson layout is for one master (or Sentinel, or a Cluster), not "
                                  "Redlock: Redisson deprecated its RedLock for RLock and RFencedLock",
                                  url_for_messages(url)));
  return topology;
}

void check_redis(const std::string& url, const Options& options) {
  RedisLayout layout{};
  (void)redis_topology(url, layout);
  check_redis_settings(url, options);
}

// `store` as the runtime gets it in `layout`.
std::unique_ptr<LockStore> in_layout(std::unique_ptr<LockStore> store, const StoreLayout& layout) {
  if (!layout.redisson()) return store;
  return std::make_unique<RedissonStore>(std::move(store));
}

std::unique_ptr<LockStore> make_redis(Loop& loop, const std::string& url, const Options& options) {
  RedisLayout kind{};
  Topology topology = redis_topology(url, kind);
  const StoreLayout layout = kind == RedisLayout::kRedisson ? StoreLayout::make_redisson() : StoreLayout{};
  if (!topology.sentinels.empty()) {
    auto node =
        std::make_unique<RedisNodeStore>(loop, topology.master, options, RedisNodeStore::Notices::kClassic, layout);
    node->follow_sentinels(std::make_unique<SentinelWatcher>(loop, topology, options));
    return in_layout(std::move(node), layout);
  }
  if (topology.masters.size() == 1)
    return in_layout(std::make_unique<RedisNodeStore>(loop, topology.masters.front(), options,
                                                      RedisNodeStore::Notices::kClassic, layout),
                     layout);
  std::vector<std::unique_ptr<LockStore>> nodes;
  std::vector<std::string> names;
  for (const auto& ep : topology.masters) {
    nodes.push_back(std::make_unique<RedisNodeStore>(loop, ep, options));
    names.push_back(ep.name());
  }
  return std::make_unique<QuorumStore>(std::move(nodes), std::move(names), options);
}

void check_cluster(const std::string& url, const Options& options) {
  (void)ClusterSeeds::parse(split_layout(url).url);
  check_redis_settings(url, options);
}

std::unique_ptr<LockStore> make_cluster(Loop& loop, const std::string& url, const Options& options) {
  LayoutUrl split = split_layout(url);
  const StoreLayout layout = split.layout == RedisLayout::kRedisson ? StoreLayout::make_redisson() : StoreLayout{};
  return in_layout(std::make_unique<ClusterStore>(loop, ClusterSeeds::parse(split.url), options, layout), layout);
}

}  // namespace

constinit const StoreKind kRedisStore{
    "redis rediss redis-sentinel rediss-sentinel",
    "redis://[user:password@]host:port[/db] (a comma-separated list of them for Redlock), "
    "redis-sentinel://[user:password@]host:port[,host:port...]/master-name[/db], the same over TLS as rediss:// "
    "and rediss-sentinel://, each with ?layout=redisson to share locks with Redisson",
    check_redis, make_redis};

constinit const StoreKind kRedisClusterStore{
    "redis-cluster rediss-cluster",
    "redis-cluster://[user:password@]host:port[,host:port...][?layout=redisson] (seed nodes of a Redis Cluster; "
    "rediss-cluster:// over TLS)",
    check_cluster, make_cluster};

}  // namespace lockwatch::detail
