#include "support/memory_store.hpp"

#include <algorithm>


namespace lockwatch::testing {

using detail::Acquired;
using detail::LockInfo;
using detail::LockRef;
using detail::Released;
using detail::Renewed;
using std::chrono::milliseconds;

// ------------------------------------------------------------------ backend

MemoryBackend::Clock::time_point MemoryBackend::now() const {
  std::lock_guard lk(mu_);
  return Clock::now() + offset_;
}

void MemoryBackend::advance(milliseconds d) {
  std::lock_guard lk(mu_);
  offset_ += d;
}

std::chrono::system_clock::time_point MemoryBackend::system_now() const {
  std::lock_guard lk(mu_);
  return std::chrono::system_clock::now() + offset_;
}

std::optional<std::int64_t> MemoryBackend::last_period(const std::string& name) const {
  std::lock_guard lk(mu_);
  auto it = periods_.find(name);
  if (it == periods_.end()) return std::nullopt;
  return it->second;
}

detail::ClaimResult MemoryBackend::claim(const std::string& name, const std::string& token, std::int64_t period,
                                         std::chrono::system_clock::time_point start) {
  std::lock_guard lk(mu_);
  detail::ClaimResult out;
  using S = detail::ClaimResult::Status;
  out.store_time = std::chrono::system_clock::now() + offset_;
  if (!held(name, Clock::now() + offset_) || locks_.at(name).owner != token) {
    out.status = S::kNotLeader;
  } else if (out.store_time < start) {
    out.status = S::kNotDue;
  } else if (auto it = periods_.find(name); it != periods_.end() && it->second >= period) {
    out.status = S::kAlreadyRun;
    out.last = it->second;
  } else {
    periods_[name] = period;
    out.status = S::kClaimed;
    out.last = period;
  }
  return out;
}

bool MemoryBackend::held(const std::string& name, Clock::time_point now) const {
  auto it = locks_.find(name);
  return it != locks_.end() && it->second.expires > now;
}

std::optional<std::string> MemoryBackend::owner(const std::string& name) const {
  std::lock_guard lk(mu_);
  if (!held(name, Clock::now() + offset_)) return std::nullopt;
  return locks_.at(name).owner;
}

std::uint64_t MemoryBackend::fence(const std::string& name) const {
  std::lock_guard lk(mu_);
  auto it = fences_.find(name);
  return it == fences_.end() ? 0 : it->second;
}

milliseconds MemoryBackend::ttl_left(const std::string& name) const {
  std::lock_guard lk(mu_);
  auto now = Clock::now() + offset_;
  if (!held(name, now)) return milliseconds(0);
  return std::chrono::duration_cast<milliseconds>(locks_.at(name).expires - now);
}

void MemoryBackend::set_owner(const std::string& name, const std::string& token, milliseconds ttl) {
  std::lock_guard lk(mu_);
  locks_[name] = Lock{token, Clock::now() + offset_ + ttl};
}

void MemoryBackend::erase(const std::string& name) {
  std::lock_guard lk(mu_);
  locks_.erase(name);
}

void MemoryBackend::release_as_other(const std::string& name) {
  std::lock_guard lk(mu_);
  locks_.erase(name);
  notify(name);
}

void MemoryBackend::hand_over(const std::string& name, const std::string& next_token, milliseconds ttl) {
  std::lock_guard lk(mu_);
  locks_[name] = Lock{next_token, Clock::now() + offset_ + ttl};
  notify(name);
}

void MemoryBackend::notify(const std::string& name) {
  auto it = subscribers_.find(name);
  if (it == subscribers_.end()) return;
  for (MemoryStore* s : it->second) s->notice(name);
}

Acquired MemoryBackend::acquire(const LockRef& lock) {
  std::lock_guard lk(mu_);
  auto now = Clock::now() + offset_;
  std::string name(lock.name);
  Acquired out;
  if (held(name, now)) {
    out.status = Acquired::Status::kBusy;
    out.busy_for = std::chrono::ceil<milliseconds>(locks_.at(name).expires - now);
    return out;
  }
  locks_[name] = Lock{std::string(lock.token), now + lock.ttl};
  out.status = Acquired::Status::kTaken;
  out.fence = ++fences_[name];
  return out;
}

Renewed MemoryBackend::renew(const LockRef& lock) {
  std::lock_guard lk(mu_);
  auto now = Clock::now() + offset_;
  std::string name(lock.name);
  if (!held(name, now)) return Renewed::kGone;
  auto& l = locks_.at(name);
  if (l.owner != lock.token) return Renewed::kTakenByOther;
  l.expires = now + lock.ttl;
  return Renewed::kYes;
}

Released MemoryBackend::release(const LockRef& lock, bool notify_waiters) {
  std::lock_guard lk(mu_);
  auto now = Clock::now() + offset_;
  std::string name(lock.name);
  if (!held(name, now)) return Released::kGone;
  if (locks_.at(name).owner != lock.token) return Released::kTakenByOther;
  locks_.erase(name);
  if (notify_waiters) notify(name);
  return Released::kYes;
}

void MemoryBackend::raise(const std::string& name, std::uint64_t fence) {
  std::lock_guard lk(mu_);
  auto& f = fences_[name];
  f = std::max(f, fence);
}

std::uint64_t MemoryBackend::reserve(const detail::LockRef& lock, std::uint32_t n) {
  std::lock_guard lk(mu_);
  std::string name(lock.name);
  if (!held(name, Clock::now() + offset_) || locks_.at(name).owner != lock.token) return 0;
  return fences_[name] += n;
}

LockInfo MemoryBackend::inspect(const std::string& name) const {
  std::lock_guard lk(mu_);
  auto now = Clock::now() + offset_;
  LockInfo info;
  if (held(name, now)) {
    info.held = true;
    info.owner = locks_.at(name).owner;
    info.ttl = std::chrono::duration_cast<milliseconds>(locks_.at(name).expires - now);
  }
  if (auto it = fences_.find(name); it != fences_.end()) info.fencing_token = it->second;
  return info;
}

bool MemoryBackend::force_release(const std::string& name) {
  std::lock_guard lk(mu_);
  bool was = held(name, Clock::now() + offset_);
  locks_.erase(name);
  notify(name);
  return was;
}

void MemoryBackend::subscribe(MemoryStore* client, const std::string& name) {
  std::lock_guard lk(mu_);
  subscribers_[name].insert(client);
}

void MemoryBackend::unsubscribe(MemoryStore* client, const std::string& name) {
  std::lock_guard lk(mu_);
  if (auto it = subscribers_.find(name); it != subscribers_.end()) {
    it->second.erase(client);
    if (it->second.empty()) subscribers_.erase(it);
  }
}

void MemoryBackend::detach(MemoryStore* client) {
  std::lock_guard lk(mu_);
  for (auto it = subscribers_.begin(); it != subscribers_.end();) {
    it->second.erase(client);
    it = it->second.empty() ? subscribers_.erase(it) : std::next(it);
  }
}

// ------------------------------------------------------------------- script

void StoreScript::set_down(bool down) {
  std::lock_guard lk(mu_);
  down_ = down;
}

void StoreScript::set_delay(milliseconds d) {
  std::lock_guard lk(mu_);
  delay_ = d;
}

void StoreScript::set_delay(Op op, milliseconds d) {
  std::lock_guard lk(mu_);
  op_delay_[op] = d;
}

void StoreScript::lose_replies(Op op, int n) {
  std::lock_guard lk(mu_);
  lose_[op] = n;
}

void StoreScript::script_acquire(std::function<std::optional<Acquired>(const std::string&)> fn) {
  std::lock_guard lk(mu_);
  acquire_fn_ = std::move(fn);
}

void StoreScript::script_renew(std::function<std::optional<Renewed>(const std::string&)> fn) {
  std::lock_guard lk(mu_);
  renew_fn_ = std::move(fn);
}

void StoreScript::script_release(std::function<std::optional<Released>(const std::string&)> fn) {
  std::lock_guard lk(mu_);
  release_fn_ = std::move(fn);
}

std::vector<StoreScript::Call> StoreScript::calls() const {
  std::lock_guard lk(mu_);
  return calls_;
}

std::size_t StoreScript::count(Op op) const {
  std::lock_guard lk(mu_);
  return static_cast<std::size_t>(std::count_if(calls_.begin(), calls_.end(), [op](const Call& c) { return c.op == op; }));
}

std::size_t StoreScript::locks(Op op) const {
  std::lock_guard lk(mu_);
  std::size_t n = 0;
  for (const auto& c : calls_)
    if (c.op == op) n += c.batch;
  return n;
}

bool StoreScript::wait_for(Op op, std::size_t n, milliseconds bound) const {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, bound, [&] {
    return static_cast<std::size_t>(std::count_if(calls_.begin(), calls_.end(),
                                                  [op](const Call& c) { return c.op == op; })) >= n;
  });
}

