#include "ops/metrics.hpp"

#include <fmt/format.h>

#include <limits>
#include <memory>
#include <mutex>
#include <vector>

namespace lockwatch::detail {

namespace {

constexpr double kAcquireBounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                     0.25,   0.5,   1,      2.5,   5,    10,    30};
constexpr double kHoldBounds[] = {0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600};
constexpr double kLagBounds[] = {0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};

std::string number(double v) {
  if (v == std::numeric_limits<double>::infinity()) return "+Inf";
  return fmt::format("{}", v);
}

void counter(std::string& out, std::string_view name, std::string_view help, std::uint64_t v) {
  fmt::format_to(std::back_inserter(out), "# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, v);
}

}  // namespace

Histogram::Histogram(std::span<const double> bounds) noexcept : n_(std::min(bounds.size(), kMaxBuckets)) {
  for (std::size_t i = 0; i < n_; ++i) bounds_[i] = bounds[i];
}

void Histogram::render(std::string& out, std::string_view name, std::string_view help) const {
  fmt::format_to(std::back_inserter(out), "# HELP {0} {1}\n# TYPE {0} histogram\n", name, help);
  render_series(out, name, "");
}

void Histogram::render_series(std::string& out, std::string_view name, std::string_view labels) const {
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i <= n_; ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    std::string le = i < n_ ? number(bounds_[i]) : "+Inf";
    fmt::format_to(std::back_inserter(out), "{}_bucket{{{}le=\"{}\"}} {}\n", name, labels, le, cumulative);
  }
  if (labels.empty()) {
    fmt::format_to(std::back_inserter(out), "{}_sum {}\n{}_count {}\n", name,
                   number(static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9), name, cumulative);
    return;
  }
  const std::string_view inner = labels.substr(0, labels.size() - 1);  // without the trailing comma
  fmt::format_to(std::back_inserter(out), "{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, inner,
                 number(static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9), name, inner, cumulative);
}

void Histogram::observe(std::chrono::nanoseconds d) noexcept {
  const double s = std::chrono::duration<double>(d).count();
  std::size_t i = 0;
  while (i < n_ && s > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<std::uint64_t>(std::max<std::int64_t>(0, d.count())), std::memory_order_relaxed);
}

Metrics::Metrics() : acquire_duration(kAcquireBounds), hold_duration(kHoldBounds), loop_lag(kLagBounds) {}

Metrics::~Metrics() {
  for (auto* a : {&acquire_by_pattern, &hold_by_pattern})
    for (auto& h : *a) delete h.load(std::memory_order_acquire);
}

namespace {
struct PatternNames {
  std::mutex mu;
  std::vector<std::string> names{""};  // id 0: none
};
PatternNames& pattern_names() {
  static PatternNames names;
  return names;
}

// The histogram of `pattern` in `by`, made on first use (any thread).
Histogram& of_pattern(std::array<std::atomic<Histogram*>, kPatternIds>& by, std::uint16_t pattern,
                      std::span<const double> bounds) {
  auto& slot = by[std::min<std::size_t>(pattern, kPatternIds - 1)];
  Histogram* h = slot.load(std::memory_order_acquire);
  if (h != nullptr) return *h;
  auto made = std::make_unique<Histogram>(bounds);
  if (slot.compare_exchange_strong(h, made.get(), std::memory_order_acq_rel)) return *made.release();
  return *h;
}
}  // namespace

std::uint16_t pattern_id(std::string_view text) noexcept {
  if (text.empty()) return 0;
  try {
    auto& p = pattern_names();
    std::lock_guard lk(p.mu);
    for (std::size_t i = 1; i < p.names.size(); ++i)
      if (p.names[i] == text) return static_cast<std::uint16_t>(i);
    if (p.names.size() < kPatternIds - 1) {
      p.names.emplace_back(text);
      return static_cast<std::uint16_t>(p.names.size() - 1);
    }
  } catch (...) {
  }
  return static_cast<std::uint16_t>(kPatternIds - 1);  // "other"
}

std::string pattern_name(std::uint16_t id) {
  if (id >= kPatternIds - 1) return "other";
  auto& p = pattern_names();
  std::lock_guard lk(p.mu);
  return id < p.names.size() ? p.names[id] : std::string();
}

namespace {
// Observes `d` in `pattern`'s histogram of `by`, or in `plain` for none
// (or when its histogram cannot be made).
void observe_in(Histogram& plain, std::array<std::atomic<Histogram*>, kPatternIds>& by, std::span<const double> bounds,
                std::uint16_t pattern, std::chrono::nanoseconds d) noexcept {
  if (pattern != 0) {
    try {
      of_pattern(by, pattern, bounds).observe(d);
      return;
    } catch (...) {
    }
  }
  plain.observe(d);
}
}  // namespace

