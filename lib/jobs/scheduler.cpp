// Scheduled jobs (lockwatch/scheduler.hpp) on the runtime's leases.
//
// A job has no thread: it is a state machine on the runtime's loop thread,
// moved on by events there (the acquisition's handler, store replies, wheel
// timeouts, a run's end, the lease's loss, a cancel), between two states:
// - standby: Runtime::acquire("job:<name>", lease, forever, wait = lease)
//   with a handler, again and again: the runtime's wait queue wakes it on a
//   release notice or the holder's ttl, so a standby costs one request per
//   lease at most, and no thread;
// - leader: it holds the LockHandle (the watchdog renews it) and sleeps on
//   the runtime's timer wheel until the next period starts by its estimate
//   of the store's clock, then claims the period (store/lock_store.hpp,
//   claim_period: lease check, store clock and at-most-once in one step)
//   and, if claimed, runs the callable on the runtime's pool with
//   this_lease() bound (max_run on the wheel, cancel and lease loss through
//   the run's stop source).
// The clock estimate is an offset from the local system clock, measured
// at each claim and TIME request: an estimate only decides when to ask;
// the store decides whether the period is due.
#include "jobs/scheduler_impl.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "core/error_values.hpp"
#include "ops/events.hpp"
#include "runtime/job_host.hpp"
#include "runtime/store_errors.hpp"

namespace lockwatch {

using namespace std::chrono;
using detail::ClaimResult;
using detail::Job;

namespace detail {

namespace {

thread_local const Job* running_job = nullptr;  // the job whose run this pool thread executes

// every(p): period n starts at n * p + offset.
class EverySchedule final : public Schedule {
 public:
  EverySchedule(milliseconds period, milliseconds offset) : p_(period), off_(offset) {}
  std::optional<std::int64_t> latest(system_clock::time_point t) const override {
    auto since = duration_cast<milliseconds>(t.time_since_epoch()) - off_;
    auto n = since.count() / p_.count();
    if (since.count() < 0 && since.count() % p_.count() != 0) --n;
    return n;
  }
  std::optional<std::int64_t> next(std::int64_t n) const override { return n + 1; }
  system_clock::time_point start(std::int64_t n) const override {
    return system_clock::time_point(duration_cast<system_clock::duration>(p_ * n + off_));
  }

 private:
  milliseconds p_, off_;
};

// cron: period n is the fire time at minute n since the epoch.
class CronSchedule final : public Schedule {
 public:
  explicit CronSchedule(CronExpr expr) : expr_(std::move(expr)) {}
  std::optional<std::int64_t> latest(system_clock::time_point t) const override {
    auto m = expr_.latest_at(t);
    if (!m) return std::nullopt;
    return m->time_since_epoch().count();
  }
  std::optional<std::int64_t> next(std::int64_t n) const override {
    auto m = expr_.next_after(start(n));
    if (!m) return std::nullopt;
    return m->time_since_epoch().count();
  }
  system_clock::time_point start(std::int64_t n) const override {
    return system_clock::time_point(duration_cast<system_clock::duration>(minutes(n)));
  }