StoreScript::Plan StoreScript::plan(Op op, const std::string& name, std::size_t batch) {
  std::lock_guard lk(mu_);
  calls_.push_back(Call{op, name, Clock::now(), batch});
  cv_.notify_all();
  Plan p;
  p.down = down_;
  p.delay = delay_;
  if (auto it = op_delay_.find(op); it != op_delay_.end()) p.delay = it->second;
  if (auto it = lose_.find(op); it != lose_.end() && it->second > 0) {
    it->second--;
    p.lose = true;
  }
  return p;
}

std::optional<Acquired> StoreScript::scripted_acquire(const std::string& name) {
  std::lock_guard lk(mu_);
  return acquire_fn_ ? acquire_fn_(name) : std::nullopt;
}
std::optional<Renewed> StoreScript::scripted_renew(const std::string& name) {
  std::lock_guard lk(mu_);
  return renew_fn_ ? renew_fn_(name) : std::nullopt;
}
std::optional<Released> StoreScript::scripted_release(const std::string& name) {
  std::lock_guard lk(mu_);
  return release_fn_ ? release_fn_(name) : std::nullopt;
}

// -------------------------------------------------------------------- store

MemoryStore::MemoryStore(detail::Loop& loop, std::shared_ptr<MemoryBackend> backend,
                         std::shared_ptr<StoreScript> script, std::string prefix)
    : LockStore(detail::StoreTraits{
          .keys = detail::KeyRules{.prefix = std::move(prefix),
                                   .problem = [](std::string_view, std::string_view key) noexcept -> const char* {
                                     if (!key.starts_with("refused:")) return nullptr;
                                     return "this store refuses keys starting with 'refused:'";
                                   }},
          .release_events = script->release_events(),
          .expiry = {.slack = script->expiry_slack(), .bounded = script->expiry_bounded()}}),
      loop_(loop), backend_(std::move(backend)), script_(std::move(script)) {
  offer({.fence_raising = this, .job_claims = this, .operator_tools = this, .token_blocks = this});
}

