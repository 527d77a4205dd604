/// @file
/// lockwatch/options.hpp: how a Runtime is configured.
///
/// Options is a plain value: fill it, hand it to a Runtime, done. Every field
/// has a default that works for a local Redis. Options::from_env() reads
/// LOCKWATCH_STORE_URL (and the LOCKWATCH_TLS_* files), which is what the
/// process-wide default runtime uses.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lockwatch/observer.hpp"

namespace lockwatch {

/// The value of Options::runtime.busy_poll (its default) that makes polling
/// adaptive; see there. Any other negative value is rejected.
inline constexpr std::chrono::microseconds kBusyPollAdaptive{-1};

/// One Redis node, parsed from `redis://[user:password@]host:port[/db]`
/// (`rediss://` for TLS).
struct Endpoint {
  /// Host name or address.
  std::string host = "127.0.0.1";
  /// TCP port.
  int port = 6379;
  std::string user;      ///< empty: AUTH with the password only (default user)
  std::string password;  ///< empty: no AUTH
  /// The database SELECTed after connecting.
  int db = 0;
  bool tls = false;      ///< rediss://

  /// Parses a redis:// or rediss:// URL; throws InvalidArgument naming what is wrong.
  static Endpoint parse(const std::string& url);
  /// Parses a comma-separated list of redis:// or rediss:// URLs (one or more).
  static std::vector<Endpoint> parse_list(const std::string& urls);
  /// "host:port" (credentials never appear in messages).
  std::string name() const;
};

/// The runtime's own threads, queues and keys: Options::runtime.
struct RuntimeOptions {
  /// The longest owner_name accepted (bytes).
  static constexpr std::size_t kMaxOwnerName = 128;