 private:
  CronExpr expr_;
};

std::string what_of_current() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what()[0] ? e.what() : "an exception with an empty message";
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

}  // namespace

Job::Job(Runtime& runtime, std::string name, std::unique_ptr<Schedule> schedule, Scheduler::Body body,
         JobOptions options, milliseconds skew)
    : host_(JobHost::of(runtime)),
      name_(std::move(name)),
      key_("job:" + name_),
      schedule_(std::move(schedule)),
      body_(std::move(body)),
      options_(options),
      skew_(skew),
      metrics_(host_.job_events().metrics().job(name_)) {
  lock_name_ = host_.store_name(key_);
  claims_ = &host_.job_claims();
  wake_.job = this;
  max_run_.job = this;
}

bool Job::post(UniqueFunction task) {
  if (host_.post(std::move(task))) return true;
  // The loop is closed (the runtime stopped): nothing runs there any more.
  leader_.store(false, std::memory_order_release);
  {
    std::lock_guard lk(mu_);
    finished_ = true;
  }
  cv_.notify_all();
  return false;
}

void Job::start() {
  post([self = shared_from_this()] { self->compete(); });
}

void Job::request_cancel() noexcept {
  {
    std::lock_guard lk(mu_);
    if (cancelled_) return;
    cancelled_ = true;
    if (run_stop_) run_stop_->request_stop();
  }
  try {
    post([self = shared_from_this()] { self->on_cancel(); });
  } catch (...) {
    // Out of memory: the job ends at its next step.
  }
}

void Job::join() noexcept {
  if (running_job == this) return;  // from inside our own run: only asked
  std::unique_lock lk(mu_);
  cv_.wait(lk, [this] { return finished_; });
}

bool Job::cancelled() const {
  std::lock_guard lk(mu_);
  return cancelled_;
}

system_clock::time_point Job::local_now() const { return system_clock::now() + skew_; }
system_clock::time_point Job::store_now() const { return local_now() + offset_; }

void Job::learn_store_time(system_clock::time_point store, system_clock::time_point sent_local) {
  // The store read its clock somewhere between send and reply: take the middle.
  auto now = local_now();
  offset_ = duration_cast<milliseconds>(store - (sent_local + (now - sent_local) / 2));
}

void Job::Wake::run(Timeout) noexcept { job->take_step(step); }

void Job::take_step(Step step) {
  switch (step) {
    case Step::kCompete:
      compete();
      break;
    case Step::kPlan:
      plan();
      break;
    case Step::kPeriodDue:
      on_period_due();
      break;
    case Step::kMaxRun:
      on_max_run();
      break;
  }
}

void Job::wake_at(steady_clock::time_point at, Step step) {
  wake_timeout_.cancel();
  wake_.step = step;
  wake_timeout_ = host_.at(wake_, at);
}

void Job::wake_at_store(system_clock::time_point t) {
  // The estimate decides only when to ask; the store decides whether the
  // period is due (a kNotDue claim corrects the estimate).
  auto left = t - store_now();
  if (left <= system_clock::duration::zero()) {
    claim_target();
    return;
  }
  wake_at(steady_clock::now() + duration_cast<steady_clock::duration>(left), Step::kPeriodDue);
}

// ------------------------------------------------------------- standby

void Job::compete() {
  if (over_) return;
  if (cancelled()) {
    finish();
    return;
  }
  // Standby: wait for the lease as long as a lease lasts, again and again;
  // the wait queue wakes us on a release notice or the holder's ttl.
  detail::LockSpec spec;
  spec.key = key_;
  spec.ttl = options_.lease;
  spec.retries = Retries(forever).count();
  spec.wait = options_.lease;
  try {
    ticket_ = host_.acquire(std::move(spec), [self = shared_from_this()](std::exception_ptr e, LockHandle h) {
      self->post([self, e, h = std::move(h)]() mutable { self->on_acquired(e, std::move(h)); });
    });
  } catch (const RuntimeStopped&) {
    finish();
  } catch (...) {
    host_.job_events().log(LogLevel::kError,
                     fmt::format("job '{}': cannot compete for its lease: {}", name_, what_of_current()));
    finish();
  }
}

void Job::on_acquired(std::exception_ptr error, LockHandle h) {
  ticket_ = AcquireTicket();
  if (over_) return;
  if (!error) {
    lead(std::move(h));
    return;
  }
  try {
    std::rethrow_exception(error);
  } catch (const LockNotAcquired&) {
    compete();  // someone else leads; wait again
  } catch (const RuntimeStopped&) {
    finish();
  } catch (const Cancelled&) {
    finish();
  } catch (...) {
    if (cancelled()) {
      finish();
      return;
    }
    auto backoff = std::clamp(options_.lease / 4, milliseconds(50), milliseconds(1000));
    wake_at(steady_clock::now() + backoff, Step::kCompete);
  }
}

// -------------------------------------------------------------- leading

void Job::lead(LockHandle h) {
  handle_ = std::move(h);
  token_ = host_.owner_token(handle_.lease());  // set at grant, read-only after
  leader_.store(true, std::memory_order_release);
  metrics_->leaders.fetch_add(1, std::memory_order_relaxed);
  lost_watch_ = handle_.lease().on_lost([self = shared_from_this()](std::optional<LostReason> reason) {
    if (reason) self->post([self] { self->on_lease_lost(); });
  });
  clock_known_ = false;
  done_upto_.reset();
  plan();
}

void Job::plan() {
  if (over_) return;
  if (cancelled() || lease_lost()) {
    stop_leading();
    return;
  }
  if (!clock_known_) {
    fetch_store_time();
    return;
  }
  auto now = store_now();
  auto cur = schedule_->latest(now);
  std::optional<std::int64_t> target;
  if (cur && (!done_upto_ || *cur > *done_upto_)) {
    bool late = options_.misfire == Misfire::kSkip && now - schedule_->start(*cur) > options_.misfire_grace;
    target = late ? schedule_->next(*cur) : cur;
  } else {
    auto after = done_upto_ ? (cur ? std::max(*cur, *done_upto_) : *done_upto_) : cur.value_or(0);
    target = schedule_->next(after);
  }
  if (!target) {
    host_.job_events().log(LogLevel::kError, fmt::format("job '{}' has no next period; it stops here", name_));
    {
      std::lock_guard lk(mu_);
      cancelled_ = true;
    }
    stop_leading();
    return;
  }
  target_ = *target;
  wake_at_store(schedule_->start(target_));
}

void Job::on_period_due() {
  if (cancelled() || lease_lost()) {
    stop_leading();
    return;
  }
  wake_at_store(schedule_->start(target_));
}

void Job::fetch_store_time() {
  auto sent = local_now();
  claims_->server_time([self = shared_from_this(), sent](system_clock::time_point t, const StoreError* e) {
    if (self->over_) return;
    if (e) {
      auto backoff = std::clamp(self->options_.lease / 4, milliseconds(20), milliseconds(500));
      self->wake_at(steady_clock::now() + backoff, Step::kPlan);
      return;
    }
    self->learn_store_time(t, sent);
    self->clock_known_ = true;
    self->plan();
  });
}

void Job::claim_target() {
  auto sent = local_now();
  claims_->claim_period(lock_name_, token_, target_, schedule_->start(target_),
                        [self = shared_from_this(), sent](const ClaimResult& r) { self->on_claim(r, sent); });
}

void Job::on_claim(const ClaimResult& r, system_clock::time_point sent) {
  if (over_) return;
  if (r.status != ClaimResult::Status::kFailed) learn_store_time(r.store_time, sent);
  switch (r.status) {
    case ClaimResult::Status::kClaimed:
      if (cancelled() || lease_lost()) {
        stop_leading();  // claimed as we stopped: the period is the next leader's loss, never run twice
        return;
      }
      run_target();
      return;
    case ClaimResult::Status::kAlreadyRun:
      done_upto_ = std::max(done_upto_.value_or(r.last), r.last);
      plan();
      return;
    case ClaimResult::Status::kNotDue:
      plan();  // the estimate was early; it was corrected from the reply
      return;
    case ClaimResult::Status::kNotLeader:
      stop_leading();
      return;
    case ClaimResult::Status::kFailed: {
      auto backoff = std::clamp(options_.lease / 4, milliseconds(20), milliseconds(500));
      wake_at(steady_clock::now() + backoff, Step::kPlan);
      return;
    }
  }
}

void Job::run_target() {
  auto stop = std::make_shared<std::stop_source>();
  {
    std::lock_guard lk(mu_);
    if (cancelled_) stop->request_stop();
    run_stop_ = stop;
  }
  running_ = true;
  const std::int64_t period = target_;
  if (options_.max_run > milliseconds(0)) {  // asked to stop after max_run
    max_run_stop_ = stop;
    max_run_.step = Step::kMaxRun;
    max_run_timeout_ = host_.at(max_run_, steady_clock::now() + options_.max_run);
  }
  host_.job_events().run_started(name_, period);
  // The handle is held until the run is over (no step releases it while
  // one runs).
  auto work = [self = shared_from_this(), stop, period, lease_ptr = &handle_.lease()] {
    const Lease& lease = *lease_ptr;
    std::stop_callback on_lost(lease.stop_token(), [&stop] { stop->request_stop(); });
    JobRun info(self->name_, period, self->schedule_->start(period), lease, stop->get_token());
    std::string error;
    self->host_.with_lease(lease, [&] {
      const Job* outer = running_job;
      running_job = self.get();
      try {
        self->body_(info);
      } catch (...) {
        error = what_of_current();
      }
      running_job = outer;
    });
    self->post([self, period, error = std::move(error)] { self->on_run_done(period, error); });
  };
  try {
    host_.run_on_pool(work);
  } catch (...) {
    // The pool stopped (the runtime is stopping): the claimed period runs
    // on a thread of its own rather than be lost (never on the loop).
    try {
      std::thread(work).detach();
    } catch (...) {
      on_run_done(period, "no thread could run it");
    }
  }
}

void Job::on_max_run() {
  if (max_run_stop_) max_run_stop_->request_stop();
}

void Job::on_run_done(std::int64_t period, const std::string& error) {
  running_ = false;
  max_run_timeout_.cancel();
  max_run_stop_.reset();
  {
    std::lock_guard lk(mu_);
    run_stop_.reset();
  }
  (error.empty() ? metrics_->runs_ok : metrics_->runs_error).fetch_add(1, std::memory_order_relaxed);
  host_.job_events().run_finished(name_, period, error);
  done_upto_ = period;
  plan();
}

void Job::on_lease_lost() {
  if (over_ || !handle_ || running_) return;  // a run ends first: its end goes on from there
  // Sleeping (or between steps): go on at once; the step sees the loss.
  if (wake_timeout_.cancel()) take_step(wake_.step);
}

void Job::on_cancel() {
  if (over_) return;
  if (ticket_) ticket_.cancel();  // its handler ends the job
  if (running_) return;           // asked to stop; its end goes on from there
  if (wake_timeout_.cancel()) take_step(wake_.step);  // every step starts by checking
}

void Job::stop_leading() {
  wake_timeout_.cancel();
  if (!handle_) {
    if (cancelled()) {
      finish();
    } else {
      compete();
    }
    return;
  }
  lost_watch_.cancel();
  lost_watch_ = LeaseWatch();
  leader_.store(false, std::memory_order_release);
  metrics_->leaders.fetch_sub(1, std::memory_order_relaxed);
  // Released so another process takes over at once; then compete again,
  // or stop.
  LockHandle h = std::move(handle_);
  h.release([self = shared_from_this()](std::error_code) {
    self->post([self] {
      if (self->cancelled())
        self->finish();
      else
        self->compete();
    });
  });
}

void Job::finish() noexcept {
  if (over_) return;
  over_ = true;
  wake_timeout_.cancel();
  max_run_timeout_.cancel();
  leader_.store(false, std::memory_order_release);
  {
    std::lock_guard lk(mu_);
    finished_ = true;
  }
  cv_.notify_all();
}

}  // namespace detail

// ---------------------------------------------------------------- public

bool JobHandle::is_leader() const noexcept { return job_ && job_->leader(); }

void JobHandle::cancel() noexcept {
  if (!job_) return;
  job_->request_cancel();
  job_->join();
}

Scheduler::Scheduler() : Scheduler(Runtime::default_runtime()) {}

Scheduler::Scheduler(Runtime& runtime) : impl_(std::make_unique<Impl>(runtime)) {}

Scheduler::~Scheduler() {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard lk(impl_->mu);
    impl_->closed = true;
    jobs = impl_->jobs;
  }
  // Every job stops taking new runs at once; then each is awaited (its
  // run asked to stop and finished, its lease released).
  for (auto& j : jobs) j->request_cancel();
  for (auto& j : jobs) j->join();
}