void Metrics::observe_acquire(std::uint16_t pattern, std::chrono::nanoseconds d) noexcept {
  observe_in(acquire_duration, acquire_by_pattern, kAcquireBounds, pattern, d);
}

void Metrics::observe_hold(std::uint16_t pattern, std::chrono::nanoseconds d) noexcept {
  observe_in(hold_duration, hold_by_pattern, kHoldBounds, pattern, d);
}

std::shared_ptr<JobMetrics> Metrics::job(const std::string& name) {
  std::lock_guard lk(jobs_mu);
  auto& m = jobs[name];
  if (!m) m = std::make_shared<JobMetrics>();
  return m;
}

namespace {
// A job name as a label value (the exposition format's escapes).
std::string label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out.push_back(c);
  }
  return out;
}
}  // namespace

void Metrics::count_lost(LostReason reason) noexcept {
  switch (reason) {
    case LostReason::kExpired: lost[0].fetch_add(1, std::memory_order_relaxed); break;
    case LostReason::kTakenByOther: lost[1].fetch_add(1, std::memory_order_relaxed); break;
    case LostReason::kRenewalsExhausted: lost[2].fetch_add(1, std::memory_order_relaxed); break;
    case LostReason::kStoreUnreachable: lost[3].fetch_add(1, std::memory_order_relaxed); break;
    case LostReason::kNotStarted: lost[4].fetch_add(1, std::memory_order_relaxed); break;
    case LostReason::kRemoved: lost[5].fetch_add(1, std::memory_order_relaxed); break;
    case LostReason::kRuntimeStopped: break;
  }
}

std::string Metrics::render(const StatsCounters& stats) const {
  std::string out;
  out.reserve(4096);
  render_calls(out);
  render_leases(out, stats);
  render_jobs(out);
  return out;
}

namespace {
std::uint64_t metrics_relaxed(const std::atomic<std::uint64_t>& a) noexcept { return a.load(std::memory_order_relaxed); }
}  // namespace

void Metrics::render_calls(std::string& out) const {
  const auto rel = metrics_relaxed;
  out +=
      "# HELP lockwatch_acquisitions_total Lock acquisitions by result: acquired, busy past the wait, or an error.\n"
      "# TYPE lockwatch_acquisitions_total counter\n";
  fmt::format_to(std::back_inserter(out),
                 "lockwatch_acquisitions_total{{result=\"acquired\"}} {}\n"
                 "lockwatch_acquisitions_total{{result=\"busy\"}} {}\n"
                 "lockwatch_acquisitions_total{{result=\"error\"}} {}\n",
                 rel(acquired), rel(busy), rel(acquire_errors));
  auto by_pattern = [&out](const std::array<std::atomic<Histogram*>, kPatternIds>& by, std::string_view name) {
    for (std::size_t p = 1; p < kPatternIds; ++p) {
      if (const Histogram* h = by[p].load(std::memory_order_acquire))
        h->render_series(out, name, fmt::format("pattern=\"{}\",", label(pattern_name(static_cast<std::uint16_t>(p)))));
    }
  };
  acquire_duration.render(out, "lockwatch_acquire_duration_seconds",
                          "Time from a call to its grant, waiting included (by LOCKED key pattern; none: "
                          "handles and key functions).");
  by_pattern(acquire_by_pattern, "lockwatch_acquire_duration_seconds");
  hold_duration.render(out, "lockwatch_hold_duration_seconds",
                       "Time a lease was held, from grant to release (by LOCKED key pattern).");
  by_pattern(hold_by_pattern, "lockwatch_hold_duration_seconds");
}

