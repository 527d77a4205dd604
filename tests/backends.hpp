// The lock stores the shared suites run on, each a real server the test
// starts: one Redis node (redis-server, with a password), a Redis Cluster
// (3 masters, 3 replicas, with a password), a SQL table (mariadbd) and,
// when lockwatch is built with it, a PostgreSQL table (postgres, one server
// for the whole test program), a ZooKeeper ensemble (three members, one
// for the whole program) when built with it; and the in-process store
// (memory://), a space of the test's own.
// What a test needs to look into or tamper with in a store goes through
// Backend, so the tests themselves are written once.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockwatch/options.hpp"
#include "store/memory/memory_space.hpp"
#include "store/redis/cluster_slot.hpp"
#if LOCKWATCH_WITH_SQL
#include "support/mariadb_server.hpp"
#endif
#if LOCKWATCH_WITH_POSTGRESQL
#include "support/postgres_server.hpp"
#endif
#if LOCKWATCH_WITH_ETCD
#include <cstdio>

#include <future>
#include <optional>

#include "core/loop.hpp"
#include "store/etcd/etcd_clock.hpp"
#include "store/etcd/etcd_store.hpp"
#include "support/etcd_cluster.hpp"
#endif
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#if LOCKWATCH_WITH_ZOOKEEPER
#include <gtest/gtest.h>

#include <thread>

#include "lockwatch/runtime.hpp"
#include "store/zookeeper/zk_nodes.hpp"
#include "support/zookeeper_ensemble.hpp"
#endif

namespace lockwatch::testing {

class Backend {
 public:
  virtual ~Backend() = default;
  // Whether the store is a server of its own, with what only a server
  // has: other processes as clients, credentials, an address where
  // nothing listens. (A test that needs one skips the in-process store.)
  virtual bool has_server() const { return true; }
  // Before each case on a backend kept for the suite: until the store
  // serves as at its start (a cluster shared by every backend of a kind may
  // still be electing after another case's faults).
  virtual void settle() {}
  // After a failed case: prints what the server logged, to tell its fault
  // from a client's.
  virtual void report_failure() const {}
  virtual std::string url() const = 0;
  // The same server, with a password it refuses.
  virtual std::string url_with_wrong_password() const = 0;
  // A server of this kind on a port where nothing listens.
  virtual std::string unreachable_url() const = 0;
  // The longest key this store takes (one byte more is InvalidArgument).
  virtual std::size_t longest_key(const Options& o) const = 0;
  // `n` distinct keys whose renewals this store may carry in one command.
  virtual std::vector<std::string> batchable_keys(int n) const {
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) out.push_back("batch" + std::to_string(i));
    return out;
  }
  // Whether acquiring again with the same owner token may lengthen the
  // lock's ttl (ZooKeeper's ttl is its session's timeout, fixed when the
  // lock was taken).
  virtual bool repeat_lengthens_ttl() const { return true; }
  // The shortest ttl whose renewals a loaded test machine keeps without a
  // miss. ZooKeeper's is longer: its client drops a connection silent for
  // two thirds of the session timeout (the ttl), and a lease loses every
  // renewal until it is back.
  virtual std::chrono::milliseconds steady_ttl() const { return std::chrono::milliseconds(400); }
  // How much longer than the lock's ttl a release that found no answer
  // takes to settle (ZooKeeper's waits out its session's expiry).
  virtual std::chrono::milliseconds unconfirmed_release_wait(std::chrono::milliseconds) const { return {}; }
  // Makes `owner` hold the lock of `key` for `ms`, whoever held it (an
  // intruder, or a clock gone wrong), with the default prefix.
  virtual void steal(const std::string& key, const std::string& owner, std::chrono::milliseconds ms) const = 0;
  // The store's clock, in ms since the epoch.
  virtual long long now_ms() const = 0;
  // The last period the store records as run for scheduled job `job`
  // (-1: none).
  virtual long long last_period(const std::string& job) const = 0;
  // Faults of the server that holds `key`'s lock (the only one, but in a
  // cluster): kill() crashes it (SIGKILL) and start() brings it back
  // (its data may be gone); pause() stops it answering (SIGSTOP) and
  // resume() lets it go on.
  virtual void kill(const std::string& key) = 0;
  virtual void start() = 0;
  virtual void pause(const std::string& key) = 0;
  virtual void resume() = 0;
};

