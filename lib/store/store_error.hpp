// lib/store/store_error.hpp: what a store reports when a call failed, as a
// value the runtime decides on by kind, never by its text.
//
// A failure is classified once, where the reply or the failure is read (a
// Redis error reply in the connection, a MariaDB error number in the SQL
// connection, a lost or timed-out connection where it is noticed), by the
// backend's own classifier (store/redis/redis_error.hpp,
// store/sql/sql_error.hpp, store/postgresql/pg_error.hpp). A redirect
// (Redis Cluster's MOVED and ASK) is a kind here; where it sends the call
// is the Redis stores' business (cluster_redirect()). Users never see a StoreError: the runtime
// maps it to the public exceptions in one place (runtime/store_errors.hpp).
//
// Threading: a plain value. Costs: nothing on a success path (callbacks
// take a pointer, null on success, or hold an empty one whose strings do
// not allocate); a failure costs its strings.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lockwatch::detail {

struct StoreError {
  enum class Kind : std::uint8_t {
    kUnavailable,  // no answer could be had: connect, reset, timeout, closed, no node for the slot
    kAuth,         // the credentials were refused, or a command by the user's ACL (NOPERM)
    kRefused,      // the server answered the command with an error
    kRedirect,     // Redis Cluster: MOVED or ASK (store/redis/redis_error.hpp reads where to)
    kRetryLater,   // "not now": TRYAGAIN, CLUSTERDOWN, LOADING, MASTERDOWN; a deadlock, a lock wait timeout
    kInvalid,      // the request cannot be made (bad input)
  };
  // Which kind of server answered: the public error it becomes depends on
  // it (RedisError, SqlError, ZooKeeperError or EtcdError; a MariaDB error
  // number, a PostgreSQL SQLSTATE, a ZooKeeper return code or a gRPC status
  // code's name).
  enum class Origin : std::uint8_t { kRedis, kSql, kPostgres, kZooKeeper, kEtcd };

  Kind kind = Kind::kUnavailable;
  Origin origin = Origin::kRedis;
  std::string endpoint;     // the server ("host:port", "mysql://host:port/db", "quorum")
  std::string code;         // the server's code: Redis's first word ("WRONGTYPE"), MariaDB's number ("1406"),
                            // PostgreSQL's SQLSTATE ("22001"), ZooKeeper's return code ("-110"); may be empty
  std::string message;      // the server's own text (Redis: its whole error line) or why no answer could be had

  // The text users have always read for it (what() of the public error it
  // maps to): "redis h:p answered an error: ...", "redis h:p: connection
  // lost: ...", "mysql://h:p/db answered error 1406: ...".
  std::string describe() const;

  bool unavailable() const noexcept { return kind == Kind::kUnavailable; }
  // Redis's ACL refused a command (NOPERM, or a script's command refused),
  // as opposed to refused credentials.
  bool acl_refusal() const noexcept {
    return kind == Kind::kAuth && origin == Origin::kRedis && (code == "NOPERM" || code == "ERR");
  }
  bool redirect() const noexcept { return kind == Kind::kRedirect; }
  // What a waiter rides out, keeping its place until its wait runs out.
  bool transient() const noexcept { return kind == Kind::kUnavailable || kind == Kind::kRetryLater; }

  static StoreError unavailable(std::string endpoint, std::string why, Origin origin = Origin::kRedis);
  static StoreError auth(std::string endpoint, std::string why, Origin origin = Origin::kRedis);
  // A reply the protocol did not expect (e.g. a script answering a wrong
  // shape): refused, with no server code.
  static StoreError refused(std::string endpoint, std::string message, Origin origin = Origin::kRedis);
  static StoreError invalid(std::string endpoint, std::string why, Origin origin = Origin::kRedis);
};

}  // namespace lockwatch::detail
