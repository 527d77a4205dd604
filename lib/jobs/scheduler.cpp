// Scheduled jobs (lockwatch/scheduler.hpp) on the runtime's leases.
//
// Each job has one thread that moves between two states:
// - standby: Runtime::acquire("job:<name>", lease, forever, wait = lease),
//   again and again: the runtime's wait queue wakes it on a release notice
//   or the holder's ttl, so a standby costs one request per lease at most;
// - leader: it holds the LockHandle (the watchdog renews it) and sleeps on
//   a condition variable until the next period starts by its estimate of
//   the store's clock, then claims the period (store/lock_store.hpp,
//   claim_period: lease check, store clock and at-most-once in one step)
//   and, if claimed, runs the callable on the runtime's pool with
//   this_lease() bound, supervising it (max_run, cancel, lease loss).
// The clock estimate is an offset from the local system clock, measured
// at each claim and TIME request: an estimate only decides when to ask;
// the store decides whether the period is due.
#include "jobs/scheduler_impl.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error_values.hpp"
#include "core/thread_name.hpp"
#include "runtime/runtime_impl.hpp"

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
    : runtime_(runtime),
      impl_(RuntimeAccess::impl(runtime)),
      name_(std::move(name)),
      key_("job:" + name_),
      schedule_(std::move(schedule)),
      body_(std::move(body)),
      options_(options),
      skew_(skew),
      metrics_(impl_.events.metrics().job(name_)) {
  lock_name_ = impl_.store->encode(key_);
}

void Job::start() {
  thread_ = std::thread([this] { main(); });
  detail::name_thread(thread_, "lw-job");
}

void Job::request_cancel() noexcept {
  std::lock_guard lk(mu_);
  cancelled_ = true;
  if (run_stop_) run_stop_->request_stop();
  cv_.notify_all();
}

void Job::join() noexcept {
  if (running_job == this) return;  // from inside our own run: only asked
  std::lock_guard lk(join_mu_);
  if (thread_.joinable()) thread_.join();
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

bool Job::sleep_until_store(system_clock::time_point store_time, const Lease* lease) {
  std::unique_lock lk(mu_);
  for (;;) {
    if (cancelled_ || (lease && lease->lost())) return false;
    auto left = store_time - store_now();
    if (left <= system_clock::duration::zero()) return true;
    cv_.wait_for(lk, left);
  }
}

bool Job::wait_for_lease(std::future<LockHandle>& f) {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      if (cancelled_) return false;
    }
    // The runtime answers the acquisition within its wait (the lease);
    // checking the cancel flag in between keeps cancel() prompt.
    if (f.wait_for(milliseconds(50)) == std::future_status::ready) return true;
  }
}

template <class T, class Start>
std::optional<T> Job::on_loop(Start start) {
  auto p = std::make_shared<std::promise<T>>();
  auto f = p->get_future();
  if (!impl_.loop.post([this, p, start]() mutable { start(*impl_.store, [p](T v) { p->set_value(std::move(v)); }); }))
    return std::nullopt;
  // Every store request completes (by reply or command timeout); the bound
  // only guards against a stopped loop.
  if (f.wait_for(impl_.options.command_timeout * 3 + seconds(5)) != std::future_status::ready) return std::nullopt;
  return f.get();
}

std::optional<system_clock::time_point> Job::fetch_store_time() {
  using R = std::pair<system_clock::time_point, bool>;  // the store's time, failed
  auto sent = local_now();
  auto r = on_loop<R>([](LockStore& s, auto done) {
    s.server_time([done](system_clock::time_point t, const StoreError* e) { done(R{t, e != nullptr}); });
  });
  if (!r || r->second) return std::nullopt;
  learn_store_time(r->first, sent);
  return r->first;
}

ClaimResult Job::claim(const std::string& token, std::int64_t period) {
  auto sent = local_now();
  auto start = schedule_->start(period);
  auto r = on_loop<ClaimResult>([this, token, period, start](LockStore& s, auto done) {
    s.claim_period(lock_name_, token, period, start, [done](const ClaimResult& c) { done(c); });
  });
  if (!r) {
    ClaimResult out;
    out.error.message = "lockwatch runtime is stopping";
    return out;
  }
  if (r->status != ClaimResult::Status::kFailed) learn_store_time(r->store_time, sent);
  return *r;
}

void Job::main() {
  const auto backoff = std::clamp(options_.lease / 4, milliseconds(50), milliseconds(1000));
  while (!cancelled()) {
    std::future<LockHandle> f;
    try {
      f = runtime_.acquire(key_, options_.lease, forever, options_.lease);
    } catch (const RuntimeStopped&) {
      return;
    } catch (...) {
      impl_.events.log(LogLevel::kError, fmt::format("job '{}': cannot compete for its lease: {}", name_,
                                                     what_of_current()));
      return;
    }
    if (!wait_for_lease(f)) return;  // cancelled; a late grant is released with the future
    LockHandle h;
    try {
      h = f.get();
    } catch (const LockNotAcquired&) {
      continue;  // someone else leads; wait again
    } catch (const RuntimeStopped&) {
      return;
    } catch (...) {
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, backoff, [this] { return cancelled_; });
      continue;
    }
    lead(h);
    try {
      auto released = h.release();
      released.wait_for(impl_.options.command_timeout * 2 + seconds(1));
    } catch (...) {
    }
  }
}

