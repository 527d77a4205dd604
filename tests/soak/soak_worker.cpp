// lockwatch-soak-worker: one process of the fault soak (scripts/soak).
//
//   lockwatch-soak-worker --redis URL --resource HOST:PORT --id p1 --history FILE
//                         --until-ns T [--threads 3] [--keys 3] [--seed S] [--min-replicas N]
//                         [--kinds rw,sem]
//
// Its threads take locks on a few shared keys until the monotonic time T,
// through the public API only (LOCKED-style `locked()` and
// `Runtime::acquire`, picked at random per call, with random ttls, waits
// and renewal limits). Under each lease they make racy increments of a
// counter held by the "resource", a second redis-server the soak never
// faults: read the counter, sleep, write it back plus one. The resource
// refuses a write whose token is below the highest it accepted, or that
// arrives after the writer's lease deadline (the writer sends its deadline
// on the wall clock: now + remaining()). So a holder paused past its lease
// cannot get a write in, while two holders at once, or tokens going
// backwards, show up in what it accepted: interleaved read/write pairs,
// "stale" refusals of writes made in time, a counter that lags the number
// of accepted writes.
//
// With --kinds, some calls take other kinds of lock (lock_kind.hpp) on
// keys of their own: "rw" as a reader (shared) or a writer (exclusive),
// "sem" as one of 2 permits. They hold for a while and write nothing; the
// checker judges them by when each held its lease: a writer that ended
// well overlapped no one, no more than 2 permit holders at once.
//
// Everything scripts/soak_check.py needs goes to the history, one JSON
// object per line, flushed at once (a process killed with SIGKILL loses at
// most the line it was writing):
//   {"e":"start"}  process start          {"e":"b"}  a call begins (with its bound)
//   {"e":"w"}      one write attempt      {"e":"c"}  a call ended (outcome, token, owner,
//   {"e":"exit"}   clean exit (stats)                 what Redis held after the release,
//   {"e":"a"}      a long hold began                  when the holder was told its lease was lost)
// Times are CLOCK_MONOTONIC nanoseconds, shared by every process on the host.
//
// While holding, a call reads the lock's owner token straight from Redis
// (the documented layout `lockwatch:{KEY}`), and after a release that
// reported success it checks that no node still holds that owner. With
// Sentinel that check is made only if the sentinels name the same master
// as when the owner was read: across a failover the old master can live
// on as a stale master (its ROLE still says master) with keys the new one
// no longer has, and which of them the library released on is not known.
// On a Redis Cluster the owner is read from the master serving the key's
// slot (following MOVED, and ASK after ASKING), and the check after the
// release is made only if the same node answers (a failover or a slot
// moved in between leaves it out). On SQL (mysql://, postgresql://) the
// owner is the lock row's while it has not expired, read on the database's
// clock. On etcd (etcd://) it is the key's value, read by a linearizable
// Range from the first member that answers.
#include <hiredis/hiredis.h>
#include <lockwatch/lockwatch.hpp>
#if LOCKWATCH_WITH_SQL
#include <mysql.h>
#endif
#if LOCKWATCH_WITH_POSTGRESQL
#include <libpq-fe.h>
#include <poll.h>
#include <sys/socket.h>
#endif
#if LOCKWATCH_WITH_ETCD
#include <grpcpp/grpcpp.h>

#include "rpc.grpc.pb.h"
#endif
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

// The URL forms as the library parses them (to read lock keys on the same
// nodes the library uses).
#include "store/redis/topology.hpp"
#if LOCKWATCH_WITH_ZOOKEEPER
#include <zookeeper/zookeeper.h>

#include "store/zookeeper/zk_nodes.hpp"
#endif

using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Client-side bounds of the soak's own connections (the resource is never
// faulted; the lock nodes are, so probing them must give up quickly).
constexpr auto kResourceTimeout = 1000ms;
constexpr auto kProbeTimeout = 200ms;
// The runtime's, kept short so that faults end calls quickly.
constexpr auto kConnectTimeout = 500ms;
constexpr auto kCommandTimeout = 1000ms;
// A future not ready this long after its bound is a hang: the process
// records it and exits (a future cannot be abandoned).
constexpr auto kHangGrace = 30s;
// After --until-ns the process must be gone by this much later.
constexpr auto kExitGrace = 45s;

// The history's times come from the kernel, not from libc: under
// scripts/soak --nemesis clock a worker runs with libfaketime, which fakes
// the process's clocks (its leases' too) but not the times the checker
// compares across processes.
std::int64_t mono_ns() {
  timespec ts{};
  ::syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
// The resource judges a write's deadline on its own wall clock: the
// writer's is read from the kernel too, so that a faked clock changes what
// the lease says is left (remaining()), not what "now" is.
std::int64_t real_us() {
  timespec ts{};
  ::syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

// ------------------------------------------------------------------ history

// One JSON object, built field by field.
class Json {
 public:
  Json& s(const char* key, std::string_view v) {
    field(key);
    out_ += '"';
    for (unsigned char c : v) {
      if (c == '"' || c == '\\') {
        out_ += '\\';
        out_ += static_cast<char>(c);
      } else if (c < 0x20 || c >= 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out_ += buf;
      } else {
        out_ += static_cast<char>(c);
      }
    }
    out_ += '"';
    return *this;
  }
  Json& i(const char* key, long long v) {
    field(key);
    out_ += std::to_string(v);
    return *this;
  }
  std::string str() const { return out_ + "}\n"; }

 private:
  void field(const char* key) {
    out_ += out_.size() > 1 ? ",\"" : "\"";
    out_ += key;
    out_ += "\":";
  }
  std::string out_ = "{";
};

class History {
 public:
  explicit History(const std::string& path) : f_(std::fopen(path.c_str(), "a")) {
    if (f_ == nullptr) throw std::runtime_error("cannot open history " + path);
  }
  ~History() { std::fclose(f_); }
  History(const History&) = delete;
  History& operator=(const History&) = delete;
  void write(const Json& j) {
    std::string line = j.str();
    std::lock_guard<std::mutex> g(m_);
    std::fputs(line.c_str(), f_);
    std::fflush(f_);
  }

 private:
  std::mutex m_;
  std::FILE* f_;
};

// ------------------------------------------------------- plain connections

using ReplyPtr = std::unique_ptr<redisReply, void (*)(void*)>;

// A synchronous hiredis connection, made on first use and dropped on any
// failure (remade by the next call).
class Conn {
 public:
  Conn(std::string host, int port, milliseconds timeout) : host_(std::move(host)), port_(port), timeout_(timeout) {}
  ~Conn() { drop(); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  Conn(Conn&& o) noexcept : host_(std::move(o.host_)), port_(o.port_), timeout_(o.timeout_), c_(o.c_) { o.c_ = nullptr; }

  const std::string& host() const { return host_; }
  int port() const { return port_; }

  // Sends the commands pipelined and returns one reply each, or nothing if
  // the connection failed on the way.
  std::vector<ReplyPtr> run(const std::vector<std::vector<std::string>>& cmds) {
    std::vector<ReplyPtr> out;
    if (!connect()) return out;
    for (const auto& cmd : cmds) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (const auto& a : cmd) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      if (redisAppendCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), lens.data()) != REDIS_OK) {
        drop();
        return {};
      }
    }
    for (std::size_t i = 0; i < cmds.size(); ++i) {
      void* r = nullptr;
      if (redisGetReply(c_, &r) != REDIS_OK || r == nullptr) {
        drop();
        return {};
      }
      out.emplace_back(static_cast<redisReply*>(r), freeReplyObject);
    }
    return out;
  }

 private:
  bool connect() {
    if (c_ != nullptr) return true;
    timeval tv{static_cast<time_t>(timeout_.count() / 1000), static_cast<suseconds_t>(timeout_.count() % 1000 * 1000)};
    c_ = redisConnectWithTimeout(host_.c_str(), port_, tv);
    if (c_ == nullptr) return false;
    if (c_->err != 0 || redisSetTimeout(c_, tv) != REDIS_OK) {
      drop();
      return false;
    }
    return true;
  }
  void drop() {
    if (c_ != nullptr) redisFree(c_);
    c_ = nullptr;
  }

  std::string host_;
  int port_;
  milliseconds timeout_;
  redisContext* c_ = nullptr;
};