class RedisBackend final : public Backend {
 public:
  RedisBackend() : server_(options()) {}
  std::string url() const override { return server_.url(); }
  std::string url_with_wrong_password() const override {
    return "redis://:wrong@127.0.0.1:" + std::to_string(server_.port());
  }
  std::string unreachable_url() const override { return "redis://127.0.0.1:" + std::to_string(free_loopback_port()); }
  std::size_t longest_key(const Options& o) const override { return o.runtime.max_key_bytes; }
  void steal(const std::string& key, const std::string& owner, std::chrono::milliseconds ms) const override {
    server_.command({"SET", "lockwatch:{" + key + "}", owner, "PX", std::to_string(ms.count())});
  }
  long long now_ms() const override {
    auto t = server_.command({"TIME"});
    return std::stoll(t.elements[0].str) * 1000 + std::stoll(t.elements[1].str) / 1000;
  }
  long long last_period(const std::string& job) const override {
    auto r = server_.command({"GET", "lockwatch:{job:" + job + "}:period"});
    return r.type == Reply::Type::kString ? std::stoll(r.str) : -1;
  }
  void kill(const std::string&) override { server_.kill(); }
  void start() override { server_.start(); }
  void pause(const std::string&) override { server_.pause(); }
  void resume() override { server_.resume(); }

 private:
  static RedisServerOptions options() {
    RedisServerOptions o;
    o.password = "right";
    return o;
  }
  RedisServer server_;
};

#if LOCKWATCH_WITH_SQL
class MariaDbBackend final : public Backend {
 public:
  std::string url() const override { return server_.url(); }
  std::string url_with_wrong_password() const override {
    return "mysql://lockwatch:wrong@127.0.0.1:" + std::to_string(server_.port()) + "/" + MariaDbServer::kDatabase;
  }
  std::string unreachable_url() const override {
    return "mysql://lockwatch:x@127.0.0.1:" + std::to_string(free_loopback_port()) + "/lockwatch_test";
  }
  std::size_t longest_key(const Options& o) const override { return 255 - o.runtime.key_prefix.size(); }
  void steal(const std::string& key, const std::string& owner, std::chrono::milliseconds ms) const override {
    server_.query(std::string("UPDATE ") + MariaDbServer::kDatabase + ".lockwatch_locks SET owner = '" + owner +
                  "', expires_at = UTC_TIMESTAMP(6) + INTERVAL " + std::to_string(ms.count() * 1000) +
                  " MICROSECOND WHERE lock_name = 'lockwatch:" + key + "'");
  }
  long long now_ms() const override {
    return static_cast<long long>(std::stod(server_.query("SELECT UNIX_TIMESTAMP(NOW(6))").at(0).at(0)) * 1000);
  }
  long long last_period(const std::string& job) const override {
    auto rows = server_.query(std::string("SELECT IFNULL(last_period, -1) FROM ") + MariaDbServer::kDatabase +
                              ".lockwatch_locks WHERE lock_name = 'lockwatch:job:" + job + "'");
    return rows.empty() ? -1 : std::stoll(rows[0][0]);
  }
  void kill(const std::string&) override { server_.kill(); }
  void start() override { server_.start(); }
  void pause(const std::string&) override { server_.pause(); }
  void resume() override { server_.resume(); }
  void report_failure() const override {
    std::fprintf(stderr, "--- mariadbd (%s), its log's end:\n%s", server_.running() ? "running" : "NOT running",
                 server_.log_tail().c_str());
  }

 private:
  MariaDbServer server_;
};
#endif

#if LOCKWATCH_WITH_POSTGRESQL
// One postgres for every case of the program (initdb costs a second): the
// cases use keys of their own, and a case that killed or paused it has
// started or resumed it before it ends.
class PostgresBackend final : public Backend {
 public:
  std::string url() const override { return server().url(); }
  std::string url_with_wrong_password() const override {
    return "postgresql://lockwatch:wrong@127.0.0.1:" + std::to_string(server().port()) + "/" +
           PostgresServer::kDatabase;
  }
  std::string unreachable_url() const override {
    return "postgresql://lockwatch:x@127.0.0.1:" + std::to_string(free_loopback_port()) + "/lockwatch_test";
  }
  std::size_t longest_key(const Options& o) const override { return 255 - o.runtime.key_prefix.size(); }
  void steal(const std::string& key, const std::string& owner, std::chrono::milliseconds ms) const override {
    server().query("UPDATE lockwatch_locks SET owner = convert_to('" + owner +
                   "', 'UTF8'), expires_at = clock_timestamp() + interval '" + std::to_string(ms.count()) +
                   " milliseconds' WHERE lock_name = convert_to('lockwatch:" + key + "', 'UTF8')");
  }
  long long now_ms() const override {
    return std::stoll(server().query("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8").at(0).at(0));
  }
  long long last_period(const std::string& job) const override {
    auto rows = server().query("SELECT coalesce(last_period, -1) FROM lockwatch_locks WHERE lock_name = "
                               "convert_to('lockwatch:job:" + job + "', 'UTF8')");
    return rows.empty() ? -1 : std::stoll(rows[0][0]);
  }
  void kill(const std::string&) override { server().kill(); }
  void start() override { server().start(); }
  void pause(const std::string&) override { server().pause(); }
  void resume() override { server().resume(); }