  /// Worker threads that run locked work; 0 means one per core.
  std::size_t threads = 0;
  /// How long a granted call may wait for a free worker. Meanwhile its lease
  /// is renewed without spending its `retries`, and the work starts with a
  /// full ttl; past this the lock is given back and the call fails with
  /// LeaseLost (LostReason::kNotStarted): a locked call that blocks a
  /// worker on another locked call queued behind it fails instead of
  /// deadlocking silently.
  std::chrono::milliseconds queue_timeout{60000};
  /// Trades CPU for latency, as SO_BUSY_POLL does: the I/O thread, and one
  /// idle pool worker, keep polling for a while before they sleep, so that
  /// the next step of a call (often the store's reply) finds them awake
  /// instead of paying a thread wake-up.
  ///   kBusyPollAdaptive (the default): polling that pays for itself. The
  ///     I/O thread polls only while a call waits on it (replies to a
  ///     call's requests, not the watchdog's renewals, or locked work on
  ///     the pool), and a pool worker only while tasks have been coming
  ///     sooner than a wake-up costs. Each polls at most as long as a
  ///     wake-up is measured to cost (at most 200 us), and a poll that
  ///     catches nothing halves the next one, down to none. A runtime that
  ///     only holds and renews leases never polls.
  ///   0: never polls.
  ///   1 us .. 10 ms: a fixed window, after every piece of work, whether
  ///     anything is outstanding or not (the CPU is spent even when idle
  ///     between calls).
  /// Any other value is an InvalidArgument.
  std::chrono::microseconds busy_poll = kBusyPollAdaptive;
  /// Prepended to every key and channel lockwatch uses in the store. It must
  /// not contain '{' or '}': each lock's Redis hash tag is its own key.
  std::string key_prefix = "lockwatch:";
  /// Longest key accepted (bytes, before the prefix).
  std::size_t max_key_bytes = std::size_t{1} << 20;
  /// The name each holder records with its lock in the store, beside its
  /// grant time (Runtime::inspect, `lockwatch status` and `ls` show both),
  /// and the name of the store's connections (Redis `CLIENT SETNAME
  /// lockwatch:NAME`, PostgreSQL `application_name`). Empty: "host:pid:program"
  /// of this process. At most kMaxOwnerName bytes, no control characters
  /// (else InvalidArgument); it is visible to anyone who can read the store:
  /// no secrets.
  std::string owner_name{};
};

/// The watchdog that renews leases: its hashed wheel and when it renews.
/// Options::watchdog.
struct WatchdogOptions {
  /// The hashed wheel's tick.
  std::chrono::milliseconds tick{5};
  /// Number of the wheel's slots.
  std::size_t wheel_size = 512;
  /// A renewal is sent ttl * renew_weight after the previous one was sent
  /// (or the lock taken) ...
  double renew_weight = 0.9;
  /// ... or earlier, so that it has at least this long to be confirmed
  /// before the local deadline, but never earlier than half the ttl. Only
  /// short ttls feel it (with the defaults, those under about 580 ms): a
  /// tenth of 200 ms would leave a stalled host or Redis 16 ms. 0 renews at
  /// exactly ttl * renew_weight. Either time is then moved early, by at
  /// most ttl / 20, onto a grid shared with other leases (the tick times a
  /// power of two), so that renewals come due together and share a batch
  /// (docs/decorator-and-runtime.md, "Renewals share wake-ups").
  std::chrono::milliseconds min_renewal_window{50};
  /// The holder considers its lease gone this early (clock drift between
  /// this host and the store): drift = ttl * drift_factor + drift_floor,
  /// and a tick more, so that the tick judging the deadline comes before
  /// the allowance begins. It is the holder's only margin against a next
  /// holder: make it exceed the longest pause the process may see
  /// (docs/guarantees.md).
  double drift_factor = 0.01;
  /// The fixed part of the drift allowance.
  std::chrono::milliseconds drift_floor{2};
};

/// The store's connections: Options::connection.
struct ConnectionOptions {
  /// A connection attempt that has not completed by then fails.
  std::chrono::milliseconds connect_timeout{2000};
  /// A request without a reply by then fails and the connection is reset.
  /// On Redis it is the server's silence that counts: the connection is
  /// reset when the server answered nothing for this long since the oldest
  /// pending request was written to the socket. Replies come in order, so a
  /// server still answering earlier ones is at work, however long the queue
  /// behind them. On every store, a reply already received is taken in
  /// before a request is judged overdue, as a client too busy to read for a
  /// while is no server's delay.
  std::chrono::milliseconds command_timeout{2000};
  /// Reconnect back-off after a connection is lost: doubles up to the max.
  std::chrono::milliseconds reconnect_min{10};
  /// The longest reconnect back-off.
  std::chrono::milliseconds reconnect_max{1000};
};

/// TLS (rediss:// and etcds:// URLs): Options::tls. PEM files: the CA that
/// signed the servers' certificates (empty: the system's CAs), and a client
/// certificate with its key for servers that require one (mutual TLS). A
/// file that cannot be read is an InvalidArgument when the options are
/// checked.
struct TlsOptions {
  /// PEM CA file (empty: the system's CAs).
  std::string ca_file{};
  /// PEM client certificate, for mutual TLS (empty: none).
  std::string cert_file{};
  /// PEM key of cert_file.
  std::string key_file{};
  /// The name the servers' certificates must carry, also sent as SNI; empty:
  /// each node's host as the URL (or a sentinel) gives it. An IP address is
  /// matched against the certificate's IP addresses.
  std::string server_name{};
  /// Verify the servers' certificates (chain, dates, name). Turn it off only
  /// to try things out: without it anyone on the path can read the locks.
  bool verify = true;
};

/// In-process hand-off on a contended key: Options::handoff.
struct HandoffOptions {
  /// On by default.
  ///
  /// When one of this runtime's leases ends while another caller in this
  /// runtime waits for the same key (with the same ttl and a retries count
  /// other than 0), the lock passes to that caller without a release and a
  /// new acquisition: the store's key stays held by this runtime's owner
  /// token and renewed by the watchdog; the new holder gets a lease of its
  /// own (a fresh stop_token, LeaseLost, its own renewal count for
  /// `retries`, and remaining() as the key's current deadline, which the
  /// watchdog keeps moving). The hand-off counts as the previous holder's
  /// release. It never happens once the lease is lost, while a renewal is
  /// failing, or past the local deadline; the waiter then takes the lock
  /// the normal way.
  ///
  /// Fencing tokens keep their meaning: every holder's token comes from the
  /// store. While callers wait here, the holder reserves the next tokens
  /// from the store's fencing counter in blocks (one round trip per block,
  /// made while the work runs, only if the store still holds the key with
  /// this runtime's token); each hand-off takes the next one. They are
  /// above every earlier holder's token, in every process, and below every
  /// token the store hands out after, whatever the other processes' setting.
  /// Tokens of a block left unused when the key goes back are skipped.
  /// Stores that cannot reserve tokens (Redlock, MariaDB, PostgreSQL, etcd,
  /// ZooKeeper) make no hand-offs; Redis (one node, Sentinel, Cluster) and
  /// memory:// do. Off: every holder takes the key from the store.
  bool enabled = true;
  /// A process must not keep a contended key forever: after this many local
  /// hand-offs in a row (1 .. 2^20 - 1), or once max_time has passed since
  /// the process took the key from the store, the lease is released to the
  /// store (with its release notice). If the notice reached another
  /// process's waiter, the local waiters sit out one tick before they try
  /// again, so that the woken waiter gets its turn; that streak's end costs
  /// this process the tick and two round trips. If it reached nobody else
  /// (the Redis stores count the notice's subscribers; memory:// knows its
  /// listeners), the next local waiter takes the key from the store at
  /// once, in two round trips. Stores that cannot tell always sit out. A
  /// bound of 64 hand-offs cost a process alone on a key most of its
  /// throughput; a longer time makes other processes wait longer.
  std::uint32_t max_streak = 1024;
  /// See max_streak.
  std::chrono::milliseconds max_time{20};
};

/// Metrics, slow-wait and long-hold warnings, and logs: Options::observability.
struct ObservabilityOptions {
  /// "host:port" (e.g. "127.0.0.1:9464") to serve GET /metrics in the
  /// Prometheus text format from the runtime's own loop; empty: off. The
  /// Runtime constructor throws ListenError if it cannot listen there.
  std::string metrics_listen{};
  /// A call waiting for a busy lock longer than this counts in the gauge
  /// lockwatch_waits_long while it waits (docs/operations.md). 0: every
  /// waiting call counts. Must not be negative.
  std::chrono::milliseconds wait_warning{10000};
  /// A lease held longer than this counts once in
  /// lockwatch_holds_long_total, and is told once to the observers
  /// (Observer::on_held_long) and the log (a warning naming the key and this
  /// runtime's owner_name). 0 (the default): off. Must not be negative.
  std::chrono::milliseconds hold_warning{0};
  /// Where log lines go (see observer.hpp); empty: warnings and errors to
  /// stderr, prefixed "lockwatch:".
  LogSink log{};
};

/// What a Runtime is made from: the store's URL and the settings of the
/// runtime, the watchdog, connections, TLS, the hand-off and observability,
/// each group its own aggregate:
///
///   Options options{.store_url = "redis://127.0.0.1:6379",
///                   .watchdog = {.tick = std::chrono::milliseconds(2)}};
///   options.connection.command_timeout = std::chrono::seconds(1);
///
/// Every field has a default; validate() (and the Runtime) check them.
struct Options {
  /// The longest runtime.owner_name accepted (bytes).
  static constexpr std::size_t kMaxOwnerName = RuntimeOptions::kMaxOwnerName;

