// Sets of keys (lockwatch::all_of): see lock_set.hpp.
#include "runtime/lock_set.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>

#include "runtime/acquisition.hpp"
#include "runtime/runtime_impl.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

// ---------------------------------------------------------------- SetRecord

SetRecord::SetRecord(std::string name, std::vector<std::string> keys, std::vector<const LeaseRecord*> parts,
                     std::vector<LockHandle> owned, milliseconds ttl, std::shared_ptr<const RuntimeLinks> run_links)
    : Lease(std::move(name), parts.front()->fencing_token(), ttl, Clock::time_point()),
      keys_(std::move(keys)),
      parts_(std::move(parts)),
      owned_(std::move(owned)) {
  set_ = true;
  links = std::move(run_links);
}

SetRecord::~SetRecord() {
  // The callbacks go before what they point at (this record).
  part_stops_.clear();
  for (auto& w : part_watches_) w.cancel();
}

void SetRecord::start_watching(const std::shared_ptr<SetRecord>& self) {
  std::weak_ptr<SetRecord> weak = self;
  for (std::size_t i = 0; i < self->parts_.size(); ++i) {
    const LeaseRecord* part = self->parts_[i];
    // A part's stop (lost, renewals spent, the runtime stopping) stops the
    // set's work at once, on the thread that stops the part.
    self->part_stops_.push_back(std::make_unique<std::stop_callback<PartStop>>(part->stop_token(), PartStop{self.get(), i}));
    // A part lost after its stop (renewals spent first) is told here.
    self->part_watches_.push_back(part->on_lost([weak, i](std::optional<LostReason> reason) {
      if (!reason) return;
      if (auto s = weak.lock()) s->part_lost(i, *reason);
    }));
  }
}

void SetRecord::part_stopped(std::size_t i) noexcept {
  if (auto reason = parts_[i]->lost_reason()) part_lost(i, *reason);
  request_stop();
}

void SetRecord::part_lost(std::size_t i, LostReason reason) noexcept {
  {
    std::lock_guard lk(mu_);
    if (!mark_lost(reason)) return;
    lost_index_ = i;
  }
  request_stop();
  end_watchers(reason);
}

void SetRecord::end_watchers(std::optional<LostReason> reason) noexcept {
  std::vector<std::shared_ptr<LeaseWatcher>> ws;
  {
    std::lock_guard lk(mu_);
    if (watch_ended_) return;
    watch_ended_ = true;
    ws = std::move(watchers_);
  }
  for (auto& w : ws) {
    if (w->claim()) post_completion(notifier(), [w, reason] { w->handler(reason); });
  }
}

void SetRecord::watch(const std::shared_ptr<LeaseWatcher>& w) {
  {
    std::lock_guard lk(mu_);
    if (!watch_ended_ && !lost()) {
      std::erase_if(watchers_, [](const auto& x) { return x->done.load(std::memory_order_relaxed); });
      watchers_.push_back(w);
      return;
    }
  }
  if (w->claim()) post_completion(notifier(), [w, reason = lost_reason()] { w->handler(reason); });
}

std::uint64_t SetRecord::token_of(std::string_view key) const {
  auto it = std::lower_bound(keys_.begin(), keys_.end(), key);
  if (it == keys_.end() || *it != key)
    throw InvalidArgument(fmt::format("the lease of {} does not hold '{}'", this->key(), key));
  return parts_[static_cast<std::size_t>(it - keys_.begin())]->fencing_token();
}

milliseconds SetRecord::least_remaining() const noexcept {
  if (lost()) return milliseconds(0);
  auto least = milliseconds::max();
  for (const auto* p : parts_) least = std::min(least, p->remaining());
  return least;
}

std::uint64_t SetRecord::least_renewals() const noexcept {
  auto least = ~std::uint64_t{0};
  for (const auto* p : parts_) least = std::min(least, p->renewals());
  return least;
}

