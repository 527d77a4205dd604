/// @file
/// lockwatch/observer.hpp: being told what the locks do.
///
///   struct Tracer : lockwatch::Observer {
///     void on_lost(std::string_view key, lockwatch::LostReason why, std::string_view detail) override {
///       page_someone(key, lockwatch::to_string(why));
///     }
///   };
///   runtime.add_observer(std::make_shared<Tracer>());
///
/// One virtual per event, each with a default that does nothing: override
/// what you need. The runtime's own metrics (Runtime::metrics_text()) and
/// log lines (Options::observability.log) are built on the same events.
///
/// Tracing without a dependency: on_span() receives each lock's life as
/// span-shaped events (wait started and ended, held, released or lost),
/// each carrying the context the caller attached to the request
/// (LockRequest::context, LOCKED's .context()), so a bridge to a tracer is
/// a short observer (docs/operations.md shows one for OpenTelemetry).
///
/// Threading: events are delivered on the runtime's event thread, one at a
/// time and in the order they happened, never on the I/O thread: an observer
/// that blocks delays other observers, never a lock. An observer must not
/// destroy the runtime. Costs: nothing while no observer is attached; with
/// one, each event is one queued task (the key is copied). Span events ride
/// in the task of the event they go with (the context is copied too); the
/// start of each wait is one task more.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string_view>

#include "lockwatch/errors.hpp"

namespace lockwatch {

/// The step of a lock's life a SpanEvent reports. Per call: kWaitStarted,
/// then kWaitEnded (granted or not); once granted, kHeld, then exactly one
/// of kReleased and kLost.
enum class SpanKind {
  kWaitStarted,  ///< the call began to take the lock (its wait span starts)
  kWaitEnded,    ///< it was granted, or failed (busy, an error, cancelled, the runtime stopped)
  kHeld,         ///< the lease began (its hold span starts)
  kReleased,     ///< the lease ended held: released, or handed on
  kLost,         ///< the lease ended lost (LeaseLost, with `reason`)
};
/// The kind as a word ("wait_started", "wait_ended", "held", "released", "lost").
const char* to_string(SpanKind kind) noexcept;

/// One step of a lock's life, shaped for a tracer: a wait span from
/// kWaitStarted to kWaitEnded, a hold span from kHeld to kReleased or
/// kLost. The views are valid during the call to Observer::on_span only.
/// A set of keys (lockwatch::all_of) reports each key's steps.
struct SpanEvent {
  /// Durations of waits and holds.
  using Duration = std::chrono::nanoseconds;
  SpanKind kind = SpanKind::kWaitStarted;  ///< Which step this is.
  /// The key as the caller named it (without the runtime's prefix).
  std::string_view key{};
  /// What the caller attached to the request (LockRequest::context), as
  /// given: an opaque string such as a W3C `traceparent`; empty if none.
  std::string_view context{};
  /// When it happened, on the wall clock (the start of a wait: the call).
  std::chrono::system_clock::time_point at{};
  /// kWaitEnded: the wait, from the call to the grant or the failure;
  /// kReleased and kLost: the hold, from the grant; otherwise zero.
  Duration duration{0};
  /// The lease's fencing token (kWaitEnded when granted, kHeld, kReleased,
  /// kLost); otherwise 0.
  std::uint64_t fencing_token = 0;
  /// kWaitEnded: whether the lock was granted.
  bool acquired = false;
  /// kLost: why the lease was lost (meaningless for the other kinds).
  LostReason reason = LostReason::kExpired;
  /// kWaitEnded without the lock: why ("busy", the error's message,
  /// "cancelled"); kLost: more of the reason (the store's answer). Often
  /// empty.
  std::string_view detail{};
};

/// Told what the locks do: one virtual per event, each a no-op by default (see the header comment).
/// Attached with Runtime::add_observer(); called on the runtime's event thread.
class Observer {
 public:
  /// Durations of waits and holds.
  using Duration = std::chrono::nanoseconds;
  virtual ~Observer() = default;

  /// A lock was taken after `waited` (from the call to the grant).
  virtual void on_acquired(std::string_view key, std::uint64_t fencing_token, Duration waited) {
    (void)key, (void)fencing_token, (void)waited;
  }
  /// A lock was busy past the call's wait (the call fails with LockNotAcquired).
  virtual void on_busy(std::string_view key, Duration waited) { (void)key, (void)waited; }
  /// Taking a lock failed with an error (ConnectionError, StoreRefused, ...).
  virtual void on_acquire_failed(std::string_view key, std::string_view what) { (void)key, (void)what; }
  /// A renewal was confirmed with `slack` left before the local deadline.
  virtual void on_renewed(std::string_view key, Duration slack) { (void)key, (void)slack; }
  /// A renewal failed for a transient reason; it is retried until the deadline.
  virtual void on_renewal_failed(std::string_view key, std::string_view why) { (void)key, (void)why; }
  /// The lease was lost: its work was asked to stop and will see LeaseLost.
  virtual void on_lost(std::string_view key, LostReason reason, std::string_view detail) {
    (void)key, (void)reason, (void)detail;
  }
  /// The lock was released (or surely expired) after being held for `held`.
  virtual void on_released(std::string_view key, Duration held) { (void)key, (void)held; }
  /// The lease on `key` has been held for `held`, longer than
  /// Options::observability.hold_warning (told once per lease, while it is still held).
  virtual void on_held_long(std::string_view key, Duration held) { (void)key, (void)held; }
  /// A connection to a store node went down, or came back.
  virtual void on_connection(std::string_view endpoint, bool up, std::string_view why) {
    (void)endpoint, (void)up, (void)why;
  }
  /// A step of a lock's life, for tracing (SpanEvent): told beside the
  /// events above, in the same order, for every lock taken by a call.
  virtual void on_span(const SpanEvent& e) { (void)e; }
  /// Scheduled jobs: a run of `job` for `period` started, and finished
  /// (`error` empty when it returned normally).
  virtual void on_run_started(std::string_view job, std::int64_t period) { (void)job, (void)period; }
  /// A run ended; `error` is empty when it returned normally.
  virtual void on_run_finished(std::string_view job, std::int64_t period, std::string_view error) {
    (void)job, (void)period, (void)error;
  }
};

/// How much a log line matters; the default sink writes kWarning and kError.
enum class LogLevel { kDebug, kInfo, kWarning, kError };
/// The level as a word ("debug", "info", "warning", "error").
const char* to_string(LogLevel level) noexcept;

/// Where the runtime's log lines go (Options::observability.log). Called on the event
/// thread. The default writes warnings and errors to stderr, prefixed
/// "lockwatch:"; nothing is logged on the happy path.
using LogSink = std::function<void(LogLevel level, std::string_view line)>;

}  // namespace lockwatch
