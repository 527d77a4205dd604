/// @file
/// lockwatch/errors.hpp: the typed errors lockwatch reports.
///
/// Every error a caller can see derives from lockwatch::Error, so one catch
/// takes them all; the concrete types say what happened and carry the facts
/// (key, node, how long was waited). They reach callers through the futures
/// that decorated calls return, or are thrown synchronously by constructors
/// and argument checks. Nothing in lockwatch throws from a destructor.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <string_view>

/// Distributed locks with a watchdog: every public name of lockwatch.
namespace lockwatch {

/// Base of every lockwatch error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller passed something lockwatch cannot use: an empty or oversized key,
/// a ttl that is not positive or too short for the wheel's tick, a renewal
/// weight outside (0, 1), a negative retry count, a malformed URL, a key
/// pattern that is malformed or refers to an argument that is missing or
/// cannot be a key part, permits(0); a lock asked for as another kind than
/// the key is held as now, or as a semaphore of another n than its holders'
/// (lock_kind.hpp, through the call's future); a locked call inside one
/// holding its key in a way that does not cover it (a writer in a reader).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// The store the runtime uses cannot do what was asked, or cannot give it
/// its guarantee (a build without the feature a URL needs, an operators'
/// call on a store without it, a kind of lock the store cannot hold
/// safely). `what()` names the store and the missing part; nothing was done.
class Unsupported : public Error {
 public:
  using Error::Error;
};

/// The lock was held by someone else and did not become free within the wait
/// the call allowed (zero unless `.wait()` was used).
class LockNotAcquired : public Error {
 public:
  /// Made by the runtime: `key` as the caller built it, `waited` how long the call waited.
  LockNotAcquired(std::string key, std::chrono::milliseconds waited);
  /// As above, for a wait that ended for another reason than an owner seen
  /// holding the lock: `why` says what kept it (it ends the message).
  LockNotAcquired(std::string key, std::chrono::milliseconds waited, std::string_view why);
  /// The key as the caller built it.
  const std::string& key() const noexcept { return key_; }
  /// How long the call waited for the lock.
  std::chrono::milliseconds waited() const noexcept { return waited_; }

 private:
  std::string key_;
  std::chrono::milliseconds waited_;
};

/// Why a lease stopped being ours while the work still ran.
enum class LostReason {
  kExpired,            ///< the key was gone when the watchdog renewed it
  kTakenByOther,       ///< the key held another owner's token
  kRenewalsExhausted,  ///< the `retries` renewals were spent and the ttl ran out
  kRedisUnreachable,   ///< no renewal was confirmed before the local deadline
  kRuntimeStopped,     ///< the runtime was destroyed while the work ran (or the handle held it)
  kNotStarted,         ///< granted, but no pool worker was free within Options::queue_timeout
};
/// The reason in words, for messages and logs ("the key expired", ...).
const char* to_string(LostReason reason) noexcept;

/// The lease was lost while the work ran: the work was asked to stop through
/// its stop_token, and its result (or exception) is discarded in favour of
/// this error, because another holder may have run at the same time.
class LeaseLost : public Error {
 public:
  /// Made by the runtime; `detail` says more of the reason (the store's answer, the node).
  LeaseLost(std::string key, LostReason reason, std::string detail = {});
  /// The key as the caller built it.
  const std::string& key() const noexcept { return key_; }
  /// Why the lease was lost.
  LostReason reason() const noexcept { return reason_; }

 private:
  std::string key_;
  LostReason reason_;
};

/// Redis could not be reached: refused, reset, timed out, or the connection
/// broke with the request in flight. `endpoint()` names the node.
class ConnectionError : public Error {
 public:
  /// `endpoint` names the node ("host:port"); `what` is the message.
  ConnectionError(std::string endpoint, const std::string& what);
  /// The node that could not be reached ("host:port"; the seeds or nodes named, for a store of
  /// several).
  const std::string& endpoint() const noexcept { return endpoint_; }

 private:
  std::string endpoint_;
};

/// The runtime could not serve its metrics where Options::metrics_listen
/// says: the port is taken, the address is not one of this host's, or the
/// port needs privileges. Thrown by the Runtime constructor; `address()` is
/// Options::metrics_listen. Not a ConnectionError: the store is not involved.
class ListenError : public Error {
 public:
  /// `address` is Options::metrics_listen; `why` the reason.
  ListenError(std::string address, const std::string& why);
  /// Where the runtime was to listen (Options::metrics_listen).
  const std::string& address() const noexcept { return address_; }