std::string str_of(const redisReply* r) {
  return r != nullptr && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) ? std::string(r->str, r->len)
                                                                                          : std::string();
}

// The owner token each value read of a lock starts with: a Redis lock's
// value goes on with its grant time and owner name, a space apart (each
// Redlock node's grant time its own), the other stores' values hold no
// space.
std::vector<std::optional<std::string>> owner_tokens(std::vector<std::optional<std::string>> values) {
  for (auto& v : values)
    if (v) v->resize(std::min(v->size(), v->find(' ')));
  return values;
}

// ---------------------------------------------------------------- resource

// Each read and write takes the key's next operation number, so the
// resource's own order of events is known. A write is refused when it
// arrives after the writer's deadline ("late": a paused holder, expected)
// or carries a token below the highest accepted ("stale": someone newer
// wrote while this writer's lease was still valid). Accepted writes and
// refusals are logged by the script itself, in the order it ran them.
constexpr const char* kReadScript = R"lua(
local n = redis.call('hincrby', KEYS[1], 'ops', 1)
return {n, tonumber(redis.call('hget', KEYS[1], 'count') or '0')}
)lua";

constexpr const char* kWriteScript = R"lua(
local n = redis.call('hincrby', KEYS[1], 'ops', 1)
local t = redis.call('time')
local now = t[1] .. string.format('%06d', tonumber(t[2]))
local hi = tonumber(redis.call('hget', KEYS[1], 'token') or '0')
local why = nil
if tonumber(now) > tonumber(ARGV[5]) then why = 'late' elseif tonumber(ARGV[1]) < hi then why = 'stale' end
if why then
  redis.call('rpush', KEYS[3], table.concat({n, ARGV[1], ARGV[3], ARGV[4], why, hi, now, ARGV[5]}, ' '))
  return {0, n, why}
end
redis.call('hset', KEYS[1], 'token', ARGV[1], 'count', ARGV[2])
redis.call('hincrby', KEYS[1], 'accepted', 1)
redis.call('rpush', KEYS[2], table.concat({n, ARGV[1], ARGV[3], ARGV[4], ARGV[2], now}, ' '))
return {1, n, 'ok'}
)lua";

struct ReadResult {
  long long seq = 0;
  long long count = 0;
};
struct WriteResult {
  std::string res = "err";  // ok | late | stale | err (no answer: unknown)
  long long seq = 0;
};

class Resource {
 public:
  Resource(const std::string& host, int port) : conn_(host, port, kResourceTimeout) {}

  std::optional<ReadResult> read(const std::string& key) {
    auto r = conn_.run({{"EVAL", kReadScript, "1", "res:" + key}});
    if (r.empty() || r[0]->type != REDIS_REPLY_ARRAY || r[0]->elements != 2) return std::nullopt;
    return ReadResult{r[0]->element[0]->integer, r[0]->element[1]->integer};
  }

  WriteResult write(const std::string& key, std::uint64_t token, long long value, const std::string& lease,
                    long long read_seq, std::int64_t deadline_us) {
    auto r = conn_.run({{"EVAL", kWriteScript, "3", "res:" + key, "log:" + key, "refused:" + key,
                         std::to_string(token), std::to_string(value), lease, std::to_string(read_seq),
                         std::to_string(deadline_us)}});
    WriteResult w;
    if (r.empty() || r[0]->type != REDIS_REPLY_ARRAY || r[0]->elements != 3) return w;
    w.seq = r[0]->element[1]->integer;
    w.res = str_of(r[0]->element[2]);
    return w;
  }

 private:
  Conn conn_;
};

// -------------------------------------------------------------- lock nodes

// Where the lock nodes are, from the URL the runtime gets: fixed masters
// and Sentinel as the library parses them, a Redis Cluster's seeds, or a
// mysql:// or postgresql:// database, a ZooKeeper ensemble, or etcd's
// members.
struct Where {
  enum class Kind { kRedis, kCluster, kSql, kPostgres, kZooKeeper, kEtcd } kind = Kind::kRedis;
  lockwatch::detail::Topology topology;  // kRedis
  std::vector<std::pair<std::string, int>> seeds;  // kCluster, kEtcd (its members)
  std::string user, password, host, database;  // kSql
  int port = 3306;
  std::string zk_hosts;  // kZooKeeper: "h:p,h:p"

