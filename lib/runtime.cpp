#include "runtime_impl.hpp"

namespace lockwatch {

using detail::LeaseRecord;
using detail::Acquisition;
using detail::KeyWaiters;
using detail::drift_for;
using detail::integer_at;
using detail::is_connection_error;
using detail::redis_key;
using detail::what_of;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

Retries::Retries(int count) : count_(count) {
  if (count < 0) throw InvalidArgument(fmt::format("retries must be >= 0 or lockwatch::forever, got {}", count));
}

void detail::Acquisition::run(Timeout) noexcept { rt->on_wait_expired(this); }
void detail::KeyWaiters::run(Timeout) noexcept { rt->attempt_head(channel); }
void detail::LeaseRecord::run(Timeout) noexcept { rt->on_lease_timer(this); }

Runtime::Impl::Impl(Options opts)
    : options(std::move(opts)),
      topology(Topology::parse(options.redis_url)),
      endpoints(topology.sentinels.empty() ? topology.masters : std::vector<Endpoint>{topology.master}),
      quorum(endpoints.size() / 2 + 1),
      pool(options.threads),
      wheel(TimerWheelOptions{std::chrono::duration_cast<std::chrono::nanoseconds>(options.tick), options.wheel_size,
                              0}) {
  std::promise<void> started;
  auto ready = started.get_future();
  loop.post([this, &started] {
    wheel.bind_to_current_thread();
    uv_timer_init(loop.uv(), &wheel_timer);
    wheel_timer.data = this;
    start_nodes();
    started.set_value();
  });
  ready.wait();
}

// ---------------------------------------------------------------- dispatch

void Runtime::Impl::validate(detail::LockSpec& spec) const {
  if (spec.key.empty()) throw InvalidArgument("lock key is empty");
  if (spec.key.size() > options.max_key_bytes)
    throw InvalidArgument(fmt::format("lock key is {} bytes; the limit (Options::max_key_bytes) is {}",
                                      spec.key.size(), options.max_key_bytes));
  if (spec.ttl <= milliseconds(0)) throw InvalidArgument(fmt::format("ttl must be positive, got {} ms", spec.ttl.count()));
  if (spec.wait < milliseconds(0)) throw InvalidArgument("wait must not be negative");
  if (spec.renew_weight == 0) spec.renew_weight = options.renew_weight;
  if (!(spec.renew_weight > 0 && spec.renew_weight < 1))
    throw InvalidArgument(fmt::format("renewal weight must be in (0, 1), got {}", spec.renew_weight));
  // The renewal fires at ttl*weight (or earlier, see renew_after), up to a
  // tick early, and must be confirmed before the local deadline (ttl - drift),
  // which is judged up to a tick late.
  auto window = spec.ttl - drift_for(options, spec.ttl) -
                std::chrono::ceil<milliseconds>(detail::renew_after(options, spec.ttl, spec.renew_weight));
  auto needed = 2 * options.tick + milliseconds(2);
  if (window < needed)
    throw InvalidArgument(fmt::format(
        "ttl {} ms is too short: renewing at {:.2f} of it leaves {} ms after the drift allowance, but the tick ({} "
        "ms) needs {} ms",
        spec.ttl.count(), spec.renew_weight, window.count(), options.tick.count(), needed.count()));
}

std::shared_ptr<Acquisition> Runtime::Impl::make_acquisition(detail::LockSpec spec,
                                                             std::shared_ptr<detail::Call> call) {
  {
    std::lock_guard lk(mu);
    if (stopping.load()) throw RuntimeStopped("lockwatch runtime is stopping");
    ++active_calls;
  }
  auto a = std::make_shared<Acquisition>();
  a->rt = this;
  a->lock_key = redis_key(options, spec.key);
  a->fence_key = a->lock_key + ":fence";
  a->channel = a->lock_key + ":rel";
  a->spec = std::move(spec);
  a->call = std::move(call);
  a->started = Clock::now();
  return a;
}

std::future<LockHandle> Runtime::Impl::acquire(detail::LockSpec spec) {
  validate(spec);
  auto call = std::make_shared<detail::HandleCall>();
  auto future = call->acquired.get_future();
  auto a = make_acquisition(std::move(spec), call);
  a->handle = call;
  if (!loop.post([this, a] { start_acquire(a); })) {
    a->call->finish(std::make_exception_ptr(RuntimeStopped("lockwatch runtime is stopping")));
    call_done();
  }
  return future;
}

void Runtime::Impl::dispatch(detail::LockSpec spec, std::shared_ptr<detail::Call> call) {
  validate(spec);

  // Reentrant and nested calls run on this thread.
  auto& held_here = detail::leases_on_this_thread();
  for (auto it = held_here.rbegin(); it != held_here.rend(); ++it) {
    if (it->rt == this && it->lease->key() == spec.key) {
      LeaseRecord* l = it->lease;  // the scope below may move the vector
      {
        detail::ThreadLeaseScope scope(this, l);
        call->run();
      }
      // lost_detail belongs to the loop thread: the reason alone here.
      call->finish(l->lost() ? std::make_exception_ptr(LeaseLost(l->key(), *l->lost_reason())) : nullptr);
      return;
    }
  }
  bool nested = !held_here.empty();

  auto a = make_acquisition(std::move(spec), std::move(call));
  a->inline_run = nested;
  std::future<std::shared_ptr<LeaseRecord>> granted;
  std::future<void> finished;
  if (nested) {
    granted = a->granted.get_future();
    a->finished = std::make_shared<std::promise<void>>();
    finished = a->finished->get_future();
  }
  if (!loop.post([this, a] { start_acquire(a); })) {
    a->call->finish(std::make_exception_ptr(RuntimeStopped("lockwatch runtime is stopping")));
    call_done();
    return;
  }
  if (!nested) return;

  // Nested call on another key: this thread waits for the lock (every
  // acquisition completes: by reply, wait deadline or command timeout),
  // runs the work itself, and returns once the lock is released.
  std::shared_ptr<LeaseRecord> l = granted.get();
  if (l) {
    {
      detail::ThreadLeaseScope scope(this, l.get());
      l->call->run();
    }
    loop.post([this, l] { work_done(l); });
  }
  finished.wait();
}

void Runtime::Impl::call_done() {
  std::lock_guard lk(mu);
  if (--active_calls == 0) cv.notify_all();
}

// ------------------------------------------------------------- acquisition

void Runtime::Impl::start_acquire(std::shared_ptr<Acquisition> a) {
  if (stopping.load()) {
    fail(a, std::make_exception_ptr(RuntimeStopped("lockwatch runtime is stopping")));
    return;
  }
  a->token = tokens.next();
  if (a->spec.wait == milliseconds(0)) {
    attempt_once(std::move(a));
    return;
  }
  auto& slot = waiters[a->channel];
  if (!slot) {
    slot = std::make_unique<KeyWaiters>();
    slot->rt = this;
    slot->channel = a->channel;
  }
  KeyWaiters* w = slot.get();
  a->wait_timeout = timeout_at(*a, a->started + a->spec.wait);
  w->queue.push_back(a);
  if (w->queue.size() == 1) attempt_head(w->channel);
}

void Runtime::Impl::attempt_once(std::shared_ptr<Acquisition> a) {
  quorum_acquire(a, [this, a](const detail::AcquireOutcome& out) { on_acquire_outcome(a, out, nullptr); });
}

void Runtime::Impl::attempt_head(const std::string& channel) {
  auto it = waiters.find(channel);
  if (it == waiters.end()) return;
  KeyWaiters* w = it->second.get();
  if (w->queue.empty() || w->held_locally) return;
  if (w->in_flight) {
    w->again = true;
    return;
  }
  w->retry.cancel();
  w->in_flight = true;
  w->again = false;
  auto a = w->queue.front();
  quorum_acquire(a, [this, a, w](const detail::AcquireOutcome& out) {
    w->in_flight = false;
    on_acquire_outcome(a, out, w);
  });
}

void Runtime::Impl::on_acquire_outcome(const std::shared_ptr<Acquisition>& a, const detail::AcquireOutcome& out,
                                       KeyWaiters* w) {
  using Kind = detail::AcquireOutcome::Kind;
  if (a->done) {
    // Its wait ran out (or the runtime stopped) while the attempt was in
    // flight: a lock taken now belongs to nobody, so give it back.
    if (out.kind == Kind::kTaken) quorum_release(a->lock_key, a->token, {}, [](bool, bool, bool, std::string) {});
    if (w) {
      attempt_head(w->channel);
      maybe_forget(w);
    }
    return;
  }
  if (w && (w->queue.empty() || w->queue.front() != a)) return;  // cannot happen: the head stays until done
  if (w && out.kind == Kind::kFailed && is_connection_error(out.error)) {
    // A waiter keeps its place through a connection blip and tries again
    // shortly (a request made while down waits for the reconnect). Its wait
    // deadline still bounds it, and then it reports this error rather than
    // a busy lock.
    w->connection_error = out.error;
    w->retry = timeout_at(*w, Clock::now() + options.reconnect_min);
    return;
  }
  if (w) w->connection_error = nullptr;
  if (out.kind != Kind::kBusy) {
    if (w) w->queue.pop_front();
    a->done = true;
    a->wait_timeout.cancel();
    if (out.kind == Kind::kFailed) {
      fail(a, out.error);
      if (w) attempt_head(w->channel);
    } else {
      if (w) w->held_locally = true;
      grant(a, out.fence, out.sent);
    }
    if (w) maybe_forget(w);
    return;
  }
  // Busy.
  auto pttl = std::max(out.pttl, milliseconds(1));
  if (w == nullptr) {
    fail(a, std::make_exception_ptr(LockNotAcquired(
                a->spec.key, std::chrono::duration_cast<milliseconds>(Clock::now() - a->started))));
    return;
  }
  if (w->again) {
    attempt_head(w->channel);
    return;
  }
  if (!w->subscribed) {
    // Subscribe, and try again once the subscription is confirmed: a
    // release between this attempt and the subscription is not missed.
    subscribe_all(w->channel);
  }
  // Sleep until a release is published or the holder's ttl runs out (a
  // holder that died never publishes).
  w->retry = timeout_at(*w, Clock::now() + pttl + milliseconds(1));
}

void Runtime::Impl::on_pubsub(std::string_view kind, std::string_view channel) {
  auto it = waiters.find(std::string(channel));
  if (it == waiters.end()) return;
  if (kind == "subscribe") {
    it->second->subscribed = true;
    attempt_head(it->first);
  } else if (kind == "message") {
    attempt_head(it->first);
  }
}

void Runtime::Impl::on_wait_expired(Acquisition* raw) {
  if (raw->done) return;
  auto wit = waiters.find(raw->channel);
  if (wit == waiters.end()) return;
  KeyWaiters* w = wit->second.get();
  auto pos = std::find_if(w->queue.begin(), w->queue.end(), [raw](const auto& p) { return p.get() == raw; });
  if (pos == w->queue.end()) return;
  auto a = *pos;
  bool head_in_flight = (pos == w->queue.begin()) && w->in_flight;
  w->queue.erase(pos);  // a head in flight: its reply sees done and cleans up
  fail(a, w->connection_error ? w->connection_error
                              : std::make_exception_ptr(LockNotAcquired(
                                    a->spec.key, std::chrono::duration_cast<milliseconds>(Clock::now() - a->started))));
  if (!head_in_flight) attempt_head(w->channel);
  maybe_forget(w);
}

void Runtime::Impl::maybe_forget(KeyWaiters* w) {
  if (!w->queue.empty() || w->in_flight) return;
  w->retry.cancel();
  unsubscribe_all(w->channel);
  waiters.erase(w->channel);
}

void Runtime::Impl::fail(const std::shared_ptr<Acquisition>& a, std::exception_ptr err) {
  a->done = true;
  a->wait_timeout.cancel();
  a->call->finish(err);
  if (a->inline_run) {
    a->granted.set_value(nullptr);
    a->finished->set_value();
  }
  call_done();
}

// ----------------------------------------------------------------- leases

void Runtime::Impl::grant(const std::shared_ptr<Acquisition>& a, std::uint64_t fence, Clock::time_point sent) {
  auto drift = drift_for(options, a->spec.ttl);
  auto l = std::make_shared<LeaseRecord>(this, a->spec.key, fence, a->spec.ttl, sent + a->spec.ttl - drift);
  l->call = a->call;
  l->token = a->token;
  l->lock_key = a->lock_key;
  l->channel = a->channel;
  l->retries = a->spec.retries;
  l->ttl_ms = std::to_string(a->spec.ttl.count());
  // The wheel fires on the first tick at or after a deadline. A renewal must
  // not lose that tick out of the little time it has: it is due a tick less
  // one nanosecond early, so it goes on the last tick at or before its time.
  // Deadlines stay as they are, judged at the tick after (remaining() is
  // exact meanwhile).
  l->renew_after =
      detail::renew_after(options, a->spec.ttl, a->spec.renew_weight) - (wheel.tick() - Clock::duration(1));
  l->drift = drift;
  l->last_sent = sent;
  l->finished = a->finished;
  leases.emplace(l.get(), l);
  held.fetch_add(1, std::memory_order_relaxed);
  stats.acquired.fetch_add(1, std::memory_order_relaxed);
  if (l->retries != 0) {
    schedule(*l, LeaseRecord::Phase::kRenewDue, sent + l->renew_after);
  } else {
    schedule(*l, LeaseRecord::Phase::kExhausted, l->deadline());
  }
  if (stopping.load()) l->request_stop();
  if (a->handle) {
    l->is_handle = true;
    a->handle->granted = true;
    auto state = std::make_shared<detail::HandleState>();
    state->rt = weak_from_this();
    state->lease = l;
    state->call = a->handle;
    a->handle->acquired.set_value(HandleAccess::make(std::move(state)));
  } else if (a->inline_run) {
    a->granted.set_value(l);
  } else {
    run_on_pool(l);
  }
}

void Runtime::Impl::run_on_pool(const std::shared_ptr<LeaseRecord>& l) {
  try {
    pool.post([this, l] {
      {
        detail::ThreadLeaseScope scope(this, l.get());
        l->call->run();
      }
      loop.post([this, l] { work_done(l); });
    });
  } catch (...) {
    // The pool refused (stopping): the work never ran; give the lock back.
    l->mark_lost(LostReason::kRuntimeStopped);
    work_done(l);
  }
}

void Runtime::Impl::schedule(LeaseRecord& l, LeaseRecord::Phase phase, Clock::time_point at) {
  l.phase = phase;
  l.timeout = timeout_at(l, at);
}

Timeout Runtime::Impl::timeout_at(TimerTask& task, Clock::time_point at) {
  Timeout t = wheel.new_timeout_at(task, at);
  arm_wheel(wheel.tick_time(at));
  return t;
}

void Runtime::Impl::on_lease_timer(LeaseRecord* l) {
  auto now = Clock::now();
  if (l->work_finished) {
    if (!l->releasing) {
      // Release could not be confirmed; the key has expired by now.
      if (l->phase == LeaseRecord::Phase::kReleasing) finish_lease(shared(l));
      return;
    }
    // The release is in flight, maybe behind a long queue: keep the key
    // alive until it is done. Nothing is judged any more: the work is over.
    if ((l->phase == LeaseRecord::Phase::kRenewDue || l->phase == LeaseRecord::Phase::kRetryDue) &&
        now < l->deadline())
      send_renew(l);
    return;
  }
  if (now >= l->deadline() && l->phase == LeaseRecord::Phase::kAwaitingReply && drained_at_ != advances_) {
    // The loop may have stalled: it runs timers before it reads sockets, so
    // a confirmation that arrived in time may be unread. Read first (once
    // per tick), then judge.
    drained_at_ = advances_;
    for (auto& n : nodes) n.renew->poll_replies();
    if (l->lost() || l->work_finished || l->phase != LeaseRecord::Phase::kAwaitingReply) return;
    now = Clock::now();
  }
  if (now >= l->deadline()) {
    lose(l, l->phase == LeaseRecord::Phase::kExhausted ? LostReason::kRenewalsExhausted : LostReason::kRedisUnreachable,
         l->lost_detail);
    return;
  }
  switch (l->phase) {
    case LeaseRecord::Phase::kRenewDue:
    case LeaseRecord::Phase::kRetryDue:
      send_renew(l);
      break;
    default:
      schedule(*l, l->phase, l->deadline());
      break;
  }
}

void Runtime::Impl::send_renew(LeaseRecord* l) {
  l->last_sent = Clock::now();
  schedule(*l, LeaseRecord::Phase::kAwaitingReply, l->deadline());
  renew_batch.push_back(shared(l));
}

void Runtime::Impl::flush_renewals() {
  // Every renewal that came due in this tick shares one command per node
  // (in chunks, so one script never holds Redis for long).
  constexpr std::size_t kChunk = 512;
  if (renew_batch.empty()) return;
  auto sent = Clock::now();
  for (std::size_t from = 0; from < renew_batch.size(); from += kChunk) {
    auto first = renew_batch.begin() + static_cast<std::ptrdiff_t>(from);
    auto last = renew_batch.begin() + static_cast<std::ptrdiff_t>(std::min(renew_batch.size(), from + kChunk));
    quorum_renew({std::make_move_iterator(first), std::make_move_iterator(last)}, sent);
  }
  renew_batch.clear();  // keeps its capacity for the next tick
}

void Runtime::Impl::renewal_failed(const std::shared_ptr<LeaseRecord>& l, std::string why) {
  // Transient until the local deadline: one lost reply must not cost the
  // lease, so try again a tick later.
  l->lost_detail = std::move(why);
  l->timeout.cancel();
  auto next = std::min(Clock::now() + options.tick, l->deadline());
  schedule(*l, LeaseRecord::Phase::kRetryDue, next);
}

void Runtime::Impl::on_renewed(const std::shared_ptr<LeaseRecord>& l, Clock::time_point sent) {
  l->timeout.cancel();
  l->bump_renewals();
  auto slack = std::chrono::duration_cast<std::chrono::microseconds>(l->deadline() - Clock::now()).count();
  if (slack < stats.min_renewal_slack_us.load(std::memory_order_relaxed))
    stats.min_renewal_slack_us.store(slack, std::memory_order_relaxed);
  l->set_deadline(sent + l->ttl() - l->drift);
  l->lost_detail.clear();
  if (l->retries < 0 || static_cast<std::int64_t>(l->renewals()) < l->retries) {
    schedule(*l, LeaseRecord::Phase::kRenewDue, sent + l->renew_after);
  } else {
    schedule(*l, LeaseRecord::Phase::kExhausted, l->deadline());
  }
}

void Runtime::Impl::lose(LeaseRecord* l, LostReason reason, std::string detail) {
  if (!l->mark_lost(reason)) return;
  stats.leases_lost.fetch_add(1, std::memory_order_relaxed);
  l->timeout.cancel();
  l->lost_detail = std::move(detail);
  auto sl = shared(l);
  // Stop callbacks are user code: run them off the loop.
  try {
    notifier.post([sl] { sl->request_stop(); });
  } catch (...) {
    sl->request_stop();
  }
}

void Runtime::Impl::work_done(const std::shared_ptr<LeaseRecord>& l) {
  if (l->work_finished) return;
  l->work_finished = true;
  l->releasing = true;
  send_release(l, [this, l](bool freed) {
    l->releasing = false;
    l->timeout.cancel();
    if (freed) {
      finish_lease(l);
      return;
    }
    // Unconfirmed: the key expires at most a ttl after our last request
    // that could have extended it. Complete then, never earlier.
    schedule(*l, LeaseRecord::Phase::kReleasing, std::max(Clock::now(), l->last_sent + l->ttl() + l->drift));
  });
}

void Runtime::Impl::send_release(const std::shared_ptr<LeaseRecord>& l, std::function<void(bool)> then) {
  quorum_release(l->lock_key, l->token, l->channel,
                 [this, l, then = std::move(then)](bool freed, bool held, bool taken, std::string why) {
                   if (!freed) {
                     if (!l->lost()) l->lost_detail = "release not confirmed: " + why;
                     then(false);
                     return;
                   }
                   if (!held) lose(l.get(), taken ? LostReason::kTakenByOther : LostReason::kExpired, "found at release");
                   then(true);
                 });
}

void Runtime::Impl::finish_lease(const std::shared_ptr<LeaseRecord>& l) {
  l->timeout.cancel();
  if (leases.erase(l.get()) == 0) return;
  held.fetch_sub(1, std::memory_order_relaxed);
  std::exception_ptr err;
  if (auto reason = l->lost_reason(); reason && *reason != LostReason::kRuntimeStopped)
    err = std::make_exception_ptr(LeaseLost(l->key(), *reason, l->lost_detail));
  else if (reason)
    err = std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped before the work could run"));
  l->call->finish(err);
  if (l->finished) l->finished->set_value();
  // Our own waiters for this key go next, in the same pipeline as the
  // release.
  if (auto it = waiters.find(l->channel); it != waiters.end()) {
    it->second->held_locally = false;
    attempt_head(l->channel);
  }
  call_done();
}

// -------------------------------------------------------------- the wheel

// `at` is a tick of the wheel (tick_time): waking before it would find
// nothing due.
void Runtime::Impl::arm_wheel(Clock::time_point at) {
  if (at >= wheel_due_) return;
  auto now = Clock::now();
  // libuv counts whole milliseconds: round up, and never 0 (a timeout due
  // now runs at the next advance anyway).
  auto delay = std::max<std::int64_t>(1, std::chrono::ceil<milliseconds>(at - now).count());
  wheel_due_ = now + milliseconds(delay);
  uv_timer_start(
      &wheel_timer, [](uv_timer_t* t) { static_cast<Impl*>(t->data)->on_wheel_timer(); },
      static_cast<uint64_t>(delay), 0);
}

void Runtime::Impl::on_wheel_timer() {
  wheel_due_ = Clock::time_point::max();
  advances_++;
  stats.timer_wakeups.fetch_add(1, std::memory_order_relaxed);
  wheel.advance();
  flush_renewals();
  // Sleep until the next occupied tick; nothing pending: until a schedule.
  if (auto next = wheel.next_expiry_in()) arm_wheel(Clock::now() + *next);
}

// ---------------------------------------------------------------- teardown

void Runtime::Impl::begin_stop() {
  for (auto& [ch, w] : waiters) {
    for (auto& a : w->queue) {
      if (a->done) continue;
      fail(a, std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped while waiting for the lock")));
    }
    w->queue.clear();
    w->retry.cancel();
  }
  std::vector<std::shared_ptr<LeaseRecord>> handles;
  for (auto& [raw, l] : leases) {
    if (l->is_handle) handles.push_back(l);
    auto sl = l;
    try {
      notifier.post([sl] { sl->request_stop(); });
    } catch (...) {
      sl->request_stop();
    }
  }
  // Nobody may be left to release a handle: the runtime gives them back.
  for (auto& l : handles) work_done(l);
}

void Runtime::Impl::close_all() {
  wheel.stop();
  uv_close(reinterpret_cast<uv_handle_t*>(&wheel_timer), nullptr);
  if (sentinel) sentinel->close();
  for (auto& n : nodes) {
    n.conn->close();
    n.renew->close();
    n.sub->close();
  }
}

void Runtime::Impl::stop() {
  {
    std::lock_guard lk(mu);
    stopping.store(true);
  }
  loop.post([this] { begin_stop(); });
  {
    // In-flight acquisitions end by reply or command timeout; running work
    // was asked to stop and is awaited.
    std::unique_lock lk(mu);
    cv.wait(lk, [this] { return active_calls == 0; });
  }
  pool.shutdown();
  notifier.shutdown();
  loop.shutdown([this] { close_all(); });
  waiters.clear();
  leases.clear();
  nodes.clear();
  sentinel.reset();
}

// ------------------------------------------------------------------ public

Runtime::Runtime(Options options) {
  options.validate();
  impl_ = std::make_shared<Impl>(std::move(options));
}

std::future<LockHandle> Runtime::acquire(std::string key, std::chrono::milliseconds ttl, Retries retries,
                                         std::chrono::milliseconds wait) {
  detail::LockSpec spec;
  spec.key = std::move(key);
  spec.ttl = ttl;
  spec.retries = retries.count();
  spec.wait = wait;
  return impl_->acquire(std::move(spec));
}

// ------------------------------------------------------------- LockHandle

LockHandle& LockHandle::operator=(LockHandle&& other) noexcept {
  if (this != &other) {
    if (state_) (void)release();
    state_ = std::move(other.state_);
  }
  return *this;
}

LockHandle::~LockHandle() {
  if (state_) {
    try {
      (void)release();
    } catch (...) {
    }
  }
}

const Lease& LockHandle::lease() const noexcept { return *state_->lease; }

std::future<void> LockHandle::release() {
  if (!state_) throw InvalidArgument("LockHandle::release() on a handle that holds no lock");
  auto state = std::move(state_);
  auto future = state->call->released.get_future();
  if (auto rt = state->rt.lock()) {
    auto l = state->lease;
    Runtime::Impl* impl = rt.get();
    // Refused only once the runtime closed, after it released the lock.
    impl->loop.post([impl, l] { impl->work_done(l); });
  }
  return future;
}

Runtime::~Runtime() {
  if (impl_) impl_->stop();
}

Runtime& Runtime::default_runtime() {
  static Runtime rt(Options::from_env());
  return rt;
}

const Options& Runtime::options() const noexcept { return impl_->options; }
ThreadPool& Runtime::pool() noexcept { return impl_->pool; }
std::size_t Runtime::held_leases() const noexcept { return impl_->held.load(std::memory_order_relaxed); }

RuntimeStats Runtime::stats() const noexcept {
  const auto& c = impl_->stats;
  RuntimeStats s;
  s.held_leases = impl_->held.load(std::memory_order_relaxed);
  s.acquired = c.acquired.load(std::memory_order_relaxed);
  s.renewals_sent = c.renewals_sent.load(std::memory_order_relaxed);
  s.renew_commands = c.renew_commands.load(std::memory_order_relaxed);
  s.leases_lost = c.leases_lost.load(std::memory_order_relaxed);
  s.timer_wakeups = c.timer_wakeups.load(std::memory_order_relaxed);
  s.min_renewal_slack = std::chrono::microseconds(c.min_renewal_slack_us.load(std::memory_order_relaxed));
  return s;
}

void Runtime::dispatch(detail::LockSpec spec, std::shared_ptr<detail::Call> call) {
  impl_->dispatch(std::move(spec), std::move(call));
}

}  // namespace lockwatch
