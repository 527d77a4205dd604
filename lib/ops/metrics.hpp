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
  void render(std::string& out, std::string_view name, std::string_view help) const;

 private:
  std::array<double, kMaxBuckets> bounds_{};
  std::size_t n_ = 0;
  std::array<std::atomic<std::uint64_t>, kMaxBuckets + 1> counts_{};  // not cumulative; the last is +Inf
  std::atomic<std::uint64_t> sum_ns_{0};
};

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
  std::atomic<std::uint64_t> holds_long{0};  // Options::hold_warning
  // By LostReason: expired, taken_by_other, renewals_exhausted, unreachable, not_started.
  std::array<std::atomic<std::uint64_t>, 5> lost{};
  // Redis Cluster redirects followed: MOVED, ASK.
  std::array<std::atomic<std::uint64_t>, 2> redirects{};
  Histogram acquire_duration;
  Histogram hold_duration;
  Histogram loop_lag;

  void count_lost(LostReason reason) noexcept;
  mutable std::mutex jobs_mu;
  std::map<std::string, std::shared_ptr<JobMetrics>> jobs;  // guarded by jobs_mu
  // The whole exposition; `stats` gives the gauges.
  std::string render(const StatsCounters& stats) const;
};

}  // namespace lockwatch::detail
