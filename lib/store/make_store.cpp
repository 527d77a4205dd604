#include "store/make_store.hpp"

#include <fmt/format.h>

#include "core/url.hpp"
#include "lockwatch/errors.hpp"
#include "store/memory/memory_store.hpp"
#include "store/quorum_store.hpp"
#include "store/redis/cluster_store.hpp"
#include "store/redis/keys.hpp"
#include "store/redis/node_store.hpp"
#include "store/redis/sentinel.hpp"
#include "store/redis/tls.hpp"
#include "store/redis/topology.hpp"
#include "store/sql/sql_store.hpp"
#include "store/sql/sql_target.hpp"
#ifdef LOCKWATCH_HAVE_POSTGRESQL
#include "store/postgresql/pg_store.hpp"
#include "store/postgresql/pg_target.hpp"
#endif

namespace lockwatch::detail {

namespace {

constexpr std::string_view kSupported =
    "redis://[user:password@]host:port[/db] (a comma-separated list of them for Redlock), "
    "redis-sentinel://[user:password@]host:port[,host:port...]/master-name[/db], the same over TLS as "
    "rediss:// and rediss-sentinel://, redis-cluster://[user:password@]host:port[,host:port...] (seed nodes of a "
    "Redis Cluster; rediss-cluster:// over TLS), mysql://user:password@host[:port]/database[?socket=/path&table=name], "
    "postgresql://user[:password]@host[:port]/database[?table=name&sslmode=...] (or postgres://), "
    "and memory://[name] (in this process: runtimes naming the same space share it)";

enum class Scheme { kRedis, kRedisSentinel, kRedisCluster, kMysql, kPostgresql, kMemory };

Scheme scheme_of(const std::string& url) {
  auto sep = url.find("://");
  std::string scheme = sep == std::string::npos ? std::string() : url.substr(0, sep);
  if (scheme == "redis" || scheme == "rediss") return Scheme::kRedis;
  if (scheme == "redis-sentinel" || scheme == "rediss-sentinel") return Scheme::kRedisSentinel;
  if (scheme == "redis-cluster" || scheme == "rediss-cluster") return Scheme::kRedisCluster;
  if (scheme == "mysql") return Scheme::kMysql;
  if (scheme == "postgresql" || scheme == "postgres") return Scheme::kPostgresql;
  if (scheme == "memory") return Scheme::kMemory;
  if (scheme.empty())
    throw InvalidArgument(fmt::format("malformed URL '{}': no scheme; lockwatch supports {}", url_for_messages(url),
                                      kSupported));
  throw InvalidArgument(fmt::format("unsupported URL scheme '{}://' in '{}': lockwatch supports {}", scheme,
                                    url_for_messages(url), kSupported));
}

}  // namespace

void check_store_options(const Options& options) {
  if (options.min_replicas < 0) throw InvalidArgument("Options::min_replicas must not be negative");
  if (options.replica_ack_timeout.count() <= 0) throw InvalidArgument("Options::replica_ack_timeout must be positive");
  // In memory, the options for servers (TLS, replicas) have nothing to act
  // on: a test swaps the URL alone.
  if (scheme_of(options.redis_url) == Scheme::kMemory) return;
  if (scheme_of(options.redis_url) == Scheme::kPostgresql) {
#ifdef LOCKWATCH_HAVE_POSTGRESQL
    PgStore::check_options(PgTarget::parse(options.redis_url), options);
    return;
#else
    throw InvalidArgument(fmt::format("'{}' needs the PostgreSQL store, which this lockwatch was built without: "
                                      "configure it with the Meson feature postgresql enabled (-Dpostgresql=enabled, "
                                      "libpq >= 14: Debian's libpq-dev)",
                                      url_for_messages(options.redis_url)));
#endif
  }
  if (scheme_of(options.redis_url) == Scheme::kMysql) {
    (void)SqlTarget::parse(options.redis_url);
    if (options.min_replicas > 0)
      throw InvalidArgument("Options::min_replicas applies to Redis replicas; a mysql:// store takes its durability "
                            "from the database's own replication settings");
    if (options.key_prefix.size() >= SqlStore::kMaxNameBytes)
      throw InvalidArgument("Options::key_prefix leaves no room for a key in the SQL lock table's 255-byte lock_name");
    return;
  }
  if (scheme_of(options.redis_url) == Scheme::kRedisCluster) {
    (void)ClusterSeeds::parse(options.redis_url);
  } else {
    (void)Topology::parse(options.redis_url);
  }
  if (const char* why = redis_keys::prefix_problem(options.key_prefix)) throw InvalidArgument(why);
  // The files are read now, so that a wrong path fails here and not at
  // every connection attempt.
  if (url_wants_tls(options.redis_url)) check_tls_options(options);
}

std::unique_ptr<LockStore> make_store(Loop& loop, const Options& options) {
  check_store_options(options);
  if (scheme_of(options.redis_url) == Scheme::kMemory)
    return std::make_unique<MemoryStore>(loop, MemorySpace::open(MemoryStore::space_name(options.redis_url)), options);
  if (scheme_of(options.redis_url) == Scheme::kMysql)
    return std::make_unique<SqlStore>(loop, SqlTarget::parse(options.redis_url), options);
#ifdef LOCKWATCH_HAVE_POSTGRESQL
  if (scheme_of(options.redis_url) == Scheme::kPostgresql)
    return std::make_unique<PgStore>(loop, PgTarget::parse(options.redis_url), options);
#endif
  if (scheme_of(options.redis_url) == Scheme::kRedisCluster)
    return std::make_unique<ClusterStore>(loop, ClusterSeeds::parse(options.redis_url), options);
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