  /// Where the locks live; the URL's scheme picks the store (redis://,
  /// Redlock's list of redis:// URLs, redis-sentinel://, redis-cluster://,
  /// their rediss variants, mysql://, postgresql://, zookeeper://, etcd://,
  /// memory://). Each scheme's URL shape and the settings its query takes
  /// (e.g. `redis-sentinel://h:26379/mymaster?min_replicas=1`) are in
  /// docs/stores.md; store_url_forms() lists the shapes. A scheme the build
  /// has no feature for fails with Unsupported naming it. Empty: redis_url.
  std::string store_url{};
  /// Deprecated: the older name of store_url, used when store_url is empty
  /// (any scheme). Set beside store_url to another URL, store_url is used
  /// and the runtime logs a warning.
  std::string redis_url = "redis://127.0.0.1:6379";
  /// Threads, queues, keys and the owner's name.
  RuntimeOptions runtime{};
  /// The watchdog's wheel and renewal timing.
  WatchdogOptions watchdog{};
  /// Connection timeouts and reconnect back-off.
  ConnectionOptions connection{};
  /// TLS files and checks.
  TlsOptions tls{};
  /// In-process hand-off on a contended key.
  HandoffOptions handoff{};
  /// Metrics, warnings and logs.
  ObservabilityOptions observability{};

  /// Defaults, with store_url taken from LOCKWATCH_STORE_URL, redis_url
  /// from LOCKWATCH_REDIS_URL, runtime.owner_name from LOCKWATCH_OWNER_NAME
  /// and tls.ca_file, tls.cert_file, tls.key_file from LOCKWATCH_TLS_CA_FILE,
  /// LOCKWATCH_TLS_CERT_FILE, LOCKWATCH_TLS_KEY_FILE when they are set.
  static Options from_env();
  /// Throws InvalidArgument if a field is out of range, the URL is bad or a
  /// TLS file cannot be used.
  void validate() const;
};

/// The URL forms Options::store_url takes, one line per kind of store, each
/// as that store describes its schemes (docs/stores.md has the details); a
/// store this build left out names the Meson feature it needs. `lockwatch
/// --help` prints them. Any thread.
std::vector<std::string> store_url_forms();

}  // namespace lockwatch