 private:
  static PostgresServer& server() {
    static PostgresServer shared;
    return shared;
  }
};
#endif

#if LOCKWATCH_WITH_ZOOKEEPER
// One 3-member ensemble for every case of the program (three JVMs cost
// seconds to start), with digest credentials: the first connection, made
// here, creates /lockwatch with its creator's ACL, which a wrong password
// then cannot pass. The store's faults are the ensemble's: kill() crashes
// every member (no quorum: the lock's lease can only be lost), start()
// brings them back on their data; pause() stops every member answering.
// steal() replaces the lock's nodes by an intruder's, of a session of the
// test's own, removed again after `ms`.
class ZooKeeperBackend final : public Backend {
 public:
  // Each case starts on an ensemble that commits writes.
  ZooKeeperBackend() { wait_writable(); }
  void settle() override { wait_writable(); }
  ~ZooKeeperBackend() override {
    for (auto& t : intruders_) t.join();
  }
  std::string url() const override { return "zookeeper://lockwatch:right@" + ensemble().hosts(); }
  std::string url_with_wrong_password() const override {
    return "zookeeper://lockwatch:wrong@" + ensemble().hosts();
  }
  std::string unreachable_url() const override {
    return "zookeeper://127.0.0.1:" + std::to_string(free_loopback_port());
  }
  std::size_t longest_key(const Options& o) const override { return 255 - o.runtime.key_prefix.size(); }
  bool repeat_lengthens_ttl() const override { return false; }
  // 2 s: at 1 s the client's connection timeout is 667 ms, which a loaded
  // machine under ASan missed once for 64 of 200 sessions.
  std::chrono::milliseconds steady_ttl() const override { return std::chrono::milliseconds(2000); }
  // The session's timeout (the ttl) and the drift allowance.
  std::chrono::milliseconds unconfirmed_release_wait(std::chrono::milliseconds ttl) const override {
    return ttl + ttl / 100 + std::chrono::milliseconds(2);
  }
  void steal(const std::string& key, const std::string& owner, std::chrono::milliseconds ms) const override {
    const std::string dir = dir_of("lockwatch:" + key);
    for (const auto& c : client().children(dir))
      if (c.rfind("lock-", 0) == 0) client().remove(dir + "/" + c);
    std::string made = client().create_ephemeral_sequential(
        dir + "/lock-" + detail::zk::escape(owner) + ".0-", owner + "\n" + std::to_string(ms.count()));
    intruders_.emplace_back([made, ms] {
      std::this_thread::sleep_for(ms);  // the intruder's ttl
      client().remove(made);
    });
  }
  long long now_ms() const override { return client().touch(detail::zk::kRoot); }
  long long last_period(const std::string& job) const override {
    auto v = client().get(dir_of("lockwatch:job:" + job) + "/period");
    return v ? std::stoll(*v) : -1;
  }
  void kill(const std::string&) override {
    for (int i = 0; i < ensemble().size(); ++i) ensemble().kill(i);
  }
  void start() override {
    for (int i = 0; i < ensemble().size(); ++i) ensemble().start(i);
    if (!ensemble().wait_serving()) throw std::runtime_error("the ZooKeeper ensemble did not serve again");
    wait_writable();
  }
  void pause(const std::string&) override {
    for (int i = 0; i < ensemble().size(); ++i) ensemble().pause(i);
  }
  void resume() override {
    for (int i = 0; i < ensemble().size(); ++i) ensemble().resume(i);
  }
  // Until a write commits: members answering `srvr` may still be electing
  // a leader or syncing with it (after a kill, or a pause long enough for
  // the followers to give the leader up).
  static void wait_writable() {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      try {
        ZooKeeperClient fresh(ensemble().hosts(), "lockwatch:right");
        (void)fresh.touch(detail::zk::kRoot);
        return;
      } catch (const std::exception&) {
        if (std::chrono::steady_clock::now() > until) throw;
      }
    }
  }
  static std::string dir_of(const std::string& name) { return detail::zk::dir_of(name); }
  static ZooKeeperClient& client() {
    static ZooKeeperClient* shared = new ZooKeeperClient(ensemble().hosts(), "lockwatch:right");
    return *shared;
  }
  static ZooKeeperEnsemble& ensemble() {
    static ZooKeeperEnsemble* shared = [] {
      // For the whole program: its members die with it. Its cases fault
      // every member at once, never one: the steady timing.
      auto* e = new ZooKeeperEnsemble(3, ZooKeeperEnsemble::Timing::kSteady);
      remove_at_exit(e->dir());
      ::testing::UnitTest::GetInstance()->listeners().Append(new LogsOnFailure(*e));
      Options o;
      o.redis_url = "zookeeper://lockwatch:right@" + e->hosts();
      o.runtime.threads = 1;
      Runtime rt(o);
      auto f = rt.acquire({.key = "set-up", .ttl = std::chrono::seconds(2), .retries = 0});
      auto h = f.get();
      h.release().get();
      return e;
    }();
    return *shared;
  }

 private:
  // A failed case prints what the members logged (warnings and errors,
  // with the time of day): a stall is then told from a client's fault.
  struct LogsOnFailure final : ::testing::EmptyTestEventListener {
    explicit LogsOnFailure(const ZooKeeperEnsemble& e) : ensemble(e) {}
    void OnTestEnd(const ::testing::TestInfo& info) override {
      if (info.result() == nullptr || !info.result()->Failed()) return;
      for (int i = 0; i < ensemble.size(); ++i)
        std::fprintf(stderr, "--- ZooKeeper member %d's log, its end:\n%s", i + 1, ensemble.log_tail(i).c_str());
    }
    const ZooKeeperEnsemble& ensemble;
  };
  mutable std::vector<std::thread> intruders_;
};
#endif

