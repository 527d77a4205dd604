// lib/jobs/scheduler_impl.hpp: the scheduler's insides (see scheduler.cpp).
//
// Ownership by thread: the runtime's loop thread owns a Job's clock
// estimate and its lead/standby state; cancelled_, finished_, run_stop_
// and the condition variable are shared with cancel() and join() under
// mu_; leader_ is read from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>

#include "jobs/cron.hpp"
#include "lockwatch/scheduler.hpp"
#include "ops/metrics.hpp"
#include "lockwatch/timer_wheel.hpp"
#include "runtime/job_host.hpp"
#include "store/capabilities.hpp"

namespace lockwatch {

namespace detail {

// When a job's periods start, on the store's clock.
class Schedule {
 public:
  virtual ~Schedule() = default;
  // The latest period started at or before `t` (nullopt: none in reach).
  virtual std::optional<std::int64_t> latest(std::chrono::system_clock::time_point t) const = 0;
  // The first period after `n`.
  virtual std::optional<std::int64_t> next(std::int64_t n) const = 0;
  virtual std::chrono::system_clock::time_point start(std::int64_t n) const = 0;
};

// One declared job: a state machine on the runtime's loop thread (no
// thread of its own, nothing polls). Every step is an event there: the
// acquisition's handler, a store reply, a wheel timeout, a run's end, the
// lease's loss, a cancel. The run itself goes to the pool.
struct Job : std::enable_shared_from_this<Job> {
  Job(Runtime& runtime, std::string name, std::unique_ptr<Schedule> schedule, Scheduler::Body body,
      JobOptions options, std::chrono::milliseconds skew);

  // Any thread.
  void start();
  void request_cancel() noexcept;
  // Waits until the job stopped here (its run over, its lease released);
  // from inside its own run it returns at once.
  void join() noexcept;
  bool leader() const noexcept { return leader_.load(std::memory_order_acquire); }
  const std::string& name() const noexcept { return name_; }

 private:
  // What a wheel timeout of the job goes on with.
  enum class Step : std::uint8_t { kCompete, kPlan, kPeriodDue, kMaxRun };
  struct Wake final : TimerTask {
    Job* job = nullptr;
    Step step = Step::kPlan;
    void run(Timeout) noexcept override;
  };
  void take_step(Step step);

  // Loop thread: the steps.
  void compete();
  void on_acquired(std::exception_ptr error, LockHandle h);
  void lead(LockHandle h);
  void plan();
  void on_period_due();
  void fetch_store_time();
  void claim_target();
  void on_claim(const ClaimResult& r, std::chrono::system_clock::time_point sent);
  void run_target();
  void on_run_done(std::int64_t period, const std::string& error);
  void on_max_run();
  void on_lease_lost();
  void on_cancel();
  void stop_leading();
  void finish() noexcept;
  // Runs `step` at `at` (one timeout at a time), or at once if that is now.
  void wake_at(std::chrono::steady_clock::time_point at, Step step);
  void wake_at_store(std::chrono::system_clock::time_point t);
  // Any thread: `task` on the loop. False (and the job is over) once the
  // loop takes no more tasks (the runtime stopped).
  bool post(UniqueFunction task);

  bool cancelled() const;
  bool lease_lost() const noexcept { return !handle_ || handle_.lease().lost(); }
  std::chrono::system_clock::time_point local_now() const;
  std::chrono::system_clock::time_point store_now() const;
  void learn_store_time(std::chrono::system_clock::time_point store, std::chrono::system_clock::time_point sent_local);

  JobHost& host_;
  const std::string name_;
  const std::string key_;  // "job:<name>"
  std::string lock_name_;  // the store's name for key_
  JobClaims* claims_ = nullptr;  // the store's (the runtime's store outlives its jobs)
  const std::unique_ptr<Schedule> schedule_;
  const Scheduler::Body body_;
  const JobOptions options_;
  const std::chrono::milliseconds skew_;  // testing: added to the local clock
  const std::shared_ptr<JobMetrics> metrics_;
  std::atomic<bool> leader_{false};

  // Loop thread.
  std::chrono::milliseconds offset_{0};  // store clock - local clock
  AcquireTicket ticket_;                 // the acquisition while competing
  LockHandle handle_;                    // while leading
  std::string token_;                    // handle_'s owner token
  LeaseWatch lost_watch_;
  bool clock_known_ = false;
  std::optional<std::int64_t> done_upto_;  // the last period run, as far as we know
  std::int64_t target_ = 0;                // the period being waited for, claimed or run
  bool running_ = false;
  Wake wake_;
  Timeout wake_timeout_;
  Wake max_run_;
  Timeout max_run_timeout_;
  std::shared_ptr<std::stop_source> max_run_stop_;  // the run max_run_ stops
  bool over_ = false;

  // Shared with cancel() and join().
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;                       // guarded by mu_
  bool finished_ = false;                        // guarded by mu_
  std::shared_ptr<std::stop_source> run_stop_;   // guarded by mu_: the running run's
};

// Testing: a scheduler whose local clock is off by `skew` (as on a machine
// with a wrong clock).
struct SchedulerAccess {
  static void set_clock_skew(Scheduler& s, std::chrono::milliseconds skew);
};

}  // namespace detail

struct Scheduler::Impl {
  explicit Impl(Runtime& rt) : runtime(rt) {}
  std::shared_ptr<detail::Job> add(std::string name, std::unique_ptr<detail::Schedule> schedule, Body body, const JobOptions& options);

  Runtime& runtime;
  std::chrono::milliseconds skew{0};  // for jobs declared from now on
  std::mutex mu;
  bool closed = false;                           // guarded by mu
  std::vector<std::shared_ptr<detail::Job>> jobs;  // guarded by mu
};

}  // namespace lockwatch