 private:
  std::string address_;
};

/// Redis refused the credentials (AUTH answered an error).
class AuthError : public ConnectionError {
 public:
  /// `endpoint` names the node that refused the credentials.
  using ConnectionError::ConnectionError;
};

/// Redis answered a command with an error: WRONGTYPE on a key lockwatch uses,
/// OOM, a script error. `redis_message()` is Redis's own text.
class RedisError : public Error {
 public:
  /// `endpoint` names the node; `redis_message` is its error reply.
  RedisError(std::string endpoint, std::string redis_message);
  /// The node that answered ("host:port").
  const std::string& endpoint() const noexcept { return endpoint_; }
  /// Redis's own error text (e.g. "WRONGTYPE ...").
  const std::string& redis_message() const noexcept { return redis_message_; }

 private:
  std::string endpoint_;
  std::string redis_message_;
};

/// A SQL lock store (mysql://, postgresql://) answered a statement with an
/// error: a lock name too long for its column, a table with the wrong
/// columns, a refused privilege. `code()` is MariaDB's error number (e.g.
/// 1406; 0 from PostgreSQL), `sqlstate()` PostgreSQL's SQLSTATE (e.g.
/// "22001"; empty from MariaDB), and `server_message()` the server's text.
class SqlError : public Error {
 public:
  /// An error of MariaDB: its error number `code`.
  SqlError(std::string endpoint, unsigned code, std::string server_message);
  /// An error of PostgreSQL: its `sqlstate`.
  SqlError(std::string endpoint, std::string sqlstate, std::string server_message);
  /// The database server ("host:port/database").
  const std::string& endpoint() const noexcept { return endpoint_; }
  /// MariaDB's error number; 0 from PostgreSQL.
  unsigned code() const noexcept { return code_; }
  /// PostgreSQL's SQLSTATE; empty from MariaDB.
  const std::string& sqlstate() const noexcept { return sqlstate_; }
  /// The server's own error text.
  const std::string& server_message() const noexcept { return server_message_; }

 private:
  std::string endpoint_;
  unsigned code_ = 0;
  std::string sqlstate_;
  std::string server_message_;
};

/// A ZooKeeper ensemble (zookeeper://) answered a request with an error
/// that is neither a lost connection nor refused credentials: a node name
/// or a chroot it refuses, say. `code()` is ZooKeeper's return code (e.g.
/// -8, ZBADARGUMENTS), `server_message()` the client library's text for it.
class ZooKeeperError : public Error {
 public:
  /// An error `endpoint` answered with ZooKeeper's return `code`.
  ZooKeeperError(std::string endpoint, int code, std::string server_message);
  /// The ensemble, as the URL named it (never a password).
  const std::string& endpoint() const noexcept { return endpoint_; }
  /// ZooKeeper's return code (negative; ZBADARGUMENTS is -8).
  int code() const noexcept { return code_; }
  /// The client library's text for the code.
  const std::string& server_message() const noexcept { return server_message_; }

 private:
  std::string endpoint_;
  int code_ = 0;
  std::string server_message_;
};

/// An etcd cluster (etcd://, etcds://) answered a call with an error other
/// than a lost connection or refused credentials: a request etcd refuses
/// (too large, too many operations), a failed precondition. `code()` is the
/// gRPC status code's name (e.g. "INVALID_ARGUMENT"), `server_message()`
/// etcd's text.
class EtcdError : public Error {
 public:
  /// An error `endpoint` answered with the gRPC status `code`.
  EtcdError(std::string endpoint, std::string code, std::string server_message);
  /// The cluster, as the URL named it (never a password).
  const std::string& endpoint() const noexcept { return endpoint_; }
  /// The gRPC status code's name, e.g. "INVALID_ARGUMENT".
  const std::string& code() const noexcept { return code_; }
  /// etcd's text for the error.
  const std::string& server_message() const noexcept { return server_message_; }

 private:
  std::string endpoint_;
  std::string code_;
  std::string server_message_;
};

/// The runtime was stopped (or is stopping) before the request could run.
class RuntimeStopped : public Error {
 public:
  using Error::Error;
};

/// An asynchronous acquisition was cancelled before it completed
/// (AcquireTicket::cancel(), an Asio cancellation slot, a LeaseWatch): the
/// handler gets this instead of a lock, and no lock is left held for it.
class Cancelled : public Error {
 public:
  /// `key` is the key of the cancelled acquisition.
  explicit Cancelled(std::string key);
  /// The key of the cancelled acquisition.
  const std::string& key() const noexcept { return key_; }

 private:
  std::string key_;
};

/// `this_lease()` was called outside a locked call.
class NoActiveLease : public Error {
 public:
  using Error::Error;
};

}  // namespace lockwatch