std::shared_ptr<Job> Scheduler::Impl::add(std::string name, std::unique_ptr<detail::Schedule> schedule, Body body,
                               const JobOptions& options) {
  if (name.empty()) throw InvalidArgument("a job's name is empty");
  if (!body) throw InvalidArgument(fmt::format("job '{}' has no callable", name));
  if (options.max_run < milliseconds(0)) throw InvalidArgument("JobOptions::max_run must not be negative");
  if (options.misfire_grace < milliseconds(0)) throw InvalidArgument("JobOptions::misfire_grace must not be negative");
  // The lease is a lock like any other: its key and ttl are checked alike.
  detail::LockSpec spec;
  spec.key = "job:" + name;
  spec.ttl = options.lease;
  detail::JobHost::of(runtime).check_lease(spec);
  auto job = std::make_shared<Job>(runtime, name, std::move(schedule), std::move(body), options, skew);
  {
    std::lock_guard lk(mu);
    if (closed) throw RuntimeStopped("the scheduler is being destroyed");
    for (auto& j : jobs)
      if (j->name() == name) throw InvalidArgument(fmt::format("job '{}' is declared twice", name));
    jobs.push_back(job);
    job->start();
  }
  return job;
}

JobHandle Scheduler::add_every(milliseconds period, std::string name, Body body, const JobOptions& options) {
  if (period <= milliseconds(0))
    throw InvalidArgument(fmt::format("job '{}': the period must be positive, got {} ms", name, period.count()));
  return JobHandle(impl_->add(std::move(name), std::make_unique<detail::EverySchedule>(period, options.offset),
                              std::move(body), options));
}

