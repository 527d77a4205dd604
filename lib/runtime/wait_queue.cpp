#include "runtime/wait_queue.hpp"

#include <algorithm>
#include <cassert>

#include "core/timing.hpp"
#include "lockwatch/errors.hpp"
#include "runtime/store_errors.hpp"
#include "store/capabilities.hpp"
#include "store/kind_rules.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

// The in-process waiters for one key.
struct WaitQueue::KeyWaiters final : TimerTask {
  WaitQueue* queue = nullptr;
  std::string name;
  std::deque<std::shared_ptr<Acquisition>> waiting;
  bool in_flight = false;     // the head's attempt awaits its answer
  bool again = false;         // a wake-up came while it was in flight
  bool subscribed = false;    // release notices are confirmed
  // Observers of the key's releases (observe()), by id.
  std::vector<std::pair<std::uint64_t, std::function<void()>>> observers;
  // Our leases on the key granted through this queue (their ends wake us):
  // exclusive ones, and shared or permit ones (a key is one family at a time).
  std::uint32_t held_exclusive = 0;
  std::uint32_t held_shared = 0;
  bool yielding = false;      // a streak's end: others' turn until `retry` fires
  Timeout retry;              // the holder's ttl runs out, or the poll back-off
  // Stores without notices: the poll back-off, from the reconnect minimum
  // doubling to a second.
  Backoff poll;

  explicit KeyWaiters(milliseconds first_poll) : poll(first_poll, milliseconds(1000)) {}
  // The head's last attempt could not reach the store, or was told "not
  // now": what a wait that runs out reports (the public error).
  std::exception_ptr connection_error;
  // When the first of the head's attempts that found the store unreachable
  // in a row was sent (max: the last one reached it).
  Clock::time_point unreachable_since = Clock::time_point::max();

  void run(Timeout) noexcept override {
    yielding = false;
    queue->attempt_head(name);
  }

  // Whether the head may ask the store now, given our own holders.
  bool admits(const LockKind& kind) const noexcept { return kinds::admits(held_exclusive, held_shared, kind); }
  void count_grant(const LockKind& kind) noexcept { ++(kind.single_holder() ? held_exclusive : held_shared); }
  // Leases granted before this queue of waiters was made are not counted:
  // the count never goes below zero (the store still decides).
  void count_end(const LockKind& kind) noexcept {
    auto& n = kind.single_holder() ? held_exclusive : held_shared;
    if (n != 0) --n;
  }
};

void Acquisition::run(Timeout) noexcept { queue->on_wait_expired(this); }
void Acquisition::FairRetry::run(Timeout) noexcept { owner->queue->on_fair_retry(owner); }

WaitQueue::WaitQueue(LockStore& store, WheelClock& clock, const Options& options, StatsCounters& stats, Decisions& decisions)
    : store_(store),
      clock_(clock),
      options_(options),
      stats_(stats),
      decisions_(decisions),
      orphan_backoff_(options.connection.reconnect_min, options.connection.reconnect_max) {
  orphan_timer_.queue = this;
  stats_.waits.set_warning(options.observability.wait_warning);
}

WaitQueue::~WaitQueue() = default;
void WaitQueue::clear() {
  deferred_.clear();  // they point into waiters_
  waiters_.clear();
  keys_.store(0);
}

WaitQueue::KeyWaiters& WaitQueue::waiters_of(std::string_view name) {
  auto it = waiters_.find(name);
  if (it != waiters_.end()) return *it->second;
  auto w = std::make_unique<KeyWaiters>(options_.connection.reconnect_min);
  w->queue = this;
  w->name = std::string(name);
  auto& slot = waiters_[w->name];
  slot = std::move(w);
  keys_.store(waiters_.size());
  return *slot;
}

void WaitQueue::start(std::shared_ptr<Acquisition> a) {
  a->queue = this;
  a->step = Step::kWaiting;
  if (a->spec.wait == milliseconds(0)) {
    attempt(a, nullptr);
    return;
  }
  KeyWaiters* w = &waiters_of(a->name);
  a->wait_mark.begin(stats_.waits, a->started);
  a->wait_timeout = clock_.at(*a, a->started + a->spec.wait);
  w->waiting.push_back(a);
  if (a->fair()) {
    // Its place in the store's queue is taken now, not when it comes first here.
    a->fair_retry.owner = a.get();
    attempt_fair(a);
    return;
  }
  if (w->waiting.size() == 1) attempt_head(w->name);
}