void SetRecord::release_keys(const std::shared_ptr<SetRecord>& self) {
  struct Pending {
    std::atomic<std::size_t> left;
    std::vector<std::exception_ptr> errors;
  };
  auto owned = std::move(self->owned_);
  if (owned.empty()) {
    self->released({});
    return;
  }
  auto pending = std::make_shared<Pending>();
  pending->left = owned.size();
  pending->errors.resize(owned.size());
  // Every key's release is handed to the loop in one task, as the set's
  // acquisition was: the store sends them together (one script call on a
  // Redis node).
  std::vector<std::shared_ptr<LeaseRecord>> records;
  records.reserve(owned.size());
  std::shared_ptr<detail::RuntimeImpl> rt;
  for (std::size_t i = 0; i < owned.size(); ++i) {
    auto state = HandleAccess::state(owned[i]);
    state->released([self, pending, i](std::exception_ptr e) {
      pending->errors[i] = e;  // each slot written once, before the count drops
      if (pending->left.fetch_sub(1, std::memory_order_acq_rel) == 1) self->released(std::move(pending->errors));
    });
    if (!rt) rt = state->runtime();
    records.push_back(std::static_pointer_cast<LeaseRecord>(std::move(state)));
    HandleAccess::forget(owned[i]);
  }
  if (rt) {
    // Refused only once the runtime closed, after it released the locks.
    rt->end_work(std::move(records));
  }
}

void SetRecord::released(std::vector<std::exception_ptr> errors) noexcept {
  // The first error in canonical order; a set lost through a key it
  // borrowed names that key.
  std::exception_ptr error;
  for (auto& e : errors) {
    if (e) {
      error = e;
      break;
    }
  }
  if (auto reason = lost_reason(); !error && reason) {
    std::lock_guard lk(mu_);
    error = std::make_exception_ptr(LeaseLost(keys_[lost_index_], *reason));
  }
  end_watchers(std::nullopt);  // ended held (a lost set told them already)
  finish(error);
}

// -------------------------------------------------------------- SetAcquirer

AcquireTicket SetAcquirer::start(detail::RuntimeImpl& impl, LockSpec spec, std::vector<const LeaseRecord*> borrowed,
                                 AcquireCallback done) {
  auto self = std::make_shared<SetAcquirer>();
  self->runtime_ = impl.weak_from_this();
  self->deadline_ = Clock::now() + spec.wait;
  const std::size_t n = spec.set.size();
  self->borrowed_ = borrowed.empty() ? std::vector<const LeaseRecord*>(n, nullptr) : std::move(borrowed);
  self->held_.resize(n);
  self->spec_ = std::move(spec);
  auto outer = std::make_shared<HandleCall>();
  outer->key = self->spec_.key;
  outer->runtime = impl.weak_from_this();
  outer->complete = [notifier = std::weak_ptr<ThreadPool>(impl.notifier()), h = std::move(done)](
                        std::exception_ptr e, LockHandle lh) mutable {
    post_completion(notifier, [h = std::move(h), e, lh = std::move(lh)]() mutable { h(e, std::move(lh)); });
  };
  std::weak_ptr<SetAcquirer> weak = self;
  outer->cancel_set = [weak] {
    if (auto s = weak.lock()) s->cancel_current();
  };
  self->outer_ = outer;
  const bool borrows = std::any_of(self->borrowed_.begin(), self->borrowed_.end(), [](auto* b) { return b != nullptr; });
  if (borrows) {
    self->ordered_ = true;
    self->next();  // nested in a call holding some of the keys: the ordered way
  }
  else
    self->try_whole();
  return RuntimeAccess::ticket(std::move(outer));
}

LockSpec SetAcquirer::key_spec(std::size_t i) const {
  LockSpec one;
  one.key = spec_.set[i];
  one.ttl = spec_.ttl;
  one.retries = spec_.retries;
  one.renew_weight = spec_.renew_weight;
  one.kind = spec_.kind;
  one.handoff = spec_.handoff;
  one.pattern = spec_.pattern;  // each key counts under the set's pattern
  one.context = spec_.context;  // each key's span events carry the set's context
  return one;
}

