/// @file
/// lockwatch/scheduler.hpp: highly available scheduled jobs.
///
///   lockwatch::Scheduler jobs;                      // or Scheduler jobs(runtime)
///   lockwatch::JobOptions o;
///   o.lease = 10s;
///   auto h = jobs.every(1h, "report:hourly", [](const lockwatch::JobRun& run) {
///     write_report(run.period(), run.fencing_token());
///   }, o);
///   jobs.cron("0 3 * * *", "nightly", [] { vacuum(); });   // 5-field cron, UTC
///
/// Every process that declares a job competes for its lease (the lock
/// "job:<name>"); one holds it continuously, renewed by the watchdog between
/// runs and during them, and runs every period while it is healthy. The
/// others wait for it without polling (release notices, or the holder's
/// ttl) and one takes over within one lease plus one period when it dies.
///
/// Periods are numbered on the store's clock (Redis TIME), not the local
/// one: every(p) periods start at multiples of p since the Unix epoch
/// (shifted by JobOptions::offset) and are numbered by that multiple; cron
/// periods are UTC minutes and are numbered by the minute since the epoch.
/// A run claims its period in one atomic step with the check that the
/// lease is still ours and that the store's clock has reached the period:
/// a period runs at most once, whoever leads and however skewed the clocks.
/// A job the store has no record of runs its current period at once (under
/// kRunOnce): a new leader cannot tell a new job from a missed period.
/// Changing a job's schedule kind (every <-> cron) needs a new name.
///
/// A program started by cron on every host (lockwatch run --once-per) has
/// no leader to keep: it takes the lock, claims the current period with
/// claim_period() or claim_cron_period(), and runs only if it claimed it.
/// The claim is the one a job's leader makes before each run.
///
/// Threading: every() and cron() from any thread. A job has no thread of
/// its own and never polls: it waits for the lease and the periods on the
/// runtime's I/O loop (the acquisition's handler, the timer wheel, store
/// replies), so a thousand jobs cost no more threads than one; runs execute
/// on the runtime's pool, one at a time per job, with this_lease() bound.
/// Destroying the Scheduler stops its jobs in order: no new runs, running
/// ones are asked to stop (their stop token) and awaited, leases released
/// so another process takes over at once. Destroy it before its Runtime,
/// and never from inside one of its runs.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "lockwatch/lease.hpp"
#include "lockwatch/runtime.hpp"

namespace lockwatch {

/// What a leader does with periods it missed (it took over late, or a run
/// outlasted its period). Never a burst of catch-up runs.
enum class Misfire {
  kRunOnce,  ///< run the latest missed period once, at once
  kSkip,     ///< run a period only within JobOptions::misfire_grace of its start
};

/// How a job runs: its lease, its periods, missed periods, a time limit.
struct JobOptions {
  /// The leader's lease, renewed by the watchdog (renewals retried
  /// forever). A dead leader is replaced within about one lease.
  std::chrono::milliseconds lease{10000};
  /// every(): periods start at n * period + offset since the epoch.
  std::chrono::milliseconds offset{0};
  /// What to do with periods missed (a dead leader, a long run).
  Misfire misfire = Misfire::kRunOnce;
  /// kSkip: how late (on the store's clock) a period may still start.
  std::chrono::milliseconds misfire_grace{1000};
  /// A run is asked to stop (its stop token) after this long; 0: never.
  std::chrono::milliseconds max_run{0};
};

/// One run of a job, as its callable sees it. Valid during the run only.
class JobRun {
 public:
  /// Made by the scheduler for each run.
  JobRun(const std::string& name, std::int64_t period, std::chrono::system_clock::time_point scheduled_for,
         const Lease& lease, std::stop_token stop) noexcept
      : name_(name), period_(period), scheduled_for_(scheduled_for), lease_(lease), stop_(std::move(stop)) {}

  /// The job's name.
  const std::string& name() const noexcept { return name_; }
  /// The period's number (see the header comment).
  std::int64_t period() const noexcept { return period_; }
  /// The period's start, on the store's clock.
  std::chrono::system_clock::time_point scheduled_for() const noexcept { return scheduled_for_; }
  /// The job lease's fencing token: pass it to every side effect.
  std::uint64_t fencing_token() const noexcept { return lease_.fencing_token(); }
  /// Fires when the lease is lost, max_run passed, or the job is cancelled.
  std::stop_token stop_token() const noexcept { return stop_; }
  /// The job's lease (its key, fencing token, time left).
  const Lease& lease() const noexcept { return lease_; }

 private:
  const std::string& name_;
  std::int64_t period_;
  std::chrono::system_clock::time_point scheduled_for_;
  const Lease& lease_;
  std::stop_token stop_;
};

namespace detail {
struct Job;
struct SchedulerAccess;
}  // namespace detail

/// A declared job. Copyable; any thread.
class JobHandle {
 public:
  JobHandle() noexcept = default;
  /// True when the handle refers to a job (not default-constructed).
  explicit operator bool() const noexcept { return job_ != nullptr; }
  /// Whether this process holds the job's lease right now.
  bool is_leader() const noexcept;
  /// Stops the job here: no new runs, a running one is asked to stop and
  /// awaited, the lease is released. Blocks until then (from inside the
  /// job's own run it only asks). Idempotent; never throws.
  void cancel() noexcept;