  static Where parse(const std::string& url) {
    Where w;
    constexpr std::string_view kCluster = "redis-cluster://", kSql = "mysql://", kPostgres = "postgresql://",
                               kZooKeeper = "zookeeper://", kEtcd = "etcd://";
    auto host_port = [&](const std::string& hp) {
      auto colon = hp.rfind(':');
      if (colon == std::string::npos) throw std::runtime_error("host:port expected in " + url);
      return std::make_pair(hp.substr(0, colon), std::atoi(hp.c_str() + colon + 1));
    };
    if (url.starts_with(kZooKeeper)) {
      // zookeeper://h:p,h:p, as scripts/soak writes it (no credentials, no chroot).
      w.kind = Kind::kZooKeeper;
      w.zk_hosts = url.substr(kZooKeeper.size());
    } else if (url.starts_with(kCluster) || url.starts_with(kEtcd)) {
      // Seeds or members, host:port each (scripts/soak writes no credentials).
      w.kind = url.starts_with(kCluster) ? Kind::kCluster : Kind::kEtcd;
      std::string rest = url.substr(url.find("://") + 3);
      for (std::size_t at = 0;;) {
        auto comma = rest.find(',', at);
        w.seeds.push_back(host_port(rest.substr(at, comma == std::string::npos ? std::string::npos : comma - at)));
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
    } else if (url.starts_with(kSql) || url.starts_with(kPostgres)) {
      // mysql:// or postgresql://user:password@host:port/database, as
      // scripts/soak writes it.
      w.kind = url.starts_with(kSql) ? Kind::kSql : Kind::kPostgres;
      std::string rest = url.substr(url.find("://") + 3);
      auto at = rest.rfind('@'), slash = rest.find('/', at);
      auto colon = rest.find(':');
      if (at == std::string::npos || slash == std::string::npos || colon > at)
        throw std::runtime_error("user:password@host:port/database expected: " + url);
      w.user = rest.substr(0, colon);
      w.password = rest.substr(colon + 1, at - colon - 1);
      std::tie(w.host, w.port) = host_port(rest.substr(at + 1, slash - at - 1));
      w.database = rest.substr(slash + 1, rest.find('?') == std::string::npos ? std::string::npos : rest.find('?') - slash - 1);
    } else {
      w.topology = lockwatch::detail::Topology::parse(url);
    }
    return w;
  }
};

// The SQL store's row for the lock whose Redis key is `redis_key`
// ("lockwatch:{K}"): key_prefix + K, "lockwatch:K".
std::string sql_lock_name(const std::string& redis_key) {
  auto open = redis_key.find('{'), close = redis_key.rfind('}');
  return "lockwatch:" + redis_key.substr(open + 1, close - open - 1);
}

// Reads lock keys straight from the lock's nodes: the fixed masters, or
// (Sentinel) the master every answering sentinel names (a majority of
// them must answer), checked with ROLE; on a Redis Cluster the node that
// serves the key's slot (following MOVED, and ASK after ASKING); on SQL the
// owner of the key's row while it has not expired. where() says which node
// that was.
class LockNodes {
 public:
  explicit LockNodes(const Where& w) : where_of_(w), master_name_(w.topology.master_name) {
    for (const auto& m : w.topology.masters) masters_.emplace_back(m.host, m.port, kProbeTimeout);
    for (const auto& s : w.topology.sentinels) sentinels_.emplace_back(s.host, s.port, kProbeTimeout);
  }
  ~LockNodes() {
#if LOCKWATCH_WITH_SQL
    if (sql_ != nullptr) mysql_close(sql_);
#endif
#if LOCKWATCH_WITH_POSTGRESQL
    if (pg_ != nullptr) PQfinish(pg_);
#endif
#if LOCKWATCH_WITH_ZOOKEEPER
    if (zh_ != nullptr) zookeeper_close(zh_);
#endif
  }
  LockNodes(const LockNodes&) = delete;
  LockNodes& operator=(const LockNodes&) = delete;

  std::size_t nodes() const { return where_of_.kind == Where::Kind::kRedis && sentinels_.empty() ? masters_.size() : 1; }
  // The longest one values() can take.
  milliseconds probe_bound() const {
    switch (where_of_.kind) {
      case Where::Kind::kCluster: return kClusterHops * 2 * kProbeTimeout;
      case Where::Kind::kSql: return 3 * kSqlTimeout;  // connect, write, read
      case Where::Kind::kPostgres: return 2 * kSqlTimeout;  // connect, query
      case Where::Kind::kZooKeeper: return 3 * kSqlTimeout;  // sync, list, read
      case Where::Kind::kEtcd: return static_cast<long>(where_of_.seeds.size()) * kEtcdTimeout;
      default: return static_cast<long>(nodes()) * 2 * kProbeTimeout;
    }
  }
  // The node values() read last ("" when it found none); "masters" with
  // fixed masters.
  const std::string& where() const { return where_; }

  // What each node holds at `key` (nullopt: the node did not answer).
  std::vector<std::optional<std::string>> values(const std::string& key) {
    if (where_of_.kind == Where::Kind::kCluster) return {cluster_value(key)};
#if LOCKWATCH_WITH_SQL
    if (where_of_.kind == Where::Kind::kSql) return {sql_value(key)};
#endif
#if LOCKWATCH_WITH_ETCD
    if (where_of_.kind == Where::Kind::kEtcd) return {etcd_value(key)};
#endif
#if LOCKWATCH_WITH_POSTGRESQL
    if (where_of_.kind == Where::Kind::kPostgres) return {pg_value(key)};
#endif
#if LOCKWATCH_WITH_ZOOKEEPER
    if (where_of_.kind == Where::Kind::kZooKeeper) return {zk_value(key)};
#endif
    std::vector<std::optional<std::string>> out;
    if (sentinels_.empty()) {
      where_ = "masters";
      for (auto& m : masters_) {
        auto r = m.run({{"GET", key}});
        // A probe connection left idle across a server restart fails its
        // next call and is remade: the read (idempotent) is asked again
        // once, so that a stale probe never reads as an empty key.
        if (r.empty()) r = m.run({{"GET", key}});
        if (r.empty() || r[0]->type == REDIS_REPLY_ERROR) out.emplace_back();
        else out.emplace_back(str_of(r[0].get()));
      }
      return out;
    }
    where_.clear();
    out.emplace_back();
    auto named = agreed_master();
    if (named.empty()) return out;
    if (!master_ || master_->host() + ":" + std::to_string(master_->port()) != named) {
      auto colon = named.rfind(':');
      master_.emplace(named.substr(0, colon), std::atoi(named.c_str() + colon + 1), kProbeTimeout);
    }
    auto r = master_->run({{"ROLE"}, {"GET", key}});
    if (!r.empty() && r[0]->type == REDIS_REPLY_ARRAY && r[0]->elements > 0 && str_of(r[0]->element[0]) == "master" &&
        r[1]->type != REDIS_REPLY_ERROR) {
      out.back() = str_of(r[1].get());
      where_ = named;
    }
    return out;
  }

