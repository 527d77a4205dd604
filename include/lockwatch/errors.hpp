/// @file
/// lockwatch/errors.hpp: the typed errors lockwatch reports.
///
/// Every error a caller can see derives from lockwatch::Error, so one catch
/// takes them all; there is one concrete type per kind of failure (per
/// lockwatch::errc value), whatever the store, and it carries the facts
/// (key, node, how long was waited, the store's own code). They reach callers through the futures
/// that decorated calls return, or are thrown synchronously by constructors
/// and argument checks. Nothing in lockwatch throws from a destructor.
#pragma once

#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

/// Distributed locks with a watchdog: every public name of lockwatch.
namespace lockwatch {

/// What went wrong, as a `std::error_code` of lockwatch's category
/// (error_category()). The asynchronous forms (Runtime::async_acquire,
/// LockHandle::release with a handler, lockwatch/asio.hpp's operations)
/// complete with one; the future and `LOCKED` forms throw the exception
/// type named here, whose code() is the same value. Compared by value,
/// never by message: `if (ec == lockwatch::errc::busy)`.
enum class errc {
  busy = 1,             ///< LockNotAcquired: held by another owner past the wait
  lease_lost,           ///< LeaseLost: the lease could not be kept
  unreachable,          ///< ConnectionError: the store could not be reached
  refused_credentials,  ///< AuthError: the store refused the credentials
  invalid_argument,     ///< InvalidArgument: the request cannot be used
  unsupported,          ///< Unsupported: the store cannot do it with its guarantee
  cancelled,            ///< Cancelled: the caller cancelled it
  runtime_stopped,      ///< RuntimeStopped: the runtime stopped first
  store_refused,        ///< StoreRefused: the store answered an error
  no_active_lease,      ///< NoActiveLease: this_lease() outside a locked call
  listen_failed,        ///< ListenError: the metrics endpoint could not listen
};

}  // namespace lockwatch

// lockwatch::errc is an error code enum: it converts to std::error_code.
/// @cond
template <>
struct std::is_error_code_enum<lockwatch::errc> : std::true_type {};
/// @endcond

namespace lockwatch {

/// lockwatch's error category: its name() is "lockwatch", its message()
/// the errc's meaning in words.
const std::error_category& error_category() noexcept;
/// The error code of `e` (found by argument-dependent lookup, so an errc
/// converts to std::error_code implicitly).
inline std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), error_category()}; }

/// Base of every lockwatch error; code() says which kind it is.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  /// The kind of failure as an error code of lockwatch's category.
  virtual std::error_code code() const noexcept = 0;
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
  /// errc::invalid_argument.
  std::error_code code() const noexcept override { return errc::invalid_argument; }
  using Error::Error;
};

/// The store the runtime uses cannot do what was asked, or cannot give it
/// its guarantee (a build without the feature a URL needs, an operators'
/// call on a store without it, a kind of lock the store cannot hold
/// safely). `what()` names the store and the missing part; nothing was done.
class Unsupported : public Error {
 public:
  /// errc::unsupported.
  std::error_code code() const noexcept override { return errc::unsupported; }
  using Error::Error;
};

/// The lock was held by someone else and did not become free within the wait
/// the call allowed (zero unless `.wait()` was used).
class LockNotAcquired : public Error {
 public:
  /// errc::busy.
  std::error_code code() const noexcept override { return errc::busy; }
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
  kExpired,            ///< the key was gone when the watchdog renewed it, after its ttl could have run out
  kTakenByOther,       ///< the key held another owner's token
  kRenewalsExhausted,  ///< the `retries` renewals were spent and the ttl ran out
  kStoreUnreachable,   ///< no renewal was confirmed before the local deadline (the store could not be reached in time)
  kRuntimeStopped,     ///< the runtime was destroyed while the work ran (or the handle held it)
  kNotStarted,         ///< granted, but no pool worker was free within Options::runtime.queue_timeout
  /// The key was gone before its ttl could have run out: removed by an
  /// operator (`lockwatch release --force`, Runtime::force_release), a
  /// delete by hand, or a failover that lost it.
  kRemoved,
  /// The former name of kStoreUnreachable, which every store reports.
  kRedisUnreachable [[deprecated("use LostReason::kStoreUnreachable")]] = kStoreUnreachable,
};
/// The reason in words, for messages and logs ("the key expired", ...).
const char* to_string(LostReason reason) noexcept;

