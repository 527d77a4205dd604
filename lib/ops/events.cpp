#include "ops/events.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>

#include "core/error_values.hpp"

namespace lockwatch {

const char* to_string(SpanKind kind) noexcept {
  switch (kind) {
    case SpanKind::kWaitStarted: return "wait_started";
    case SpanKind::kWaitEnded: return "wait_ended";
    case SpanKind::kHeld: return "held";
    case SpanKind::kReleased: return "released";
    case SpanKind::kLost: return "lost";
  }
  return "unknown";
}

const char* to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "unknown";
}

namespace detail {

namespace {

// "host:pid": who holds, as far as this process can say.
const std::string& process_identity() {
  static const std::string identity = [] {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    return fmt::format("{}:{}", host[0] ? host : "unknown-host", static_cast<long>(::getpid()));
  }();
  return identity;
}

void stderr_sink(LogLevel level, std::string_view line) {
  if (level < LogLevel::kWarning) return;
  std::fprintf(stderr, "lockwatch: %s: %.*s\n", to_string(level), static_cast<int>(line.size()), line.data());
}

}  // namespace

Events::Events(ThreadPool& thread, LogSink sink, std::string owner)
    : thread_(thread), sink_(sink ? std::move(sink) : &stderr_sink), owner_(std::move(owner)) {}

void Events::add(std::shared_ptr<Observer> observer) {
  if (!observer) return;
  std::lock_guard lk(mu_);
  observers_.push_back(std::move(observer));
  observed_.store(true, std::memory_order_release);
}

template <class F>
void Events::tell(F&& f) {
  try {
    thread_.post([this, f = std::forward<F>(f)]() mutable {
      std::vector<std::shared_ptr<Observer>> observers;
      {
        std::lock_guard lk(mu_);
        observers = observers_;
      }
      for (auto& o : observers) {
        try {
          f(*o);
        } catch (...) {
          // An observer's exception is its own; the others still hear.
        }
      }
    });
  } catch (...) {
    // The event thread stopped: the runtime is going away.
  }
}

void Events::log(LogLevel level, std::string line) {
  try {
    thread_.post([this, level, line = std::move(line)] {
      try {
        sink_(level, line);
      } catch (...) {
      }
    });
  } catch (...) {
  }
}

namespace {
// The wall-clock time of an event reported now.
std::chrono::system_clock::time_point wall_now() noexcept {
  return std::chrono::time_point_cast<std::chrono::system_clock::duration>(std::chrono::system_clock::now());
}
}  // namespace

void Events::acquired(const std::string& key, std::uint64_t fencing_token, Duration waited, std::uint16_t pattern,
                      std::string_view context) {
  metrics_.acquired.fetch_add(1, std::memory_order_relaxed);
  metrics_.observe_acquire(pattern, waited);
  if (!observed()) return;
  tell([key, fencing_token, waited, at = wall_now(), context = std::string(context)](Observer& o) {
    o.on_acquired(key, fencing_token, waited);
    SpanEvent e{.kind = SpanKind::kWaitEnded,
                .key = key,
                .context = context,
                .at = at,
                .duration = waited,
                .fencing_token = fencing_token,
                .acquired = true};
    o.on_span(e);
    e.kind = SpanKind::kHeld;
    e.duration = Duration(0);
    e.acquired = false;
    o.on_span(e);
  });
}

void Events::busy(const std::string& key, Duration waited, std::uint16_t pattern, std::string_view context) {
  metrics_.busy.fetch_add(1, std::memory_order_relaxed);
  metrics_.observe_acquire(pattern, waited);
  if (!observed()) return;
  tell([key, waited, at = wall_now(), context = std::string(context)](Observer& o) {
    o.on_busy(key, waited);
    o.on_span(SpanEvent{
        .kind = SpanKind::kWaitEnded, .key = key, .context = context, .at = at, .duration = waited, .detail = "busy"});
  });
}

void Events::acquire_failed(const std::string& key, std::exception_ptr error, Duration waited,
                            std::string_view context) {
  metrics_.acquire_errors.fetch_add(1, std::memory_order_relaxed);
  if (!observed()) return;
  tell([key, what = what_of(error), waited, at = wall_now(), context = std::string(context)](Observer& o) {
    o.on_acquire_failed(key, what);
    o.on_span(SpanEvent{
        .kind = SpanKind::kWaitEnded, .key = key, .context = context, .at = at, .duration = waited, .detail = what});
  });
}

void Events::renewed(const std::string& key, Duration slack) {
  metrics_.renewals.fetch_add(1, std::memory_order_relaxed);
  if (!observed()) return;
  tell([key, slack](Observer& o) { o.on_renewed(key, slack); });
}

void Events::renewal_failed(const std::string& key, const std::string& why) {
  metrics_.renewal_failures.fetch_add(1, std::memory_order_relaxed);
  if (!observed()) return;
  tell([key, why](Observer& o) { o.on_renewal_failed(key, why); });
}

void Events::lost(const std::string& key, LostReason reason, const std::string& detail, Duration held,
                  std::uint64_t fencing_token, std::string_view context) {
  metrics_.count_lost(reason);
  // A handle the runtime gives back as it is destroyed is what its owner
  // asked for by destroying it: told to observers, not warned of.
  if (reason != LostReason::kRuntimeStopped)
    log(LogLevel::kWarning, fmt::format("lease lost: key '{}', reason {}{}{}", key, to_string(reason),
                                        detail.empty() ? "" : ": ", detail));
  if (!observed()) return;
  tell([key, reason, detail, held, fencing_token, at = wall_now(), context = std::string(context)](Observer& o) {
    o.on_lost(key, reason, detail);
    o.on_span(SpanEvent{.kind = SpanKind::kLost,
                        .key = key,
                        .context = context,
                        .at = at,
                        .duration = held,
                        .fencing_token = fencing_token,
                        .reason = reason,
                        .detail = detail});
  });
}

void Events::released(const std::string& key, Duration held, std::uint16_t pattern, std::uint64_t fencing_token,
                      std::string_view context, bool lost) {
  metrics_.observe_hold(pattern, held);
  if (!observed()) return;
  tell([key, held, fencing_token, lost, at = wall_now(), context = std::string(context)](Observer& o) {
    o.on_released(key, held);
    if (lost) return;  // its hold span ended with kLost
    o.on_span(SpanEvent{.kind = SpanKind::kReleased,
                        .key = key,
                        .context = context,
                        .at = at,
                        .duration = held,
                        .fencing_token = fencing_token});
  });
}

void Events::held_long(const std::string& key, Duration held) {
  metrics_.holds_long.fetch_add(1, std::memory_order_relaxed);
  log(LogLevel::kWarning,
      fmt::format("lease on key '{}' held by {} for {} ms, longer than Options::observability.hold_warning", key,
                  owner_.empty() ? process_identity() : owner_,
                  std::chrono::duration_cast<std::chrono::milliseconds>(held).count()));
  if (!observed()) return;
  tell([key, held](Observer& o) { o.on_held_long(key, held); });
}

void Events::span(const SpanEvent& e, Duration ago) {
  SpanEvent stamped = e;
  stamped.at = std::chrono::time_point_cast<std::chrono::system_clock::duration>(wall_now() - ago);
  tell([e = stamped, key = std::string(e.key), context = std::string(e.context),
        detail = std::string(e.detail)](Observer& o) {
    SpanEvent told = e;
    told.key = key;
    told.context = context;
    told.detail = detail;
    o.on_span(told);
  });
}

void Events::wait_started(const std::string& key, std::string_view context,
                          std::chrono::steady_clock::time_point began) {
  if (!observed()) return;
  span(SpanEvent{.kind = SpanKind::kWaitStarted, .key = key, .context = context},
       std::chrono::steady_clock::now() - began);
}

void Events::wait_cancelled(const std::string& key, std::string_view context, Duration waited) {
  if (!observed()) return;
  span(SpanEvent{.kind = SpanKind::kWaitEnded, .key = key, .context = context, .duration = waited, .detail = "cancelled"});
}

void Events::stopped_before_start(const std::string& key, std::string_view context, Duration held,
                                  std::uint64_t fencing_token) {
  if (!observed()) return;
  span(SpanEvent{.kind = SpanKind::kLost,
                 .key = key,
                 .context = context,
                 .duration = held,
                 .fencing_token = fencing_token,
                 .reason = LostReason::kRuntimeStopped,
                 .detail = "the runtime stopped before the work started"});
}

void Events::connection(const std::string& endpoint, bool up, const std::string& why) {
  log(up ? LogLevel::kInfo : LogLevel::kWarning,
      up ? fmt::format("connected to {} again", endpoint)
         : fmt::format("connection to {} lost: {}; reconnecting", endpoint, why));
  if (!observed()) return;
  tell([endpoint, up, why](Observer& o) { o.on_connection(endpoint, up, why); });
}

void Events::run_started(const std::string& job, std::int64_t period) {
  if (!observed()) return;
  tell([job, period](Observer& o) { o.on_run_started(job, period); });
}

void Events::run_finished(const std::string& job, std::int64_t period, const std::string& error) {
  if (!error.empty()) log(LogLevel::kError, fmt::format("job '{}' period {} threw: {}", job, period, error));
  if (!observed()) return;
  tell([job, period, error](Observer& o) { o.on_run_finished(job, period, error); });
}

}  // namespace detail
}  // namespace lockwatch
