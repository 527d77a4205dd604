/// @file
/// lockwatch/lock_request.hpp: what a caller asks for when it takes a lock.
///
///   auto h = rt.acquire({.key = "sku:42", .ttl = 5s, .wait = 2s}).get();
///   rt.async_acquire({.key = "report", .kind = lockwatch::LockKind::shared()},
///                    [](std::error_code ec, lockwatch::LockHandle h) { ... });
///
/// LockRequest is an aggregate whose fields are named at the call
/// (designated initializers), so two durations cannot be swapped unseen.
/// Every way of taking a lock takes one: Runtime::acquire and
/// async_acquire, lockwatch::async_lock (lockwatch/asio.hpp); LOCKED builds
/// its own from the key pattern and the builder's arguments.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "lockwatch/errors.hpp"
#include "lockwatch/lock_key.hpp"
#include "lockwatch/lock_kind.hpp"

namespace lockwatch {

/// `lockwatch::forever` as the retries argument: renew for as long as the
/// work runs.
struct Forever {
  explicit constexpr Forever() = default;
};
/// Renew for as long as the work runs: the retries argument of LOCKED, locked(), Runtime::acquire.
inline constexpr Forever forever{};

/// The longest ttl and wait a call may ask for (7 days): longer ones are
/// InvalidArgument at the call, before anything starts (a ttl is renewed
/// for as long as the work runs, so none needs more).
inline constexpr std::chrono::milliseconds max_ttl{7LL * 24 * 3600 * 1000};
/// The longest wait a call may ask for: 7 days, as max_ttl.
inline constexpr std::chrono::milliseconds max_wait = max_ttl;
/// The longest context a call may carry (LockRequest::context): a W3C
/// `traceparent` is 55 bytes, with a `tracestate` a few hundred.
inline constexpr std::size_t max_context_bytes = 512;

/// How many renewals the watchdog may make: a count >= 0, or forever.
class Retries {
 public:
  Retries(int count);  ///< NOLINT: implicit on purpose (LOCKED("k", 1s, 3)); throws InvalidArgument if < 0
  /// lockwatch::forever: no limit.
  constexpr Retries(Forever) noexcept : count_(-1) {}  // NOLINT
  /// True for lockwatch::forever.
  constexpr bool is_forever() const noexcept { return count_ < 0; }
  /// The count; -1 for forever.
  constexpr std::int64_t count() const noexcept { return count_; }

 private:
  std::int64_t count_;
};

/// The `pattern` label a request gives its lock's acquisition and hold
/// histograms (Runtime::metrics_text): the text of a key pattern
/// ("sku:{0}"), never a key, as each distinct text is a series (past 62
/// texts, one series shown as "other"). Made from text, it is interned
/// process-wide (any thread); a copy costs nothing.
class MetricsPattern {
 public:
  /// None: the histograms' series without a pattern.
  constexpr MetricsPattern() noexcept = default;
  /// The label `text` (empty: none).
  explicit MetricsPattern(std::string_view text) noexcept;
  /// The interned id (0: none).
  constexpr std::uint16_t id() const noexcept { return id_; }

 private:
  std::uint16_t id_ = 0;
};

/// One lock asked for: the fields in this order, each with the default a
/// caller most often wants. Checked before anything starts: an empty key
/// (or an empty set, or one of more than max_set_keys keys), a ttl outside 1 ms .. max_ttl, a wait outside 0 .. max_wait or
/// permits(0), a renew_weight outside (0, 1) (0 aside), a context longer than max_context_bytes or with a control
/// character is errc::invalid_argument, a kind the store cannot hold
/// errc::unsupported (thrown by the future form, given to the handler by
/// the asynchronous ones, never both).
struct LockRequest {
  /// The key as the caller names it (the runtime adds its prefix), or a
  /// set of keys taken all or none: lockwatch::all_of("acct:1", "acct:2")
  /// (lock_key.hpp).
  LockKey key;
  /// The lease: how long the lock outlives a holder that stops renewing
  /// it. The watchdog renews it every ttl * 9/10 while it is held.
  std::chrono::milliseconds ttl{30000};
  /// How many renewals the watchdog may make (lockwatch::forever: no limit).
  Retries retries = forever;
  /// How long to wait for a busy lock (0: fail at once with errc::busy).
  std::chrono::milliseconds wait{0};
  /// How it is held (lock_kind.hpp): exclusive unless shared(), permits(n)
  /// or fair().
  LockKind kind{};
  /// An opaque string the caller attaches to the request, such as a W3C
  /// `traceparent`: given back as it is in every SpanEvent of this lock
  /// (Observer::on_span), never interpreted or sent to the store. At most
  /// max_context_bytes, no control characters. Empty (the default) costs
  /// nothing.
  std::string context{};
  /// Renew the lease every ttl * renew_weight, in (0, 1); 0 (the default)
  /// takes the runtime's Options::watchdog.renew_weight (9/10).
  double renew_weight = 0;
  /// The `pattern` label of this lock's acquisition and hold histograms
  /// (none by default). LOCKED gives its key expression as written.
  MetricsPattern metrics_pattern{};
};

}  // namespace lockwatch