void Metrics::render_leases(std::string& out, const StatsCounters& stats) const {
  const auto rel = metrics_relaxed;
  counter(out, "lockwatch_renewals_total", "Lease renewals confirmed by the store.", rel(renewals));
  counter(out, "lockwatch_renewal_failures_total", "Lease renewals that failed for a transient reason (retried).",
          rel(renewal_failures));
  out +=
      "# HELP lockwatch_leases_lost_total Leases lost while their work ran, by reason.\n"
      "# TYPE lockwatch_leases_lost_total counter\n";
  fmt::format_to(std::back_inserter(out),
                 "lockwatch_leases_lost_total{{reason=\"expired\"}} {}\n"
                 "lockwatch_leases_lost_total{{reason=\"taken_by_other\"}} {}\n"
                 "lockwatch_leases_lost_total{{reason=\"renewals_exhausted\"}} {}\n"
                 "lockwatch_leases_lost_total{{reason=\"unreachable\"}} {}\n"
                 "lockwatch_leases_lost_total{{reason=\"not_started\"}} {}\n"
                 "lockwatch_leases_lost_total{{reason=\"removed\"}} {}\n",
                 rel(lost[0]), rel(lost[1]), rel(lost[2]), rel(lost[3]), rel(lost[4]), rel(lost[5]));
  out +=
      "# HELP lockwatch_cluster_redirects_total Calls and lease renewals a Redis Cluster redirected to another "
      "node, by kind (0 on other stores).\n"
      "# TYPE lockwatch_cluster_redirects_total counter\n";
  fmt::format_to(std::back_inserter(out),
                 "lockwatch_cluster_redirects_total{{kind=\"moved\"}} {}\n"
                 "lockwatch_cluster_redirects_total{{kind=\"ask\"}} {}\n",
                 rel(redirects[0]), rel(redirects[1]));
  fmt::format_to(std::back_inserter(out),
                 "# HELP lockwatch_leases_held Leases held right now.\n"
                 "# TYPE lockwatch_leases_held gauge\n"
                 "lockwatch_leases_held {}\n",
                 rel(stats.held));
  const Waits::Snapshot waits = stats.waits.snapshot();
  fmt::format_to(std::back_inserter(out),
                 "# HELP lockwatch_waiting Calls waiting for a busy lock right now.\n"
                 "# TYPE lockwatch_waiting gauge\n"
                 "lockwatch_waiting {}\n"
                 "# HELP lockwatch_waits_long Calls waiting for a busy lock right now for longer than "
                 "Options::observability.wait_warning.\n"
                 "# TYPE lockwatch_waits_long gauge\n"
                 "lockwatch_waits_long {}\n"
                 "# HELP lockwatch_oldest_wait_seconds How long the longest wait going on has lasted so far "
                 "(0 when no call waits).\n"
                 "# TYPE lockwatch_oldest_wait_seconds gauge\n"
                 "lockwatch_oldest_wait_seconds {}\n",
                 waits.waiting, waits.long_waits, number(std::chrono::duration<double>(waits.oldest).count()));
  counter(
      out, "lockwatch_holds_long_total",
      "Leases held longer than Options::observability.hold_warning (each counted once, when it passes the warning).",
      rel(holds_long));
  auto slack_us = stats.min_renewal_slack_us.load(std::memory_order_relaxed);
  fmt::format_to(std::back_inserter(out),
                 "# HELP lockwatch_renewal_slack_seconds The least time a lease had left before its local deadline "
                 "when a renewal was confirmed (+Inf until one was).\n"
                 "# TYPE lockwatch_renewal_slack_seconds gauge\n"
                 "lockwatch_renewal_slack_seconds {}\n",
                 slack_us == std::numeric_limits<std::int64_t>::max() ? std::string("+Inf")
                                                                       : number(static_cast<double>(slack_us) / 1e6));
  loop_lag.render(out, "lockwatch_loop_lag_seconds",
                  "How late the I/O loop ran the watchdog's timer after it was due.");
}

void Metrics::render_jobs(std::string& out) const {
  const auto rel = metrics_relaxed;
  out +=
      "# HELP lockwatch_job_runs_total Runs of scheduled jobs in this process, by job and result.\n"
      "# TYPE lockwatch_job_runs_total counter\n";
  std::string leaders =
      "# HELP lockwatch_job_leader Whether this process leads the scheduled job (holds its lease).\n"
      "# TYPE lockwatch_job_leader gauge\n";
  {
    std::lock_guard lk(jobs_mu);
    for (const auto& [name, m] : jobs) {
      auto l = label(name);
      fmt::format_to(std::back_inserter(out),
                     "lockwatch_job_runs_total{{job=\"{0}\",result=\"ok\"}} {1}\n"
                     "lockwatch_job_runs_total{{job=\"{0}\",result=\"error\"}} {2}\n",
                     l, rel(m->runs_ok), rel(m->runs_error));
      fmt::format_to(std::back_inserter(leaders), "lockwatch_job_leader{{job=\"{}\"}} {}\n", l,
                     m->leaders.load(std::memory_order_relaxed) > 0 ? 1 : 0);
    }
  }
  out += leaders;
}

}  // namespace lockwatch::detail
