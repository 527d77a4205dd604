// lib/ops/metrics.hpp: the runtime's Prometheus metrics.
//
// Counters and histograms are relaxed atomics with fixed buckets: counting
// takes no lock and allocates nothing, so the loop thread counts as it
// goes. Rendering (Runtime::metrics_text(), GET /metrics) reads them from
// any thread; each value is read on its own, so a scrape is not one
// instant, as with every Prometheus client.
//
// No label carries a lock's key: label values are fixed sets, or the names
// of scheduled jobs (declared by the program, so a bounded set).
#pragma once

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "lockwatch/errors.hpp"
#include "ops/stats.hpp"

namespace lockwatch::detail {

// Bucket bounds in seconds, ascending; +Inf is implied.
class Histogram {
 public:
  static constexpr std::size_t kMaxBuckets = 16;
  explicit Histogram(std::span<const double> bounds) noexcept;
  void observe(std::chrono::nanoseconds d) noexcept;
  // The family's HELP and TYPE lines, then its series.
  void render(std::string& out, std::string_view name, std::string_view help) const;
  // The series alone, `labels` first in each (`pattern="sku:{0}",`).
  void render_series(std::string& out, std::string_view name, std::string_view labels) const;

 private:
  std::array<double, kMaxBuckets> bounds_{};
  std::size_t n_ = 0;
  std::array<std::atomic<std::uint64_t>, kMaxBuckets + 1> counts_{};  // not cumulative; the last is +Inf
  std::atomic<std::uint64_t> sum_ns_{0};
};

// The key patterns named in the metrics' `pattern` label: process-wide,
// interned by pattern_id() (lockwatch/locked.hpp), at most kPatternIds - 2
// distinct ones; later ones share the last id, shown as "other".
inline constexpr std::size_t kPatternIds = 64;
std::string pattern_name(std::uint16_t id);

// A scheduled job's counters, kept for the runtime's life once declared.
struct JobMetrics {
  std::atomic<std::uint64_t> runs_ok{0}, runs_error{0};
  std::atomic<int> leaders{0};  // this process's schedulers leading the job (0 or 1 in practice)
};

struct Metrics {
  Metrics();

  // Any thread. The counters of job `name` (made on first use).
  std::shared_ptr<JobMetrics> job(const std::string& name);

  std::atomic<std::uint64_t> acquired{0}, busy{0}, acquire_errors{0};
  std::atomic<std::uint64_t> renewals{0}, renewal_failures{0};
  std::atomic<std::uint64_t> holds_long{0};  // Options::observability.hold_warning
  // By LostReason: expired, taken_by_other, renewals_exhausted, unreachable, not_started, removed.
  std::array<std::atomic<std::uint64_t>, 6> lost{};
  // Redis Cluster redirects followed: MOVED, ASK.
  std::array<std::atomic<std::uint64_t>, 2> redirects{};
  Histogram acquire_duration;
  Histogram hold_duration;
  Histogram loop_lag;
  // The same two by LOCKED key pattern (LockSpec::pattern, 1 ..
  // kPatternIds - 1; 0, a call without one, counts in the two above),
  // each made on its first observation.
  std::array<std::atomic<Histogram*>, kPatternIds> acquire_by_pattern{};
  std::array<std::atomic<Histogram*>, kPatternIds> hold_by_pattern{};
  void observe_acquire(std::uint16_t pattern, std::chrono::nanoseconds d) noexcept;
  void observe_hold(std::uint16_t pattern, std::chrono::nanoseconds d) noexcept;
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  void count_lost(LostReason reason) noexcept;
  mutable std::mutex jobs_mu;
  std::map<std::string, std::shared_ptr<JobMetrics>> jobs;  // guarded by jobs_mu
  // The whole exposition; `stats` gives the gauges.
  std::string render(const StatsCounters& stats) const;

 private:
  // render()'s parts: calls (acquisitions and their durations), leases
  // (renewals, losses, what is held and waited for now), scheduled jobs.
  void render_calls(std::string& out) const;
  void render_leases(std::string& out, const StatsCounters& stats) const;
  void render_jobs(std::string& out) const;
};

}  // namespace lockwatch::detail