void Job::lead(LockHandle& h) {
  const Lease& lease = h.lease();
  // The handle's lease is the runtime's record of it (the scope below
  // needs the record to bind this_lease() on the pool thread).
  auto* record = const_cast<LeaseRecord*>(static_cast<const LeaseRecord*>(&lease));
  std::string token = record->token.str();  // set at grant, read-only after
  leader_.store(true, std::memory_order_release);
  metrics_->leaders.fetch_add(1, std::memory_order_relaxed);
  std::stop_callback wake(lease.stop_token(), [this] {
    std::lock_guard lk(mu_);
    cv_.notify_all();
  });
  const auto backoff = std::clamp(options_.lease / 4, milliseconds(20), milliseconds(500));
  auto pause = [&] {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, backoff, [&] { return cancelled_ || lease.lost(); });
  };

  std::optional<std::int64_t> done_upto;  // the last period run, as far as we know
  bool clock_known = fetch_store_time().has_value();
  while (!cancelled() && !lease.lost()) {
    if (!clock_known) {
      clock_known = fetch_store_time().has_value();
      if (!clock_known) {
        pause();
        continue;
      }
    }
    auto now = store_now();
    auto cur = schedule_->latest(now);
    std::optional<std::int64_t> target;
    if (cur && (!done_upto || *cur > *done_upto)) {
      bool late = options_.misfire == Misfire::kSkip && now - schedule_->start(*cur) > options_.misfire_grace;
      target = late ? schedule_->next(*cur) : cur;
    } else {
      auto after = done_upto ? (cur ? std::max(*cur, *done_upto) : *done_upto) : cur.value_or(0);
      target = schedule_->next(after);
    }
    if (!target) {
      impl_.events.log(LogLevel::kError, fmt::format("job '{}' has no next period; it stops here", name_));
      break;
    }
    if (!sleep_until_store(schedule_->start(*target), &lease)) break;
    auto r = claim(token, *target);
    switch (r.status) {
      case ClaimResult::Status::kClaimed:
        run(*target, lease, record);
        done_upto = *target;
        break;
      case ClaimResult::Status::kAlreadyRun:
        done_upto = std::max(done_upto.value_or(r.last), r.last);
        break;
      case ClaimResult::Status::kNotDue:
        break;  // the estimate was early; it was corrected from the reply
      case ClaimResult::Status::kNotLeader:
        goto out;
      case ClaimResult::Status::kFailed:
        pause();
        break;
    }
  }
out:
  leader_.store(false, std::memory_order_release);
  metrics_->leaders.fetch_sub(1, std::memory_order_relaxed);
}

void Job::run(std::int64_t period, const Lease& lease, LeaseRecord* record) {
  std::stop_source stop;
  {
    std::lock_guard lk(mu_);
    if (cancelled_) stop.request_stop();
    run_stop_ = &stop;
  }
  std::stop_callback on_lost(lease.stop_token(), [&stop] { stop.request_stop(); });
  JobRun info(name_, period, schedule_->start(period), lease, stop.get_token());
  impl_.events.run_started(name_, period);
  std::promise<std::string> finished;
  auto result = finished.get_future();
  auto work = [this, &info, &finished, record] {
    std::string error;
    {
      ThreadLeaseScope scope(&impl_, record);
      const Job* outer = running_job;
      running_job = this;
      try {
        body_(info);
      } catch (...) {
        error = what_of_current();
      }
      running_job = outer;
    }
    finished.set_value(std::move(error));
  };
  try {
    impl_.pool.post(work);
  } catch (...) {
    work();  // the pool stopped: run here rather than lose a claimed period
  }
  if (options_.max_run > milliseconds(0) && result.wait_for(options_.max_run) != std::future_status::ready)
    stop.request_stop();
  std::string error = result.get();
  {
    std::lock_guard lk(mu_);
    run_stop_ = nullptr;
  }
  (error.empty() ? metrics_->runs_ok : metrics_->runs_error).fetch_add(1, std::memory_order_relaxed);
  impl_.events.run_finished(name_, period, error);
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
  auto& rt = detail::RuntimeAccess::impl(runtime);
  rt.validate(spec);
  if (rt.stopping.load()) throw RuntimeStopped("lockwatch runtime is stopping");
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

namespace lockwatch::detail {
void SchedulerAccess::set_clock_skew(Scheduler& s, std::chrono::milliseconds skew) { s.impl_->skew = skew; }
}  // namespace lockwatch::detail