 private:
  static constexpr int kClusterHops = 3;
  static constexpr auto kSqlTimeout = 1000ms;  // the client library counts in seconds
  static constexpr auto kEtcdTimeout = 500ms;    // per member (a linearizable read goes through the leader)

#if LOCKWATCH_WITH_ETCD
  // The key's value ("" when absent) from the first member that answers a
  // linearizable Range, starting with the one that answered last.
  std::optional<std::string> etcd_value(const std::string& key) {
    where_.clear();
    const std::size_t n = where_of_.seeds.size();
    if (etcd_.empty()) {
      for (const auto& [host, port] : where_of_.seeds)
        etcd_.push_back(etcdserverpb::KV::NewStub(
            grpc::CreateChannel(host + ":" + std::to_string(port), grpc::InsecureChannelCredentials())));
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t m = (etcd_last_ + i) % n;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + kEtcdTimeout);
      etcdserverpb::RangeRequest req;
      req.set_key(sql_lock_name(key));
      etcdserverpb::RangeResponse resp;
      if (!etcd_[m]->Range(&ctx, req, &resp).ok()) continue;
      etcd_last_ = m;
      where_ = "etcd";
      return resp.kvs_size() > 0 ? resp.kvs(0).value() : std::string();
    }
    return std::nullopt;
  }
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> etcd_;
  std::size_t etcd_last_ = 0;
#endif

