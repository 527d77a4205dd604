#include "store/redis/redis_kinds.hpp"

#include <fmt/format.h>

#include "core/tls.hpp"
#include "core/url.hpp"
#include "lockwatch/errors.hpp"
#include "store/quorum_store.hpp"
#include "store/redis/cluster_store.hpp"
#include "store/redis/keys.hpp"
#include "store/redis/layout.hpp"
#include "store/redis/node_store.hpp"
#include "store/redis/sentinel.hpp"
#include "store/redis/topology.hpp"

namespace lockwatch::detail {

namespace {

// What every Redis URL's store checks beyond its URL.
void check_redis_settings(const std::string& url, const Options& options) {
  if (const char* why = redis_keys::prefix_problem(options.runtime.key_prefix)) throw InvalidArgument(why);
  // A URL over TLS (rediss://, rediss-sentinel://, rediss-cluster://): the files are read now, so that a wrong
  // path fails here and not at every connection attempt.
  if (url.starts_with("rediss://") || url.starts_with("rediss-sentinel://") || url.starts_with("rediss-cluster://") ||
      url.find(",rediss://") != std::string::npos || url.find(", rediss://") != std::string::npos)
    check_tls_options(options.tls);
}

// sentinel_user and sentinel_password: for redis-sentinel:// URLs only.
void refuse_sentinel_credentials(const std::string& url, const RedisUrl& split) {
  if (!split.sentinel_user.empty() || !split.sentinel_password.empty())
    throw InvalidArgument(fmt::format("'{}': sentinel_user and sentinel_password are for redis-sentinel:// URLs",
                                      url_for_messages(url)));
}

// The URL's settings and topology, its layout checked against it.
Topology redis_topology(const std::string& url, RedisUrl& split) {
  split = split_redis_url(url);
  Topology topology = Topology::parse(split.url);
  if (split.layout == RedisLayout::kRedisson && topology.sentinels.empty() && topology.masters.size() > 1)
    throw Unsupported(fmt::format("'{}': the redisson layout is for one master (or Sentinel, or a Cluster), not "
                                  "Redlock: Redisson deprecated its RedLock for RLock and RFencedLock",
                                  url_for_messages(url)));
  if (topology.sentinels.empty()) refuse_sentinel_credentials(url, split);
  return topology;
}

void check_redis(const std::string& url, const Options& options) {
  RedisUrl split;
  (void)redis_topology(url, split);
  check_redis_settings(url, options);
}

StoreLayout store_layout(const RedisUrl& split) {
  return split.layout == RedisLayout::kRedisson ? StoreLayout::make_redisson() : StoreLayout{};
}

std::unique_ptr<LockStore> make_redis(Loop& loop, const std::string& url, const Options& options) {
  RedisUrl split;
  Topology topology = redis_topology(url, split);
  const StoreSettings settings = StoreSettings::of(options);
  constexpr auto kClassic = RedisNodeStore::Notices::kClassic;
  const bool sentinel = !topology.sentinels.empty();
  if (sentinel || topology.masters.size() == 1) {
    // One master: the URL's, or the one the sentinels name.
    auto node = std::make_unique<RedisNodeStore>(loop, sentinel ? topology.master : topology.masters.front(), settings,
                                                 kClassic, store_layout(split), split.replicas);
    node->write_directly();
    if (sentinel)
      node->follow_sentinels(
          std::make_unique<SentinelWatcher>(loop, topology, settings, split.sentinel_user, split.sentinel_password));
    return node;
  }
  std::vector<std::unique_ptr<LockStore>> nodes;
  std::vector<std::string> names;
  for (const auto& ep : topology.masters) {
    nodes.push_back(std::make_unique<RedisNodeStore>(loop, ep, settings, kClassic, StoreLayout{}, split.replicas));
    names.push_back(ep.name());
  }
  return std::make_unique<QuorumStore>(std::move(nodes), std::move(names), options.watchdog);
}

void check_cluster(const std::string& url, const Options& options) {
  const RedisUrl split = split_redis_url(url);
  refuse_sentinel_credentials(url, split);
  (void)ClusterSeeds::parse(split.url);
  check_redis_settings(url, options);
}

std::unique_ptr<LockStore> make_cluster(Loop& loop, const std::string& url, const Options& options) {
  const RedisUrl split = split_redis_url(url);
  return std::make_unique<ClusterStore>(loop, ClusterSeeds::parse(split.url), StoreSettings::of(options),
                                        store_layout(split), split.replicas);
}

}  // namespace

constinit const StoreKind kRedisStore{
    "redis rediss redis-sentinel rediss-sentinel",
    "redis://[user:password@]host:port[/db] (a comma-separated list of them for Redlock), "
    "redis-sentinel://[user:password@]host:port[,host:port...]/master-name[/db], the same over TLS as rediss:// "
    "and rediss-sentinel://, each with ?layout=redisson to share locks with Redisson, ?min_replicas=N"
    "[&replica_ack_timeout=MS] to wait for replicas, and for Sentinel ?sentinel_user=U&sentinel_password=P",
    check_redis, make_redis};

constinit const StoreKind kRedisClusterStore{
    "redis-cluster rediss-cluster",
    "redis-cluster://[user:password@]host:port[,host:port...][?layout=redisson][&min_replicas=N] (seed nodes of a "
    "Redis Cluster; rediss-cluster:// over TLS)",
    check_cluster, make_cluster};

}  // namespace lockwatch::detail