#if LOCKWATCH_WITH_ETCD
// One etcd cluster of three members, with authentication on, for every
// case of the program (as PostgresBackend). Its faults are the whole
// cluster's: kill() crashes every member (start() brings them back on
// their data), pause() stops every member answering. Its clock is the
// members', read as the store reads it (EtcdClock: their HTTP Date
// headers); a job's last period is its period key.
class EtcdBackend final : public Backend {
 public:
  std::string url() const override { return cluster().url(); }
  std::string url_with_wrong_password() const override {
    return std::string("etcd://") + EtcdCluster::kUser + ":wrong@" + cluster().endpoints();
  }
  std::string unreachable_url() const override { return "etcd://127.0.0.1:" + std::to_string(free_loopback_port()); }
  std::size_t longest_key(const Options& o) const override {
    return detail::EtcdStore::kMaxNameBytes - o.runtime.key_prefix.size();
  }
  EtcdBackend() { (void)clock_offset(); }
  // A keep-alive goes through the cluster's leader and its quorum: at
  // 400 ms the 50 ms a renewal has to be confirmed is less than a loaded
  // two-core machine gives three members, and under ASan so were the
  // 100 ms of a 1 s ttl (175 of 200 leases lost once).
  std::chrono::milliseconds steady_ttl() const override { return std::chrono::milliseconds(2000); }
  // The holder's lease revoked (as force_release does: a lock in etcd is
  // taken from its holder only so, and its next renewal finds it gone),
  // then the key put on a lease of the intruder's own (whole seconds,
  // rounded up).
  void steal(const std::string& key, const std::string& owner, std::chrono::milliseconds ms) const override {
    std::string held = cluster().etcdctl("get 'lockwatch:" + key + "' -w json");
    if (auto at = held.find("\"lease\":"); at != std::string::npos) {
      long long lease = std::stoll(held.substr(at + 8));
      char hex[32];
      std::snprintf(hex, sizeof hex, "%llx", lease);
      if (lease != 0) cluster().etcdctl(std::string("lease revoke ") + hex);
    }
    std::string granted = cluster().etcdctl("lease grant " + std::to_string((ms.count() + 999) / 1000));
    char id[32] = {};
    if (std::sscanf(granted.c_str(), "lease %31s granted", id) != 1)
      throw std::runtime_error("etcdctl lease grant: " + granted);
    cluster().etcdctl("put --lease=" + std::string(id) + " 'lockwatch:" + key + "' '" + owner + "'");
  }
  long long now_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               (std::chrono::system_clock::now() + clock_offset()).time_since_epoch())
        .count();
  }
  long long last_period(const std::string& job) const override {
    std::string v = cluster().etcdctl("get --print-value-only " +
                                      detail::EtcdStore::period_key("lockwatch:job:" + job));
    while (!v.empty() && (v.back() == '\n' || v.back() == '\r')) v.pop_back();
    return v.empty() ? -1 : std::stoll(v);
  }
  void kill(const std::string&) override {
    for (int i = 0; i < cluster().size(); ++i) cluster().kill(i);
  }
  void start() override { cluster().start_all(); }
  void pause(const std::string&) override {
    for (int i = 0; i < cluster().size(); ++i) cluster().pause(i);
  }
  void resume() override {
    for (int i = 0; i < cluster().size(); ++i) cluster().resume(i);
  }

 private:
  static EtcdCluster& cluster() {
    static EtcdCluster shared(EtcdClusterOptions{.members = 3, .auth = true});
    return shared;
  }
  // The members' clock minus ours, measured once per program (a
  // measurement takes up to a second and a fifth, too long to make while
  // a test counts periods).
  static std::chrono::milliseconds clock_offset() {
    static const std::chrono::milliseconds offset = [] {
      detail::Loop loop;
      Options o;
      o.connection.connect_timeout = std::chrono::seconds(2);
      o.connection.command_timeout = std::chrono::seconds(1);
      auto clock = std::make_unique<detail::EtcdClock>(loop, detail::EtcdTarget::parse(cluster().url()),
                                                       detail::StoreSettings::of(o));
      std::promise<std::optional<std::chrono::milliseconds>> p;
      auto f = p.get_future();
      loop.post([&] {
        clock->now([&p](std::chrono::system_clock::time_point t, const detail::StoreError* e) {
          if (e) p.set_value(std::nullopt);
          else
            p.set_value(std::chrono::duration_cast<std::chrono::milliseconds>(t - std::chrono::system_clock::now()));
        });
      });
      auto got = f.wait_for(std::chrono::seconds(10)) == std::future_status::ready ? f.get() : std::nullopt;
      loop.shutdown([&] { clock->close(); });
      if (!got) throw std::runtime_error("the etcd members' clock could not be read");
      return *got;
    }();
    return offset;
  }
};
#endif