MemoryStore::~MemoryStore() {
  alive_->store(false);
  backend_->detach(this);
}

void MemoryStore::start(detail::StoreEvents events) { events_ = std::move(events); }

detail::StoreError MemoryStore::down_error() {
  return detail::StoreError::unavailable("memory", "the store is down");
}

void MemoryStore::deliver(milliseconds delay, std::function<void()> answer) {
  if (delay.count() <= 0 || closed_) {
    loop_.post(std::move(answer));  // refused only once the loop shuts down, after close()
    return;
  }
  struct Timer {
    uv_timer_t handle;
    std::function<void()> answer;
  };
  auto* t = new Timer{{}, std::move(answer)};
  uv_timer_init(loop_.uv(), &t->handle);
  t->handle.data = t;
  uv_timer_start(
      &t->handle,
      [](uv_timer_t* h) {
        auto* t = static_cast<Timer*>(h->data);
        auto answer = std::move(t->answer);
        uv_close(reinterpret_cast<uv_handle_t*>(h), [](uv_handle_t* h) { delete static_cast<Timer*>(h->data); });
        answer();
      },
      static_cast<uint64_t>(delay.count()), 0);
}

// A delayed request is processed when its answer is due, as by a server
// with a queue in front of it; a lost reply was processed, but its answer
// is a connection error.
void MemoryStore::acquire(std::span<const LockRef> locks, AcquireDone done) {
  auto plan = script_->plan(Op::kAcquire, locks.empty() ? std::string() : std::string(locks[0].name), locks.size());
  std::vector<Owned> owned(locks.begin(), locks.end());
  deliver(plan.delay, [this, plan, owned = std::move(owned), done = std::move(done)] {
    for (std::size_t k = 0; k < owned.size(); ++k) {
      Acquired out;
      if (plan.down) {
        out.error = down_error();
      } else {
        auto scripted = script_->scripted_acquire(owned[k].name);
        out = scripted ? *scripted : backend_->acquire(owned[k].ref());
        if (plan.lose) out = Acquired{Acquired::Status::kFailed, 0, milliseconds(0), down_error()};
      }
      done(k, out);
    }
  });
}