/// The lease was lost while the work ran: the work was asked to stop through
/// its stop_token, and its result (or exception) is discarded in favour of
/// this error, because another holder may have run at the same time.
class LeaseLost : public Error {
 public:
  /// errc::lease_lost.
  std::error_code code() const noexcept override { return errc::lease_lost; }
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

/// The store could not be reached: refused, reset, timed out, or the
/// connection broke with the request in flight. `endpoint()` names the
/// server; `backend_code()` is the store's own code for it when one was
/// given (a MariaDB client error number, a ZooKeeper return code, a gRPC
/// status from etcd), empty otherwise.
class ConnectionError : public Error {
 public:
  /// errc::unreachable.
  std::error_code code() const noexcept override { return errc::unreachable; }
  /// `endpoint` names the server ("host:port" for Redis, else the URL
  /// without credentials); `what` is the message; `backend_code` the
  /// store's own code, if any.
  ConnectionError(std::string endpoint, const std::string& what, std::error_code backend_code = {});
  /// The server that could not be reached ("host:port"; the seeds or nodes named, for a store of
  /// several).
  const std::string& endpoint() const noexcept { return endpoint_; }
  /// The store's own code for the failure, of its backend's category
  /// ("lockwatch.mariadb", "lockwatch.postgresql", "lockwatch.zookeeper",
  /// "lockwatch.etcd", "lockwatch.redis"); empty when the store gave none.
  std::error_code backend_code() const noexcept { return backend_code_; }

 private:
  std::string endpoint_;
  std::error_code backend_code_;
};

/// The runtime could not serve its metrics where Options::observability.metrics_listen
/// says: the port is taken, the address is not one of this host's, or the
/// port needs privileges. Thrown by the Runtime constructor; `address()` is
/// Options::observability.metrics_listen. Not a ConnectionError: the store is not involved.
class ListenError : public Error {
 public:
  /// errc::listen_failed.
  std::error_code code() const noexcept override { return errc::listen_failed; }
  /// `address` is Options::observability.metrics_listen; `why` the reason.
  ListenError(std::string address, const std::string& why);
  /// Where the runtime was to listen (Options::observability.metrics_listen).
  const std::string& address() const noexcept { return address_; }

 private:
  std::string address_;
};

/// The store refused the credentials (Redis's AUTH answered an error, a
/// database refused the login, ...); backend_code() is the store's code for
/// the refusal when it gave one (WRONGPASS, MariaDB's 1045, SQLSTATE 28P01...).
class AuthError : public ConnectionError {
 public:
  /// errc::refused_credentials.
  std::error_code code() const noexcept override { return errc::refused_credentials; }
  /// `endpoint` names the node that refused the credentials.
  using ConnectionError::ConnectionError;
};

/// The store answered a request with an error that is neither a lost
/// connection nor refused credentials: a lockwatch key of the wrong type
/// or OOM in Redis, a lock name too long for its column in MariaDB or
/// PostgreSQL, a node name ZooKeeper refuses, a request too large for etcd.
/// One class for every store: backend_code() is the store's own code, of
/// its backend's category, compared by value
/// (`e.backend_code().category().name()` says which store).
///
/// | store      | category               | value                           | message()            |
/// |------------|------------------------|---------------------------------|----------------------|
/// | Redis      | "lockwatch.redis"      | the error reply's first word    | "WRONGTYPE", ...     |
/// | MariaDB    | "lockwatch.mariadb"    | the error number (1406)         | "ER_DATA_TOO_LONG (1406)" |
/// | PostgreSQL | "lockwatch.postgresql" | the SQLSTATE, packed            | "22001"              |
/// | ZooKeeper  | "lockwatch.zookeeper"  | the return code (-8)            | the client's text    |
/// | etcd       | "lockwatch.etcd"       | the gRPC status code (3)        | "INVALID_ARGUMENT"   |
///
/// backend_code() is empty when the answer carried no code (a reply of a
/// shape the protocol did not expect).
class StoreRefused : public Error {
 public:
  /// errc::store_refused.
  std::error_code code() const noexcept override { return errc::store_refused; }
  /// `endpoint` names the server, `backend_code` is its code for the error,
  /// `server_message` its text; `what` is the whole message.
  StoreRefused(std::string endpoint, std::error_code backend_code, std::string server_message, const std::string& what);
  /// The server that answered ("host:port" for Redis, else the URL without credentials).
  const std::string& endpoint() const noexcept { return endpoint_; }
  /// The store's own code for the error (see the table above).
  std::error_code backend_code() const noexcept { return backend_code_; }
  /// The server's own text (Redis: its whole error reply, e.g. "WRONGTYPE ...").
  const std::string& server_message() const noexcept { return server_message_; }

 private:
  std::string endpoint_;
  std::error_code backend_code_;
  std::string server_message_;
};

/// The runtime was stopped (or is stopping) before the request could run.
class RuntimeStopped : public Error {
 public:
  /// errc::runtime_stopped.
  std::error_code code() const noexcept override { return errc::runtime_stopped; }
  using Error::Error;
};

/// An asynchronous acquisition was cancelled before it completed
/// (AcquireTicket::cancel(), an Asio cancellation slot, a LeaseWatch): the
/// handler gets this instead of a lock, and no lock is left held for it.
class Cancelled : public Error {
 public:
  /// errc::cancelled.
  std::error_code code() const noexcept override { return errc::cancelled; }
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
  /// errc::no_active_lease.
  std::error_code code() const noexcept override { return errc::no_active_lease; }
  using Error::Error;
};

namespace detail {
/// The code() of the lockwatch error `e` holds (none for none; a generic
/// code for an exception that is no lockwatch error).
std::error_code code_of(std::exception_ptr e) noexcept;
}  // namespace detail

}  // namespace lockwatch