void SetAcquirer::try_whole() {
  auto rt = runtime_.lock();
  if (!rt) {
    fail(std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped")));
    return;
  }
  const std::size_t n = spec_.set.size();
  {
    std::lock_guard lk(mu_);
    tries_left_ = n;
    try_errors_.assign(n, nullptr);
  }
  std::vector<LockSpec> specs;
  specs.reserve(n);
  for (std::size_t i = 0; i < n; ++i) specs.push_back(key_spec(i));
  try {
    rt->acquire_together(std::move(specs), [self = shared_from_this()](std::size_t i, std::exception_ptr e,
                                                                      LockHandle h) { self->tried(i, e, std::move(h)); });
  } catch (...) {
    fail(std::current_exception());  // nothing started
  }
}

void SetAcquirer::tried(std::size_t i, std::exception_ptr error, LockHandle handle) {
  std::exception_ptr first;
  {
    std::lock_guard lk(mu_);
    try_errors_[i] = error;
    held_[i] = std::move(handle);
    if (--tries_left_ != 0) return;
    for (auto& e : try_errors_) {
      if (e) {
        first = e;
        break;
      }
    }
  }
  if (!first) {
    next_ = held_.size();
    next();  // every key held: granted (or given back if cancelled)
    return;
  }
  // Busy somewhere, or a store's error: a wait goes on the ordered way,
  // holding nothing meanwhile. Each key's waiter there rides out what is
  // passing (a connection blip, a deadlock the server broke, a cluster
  // failing over) within the wait and fails at once on a refusal, as a
  // single key's does; the whole try, which does not wait, cannot tell
  // them apart. Any other error (bad input, credentials, a stop), or no
  // wait, ends the call.
  bool ordered = false;
  try {
    std::rethrow_exception(first);
  } catch (const LockNotAcquired&) {
    ordered = true;
  } catch (const ConnectionError&) {
    ordered = true;
  } catch (const StoreRefused&) {
    ordered = true;
  } catch (...) {
  }
  if (!ordered || spec_.wait == milliseconds(0)) {
    fail(first);
    return;
  }
  for (auto& h : held_) h = LockHandle();  // given back, before the ordered way's first request
  next_ = 0;
  ordered_ = true;
  next();
}

void SetAcquirer::next() {
  const std::size_t n = spec_.set.size();
  while (next_ < n && borrowed_[next_] != nullptr) ++next_;
  if (outer_->cancelled()) {
    held_.clear();  // released
    return;
  }
  if (next_ == n) {
    granted();
    return;
  }
  auto rt = runtime_.lock();
  if (!rt) {
    fail(std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped")));
    return;
  }
  LockSpec one = key_spec(next_);
  // What is left of the call's wait (at least one attempt).
  if (spec_.wait > milliseconds(0))
    one.wait = std::max(milliseconds(0), std::chrono::ceil<milliseconds>(deadline_ - Clock::now()));
  const std::size_t step = next_;
  try {
    AcquireTicket t = rt->acquire(std::move(one), [self = shared_from_this()](std::exception_ptr e, LockHandle h) {
      self->taken(e, std::move(h));
    });
    std::lock_guard lk(mu_);
    if (current_step_ <= step) {
      current_ = std::move(t);
      current_step_ = step;
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

void SetAcquirer::taken(std::exception_ptr error, LockHandle handle) {
  if (error) {
    fail(error);
    return;
  }
  {
    std::lock_guard lk(mu_);
    current_step_ = next_ + 1;
    current_ = AcquireTicket();
  }
  held_[next_++] = std::move(handle);
  next();
}

void SetAcquirer::fail(std::exception_ptr error) {
  held_.clear();  // every key taken is given back
  if (outer_->claim(HandleCall::kDone)) outer_->deliver(error, LockHandle());
}

void SetAcquirer::granted() {
  if (!outer_->claim(HandleCall::kDone)) {
    held_.clear();
    return;
  }
  std::vector<const LeaseRecord*> parts;
  std::vector<LockHandle> owned;
  std::shared_ptr<const RuntimeLinks> links;
  parts.reserve(held_.size());
  for (std::size_t i = 0; i < held_.size(); ++i) {
    if (borrowed_[i] != nullptr) {
      parts.push_back(borrowed_[i]);
      if (!links) links = borrowed_[i]->links;
    } else {
      auto state = HandleAccess::state(held_[i]);
      const auto* record = static_cast<const LeaseRecord*>(state.get());
      parts.push_back(record);
      if (!links) links = record->links;
      owned.push_back(std::move(held_[i]));
    }
  }
  held_.clear();
  if (ordered_ && owned.size() > 1) {
    // Taken one after the other, the keys would come due at different
    // times: renewed together now, they travel together from here on.
    std::vector<std::shared_ptr<LeaseRecord>> leases;
    leases.reserve(owned.size());
    for (const auto& h : owned) leases.push_back(std::static_pointer_cast<LeaseRecord>(HandleAccess::state(h)));
    if (auto rt = runtime_.lock())
      rt->renew_together(std::move(leases));
  }
  auto record = std::make_shared<SetRecord>(spec_.key, spec_.set, std::move(parts), std::move(owned), spec_.ttl,
                                            std::move(links));
  SetRecord::start_watching(record);
  outer_->deliver(nullptr, HandleAccess::make_set(std::move(record)));
}

void SetAcquirer::cancel_current() {
  AcquireTicket t;
  {
    std::lock_guard lk(mu_);
    t = current_;
  }
  t.cancel();
}

}  // namespace lockwatch::detail

namespace lockwatch {

// A LOCKED call on a set: see lock_set.hpp. The keys held by calls around
// this one on this thread are borrowed (reentrancy per key).
void detail::RuntimeImpl::dispatch_set(detail::LockSpec spec, std::shared_ptr<LockedWork> call) {
  auto& held_here = detail::leases_on_this_thread();
  std::vector<const detail::LeaseRecord*> borrowed;
  if (!held_here.empty()) {
    borrowed.assign(spec.set.size(), nullptr);
    for (std::size_t i = 0; i < spec.set.size(); ++i) {
      for (auto it = held_here.rbegin(); it != held_here.rend(); ++it) {
        if (it->runtime == this && it->lease->key() == spec.set[i]) {
          detail::check_reentrant(spec.set[i], it->lease->kind, spec.kind);
          borrowed[i] = it->lease;
          break;
        }
      }
    }
    // Nested: this thread waits for the set, runs the work itself, and
    // returns once the set is released (as a nested call on one key does).
    auto granted = std::make_shared<std::promise<LockHandle>>();
    auto got = granted->get_future();
    detail::SetAcquirer::start(*this, std::move(spec), std::move(borrowed), [granted](std::exception_ptr e, LockHandle h) {
      if (e)
        granted->set_exception(e);
      else
        granted->set_value(std::move(h));
    });
    LockHandle h;
    try {
      h = got.get();
    } catch (...) {
      call->finish(std::current_exception());
      return;
    }
    {
      LeaseScope in = h.enter();
      call->run();
    }
    std::promise<std::exception_ptr> released;
    auto outcome = released.get_future();
    detail::HandleAccess::release(h, [&released](std::exception_ptr e) { released.set_value(e); });
    call->finish(outcome.get());
    return;
  }

  admission_.begin();
  detail::SetAcquirer::start(*this, std::move(spec), {}, [this, call](std::exception_ptr e, LockHandle h) {
    if (e) {
      call->finish(e);
      admission_.end();
      return;
    }
    auto held = std::make_shared<LockHandle>(std::move(h));
    auto end = [this, call](std::exception_ptr e) {
      call->finish(e);
      admission_.end();
    };
    try {
      pool_.post([held, call, end] {
        {
          LeaseScope in = held->enter();
          call->run();
        }
        detail::HandleAccess::release(*held, end);
      });
    } catch (...) {
      // The pool refused it (stopping): the work never runs.
      detail::HandleAccess::release(*held, [end](std::exception_ptr) {
        end(std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped before the work could run")));
      });
    }
  });
}

}  // namespace lockwatch
