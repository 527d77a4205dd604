// lib/store/store_error.hpp: what a store reports when a call failed, as a
// value the runtime decides on by kind, never by its text.
//
// A failure is classified once, where the reply or the failure is read (a
// Redis error reply in the connection, a MariaDB error number in the SQL
// connection, a lost or timed-out connection where it is noticed). A
// redirect (Redis Cluster's MOVED and ASK) is parsed there too: its slot and
// target travel in the value. Users never see a StoreError: the runtime
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
    kRedirect,     // Redis Cluster: MOVED or ASK (slot, target)
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
  bool ask = false;         // kRedirect: ASK (true) or MOVED
  std::uint16_t slot = 0;   // kRedirect: the hash slot
  int target_port = 0;      // kRedirect: where to go
  std::string target_host;  // kRedirect
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

// A Redis error reply, classified: MOVED/ASK (parsed: slot and target) as
// kRedirect; TRYAGAIN, CLUSTERDOWN, LOADING, MASTERDOWN as kRetryLater;
// NOAUTH, WRONGPASS, NOPERM, and an ERR saying the user's ACL refused a
// command a script called, as kAuth; anything else kRefused. `code` is the
// reply's first word. A MOVED or ASK that cannot be parsed is kRefused.
StoreError redis_reply_error(std::string endpoint, std::string_view message);

// A MariaDB/MySQL error number, classified: 1213 (deadlock) and 1205 (lock
// wait timeout) as kRetryLater; 1045 (access denied) as kAuth; 2002, 2003,
// 2006, 2013 (no connection, gone away, lost) as kUnavailable; others
// kRefused, the number as `code`.
StoreError sql_error(std::string endpoint, unsigned number, std::string message);

}  // namespace lockwatch::detail