 private:
  friend class Scheduler;
  explicit JobHandle(std::shared_ptr<detail::Job> job) noexcept : job_(std::move(job)) {}
  std::shared_ptr<detail::Job> job_;
};

/// Runs jobs once per period across every process that declares them (see the header comment): each
/// job has one leader at a time, chosen by a lock, and a period is claimed on the store before it
/// runs.
class Scheduler {
 public:
  /// A job's callable.
  using Body = std::function<void(const JobRun&)>;

  /// On Runtime::default_runtime().
  Scheduler();
  /// On `runtime`, which must outlive the scheduler.
  explicit Scheduler(Runtime& runtime);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Runs `f` every `period` (on the store's clock). `f` takes a const
  /// JobRun& or nothing. Throws InvalidArgument (period <= 0, an empty or
  /// duplicate name, a lease too short for the runtime's tick, negative
  /// options) or RuntimeStopped.
  template <class F>
  JobHandle every(std::chrono::milliseconds period, std::string name, F&& f, JobOptions options = {}) {
    return add_every(period, std::move(name), wrap(std::forward<F>(f)), options);
  }
  /// Runs `f` at the times of a 5-field cron expression (minute hour
  /// day-of-month month day-of-week), in UTC. Fields take numbers, `*`,
  /// lists `a,b`, ranges `a-b` and steps `*/n` or `a-b/n`; day-of-week 0 or
  /// 7 is Sunday; names (JAN, MON) are not supported. When both day fields
  /// are restricted, a day matching either runs (as Vixie cron). Throws as
  /// every(), and InvalidArgument for a bad expression or one that never
  /// fires.
  template <class F>
  JobHandle cron(std::string expression, std::string name, F&& f, JobOptions options = {}) {
    return add_cron(std::move(expression), std::move(name), wrap(std::forward<F>(f)), options);
  }

  struct Impl;

 private:
  friend struct detail::SchedulerAccess;
  template <class F>
  static Body wrap(F&& f) {
    if constexpr (std::is_invocable_v<std::decay_t<F>&, const JobRun&>) {
      return Body(std::forward<F>(f));
    } else {
      static_assert(std::is_invocable_v<std::decay_t<F>&>, "a job takes a const lockwatch::JobRun& or nothing");
      return [g = std::forward<F>(f)](const JobRun&) mutable { g(); };
    }
  }
  JobHandle add_every(std::chrono::milliseconds period, std::string name, Body body, const JobOptions& options);
  JobHandle add_cron(std::string expression, std::string name, Body body, const JobOptions& options);

  std::unique_ptr<Impl> impl_;
};

// ------------------------------------------------- once per period, from cron

/// What claim_period() found.
struct PeriodClaim {
  /// True: the period is the caller's to run, and the store records it as
  /// run (whether the run then succeeds or not). False: it was run already,
  /// here or on another host.
  bool claimed = false;
  /// The current period's number and start, on the store's clock (numbered
  /// as JobRun::period() numbers them).
  std::int64_t period = 0;
  /// The current period's start, on the store's clock.
  std::chrono::system_clock::time_point scheduled_for{};
  /// Not claimed: the latest period the store records as run (>= period).
  std::int64_t last_run = 0;
};

/// Claims the current period of every(`period`) (started at n * period +
/// offset since the epoch, on the store's clock) for the lock `held`, a
/// handle taken on `runtime`: the store's record of the last period run is
/// kept with that lock (so a Scheduler job "NAME" shares it with a holder of
/// "job:NAME"), and a claim succeeds only while the lock is ours. Two round
/// trips: the store's clock, then the claim, which checks the lease, the
/// clock and the record in one atomic step. Changing the period of a lock's
/// claims renumbers its periods: use a new key.
///
/// Any thread; never blocks. The future holds the PeriodClaim, or LeaseLost
/// (the store no longer holds the lock for us), ConnectionError and the
/// other store errors. Throws before anything starts: InvalidArgument (an
/// empty handle, period <= 0), Unsupported (a store without scheduled jobs'
/// claims), RuntimeStopped.
std::future<PeriodClaim> claim_period(Runtime& runtime, const LockHandle& held, std::chrono::milliseconds period,
                                      std::chrono::milliseconds offset = std::chrono::milliseconds(0));
/// The same for the periods of a cron expression (as Scheduler::cron: UTC,
/// a period is a fire time, numbered by its minute since the epoch). Also
/// throws InvalidArgument for a bad expression.
std::future<PeriodClaim> claim_cron_period(Runtime& runtime, const LockHandle& held, std::string_view expression);

}  // namespace lockwatch
