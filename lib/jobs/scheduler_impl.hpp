// lib/jobs/scheduler_impl.hpp: the scheduler's insides (see scheduler.cpp).
//
// Ownership by thread: a Job's thread owns its clock estimate and its
// lead/standby state; cancelled_, run_stop_ and the condition variable are
// shared with cancel() under mu_; leader_ is read from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "jobs/cron.hpp"
#include "lockwatch/scheduler.hpp"
#include "ops/metrics.hpp"
#include "runtime/lease_record.hpp"
#include "store/lock_store.hpp"

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

struct Job {
  Job(Runtime& runtime, std::string name, std::unique_ptr<Schedule> schedule, Scheduler::Body body,
      JobOptions options, std::chrono::milliseconds skew);

  void start();
  void request_cancel() noexcept;
  void join() noexcept;
  bool leader() const noexcept { return leader_.load(std::memory_order_acquire); }
  const std::string& name() const noexcept { return name_; }

 private:
  void main();
  void lead(LockHandle& h);
  void run(std::int64_t period, const Lease& lease, LeaseRecord* record);
  bool cancelled() const;
  bool wait_for_lease(std::future<LockHandle>& f);
  // Sleeps until the store's clock (as estimated) reaches `t`; false when
  // cancelled or the lease is lost first.
  bool sleep_until_store(std::chrono::system_clock::time_point t, const Lease* lease);
  std::chrono::system_clock::time_point local_now() const;
  std::chrono::system_clock::time_point store_now() const;
  void learn_store_time(std::chrono::system_clock::time_point store, std::chrono::system_clock::time_point sent_local);
  std::optional<std::chrono::system_clock::time_point> fetch_store_time();
  ClaimResult claim(const std::string& token, std::int64_t period);
  // Runs `start(store, done)` on the loop thread and waits for `done`'s value.
  template <class T, class Start>
  std::optional<T> on_loop(Start start);

  Runtime& runtime_;
  Runtime::Impl& impl_;
  const std::string name_;
  const std::string key_;  // "job:<name>"
  std::string lock_name_;  // the store's name for key_
  const std::unique_ptr<Schedule> schedule_;
  const Scheduler::Body body_;
  const JobOptions options_;
  const std::chrono::milliseconds skew_;  // testing: added to the local clock
  const std::shared_ptr<JobMetrics> metrics_;
  std::chrono::milliseconds offset_{0};  // store clock - local clock; job thread
  std::atomic<bool> leader_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;                 // guarded by mu_
  std::stop_source* run_stop_ = nullptr;   // guarded by mu_: the running run's
  std::mutex join_mu_;
  std::thread thread_;
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