void WaitQueue::answered(const std::shared_ptr<Acquisition>& a, const Acquired& out, Clock::time_point sent) {
  a->queue = this;
  a->step = Step::kWaiting;
  a->last_sent = sent;
  on_outcome(a, out, sent, nullptr);
}

void WaitQueue::attempt_fair(const std::shared_ptr<Acquisition>& a) {
  if (a->wait_over()) return;
  if (a->fair_in_flight) {
    a->fair_again = true;
    return;
  }
  a->fair_timeout.cancel();
  a->fair_in_flight = true;
  a->fair_again = false;
  auto sent = Clock::now();
  a->last_sent = sent;
  LockRef ref = a->ref();
  store_.acquire(std::span<const LockRef>(&ref, 1), [this, a, sent](std::size_t, const Acquired& out) {
    a->fair_in_flight = false;
    on_fair_outcome(a, out, sent);
  });
}

void WaitQueue::on_fair_retry(Acquisition* raw) {
  auto it = waiters_.find(raw->name.view());
  if (it == waiters_.end()) return;
  for (const auto& a : it->second->waiting) {
    if (a.get() != raw) continue;
    attempt_fair(a);
    return;
  }
}

void WaitQueue::withdraw(const Acquisition& a) {
  auto* queue = capability<FairQueue>(store_);
  if (queue == nullptr) return;  // never: the runtime offers fair locks only with it
  LockRef ref = a.ref();
  // A withdraw that fails leaves the place to run out by its ttl.
  queue->withdraw(ref, [](const StoreError*) {});
}

void WaitQueue::on_fair_outcome(const std::shared_ptr<Acquisition>& a, const Acquired& out, Clock::time_point sent) {
  using Status = Acquired::Status;
  if (out.status != Status::kBusy) a->maybe_held = true;
  if (a->wait_over()) {
    // It gave up (or the runtime stops) while the attempt was in flight.
    abandon(*a);
    return;
  }
  auto it = waiters_.find(a->name.view());
  assert(it != waiters_.end());
  KeyWaiters* w = it->second.get();
  if (out.status == Status::kFailed && out.error.transient()) {
    // As for the head of other kinds: a blip is ridden out, a store down
    // for the connect timeout fails every waiter of the key.
    if (!ride_out(w, out.error, sent)) return;
    a->fair_timeout = clock_.at(a->fair_retry, Clock::now() + options_.connection.reconnect_min);
    return;
  }
  w->connection_error = nullptr;
  w->unreachable_since = Clock::time_point::max();
  if (out.status != Status::kBusy) {
    auto pos = std::find(w->waiting.begin(), w->waiting.end(), a);
    if (pos != w->waiting.end()) w->waiting.erase(pos);
    a->end_wait(out.status != Status::kFailed);
    if (out.status == Status::kFailed) {
      decisions_.failed(a, to_exception(out.error), false);
      abandon(*a);
    } else {
      w->count_grant(a->spec.kind);
      decisions_.taken(a, out.fence, sent);
    }
    // The grant may have ended the key's waiters already: look again.
    it = waiters_.find(a->name.view());
    if (it != waiters_.end()) maybe_forget(it->second.get());
    return;
  }
  if (a->fair_again) {
    attempt_fair(a);
    return;
  }
  // Busy: the store says when to try again (within a third of the ttl, which
  // keeps our place); a release notice for the key wakes our first waiter.
  auto next = std::max(out.busy_for, milliseconds(1)) + milliseconds(1);
  if (store_.release_events()) {
    if (!w->subscribed) store_.subscribe(w->name);
  } else {
    next = std::min(next, milliseconds(1000));
  }
  a->fair_timeout = clock_.at(a->fair_retry, Clock::now() + next);
}