  // The value at `key` on the master serving its slot. The first try goes
  // where the last answer came from, else to a seed.
  std::optional<std::string> cluster_value(const std::string& key) {
    where_.clear();
    std::pair<std::string, int> at = last_.second > 0 ? last_ : where_of_.seeds.front();
    bool asking = false;
    for (int hop = 0; hop < kClusterHops; ++hop) {
      Conn& c = cluster_conn(at);
      std::vector<std::vector<std::string>> cmds;
      if (asking) cmds.push_back({"ASKING"});
      cmds.push_back({"GET", key});
      auto r = c.run(cmds);
      if (r.empty()) {
        // Down (killed, or failed over): the next seed.
        last_ = {};
        at = where_of_.seeds[static_cast<std::size_t>(hop + 1) % where_of_.seeds.size()];
        asking = false;
        continue;
      }
      const redisReply* got = r.back().get();
      if (got->type != REDIS_REPLY_ERROR) {
        last_ = at;
        where_ = at.first + ":" + std::to_string(at.second);
        return str_of(got);
      }
      std::string err(got->str, got->len);
      asking = err.starts_with("ASK ");
      if (!asking && !err.starts_with("MOVED ")) return std::nullopt;  // TRYAGAIN, CLUSTERDOWN, ...
      auto hp = err.substr(err.rfind(' ') + 1);
      auto colon = hp.rfind(':');
      at = {hp.substr(0, colon), std::atoi(hp.c_str() + colon + 1)};
    }
    return std::nullopt;
  }
  Conn& cluster_conn(const std::pair<std::string, int>& at) {
    auto name = at.first + ":" + std::to_string(at.second);
    auto it = cluster_.find(name);
    if (it == cluster_.end()) it = cluster_.emplace(name, Conn(at.first, at.second, kProbeTimeout)).first;
    return it->second;
  }

#if LOCKWATCH_WITH_SQL
  std::optional<std::string> sql_value(const std::string& key) {
    where_.clear();
    if (sql_ == nullptr) {
      sql_ = mysql_init(nullptr);
      unsigned seconds = static_cast<unsigned>(kSqlTimeout.count() / 1000);
      mysql_options(sql_, MYSQL_OPT_CONNECT_TIMEOUT, &seconds);
      mysql_options(sql_, MYSQL_OPT_READ_TIMEOUT, &seconds);
      mysql_options(sql_, MYSQL_OPT_WRITE_TIMEOUT, &seconds);
      if (mysql_real_connect(sql_, where_of_.host.c_str(), where_of_.user.c_str(), where_of_.password.c_str(),
                             where_of_.database.c_str(), static_cast<unsigned>(where_of_.port), nullptr, 0) == nullptr) {
        mysql_close(sql_);
        sql_ = nullptr;
        return std::nullopt;
      }
    }
    // Judged on the database's clock, as the store does.
    std::string q = "SELECT owner FROM lockwatch_locks WHERE lock_name = '" + sql_lock_name(key) +
                    "' AND owner <> '' AND expires_at > NOW(6)";
    if (mysql_real_query(sql_, q.data(), q.size()) != 0) {
      // No table yet (no lock taken so far) is "not held"; anything else
      // is no answer, and the connection is made again next time.
      bool no_table = mysql_errno(sql_) == 1146;
      mysql_close(sql_);
      sql_ = nullptr;
      if (no_table) return std::string();
      return std::nullopt;
    }
    MYSQL_RES* res = mysql_store_result(sql_);
    if (res == nullptr) {
      mysql_close(sql_);
      sql_ = nullptr;
      return std::nullopt;
    }
    std::string owner;
    if (MYSQL_ROW row = mysql_fetch_row(res); row != nullptr && row[0] != nullptr)
      owner.assign(row[0], mysql_fetch_lengths(res)[0]);
    mysql_free_result(res);
    where_ = "sql";
    return owner;
  }
#endif

#if LOCKWATCH_WITH_POSTGRESQL
  // Waits for libpq's socket until `until` (false: timed out or failed).
  bool pg_wait(bool for_write, Clock::time_point until) {
    auto left = std::chrono::ceil<milliseconds>(until - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{PQsocket(pg_), static_cast<short>(for_write ? POLLOUT : POLLIN), 0};
    return ::poll(&p, 1, static_cast<int>(left)) == 1;
  }
  void pg_drop() {
    if (pg_ == nullptr) return;
    if (int fd = PQsocket(pg_); fd >= 0) ::shutdown(fd, SHUT_RDWR);  // a hung server is not waited on
    PQfinish(pg_);
    pg_ = nullptr;
  }
  // The owner of the key's row on the database's clock, through libpq's
  // asynchronous calls with a deadline each (a blocking query would wait
  // forever on a stopped server).
  std::optional<std::string> pg_value(const std::string& key) {
    where_.clear();
    if (pg_ == nullptr) {
      const std::string port = std::to_string(where_of_.port);
      const char* keys[] = {"hostaddr", "port", "dbname", "user", "password", "sslmode", "gssencmode", nullptr};
      const char* vals[] = {where_of_.host.c_str(), port.c_str(), where_of_.database.c_str(), where_of_.user.c_str(),
                            where_of_.password.c_str(), "disable", "disable", nullptr};
      pg_ = PQconnectStartParams(keys, vals, 0);
      if (pg_ == nullptr) return std::nullopt;
      auto until = Clock::now() + kSqlTimeout;
      PostgresPollingStatusType st = PGRES_POLLING_WRITING;
      while (st != PGRES_POLLING_OK) {
        if (st == PGRES_POLLING_FAILED || !pg_wait(st == PGRES_POLLING_WRITING, until)) {
          pg_drop();
          return std::nullopt;
        }
        st = PQconnectPoll(pg_);
      }
      PQsetnonblocking(pg_, 1);
    }
    const std::string name = sql_lock_name(key);
    const char* params[] = {name.c_str()};
    if (PQsendQueryParams(pg_,
                          "SELECT convert_from(owner, 'UTF8') FROM lockwatch_locks WHERE lock_name = "
                          "convert_to($1, 'UTF8') AND owner <> '' AND expires_at > clock_timestamp()",
                          1, nullptr, params, nullptr, nullptr, 0) != 1) {
      pg_drop();
      return std::nullopt;
    }
    auto until = Clock::now() + kSqlTimeout;
    while (PQflush(pg_) == 1)
      if (!pg_wait(true, until)) {
        pg_drop();
        return std::nullopt;
      }
    std::optional<std::string> owner;
    bool no_table = false;
    for (;;) {
      while (PQisBusy(pg_) == 1) {
        if (!pg_wait(false, until) || PQconsumeInput(pg_) == 0) {
          pg_drop();
          return std::nullopt;
        }
      }
      PGresult* r = PQgetResult(pg_);
      if (r == nullptr) break;
      if (PQresultStatus(r) == PGRES_TUPLES_OK) {
        owner = PQntuples(r) > 0 ? std::string(PQgetvalue(r, 0, 0)) : std::string();
      } else {
        const char* code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        no_table = code != nullptr && std::strcmp(code, "42P01") == 0;  // no lock taken so far
      }
      PQclear(r);
    }
    if (no_table) owner = std::string();
    if (!owner) {
      pg_drop();
      return std::nullopt;
    }
    where_ = "sql";
    return owner;
  }
#endif

#if LOCKWATCH_WITH_ZOOKEEPER
  // One answer of the client's, waited for with a deadline (the client's
  // own calls would wait on a stopped ensemble for the session timeout).
  struct ZkWait {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    int rc = 0;
    std::vector<std::string> children;
    std::string data;
  };
  static void zk_done(std::shared_ptr<ZkWait>* ctx, const std::function<void(ZkWait&)>& fill) {
    auto w = std::move(*ctx);
    delete ctx;
    std::lock_guard lk(w->mu);
    fill(*w);
    w->done = true;
    w->cv.notify_all();
  }
  bool zk_wait(ZkWait& w) {
    std::unique_lock lk(w.mu);
    return w.cv.wait_for(lk, kSqlTimeout, [&] { return w.done; });
  }
  static void zk_no_log(const char*) {}
  // The holder of the key's lock: the owner token in the lowest node of its
  // directory ("" when there is none).
  std::optional<std::string> zk_value(const std::string& key) {
    where_.clear();
    if (zh_ != nullptr && (zoo_state(zh_) == ZOO_EXPIRED_SESSION_STATE || zoo_state(zh_) == ZOO_AUTH_FAILED_STATE)) {
      zookeeper_close(zh_);
      zh_ = nullptr;
    }
    if (zh_ == nullptr) zh_ = zookeeper_init2(where_of_.zk_hosts.c_str(), nullptr, 10000, nullptr, nullptr, 0, zk_no_log);
    if (zh_ == nullptr) return std::nullopt;
    const std::string dir = lockwatch::detail::zk::dir_of(sql_lock_name(key));
    // A member may lag the leader, and a leader stopped for a while may
    // answer as one until it learns it was replaced (a sync would pass
    // there): a write first, which only the ensemble's quorum commits, so
    // that the read after it sees every write committed before.
    auto synced = std::make_shared<ZkWait>();
    if (zoo_aset(zh_, lockwatch::detail::zk::kRoot, "", 0, -1,
                 [](int rc, const Stat*, const void* d) {
                   zk_done(static_cast<std::shared_ptr<ZkWait>*>(const_cast<void*>(d)), [&](ZkWait& w) { w.rc = rc; });
                 },
                 new std::shared_ptr<ZkWait>(synced)) != ZOK ||
        !zk_wait(*synced) || (synced->rc != ZOK && synced->rc != ZNONODE))
      return std::nullopt;
    auto list = std::make_shared<ZkWait>();
    if (zoo_aget_children(zh_, dir.c_str(), 0,
                          [](int rc, const String_vector* v, const void* d) {
                            zk_done(static_cast<std::shared_ptr<ZkWait>*>(const_cast<void*>(d)), [&](ZkWait& w) {
                              w.rc = rc;
                              if (rc == ZOK && v != nullptr)
                                for (int i = 0; i < v->count; ++i) w.children.emplace_back(v->data[i]);
                            });
                          },
                          new std::shared_ptr<ZkWait>(list)) != ZOK ||
        !zk_wait(*list))
      return std::nullopt;
    if (list->rc == ZNONODE) list->children.clear();
    else if (list->rc != ZOK) return std::nullopt;
    std::string lowest;
    for (const auto& c : list->children) {
      if (c.size() < 11 || c.rfind("lock-", 0) != 0) continue;
      if (lowest.empty() || c.substr(c.size() - 10) < lowest.substr(lowest.size() - 10)) lowest = c;
    }
    where_ = "zookeeper";
    if (lowest.empty()) return std::string();
    auto get = std::make_shared<ZkWait>();
    const std::string node = dir + "/" + lowest;
    if (zoo_aget(zh_, node.c_str(), 0,
                 [](int rc, const char* value, int len, const Stat*, const void* d) {
                   zk_done(static_cast<std::shared_ptr<ZkWait>*>(const_cast<void*>(d)), [&](ZkWait& w) {
                     w.rc = rc;
                     if (rc == ZOK && value != nullptr && len > 0) w.data.assign(value, static_cast<std::size_t>(len));
                   });
                 },
                 new std::shared_ptr<ZkWait>(get)) != ZOK ||
        !zk_wait(*get)) {
      where_.clear();
      return std::nullopt;
    }
    if (get->rc == ZNONODE) return std::string();  // released meanwhile
    if (get->rc != ZOK) {
      where_.clear();
      return std::nullopt;
    }
    return get->data.substr(0, get->data.find('\n'));
  }
  zhandle_t* zh_ = nullptr;
#endif

  // "host:port" that every answering sentinel names, or "" (too few
  // answered, or they disagree: a failover is under way).
  std::string agreed_master() {
    std::string named;
    std::size_t answered = 0;
    for (auto& s : sentinels_) {
      auto r = s.run({{"SENTINEL", "get-master-addr-by-name", master_name_}});
      if (r.empty() || r[0]->type != REDIS_REPLY_ARRAY || r[0]->elements != 2) continue;
      std::string addr = str_of(r[0]->element[0]) + ":" + str_of(r[0]->element[1]);
      if (answered++ > 0 && addr != named) return "";
      named = addr;
    }
    return answered >= sentinels_.size() / 2 + 1 ? named : "";
  }

  const Where& where_of_;
  std::string master_name_;
  std::vector<Conn> masters_;
  std::vector<Conn> sentinels_;
  std::optional<Conn> master_;
  std::map<std::string, Conn> cluster_;
  std::pair<std::string, int> last_;
#if LOCKWATCH_WITH_SQL
  MYSQL* sql_ = nullptr;
#endif
#if LOCKWATCH_WITH_POSTGRESQL
  PGconn* pg_ = nullptr;
#endif
  std::string where_;
};

// ------------------------------------------------------------------- worker

struct Args {
  std::string redis;
  std::string resource_host = "127.0.0.1";
  int resource_port = 0;
  std::string id = "p0";
  std::string history;
  std::int64_t until_ns = 0;
  int threads = 3;
  int keys = 3;
  std::uint64_t seed = 1;
  int min_replicas = 0;
  bool rw = false, sem = false;  // --kinds
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "lockwatch-soak-worker: %s\nusage: lockwatch-soak-worker --redis URL --resource HOST:PORT --id NAME "
               "--history FILE --until-ns T [--threads N] [--keys N] [--seed S] [--min-replicas N] [--kinds rw,sem]\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value");
      return argv[++i];
    };
    std::string opt = argv[i];
    if (opt == "--redis") a.redis = value();
    else if (opt == "--resource") {
      std::string v = value();
      auto colon = v.rfind(':');
      if (colon == std::string::npos) usage("--resource wants HOST:PORT");
      a.resource_host = v.substr(0, colon);
      a.resource_port = std::atoi(v.c_str() + colon + 1);
    } else if (opt == "--id") a.id = value();
    else if (opt == "--history") a.history = value();
    else if (opt == "--until-ns") a.until_ns = std::atoll(value().c_str());
    else if (opt == "--threads") a.threads = std::atoi(value().c_str());
    else if (opt == "--keys") a.keys = std::atoi(value().c_str());
    else if (opt == "--seed") a.seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (opt == "--min-replicas") a.min_replicas = std::atoi(value().c_str());
    else if (opt == "--kinds") {
      const std::string v = value();
      a.rw = v.find("rw") != std::string::npos;
      a.sem = v.find("sem") != std::string::npos;
    }
    else usage("unknown option");
  }
  if (a.redis.empty() || a.resource_port <= 0 || a.history.empty() || a.until_ns <= 0) usage("missing option");
  if (a.threads <= 0 || a.keys <= 0) usage("--threads and --keys must be positive");
  return a;
}