std::size_t MemoryStore::renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive,
                               RenewDone done) {
  auto plan = script_->plan(Op::kRenew, locks.empty() ? std::string() : std::string(locks[0].name), locks.size());
  std::vector<Owned> owned(locks.begin(), locks.end());
  deliver(plan.delay, [this, plan, owned = std::move(owned), keepalive, done = std::move(done)] {
    const detail::StoreError why = plan.down   ? down_error()
                                   : plan.lose ? detail::StoreError::unavailable("memory", "the reply was lost")
                                               : detail::StoreError::refused("memory", "refused");
    for (std::size_t k = 0; k < owned.size(); ++k) {
      Renewed out = Renewed::kTransient;
      if (!plan.down) {
        auto scripted = script_->scripted_renew(owned[k].name);
        out = scripted ? *scripted : backend_->renew(owned[k].ref());
        if (plan.lose) out = Renewed::kTransient;
      }
      done(k, out, out == Renewed::kTransient ? &why : nullptr);
    }
  });
  return 1;
}

void MemoryStore::release(std::span<const LockRef> locks, bool notify, ReleaseDone done) {
  auto plan = script_->plan(Op::kRelease, locks.empty() ? std::string() : std::string(locks[0].name), locks.size());
  std::vector<Owned> owned(locks.begin(), locks.end());
  deliver(plan.delay, [this, plan, notify, owned = std::move(owned), done = std::move(done)] {
    const detail::StoreError why = detail::StoreError::unavailable("memory", "no answer");
    for (std::size_t k = 0; k < owned.size(); ++k) {
      Released out = Released::kUnconfirmed;
      if (!plan.down) {
        auto scripted = script_->scripted_release(owned[k].name);
        out = scripted ? *scripted : backend_->release(owned[k].ref(), notify);
        if (plan.lose) out = Released::kUnconfirmed;
      }
      done(k, out, out == Released::kUnconfirmed ? &why : nullptr);
    }
  });
}

void MemoryStore::raise_fence(std::string_view name, std::uint64_t fence, std::function<void(bool)> done) {
  auto plan = script_->plan(Op::kRaise, std::string(name), 1);
  if (!plan.down) backend_->raise(std::string(name), fence);
  bool ok = !plan.down && !plan.lose;
  deliver(plan.delay, [ok, done = std::move(done)] { done(ok); });
}