// The key's server in a cluster is its slot's master. kill() takes its
// replicas down with it, so that no failover can keep the lock: the
// slot is gone, as one server would be. pause() stops the master alone;
// a pause shorter than the node timeout (1 s) starts no failover.
class ClusterBackend final : public Backend {
 public:
  ClusterBackend() : cluster_(options()) {}
  std::string url() const override { return cluster_.url(); }
  std::string url_with_wrong_password() const override {
    return "redis-cluster://:wrong@127.0.0.1:" + std::to_string(cluster_.node(0).port());
  }
  std::string unreachable_url() const override {
    return "redis-cluster://127.0.0.1:" + std::to_string(free_loopback_port());
  }
  std::size_t longest_key(const Options& o) const override { return o.runtime.max_key_bytes; }
  // A script's keys must share one slot (CROSSSLOT otherwise): keys of one
  // slot. A key is its own hash tag in the lock's name, so its slot is the
  // slot of the key.
  std::vector<std::string> batchable_keys(int n) const override {
    std::vector<std::string> out;
    const std::uint16_t slot = detail::key_slot("batch0");
    for (int i = 0; static_cast<int>(out.size()) < n; ++i) {
      std::string key = "batch" + std::to_string(i);
      if (detail::key_slot(key) == slot) out.push_back(std::move(key));
    }
    return out;
  }
  void steal(const std::string& key, const std::string& owner, std::chrono::milliseconds ms) const override {
    const std::string lock = "lockwatch:{" + key + "}";
    cluster_.command_for(lock, {"SET", lock, owner, "PX", std::to_string(ms.count())});
  }
  long long now_ms() const override {
    auto t = cluster_.node(cluster_.masters().at(0)).command({"TIME"});
    return std::stoll(t.elements[0].str) * 1000 + std::stoll(t.elements[1].str) / 1000;
  }
  long long last_period(const std::string& job) const override {
    const std::string key = "lockwatch:{job:" + job + "}:period";
    auto r = cluster_.command_for(key, {"GET", key});
    return r.type == Reply::Type::kString ? std::stoll(r.str) : -1;
  }
  void kill(const std::string& key) override {
    const int master = master_of(key);
    down_ = cluster_.replicas_of(master);
    down_.push_back(master);
    for (int n : down_) cluster_.node(n).kill();
  }
  // Once both are back, the shard serves its slots again (empty).
  void start() override {
    for (int n : down_) cluster_.node(n).start();
    down_.clear();
    std::string wrong = cluster_.wait_healthy(std::chrono::seconds(30));
    if (!wrong.empty()) throw std::runtime_error("the cluster did not recover: " + wrong);
  }
  void pause(const std::string& key) override {
    paused_ = master_of(key);
    cluster_.node(paused_).pause();
  }
  void resume() override {
    if (paused_ >= 0) cluster_.node(paused_).resume();
    paused_ = -1;
  }