// One locked call, planned up front (so that the work, which may run on a
// pool thread, needs no shared random generator) and filled in as it runs.
struct Op {
  std::string id;
  std::string key;
  bool handle = false;
  bool blocking = false;  // a handle's call through Runtime::lock() and LockHandle::unlock()
  int ttl_ms = 0;
  int wait_ms = 0;
  int retries = -1;  // < 0: forever
  int hold_ms = 0;   // a longer hold before the writes, so renewals happen
  std::vector<int> gaps_ms;  // per write: the sleep between read and write
  // --kinds: "reader" or "writer" on key "rw", "permit" (of kSemPermits) on
  // "sem"; empty for the counters' exclusive locks.
  std::string kind;

  std::int64_t acq_ns = 0;
  std::int64_t work_end_ns = 0;  // the work returned (the release comes after)
  // When the lease's stop token fired while the work ran (the holder was
  // told its lease was lost), 0 if it did not.
  std::atomic<std::int64_t> told_ns{0};
  std::uint64_t token = 0;
  std::string owner;
  std::string owner_node;  // where the owner was read

  // `probe`: the longest one read of the lock's owner takes (two per call).
  milliseconds bound(milliseconds probe) const {
    auto acquire = 3 * (kConnectTimeout + kCommandTimeout);
    auto work = milliseconds(hold_ms) + static_cast<long>(gaps_ms.size()) * (15ms + 2 * kResourceTimeout) + 2 * probe;
    auto release = milliseconds(ttl_ms) + kConnectTimeout + kCommandTimeout;
    return milliseconds(wait_ms) + acquire + work + release + 2s;
  }
};

std::string lock_key(const std::string& key) { return "lockwatch:{soak:" + key + "}"; }

constexpr std::uint32_t kSemPermits = 2;

lockwatch::LockKind kind_of(const std::string& kind) {
  if (kind == "reader") return lockwatch::LockKind::shared();
  if (kind == "permit") return lockwatch::LockKind::permits(kSemPermits);
  return lockwatch::LockKind::exclusive();
}

class Worker {
 public:
  Worker(const Args& args, History& history)
      : args_(args), history_(history), where_(Where::parse(args.redis)) {}