void MemoryStore::reserve_tokens(const detail::LockRef& lock, std::uint32_t n, ReserveDone done) {
  auto plan = script_->plan(Op::kReserve, std::string(lock.name), 1);
  std::uint64_t last = plan.down ? 0 : backend_->reserve(lock, n);
  const bool failed = plan.down || plan.lose;
  deliver(plan.delay, [last, failed, done = std::move(done)] {
    const detail::StoreError err = down_error();
    done(failed ? 0 : last, failed ? &err : nullptr);
  });
}

void MemoryStore::server_time(std::function<void(std::chrono::system_clock::time_point, const detail::StoreError*)> done) {
  auto plan = script_->plan(Op::kTime, std::string(), 1);
  auto now = backend_->system_now();
  const bool failed = plan.down || plan.lose;
  deliver(plan.delay, [now, failed, done = std::move(done)] {
    const detail::StoreError err = down_error();
    done(now, failed ? &err : nullptr);
  });
}

void MemoryStore::claim_period(std::string_view name, std::string_view token, std::int64_t period,
                               std::chrono::system_clock::time_point start,
                               std::function<void(const detail::ClaimResult&)> done) {
  auto plan = script_->plan(Op::kClaim, std::string(name), 1);
  detail::ClaimResult out;
  if (!plan.down) out = backend_->claim(std::string(name), std::string(token), period, start);
  if (plan.down || plan.lose) {
    out = detail::ClaimResult{};
    out.error = down_error();
  }
  deliver(plan.delay, [out, done = std::move(done)] { done(out); });
}

void MemoryStore::inspect(std::string_view name, std::function<void(const LockInfo&, const detail::StoreError*)> done) {
  auto plan = script_->plan(Op::kInspect, std::string(name), 1);
  LockInfo info = plan.down ? LockInfo{} : backend_->inspect(std::string(name));
  const bool failed = plan.down;
  deliver(plan.delay, [info, failed, done = std::move(done)] {
    const detail::StoreError err = down_error();
    done(info, failed ? &err : nullptr);
  });
}

void MemoryStore::force_release(std::string_view name, std::function<void(bool, const detail::StoreError*)> done) {
  auto plan = script_->plan(Op::kForceRelease, std::string(name), 1);
  bool held = plan.down ? false : backend_->force_release(std::string(name));
  const bool failed = plan.down;
  deliver(plan.delay, [held, failed, done = std::move(done)] {
    const detail::StoreError err = down_error();
    done(held, failed ? &err : nullptr);
  });
}

void MemoryStore::subscribe(std::string_view name) {
  if (!release_events()) return;
  std::string n(name);
  script_->plan(Op::kSubscribe, n, 1);
  if (!subscribed_.insert(n).second) return;
  backend_->subscribe(this, n);
  deliver(milliseconds(0), [this, n] {
    if (events_.subscribed && subscribed_.count(n)) events_.subscribed(n);
  });
}

void MemoryStore::unsubscribe(std::string_view name) {
  std::string n(name);
  if (subscribed_.erase(n) == 0) return;
  script_->plan(Op::kUnsubscribe, n, 1);
  backend_->unsubscribe(this, n);
}

void MemoryStore::notice(const std::string& name) {
  // From the backend, on whatever thread released: onto our loop.
  auto alive = alive_;
  loop_.post([this, alive, name] {
    if (alive->load() && !closed_ && events_.released) events_.released(name);
  });
}

void MemoryStore::drop_subscriptions() {
  for (const auto& n : subscribed_) backend_->unsubscribe(this, n);
  subscribed_.clear();
  if (events_.subscriptions_lost) events_.subscriptions_lost();
}

void MemoryStore::drop_subscriptions_soon() {
  loop_.post([this] {
    for (const auto& n : subscribed_) script_->plan(Op::kUnsubscribe, n, 1);
    drop_subscriptions();
  });
}

void MemoryStore::close() {
  closed_ = true;
  backend_->detach(this);
}

}  // namespace lockwatch::testing