JobHandle Scheduler::add_cron(std::string expression, std::string name, Body body, const JobOptions& options) {
  auto expr = detail::CronExpr::parse(expression);
  return JobHandle(
      impl_->add(std::move(name), std::make_unique<detail::CronSchedule>(std::move(expr)), std::move(body), options));
}

}  // namespace lockwatch

// ------------------------------------------------- once per period, from cron

namespace lockwatch {

namespace {

// One claim of the current period, on the loop thread: the store's clock,
// then the claim of the period that clock is in. A claim found not due
// (the store's clock stepped back between the two, or a quorum's members
// disagree) is retried for the period its reply's clock is in, a few times.
struct OnceClaim : std::enable_shared_from_this<OnceClaim> {
  static constexpr int kAttempts = 3;

  OnceClaim(detail::JobHost& h, detail::JobClaims& c, std::string k, std::unique_ptr<detail::Schedule> s)
      : host(h), claims(c), key(std::move(k)), schedule(std::move(s)) {}

  void start() {
    claims.server_time([self = shared_from_this()](system_clock::time_point now, const detail::StoreError* e) {
      if (e) {
        self->promise.set_exception(detail::to_exception(*e));
        return;
      }
      self->claim_at(now);
    });
  }

  void claim_at(system_clock::time_point now) {
    auto period = schedule->latest(now);
    if (!period) {
      promise.set_exception(
          std::make_exception_ptr(InvalidArgument(fmt::format("'{}': the schedule has no period in reach", key))));
      return;
    }
    ++attempts;
    claims.claim_period(name, token, *period, schedule->start(*period),
                        [self = shared_from_this(), period = *period](const ClaimResult& r) { self->on_claim(r, period); });
  }