  void run(lockwatch::Runtime& rt, int thread) {
    std::mt19937_64 rng(args_.seed * 1000003u + static_cast<std::uint64_t>(thread));
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    static constexpr int kTtls[] = {200, 300, 500, 800, 1200, 2500};
    for (long n = 0; mono_ns() < args_.until_ns; ++n) {
      Op op;
      op.id = args_.id + "." + std::to_string(thread) + "." + std::to_string(n);
      op.key = "k" + std::to_string(pick(0, args_.keys - 1));
      op.handle = pick(0, 9) < 3;
      op.blocking = op.handle && pick(0, 1) == 0;
      op.ttl_ms = kTtls[pick(0, 5)];
      op.wait_ms = pick(0, 9) < 4 ? 0 : pick(50, 2000);
      op.retries = pick(0, 9) < 8 ? -1 : pick(0, 3);
      op.hold_ms = pick(0, 99) < 15 ? pick(op.ttl_ms / 2, op.ttl_ms * 2) : 0;
      if ((args_.rw || args_.sem) && pick(0, 9) < 3) {
        const bool rw = args_.rw && (!args_.sem || pick(0, 1) == 0);
        op.key = rw ? "rw" : "sem";
        op.kind = !rw ? "permit" : pick(0, 9) < 7 ? "reader" : "writer";
        op.hold_ms = pick(0, 99) < 15 ? pick(op.ttl_ms / 2, op.ttl_ms * 2) : pick(2, 40);
      } else {
        for (int w = pick(1, 3); w > 0; --w) op.gaps_ms.push_back(pick(0, 15));
      }
      std::string outcome = call(rt, op);
      // Back off a little after a refusal, so that a busy key is not hammered.
      std::this_thread::sleep_for(milliseconds(outcome == "ok" ? pick(0, 5) : pick(5, 30)));
    }
  }

 private:
  static LockNodes& nodes(const Where& t) {
    thread_local std::unique_ptr<LockNodes> n;
    if (!n) n = std::make_unique<LockNodes>(t);
    return *n;
  }
  Resource& resource() {
    thread_local std::unique_ptr<Resource> r;
    if (!r) r = std::make_unique<Resource>(args_.resource_host, args_.resource_port);
    return *r;
  }

  // The holder learns its lease is gone from the stop token or from
  // remaining(): the first time either says so is when it was told.
  static bool gone(const lockwatch::Lease& lease, Op& op) {
    const bool g = lease.stop_token().stop_requested() || lease.remaining() <= 0ms;
    std::int64_t none = 0;
    if (g) op.told_ns.compare_exchange_strong(none, mono_ns());
    return g;
  }

  // The work under the lease: read the owner, hold, then read/sleep/write.
  void work(const lockwatch::Lease& lease, Op& op) {
    op.acq_ns = mono_ns();
    struct Done {
      Op& op;
      ~Done() { op.work_end_ns = mono_ns(); }
    } done{op};
    // Runs on the thread that requests the stop: the moment the holder is told.
    std::stop_callback told(lease.stop_token(), [&op] {
      std::int64_t none = 0;
      op.told_ns.compare_exchange_strong(none, mono_ns());
    });
    op.token = lease.fencing_token();
    // A long hold (renewed on the way) is announced, so that the soak can
    // cut off or starve a process while it holds a lease.
    if (op.hold_ms >= op.ttl_ms / 2)
      history_.write(Json().s("e", "a").s("op", op.id).s("k", op.key).s("kind", op.kind).i("t", op.acq_ns));
    if (!op.kind.empty()) {  // other kinds: the time held is what is judged
      auto until = Clock::now() + milliseconds(op.hold_ms);
      while (Clock::now() < until && !gone(lease, op)) std::this_thread::sleep_for(2ms);
      return;
    }
    // The majority value is the owner (with one node: its value). Valid
    // only if the lease was still ours after the read.
    auto vals = owner_tokens(nodes(where_).values(lock_key(op.key)));
    std::map<std::string, std::size_t> votes;
    for (const auto& v : vals)
      if (v && !v->empty()) ++votes[*v];
    for (const auto& [value, count] : votes)
      if (count >= vals.size() / 2 + 1 && !gone(lease, op)) op.owner = value;
    op.owner_node = nodes(where_).where();

    auto until = Clock::now() + milliseconds(op.hold_ms);
    while (Clock::now() < until && !gone(lease, op)) std::this_thread::sleep_for(5ms);

    for (int gap : op.gaps_ms) {
      if (gone(lease, op)) return;
      std::int64_t r0 = mono_ns();
      auto rd = resource().read(op.key);
      if (!rd) {
        history_.write(Json().s("e", "w").s("op", op.id).s("k", op.key).i("tok", static_cast<long long>(op.token))
                           .i("r0", r0).s("res", "err").s("why", "read failed"));
        return;
      }
      std::this_thread::sleep_for(milliseconds(gap));  // widen the race the lock closes
      if (gone(lease, op)) return;
      // Wall clock first, remaining() second: the deadline errs early.
      std::int64_t now_us = real_us();
      std::int64_t deadline_us = now_us + lease.remaining().count() * 1000;
      std::int64_t w0 = mono_ns();
      auto wr = resource().write(op.key, op.token, rd->count + 1, op.id, rd->seq, deadline_us);
      std::int64_t w1 = mono_ns();
      history_.write(Json()
                         .s("e", "w")
                         .s("op", op.id)
                         .s("k", op.key)
                         .i("tok", static_cast<long long>(op.token))
                         .i("rseq", rd->seq)
                         .i("rval", rd->count)
                         .i("r0", r0)
                         .i("w0", w0)
                         .i("w1", w1)
                         .i("dl", deadline_us)
                         .s("res", wr.res)
                         .i("seq", wr.seq));
      if (wr.res != "ok") return;
    }
  }

