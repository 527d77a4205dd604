// lib/ops/events.hpp: what the runtime tells its observers, its metrics
// and its log.
//
// The loop thread reports each event once, here. Metrics count it inline
// (relaxed atomics: no lock, no allocation). Observers and the log sink are
// user code, so they get it on the event thread, one queued task per event,
// and only when there is someone to tell: with no observer attached and a
// happy path, an event costs the counters and one relaxed load.
//
// A lock's span events (Observer::on_span) ride in the task of the event
// they go with (acquired, busy, acquire_failed, lost, released): only the
// start of a wait, a cancelled wait and a lease given up as the runtime
// stops are tasks of their own.
//
// Threading: add() and the metrics from any thread; the reporting members
// from the loop thread (connection() from wherever a store reports).
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lockwatch/observer.hpp"
#include "lockwatch/thread_pool.hpp"
#include "ops/metrics.hpp"

namespace lockwatch::detail {

class Events {
 public:
  using Duration = std::chrono::nanoseconds;

  // `thread`: the event thread (one worker). An empty `sink` logs warnings
  // and errors to stderr. `owner`: who holds, as the log names it
  // (Options::runtime.owner_name; empty: host:pid).
  Events(ThreadPool& thread, LogSink sink, std::string owner = {});

  void add(std::shared_ptr<Observer> observer);
  Metrics& metrics() noexcept { return metrics_; }
  const Metrics& metrics() const noexcept { return metrics_; }

  // `pattern`: LockSpec::pattern, the histograms' label. `context`:
  // LockRequest::context, for the span events told with these (the wait
  // ended; granted: the lease held).
  void acquired(const std::string& key, std::uint64_t fencing_token, Duration waited, std::uint16_t pattern = 0,
                std::string_view context = {});
  void busy(const std::string& key, Duration waited, std::uint16_t pattern = 0, std::string_view context = {});
  void acquire_failed(const std::string& key, std::exception_ptr error, Duration waited, std::string_view context);
  void renewed(const std::string& key, Duration slack);
  void renewal_failed(const std::string& key, const std::string& why);
  // With the span event kLost: the lease's hold so far and its token.
  void lost(const std::string& key, LostReason reason, const std::string& detail, Duration held,
            std::uint64_t fencing_token, std::string_view context);
  // With the span event kReleased unless `lost` (its hold span ended then).
  void released(const std::string& key, Duration held, std::uint16_t pattern = 0, std::uint64_t fencing_token = 0,
                std::string_view context = {}, bool lost = false);
  // Options::observability.hold_warning: the lease on `key` is held `held` already (once per lease).
  void held_long(const std::string& key, Duration held);
  // Span events of their own (no other event goes with them). `began`:
  // when the wait began (the call); the clock is read only when observed.
  void wait_started(const std::string& key, std::string_view context, std::chrono::steady_clock::time_point began);
  void wait_cancelled(const std::string& key, std::string_view context, Duration waited);
  // A lease given up as the runtime stops, before its work started.
  void stopped_before_start(const std::string& key, std::string_view context, Duration held,
                            std::uint64_t fencing_token);
  void connection(const std::string& endpoint, bool up, const std::string& why);
  void log(LogLevel level, std::string line);
  // Scheduled jobs (any thread: the scheduler's). `error` empty: it returned.
  void run_started(const std::string& job, std::int64_t period);
  void run_finished(const std::string& job, std::int64_t period, const std::string& error);

 private:
  // Checked before an event's text is copied: no observer, no copy.
  bool observed() const noexcept { return observed_.load(std::memory_order_acquire); }
  template <class F>
  void tell(F&& f);
  // Tells observers `e` alone, stamped now less `ago`, its views made to
  // point into copies the task keeps.
  void span(const SpanEvent& e, Duration ago = Duration(0));

  ThreadPool& thread_;
  LogSink sink_;
  const std::string owner_;
  Metrics metrics_;
  std::atomic<bool> observed_{false};
  std::mutex mu_;
  std::vector<std::shared_ptr<Observer>> observers_;  // guarded by mu_
};

}  // namespace lockwatch::detail
