// The lock stores the shared suites run on, each a real server the test
// starts: one Redis node (redis-server, with a password) and a SQL table
// (mariadbd). What a test needs to look into or tamper with in a store
// goes through Backend, so the tests themselves are written once.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "lockwatch/options.hpp"
#include "support/mariadb_server.hpp"
#include "support/redis_server.hpp"

namespace lockwatch::testing {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string url() const = 0;
  // The same server, with a password it refuses.
  virtual std::string url_with_wrong_password() const = 0;
  // A server of this kind on a port where nothing listens.
  virtual std::string unreachable_url() const = 0;
  // The longest key this store takes (one byte more is InvalidArgument).
  virtual std::size_t longest_key(const Options& o) const = 0;
  // Makes `owner` hold the lock of `key` for `ms`, whoever held it (an
  // intruder, or a clock gone wrong), with the default prefix.
  virtual void steal(const std::string& key, const std::string& owner, std::chrono::milliseconds ms) const = 0;
  // The store's clock, in ms since the epoch.
  virtual long long now_ms() const = 0;
  // The last period the store records as run for scheduled job `job`
  // (-1: none).
  virtual long long last_period(const std::string& job) const = 0;
  virtual void kill() = 0;
  virtual void start() = 0;
  virtual void pause() = 0;
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
  std::size_t longest_key(const Options& o) const override { return o.max_key_bytes; }
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
  void kill() override { server_.kill(); }
  void start() override { server_.start(); }
  void pause() override { server_.pause(); }
  void resume() override { server_.resume(); }

 private:
  static RedisServerOptions options() {
    RedisServerOptions o;
    o.password = "right";
    return o;
  }
  RedisServer server_;
};

class MariaDbBackend final : public Backend {
 public:
  std::string url() const override { return server_.url(); }
  std::string url_with_wrong_password() const override {
    return "mysql://lockwatch:wrong@127.0.0.1:" + std::to_string(server_.port()) + "/" + MariaDbServer::kDatabase;
  }
  std::string unreachable_url() const override {
    return "mysql://lockwatch:x@127.0.0.1:" + std::to_string(free_loopback_port()) + "/lockwatch_test";
  }
  std::size_t longest_key(const Options& o) const override { return 255 - o.key_prefix.size(); }
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
  void kill() override { server_.kill(); }
  void start() override { server_.start(); }
  void pause() override { server_.pause(); }
  void resume() override { server_.resume(); }

 private:
  MariaDbServer server_;
};

// "redis" or "mysql".
inline std::unique_ptr<Backend> make_backend(const std::string& kind) {
  if (kind == "redis") return std::make_unique<RedisBackend>();
  return std::make_unique<MariaDbBackend>();
}

}  // namespace lockwatch::testing