  void on_claim(const ClaimResult& r, std::int64_t period) {
    PeriodClaim out;
    out.period = period;
    out.scheduled_for = schedule->start(period);
    switch (r.status) {
      case ClaimResult::Status::kClaimed:
        out.claimed = true;
        out.last_run = period;
        promise.set_value(out);
        return;
      case ClaimResult::Status::kAlreadyRun:
        out.last_run = std::max(r.last, period);
        promise.set_value(out);
        return;
      case ClaimResult::Status::kNotDue:
        if (attempts < kAttempts) {
          claim_at(r.store_time);
          return;
        }
        promise.set_exception(std::make_exception_ptr(
            InvalidArgument(fmt::format("'{}': the store's clock does not settle on a period", key))));
        return;
      case ClaimResult::Status::kNotLeader:
        promise.set_exception(std::make_exception_ptr(
            LeaseLost(key, LostReason::kExpired, "the store no longer held the lock when its period was claimed")));
        return;
      case ClaimResult::Status::kFailed:
        promise.set_exception(detail::to_exception(r.error));
        return;
    }
  }

  detail::JobHost& host;
  detail::JobClaims& claims;
  const std::string key;
  std::string name;   // the store's name for key
  std::string token;  // the holder's owner token
  const std::unique_ptr<detail::Schedule> schedule;
  std::promise<PeriodClaim> promise;
  int attempts = 0;
};

std::future<PeriodClaim> claim_current(Runtime& runtime, const LockHandle& held,
                                       std::unique_ptr<detail::Schedule> schedule) {
  if (!held) throw InvalidArgument("claiming a period needs a held lock; the handle is empty");
  auto& host = detail::JobHost::of(runtime);
  const Lease& lease = held.lease();
  auto claim = std::make_shared<OnceClaim>(host, host.job_claims(), lease.key(), std::move(schedule));
  claim->name = host.store_name(lease.key());
  claim->token = host.owner_token(lease);
  auto future = claim->promise.get_future();
  if (!host.post([claim] { claim->start(); })) throw RuntimeStopped("lockwatch runtime is stopping");
  return future;
}

}  // namespace

std::future<PeriodClaim> claim_period(Runtime& runtime, const LockHandle& held, milliseconds period,
                                      milliseconds offset) {
  if (period <= milliseconds(0))
    throw InvalidArgument(fmt::format("the period must be positive, got {} ms", period.count()));
  return claim_current(runtime, held, std::make_unique<detail::EverySchedule>(period, offset));
}

std::future<PeriodClaim> claim_cron_period(Runtime& runtime, const LockHandle& held, std::string_view expression) {
  return claim_current(runtime, held, std::make_unique<detail::CronSchedule>(detail::CronExpr::parse(expression)));
}

}  // namespace lockwatch

namespace lockwatch::detail {
void SchedulerAccess::set_clock_skew(Scheduler& s, std::chrono::milliseconds skew) { s.impl_->skew = skew; }
}  // namespace lockwatch::detail