  // Runs one call to its end and records it; returns the outcome.
  std::string call(lockwatch::Runtime& rt, Op& op) {
    const auto bound = op.bound(nodes(where_).probe_bound());
    const std::int64_t t0 = mono_ns();
    history_.write(Json()
                       .s("e", "b")
                       .s("op", op.id)
                       .s("k", op.key)
                       .s("api", op.blocking ? "lock" : op.handle ? "handle" : "locked")
                       .s("kind", op.kind)
                       .i("ttl", op.ttl_ms)
                       .i("wait", op.wait_ms)
                       .i("retries", op.retries)
                       .i("t", t0)
                       .i("bound", bound.count()));
    const auto hard = bound + kHangGrace;
    lockwatch::Retries retries = op.retries < 0 ? lockwatch::Retries(lockwatch::forever) : lockwatch::Retries(op.retries);
    std::string out = "ok", msg;
    try {
      if (op.handle) {
        const lockwatch::LockRequest request{.key = "soak:" + op.key,
                                             .ttl = milliseconds(op.ttl_ms),
                                             .retries = retries,
                                             .wait = milliseconds(op.wait_ms),
                                             .kind = kind_of(op.kind)};
        // The blocking pair each on a thread of its own, so that a hang is
        // still seen here.
        auto f = op.blocking ? std::async(std::launch::async, [&] { return rt.lock(request); }) : rt.acquire(request);
        if (f.wait_for(hard) != std::future_status::ready) hang(op, op.blocking ? "lock" : "acquire");
        lockwatch::LockHandle h = f.get();
        work(h.lease(), op);
        auto r = op.blocking ? std::async(std::launch::async, [&h] { h.unlock(); }) : h.release();
        if (r.wait_for(hard) != std::future_status::ready) hang(op, op.blocking ? "unlock" : "release");
        r.get();
      } else {
        auto builder = lockwatch::locked("soak:{0}", milliseconds(op.ttl_ms), retries);
        if (op.kind == "reader") builder = builder.shared();
        if (op.kind == "permit") builder = builder.permits(kSemPermits);
        auto fn = builder.on(rt)
                      .wait(milliseconds(op.wait_ms))([this, &op](const std::string&) { work(lockwatch::this_lease(), op); });
        auto f = fn(op.key);
        if (f.wait_for(hard) != std::future_status::ready) hang(op, "locked call");
        f.get();
      }
    } catch (const lockwatch::LeaseLost& e) {
      out = "lost";
      msg = e.what();
    } catch (const lockwatch::LockNotAcquired&) {
      out = "busy";
    } catch (const lockwatch::ConnectionError& e) {
      out = "conn";
      msg = e.what();
    } catch (const lockwatch::StoreRefused& e) {
      out = "redis";
      msg = e.what();
    } catch (const lockwatch::RuntimeStopped& e) {
      out = "stopped";
      msg = e.what();
    } catch (const std::exception& e) {
      out = "error";
      msg = e.what();
    }
    const std::int64_t t1 = mono_ns();
    // A release reported done must have left the owner nowhere in Redis
    // (the checker judges the counts per topology).
    int held = 0, answered = 0;
    const std::size_t total = nodes(where_).nodes();
    if (out == "ok" && !op.owner.empty()) {
      auto vals = owner_tokens(nodes(where_).values(lock_key(op.key)));
      if (nodes(where_).where() == op.owner_node) {
        for (const auto& v : vals) {
          if (!v) continue;
          ++answered;
          if (*v == op.owner) ++held;
        }
      }
    }
    history_.write(Json()
                       .s("e", "c")
                       .s("op", op.id)
                       .s("k", op.key)
                       .s("kind", op.kind)
                       .s("out", out)
                       .s("msg", msg)
                       .i("t0", t0)
                       .i("t1", t1)
                       .i("acq", op.acq_ns)
                       .i("wend", op.work_end_ns)
                       .i("told", op.told_ns.load())
                       .i("tok", static_cast<long long>(op.token))
                       .s("owner", op.owner)
                       .i("held", held)
                       .i("answered", answered)
                       .i("nodes", static_cast<long long>(total)));
    return out;
  }

  [[noreturn]] void hang(const Op& op, const char* what) {
    history_.write(Json().s("e", "hang").s("op", op.id).s("k", op.key).s("what", what).i("t", mono_ns()));
    std::fprintf(stderr, "lockwatch-soak-worker %s: %s of %s did not end; exiting\n", args_.id.c_str(), what,
                 op.id.c_str());
    std::_Exit(4);
  }

  const Args& args_;
  History& history_;
  Where where_;
};

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  // Our own probes write to lock nodes the soak kills.
  ::signal(SIGPIPE, SIG_IGN);
  try {
    History history(args.history);
    history.write(Json().s("e", "start").s("w", args.id).i("pid", ::getpid()).i("t", mono_ns()));

    // The process must end by itself: past the grace it records why not
    // and exits, whatever is stuck.
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::thread guard([&] {
      std::unique_lock<std::mutex> lk(m);
      auto until = Clock::time_point(std::chrono::nanoseconds(args.until_ns)) + kExitGrace;
      if (cv.wait_until(lk, until, [&] { return done; })) return;
      history.write(Json().s("e", "hang").s("op", args.id).s("what", "exit").i("t", mono_ns()));
      std::fprintf(stderr, "lockwatch-soak-worker %s: did not finish in time; exiting\n", args.id.c_str());
      std::_Exit(5);
    });

    lockwatch::RuntimeStats stats;
    std::int64_t stop_begin = 0;
    {
      lockwatch::Options o;
      o.redis_url = args.redis;
      o.runtime.threads = static_cast<std::size_t>(args.threads);
      o.connection.connect_timeout = kConnectTimeout;
      o.connection.command_timeout = kCommandTimeout;
      if (args.min_replicas > 0) {
        // A Redis URL's own setting, in its query (after any '@' of a password).
        const auto at = o.redis_url.rfind('@');
        const bool has_query = o.redis_url.find('?', at == std::string::npos ? 0 : at) != std::string::npos;
        o.redis_url += (has_query ? "&min_replicas=" : "?min_replicas=") + std::to_string(args.min_replicas);
      }
      lockwatch::Runtime rt(o);
      Worker worker(args, history);
      std::vector<std::thread> threads;
      for (int t = 0; t < args.threads; ++t) threads.emplace_back([&, t] { worker.run(rt, t); });
      for (auto& t : threads) t.join();
      stats = rt.stats();
      stop_begin = mono_ns();
    }  // the runtime stops here: held locks released, threads joined
    auto slack = stats.min_renewal_slack == std::chrono::microseconds::max() ? 0 : stats.min_renewal_slack.count();
    history.write(Json()
                      .s("e", "exit")
                      .s("w", args.id)
                      .i("t", mono_ns())
                      .i("stop_ns", mono_ns() - stop_begin)
                      .i("acquired", static_cast<long long>(stats.acquired))
                      .i("lost", static_cast<long long>(stats.leases_lost))
                      .i("renewals", static_cast<long long>(stats.renewals_sent))
                      .i("min_slack_us", slack));
    {
      std::lock_guard<std::mutex> g(m);
      done = true;
    }
    cv.notify_one();
    guard.join();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockwatch-soak-worker %s: %s\n", args.id.c_str(), e.what());
    return 1;
  }
}