 private:
  static RedisClusterOptions options() {
    RedisClusterOptions o;
    o.password = "right";
    return o;
  }
  int master_of(const std::string& key) const {
    auto slot = cluster_.node(cluster_.masters().at(0)).command({"CLUSTER", "KEYSLOT", "lockwatch:{" + key + "}"});
    int m = cluster_.master_of_slot(static_cast<int>(slot.integer));
    if (m < 0) throw std::runtime_error("no master serves the slot of " + key);
    return m;
  }
  RedisCluster cluster_;
  std::vector<int> down_;
  int paused_ = -1;
};

// memory://: a space of its own per test, held by the backend as a
// server outlives its clients. The faults are the space's: kill() loses
// every lock, counter and period (a server restarted empty; start() has
// nothing to do), pause() holds every request until resume() runs them
// in order (clients time out meanwhile, as with a hung server).
class EmbeddedBackend final : public Backend {
 public:
  EmbeddedBackend() : space_(detail::MemorySpace::open(next_name())) {}
  bool has_server() const override { return false; }
  std::string url() const override { return "memory://" + space_->name(); }
  std::string url_with_wrong_password() const override { return url(); }
  std::string unreachable_url() const override { return url(); }
  std::size_t longest_key(const Options& o) const override { return o.runtime.max_key_bytes; }
  void steal(const std::string& key, const std::string& owner, std::chrono::milliseconds ms) const override {
    space_->steal("lockwatch:" + key, owner, ms);
  }
  long long now_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  long long last_period(const std::string& job) const override {
    return space_->last_period("lockwatch:job:" + job).value_or(-1);
  }
  void kill(const std::string&) override { space_->clear(); }
  void start() override {}
  void pause(const std::string&) override { space_->pause(); }
  void resume() override { space_->resume(); }

 private:
  static std::string next_name() {
    static std::atomic<int> n{0};
    return "backend-" + std::to_string(n.fetch_add(1));
  }
  std::shared_ptr<detail::MemorySpace> space_;
};

// "redis", "redis-cluster", "mysql", "postgresql", "zookeeper", "etcd" or "memory".
inline std::unique_ptr<Backend> make_backend(const std::string& kind) {
  if (kind == "redis") return std::make_unique<RedisBackend>();
  if (kind == "redis-cluster") return std::make_unique<ClusterBackend>();
  if (kind == "memory") return std::make_unique<EmbeddedBackend>();
#if LOCKWATCH_WITH_POSTGRESQL
  if (kind == "postgresql") return std::make_unique<PostgresBackend>();
#endif
#if LOCKWATCH_WITH_ZOOKEEPER
  if (kind == "zookeeper") return std::make_unique<ZooKeeperBackend>();
#endif
#if LOCKWATCH_WITH_ETCD
  if (kind == "etcd") return std::make_unique<EtcdBackend>();
#endif
#if LOCKWATCH_WITH_SQL
  if (kind == "mysql") return std::make_unique<MariaDbBackend>();
#endif
  throw std::invalid_argument("no backend " + kind);
}

// Every kind this build has (mysql, postgresql, zookeeper and etcd with their Meson features).
inline std::vector<std::string> backend_kinds() {
  std::vector<std::string> kinds{"redis", "redis-cluster"};
#if LOCKWATCH_WITH_SQL
  kinds.push_back("mysql");
#endif
#if LOCKWATCH_WITH_POSTGRESQL
  kinds.push_back("postgresql");
#endif
#if LOCKWATCH_WITH_ZOOKEEPER
  kinds.push_back("zookeeper");
#endif
#if LOCKWATCH_WITH_ETCD
  kinds.push_back("etcd");
#endif
  kinds.push_back("memory");
  return kinds;
}

// Those of them that run scheduled jobs (JobClaims): all of them.
inline std::vector<std::string> job_backend_kinds() { return backend_kinds(); }

}  // namespace lockwatch::testing