void WaitQueue::attempt(const std::shared_ptr<Acquisition>& a, KeyWaiters* w) {
  if (attempts_in_flight_ >= kAttemptsInFlight || !deferred_.empty()) {
    deferred_.push_back(Deferred{a, w});
    a->in_window = true;
    stats_.attempts_queued.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  send_attempt(a, w);
}

void WaitQueue::send_attempt(const std::shared_ptr<Acquisition>& a, KeyWaiters* w) {
  auto sent = Clock::now();
  a->last_sent = sent;
  LockRef ref = a->ref();
  ++attempts_in_flight_;
  a->attempt_hold = a;
  a->attempt_for_waiters = w != nullptr;  // w stays while its attempt is in flight
  store_.acquire(std::span<const LockRef>(&ref, 1), [this, raw = a.get()](std::size_t, const Acquired& out) {
    const std::shared_ptr<Acquisition> held = std::move(raw->attempt_hold);
    KeyWaiters* waiters = nullptr;
    if (raw->attempt_for_waiters) {
      auto it = waiters_.find(raw->name.view());
      if (it != waiters_.end()) waiters = it->second.get();
    }
    --attempts_in_flight_;
    if (waiters) waiters->in_flight = false;
    on_outcome(held, out, held->last_sent, waiters);
    send_deferred();
  });
}

void WaitQueue::send_deferred() {
  if (sending_deferred_) return;
  sending_deferred_ = true;
  while (!deferred_.empty() && attempts_in_flight_ < kAttemptsInFlight) {
    Deferred d = std::move(deferred_.front());
    deferred_.pop_front();
    d.a->in_window = false;
    if (!d.a->wait_over()) {
      send_attempt(d.a, d.w);
      continue;
    }
    // Its wait ended while it waited here, never sent: nothing to give
    // back; the key's next waiter goes on, as after an answer.
    if (d.w) {
      d.w->in_flight = false;
      attempt_head(d.w->name);
      maybe_forget(d.w);
    }
  }
  sending_deferred_ = false;
}

void WaitQueue::attempt_head(std::string_view name) {
  auto it = waiters_.find(name);
  if (it == waiters_.end()) return;
  KeyWaiters* w = it->second.get();
  if (w->waiting.empty() || w->yielding || !w->admits(w->waiting.front()->spec.kind)) return;
  if (w->waiting.front()->fair()) {
    attempt_fair(w->waiting.front());
    return;
  }
  if (w->in_flight) {
    w->again = true;
    return;
  }
  w->retry.cancel();
  w->in_flight = true;
  w->again = false;
  attempt(w->waiting.front(), w);
}

void WaitQueue::abandon(const Acquisition& a) {
  if (a.fair()) withdraw(a);
  if (!a.maybe_held) return;
  // The store drops the key its expiry bound (the ttl, or more where it
  // rounds the ttl up) after the last attempt that could have set it, at
  // the latest (its clock may run a drift faster than ours).
  auto until = gone_by(options_.watchdog, a.last_sent, a.spec.ttl, store_.expiry_bound(a.spec.ttl));
  if (Clock::now() >= until) return;
  orphans_.push_back(Orphan{a.name.str(), a.token, a.ttl_ms, a.spec.ttl, a.spec.kind, until});
  if (orphans_sending_ == 0) give_back_orphans();
}

void WaitQueue::give_back_orphans() {
  orphan_retry_.cancel();
  auto now = Clock::now();
  std::erase_if(orphans_, [now](const Orphan& o) { return now >= o.until; });
  if (orphans_.empty() || orphans_sending_ != 0) {
    if (orphans_.empty() && orphans_sending_ == 0) orphan_backoff_.reset();
    return;
  }
  auto batch = std::make_shared<std::vector<Orphan>>(std::move(orphans_));
  orphans_.clear();
  orphans_sending_ = batch->size();
  std::vector<LockRef> refs;
  refs.reserve(batch->size());
  for (auto& o : *batch) {
    o.tried = true;
    refs.push_back(LockRef{o.name, o.token.view(), o.ttl_ms.view(), o.ttl, o.kind});
  }
  // With notify: a ghost's waiters in other processes wake at once.
  store_.release(refs, true, [this, batch](std::size_t i, Released status, const StoreError*) {
    // Any answer settles it: released, gone (never taken, or expired) or
    // another owner's. Only no answer leaves it for another try.
    if (status == Released::kUnconfirmed) orphans_.push_back(std::move((*batch)[i]));
    if (--orphans_sending_ != 0) return;
    if (orphans_.empty()) {
      orphan_backoff_.reset();
      return;
    }
    bool fresh = std::any_of(orphans_.begin(), orphans_.end(), [](const Orphan& o) { return !o.tried; });
    if (fresh) {
      give_back_orphans();
      return;
    }
    if (stopping_) return;  // the store closes: what is left expires by its ttl
    orphan_retry_ = clock_.at(orphan_timer_, Clock::now() + orphan_backoff_.next());
  });
}

bool WaitQueue::ride_out(KeyWaiters* w, const StoreError& error, Clock::time_point sent) {
  w->connection_error = to_exception(error);
  if (!error.unavailable()) {
    w->unreachable_since = Clock::time_point::max();
    return true;
  }
  w->unreachable_since = std::min(w->unreachable_since, sent);
  if (Clock::now() - w->unreachable_since < options_.connection.connect_timeout) return true;
  fail_waiters(w, w->connection_error);
  return false;
}

void WaitQueue::fail_waiters(KeyWaiters* w, std::exception_ptr error) {
  // The head's attempt is not in flight (its answer brought us here); the
  // others never attempted.
  auto waiting = std::move(w->waiting);
  w->waiting.clear();
  w->retry.cancel();
  w->connection_error = nullptr;
  w->unreachable_since = Clock::time_point::max();
  for (auto& a : waiting) {
    if (a->wait_over()) continue;
    a->end_wait(false);
    decisions_.failed(a, error, false);
    if (!a->fair_in_flight) abandon(*a);  // in flight: its answer does it
  }
  maybe_forget(w);  // w may be gone
}

void WaitQueue::on_outcome(const std::shared_ptr<Acquisition>& a, const Acquired& out, Clock::time_point sent,
                           KeyWaiters* w) {
  using Status = Acquired::Status;
  if (out.status != Status::kBusy) a->maybe_held = true;  // taken, or unknown: kept only if it ends well
  if (a->wait_over()) {
    // Its wait ran out (or the runtime stopped) while the attempt was in
    // flight: a lock taken now belongs to nobody, so give it back (also
    // when the answer was an error: the store may have taken it).
    abandon(*a);
    if (w) {
      attempt_head(w->name);
      maybe_forget(w);
    }
    return;
  }
  if (w) {
    // The head stays at the front until it is done: only it attempts.
    assert(!w->waiting.empty() && w->waiting.front() == a);
  }
  if (w && out.status == Status::kFailed && out.error.transient()) {
    // A waiter keeps its place through a connection blip (or a cluster
    // failing over) and tries again shortly (a request made while down
    // waits for the reconnect). A store that stays unreachable for the
    // connect timeout is down, not busy: every waiter of the key fails now
    // rather than at its wait's end. A cluster's "not now" is ridden out
    // within the wait. Either way a wait that runs out meanwhile reports
    // this error rather than a busy lock.
    if (!ride_out(w, out.error, sent)) return;
    w->retry = clock_.at(*w, Clock::now() + options_.connection.reconnect_min);
    return;
  }
  if (w) {
    w->connection_error = nullptr;
    w->unreachable_since = Clock::time_point::max();
  }
  if (out.status == Status::kBusy)
    on_busy(a, out, w);
  else
    on_decided(a, out, sent, w);
}

void WaitQueue::on_decided(const std::shared_ptr<Acquisition>& a, const Acquired& out, Clock::time_point sent,
                           KeyWaiters* w) {
  if (w) w->waiting.pop_front();
  a->end_wait(out.status != Acquired::Status::kFailed);
  if (out.status == Acquired::Status::kFailed) {
    decisions_.failed(a, to_exception(out.error), false);
    abandon(*a);
    if (w) attempt_head(w->name);
  } else {
    if (w) {
      w->count_grant(a->spec.kind);
      w->poll.reset();
    }
    decisions_.taken(a, out.fence, sent);
    if (w) {
      // The grant may have handed the lock on and ended the waiters of the
      // key (a cancelled handle's lease given back at once): look again.
      auto it = waiters_.find(a->name.view());
      if (it == waiters_.end()) return;
      w = it->second.get();
      // A shared grant lets the next head try at once (another reader
      // goes in beside it; a writer marks that it waits); an exclusive
      // one leaves the next waiting for its end.
      attempt_head(w->name);
    }
  }
  if (w) maybe_forget(w);
}

void WaitQueue::on_busy(const std::shared_ptr<Acquisition>& a, const Acquired& out, KeyWaiters* w) {
  auto busy_for = std::max(out.busy_for, milliseconds(1));
  if (w == nullptr) {
    a->end_wait(false);
    if (a->fair()) withdraw(*a);  // it does not wait: its place goes
    decisions_.failed(a,
                  std::make_exception_ptr(LockNotAcquired(
                      a->spec.key, std::chrono::duration_cast<milliseconds>(Clock::now() - a->started))),
                  true);
    return;
  }
  if (w->again) {
    attempt_head(w->name);
    return;
  }
  auto next = busy_for + milliseconds(1);
  if (store_.release_events()) {
    // Subscribe, and try again once the subscription is confirmed: a
    // release between this attempt and the subscription is not missed.
    if (!w->subscribed) store_.subscribe(w->name);
  } else {
    // No notices: poll, from the reconnect minimum doubling to a second,
    // and never later than the holder's ttl.
    next = std::min(next, w->poll.next());
  }
  // Sleep until a release is announced or the holder's ttl runs out.
  w->retry = clock_.at(*w, Clock::now() + next);
}

void WaitQueue::on_released(std::string_view name) {
  attempt_head(name);
  tell_observers(name);
}

void WaitQueue::tell_observers(std::string_view name) {
  auto it = waiters_.find(name);
  if (it == waiters_.end() || it->second->observers.empty()) return;
  // A copy: an observer may leave (unobserve) from its own call.
  auto observers = it->second->observers;
  for (auto& [id, look] : observers) look();
}

void WaitQueue::observe(std::uint64_t id, std::string_view name, std::function<void()> look) {
  KeyWaiters& w = waiters_of(name);
  w.observers.emplace_back(id, std::move(look));
  observed_.emplace(id, w.name);
  if (store_.release_events() && !w.subscribed) store_.subscribe(w.name);
}

void WaitQueue::keep_observing(std::uint64_t id) {
  auto o = observed_.find(id);
  if (o == observed_.end()) return;
  auto it = waiters_.find(o->second);
  if (it != waiters_.end() && store_.release_events() && !it->second->subscribed) store_.subscribe(it->first);
}

void WaitQueue::unobserve(std::uint64_t id) {
  auto o = observed_.find(id);
  if (o == observed_.end()) return;
  auto it = waiters_.find(o->second);
  observed_.erase(o);
  if (it == waiters_.end()) return;
  auto& obs = it->second->observers;
  std::erase_if(obs, [id](const auto& each) { return each.first == id; });
  maybe_forget(it->second.get());
}

void WaitQueue::on_subscribed(std::string_view name) {
  auto it = waiters_.find(name);
  if (it == waiters_.end()) return;
  it->second->subscribed = true;
  tell_observers(name);
  it = waiters_.find(name);
  if (it == waiters_.end()) return;
  attempt_head(it->first);
}

void WaitQueue::on_subscriptions_lost() {
  for (auto& [name, w] : waiters_) w->subscribed = false;
}

void WaitQueue::hold_back(std::string_view name) {
  auto it = waiters_.find(name);
  if (it == waiters_.end()) return;
  KeyWaiters* w = it->second.get();
  if (w->waiting.empty() || w->in_flight) return;
  // From the release's sending on: its notice may come before its answer
  // (memory:// posts it at once), and must not wake ours first.
  w->yielding = true;
  w->retry.cancel();
}

void WaitQueue::on_lease_finished(std::string_view name, const LockKind& kind, bool yield) {
  auto it = waiters_.find(name);
  if (it == waiters_.end()) return;
  KeyWaiters* w = it->second.get();
  w->count_end(kind);
  if (!yield) w->yielding = false;  // held back for a release nobody else heard
  if (yield && !w->waiting.empty() && !w->in_flight) {
    // Other processes' waiters learn of the release from its notice, a
    // round trip or so from now; ours, awake already, would win every time.
    // They sit out one tick (notices meanwhile are our own release's), then
    // try, and wait for the holder's release if another process took it.
    w->yielding = true;
    w->retry.cancel();
    w->retry = clock_.at(*w, Clock::now() + options_.watchdog.tick);
    return;
  }
  // Otherwise our own waiters go next, in the same pipeline as the release.
  attempt_head(w->name);
}

Acquisition* WaitQueue::next_waiter(std::string_view name) const {
  auto it = waiters_.find(name);
  if (it == waiters_.end()) return nullptr;
  const KeyWaiters& w = *it->second;
  // A head whose attempt is in flight may take it too: that answer sees it
  // done (and gives back a lock taken meanwhile).
  return w.waiting.empty() ? nullptr : w.waiting.front().get();
}

std::shared_ptr<Acquisition> WaitQueue::take_next(std::string_view name) {
  auto it = waiters_.find(name);
  assert(it != waiters_.end() && !it->second->waiting.empty());
  KeyWaiters* w = it->second.get();
  auto a = std::move(w->waiting.front());
  w->waiting.pop_front();
  a->end_wait(true);
  // The handed-on lease takes its giver's place (counted, or not yet).
  w->held_exclusive = std::max<std::uint32_t>(w->held_exclusive, 1);
  w->connection_error = nullptr;
  maybe_forget(w);  // w may be gone (not while an attempt is in flight)
  return a;
}

void WaitQueue::on_wait_expired(Acquisition* raw) { end_wait(raw, nullptr); }

void WaitQueue::cancel(Acquisition* a, std::exception_ptr error) { end_wait(a, std::move(error)); }

void WaitQueue::end_wait(Acquisition* raw, std::exception_ptr error) {
  if (raw->wait_over()) return;
  auto wit = waiters_.find(raw->name.view());
  if (wit == waiters_.end()) return;
  KeyWaiters* w = wit->second.get();
  auto pos = std::find_if(w->waiting.begin(), w->waiting.end(), [raw](const auto& p) { return p.get() == raw; });
  if (pos == w->waiting.end()) return;
  auto a = *pos;
  bool head_in_flight = a->fair() ? a->fair_in_flight : (pos == w->waiting.begin()) && w->in_flight;
  w->waiting.erase(pos);  // a head in flight: its answer sees the wait over and cleans up
  a->end_wait(false);
  if (error)
    decisions_.failed(a, error, false);
  else if (w->connection_error)
    decisions_.failed(a, w->connection_error, false);
  else if (a->in_window)
    // Never asked for: the store was busy answering, not the lock.
    decisions_.failed(a,
                  std::make_exception_ptr(LockNotAcquired(
                      a->spec.key, std::chrono::duration_cast<milliseconds>(Clock::now() - a->started),
                      "it was never sent, while " + std::to_string(kAttemptsInFlight) +
                          " earlier attempts awaited the store's answers")),
                  true);
  else
    decisions_.failed(a,
                  std::make_exception_ptr(LockNotAcquired(
                      a->spec.key, std::chrono::duration_cast<milliseconds>(Clock::now() - a->started))),
                  true);
  if (!head_in_flight) {
    abandon(*a);  // in flight: its answer does it
    attempt_head(w->name);
  }
  maybe_forget(w);
}

void WaitQueue::maybe_forget(KeyWaiters* w) {
  if (!w->waiting.empty() || w->in_flight) return;
  w->retry.cancel();
  if (!w->observers.empty()) {
    // Kept, and subscribed, for its observers; the next waiter starts
    // afresh, as in a new entry (the counts of our own holders too: the
    // store decides, they only spare it an attempt).
    w->held_exclusive = 0;
    w->held_shared = 0;
    w->yielding = false;
    w->again = false;
    w->poll.reset();
    w->connection_error = nullptr;
    w->unreachable_since = Clock::time_point::max();
    return;
  }
  store_.unsubscribe(w->name);
  waiters_.erase(w->name);  // w is gone
  keys_.store(waiters_.size());
}

void WaitQueue::fail_all(std::exception_ptr error) {
  stopping_ = true;
  // Never sent: nothing to give back. Those without a wait are in no
  // key's queue, so they fail here.
  for (auto& d : deferred_) {
    if (d.w) d.w->in_flight = false;
    if (d.a->wait_over()) continue;
    if (d.w == nullptr) {
      d.a->end_wait(false);
      decisions_.failed(d.a, error, false);
    }
  }
  deferred_.clear();
  for (auto& [name, w] : waiters_) {
    for (std::size_t i = 0; i < w->waiting.size(); ++i) {
      auto& a = w->waiting[i];
      if (a->wait_over()) continue;
      a->end_wait(false);
      decisions_.failed(a, error, false);
      const bool in_flight = a->fair() ? a->fair_in_flight : i == 0 && w->in_flight;
      if (!in_flight) abandon(*a);  // in flight: its answer does it
    }
    w->waiting.clear();
    w->retry.cancel();
  }
  // One last try for the tokens still to give back, before the store closes.
  if (!orphans_.empty() && orphans_sending_ == 0) give_back_orphans();
}

}  // namespace lockwatch::detail
