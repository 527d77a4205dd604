// lib/runtime/lock_table.cpp: a lock's life from start to grant or
// failure, and how a granted lease goes on (runtime/lock_table.hpp); what
// happens when work ends is handoff.cpp.
#include "runtime/lock_table.hpp"

#include <future>

namespace lockwatch::detail {

LockTable::LockTable(Parts parts)
    : parts_(parts),
      token_blocks_(capability<TokenBlocks>(parts.store)),
      lane_(capability<DirectLane>(parts.store)),
      decisions_([this] { act(); }),
      watchdog_(parts.store, parts.clock, parts.notifier, parts.options, parts.stats, parts.events, decisions_),
      waits_(parts.store, parts.clock, parts.options, parts.stats, decisions_) {
  parts_.clock.after_advance([this] { watchdog_.flush(); });
}

void LockTable::start(std::shared_ptr<Acquisition> a) {
  Decisions::Scope scope(decisions_);  // acted on as the call ends
  parts_.events.wait_started(a->spec.key, a->spec.context, a->started);
  if (parts_.admission.stopping()) {
    fail(a, std::make_exception_ptr(RuntimeStopped("lockwatch runtime is stopping")));
  } else {
    a->token = tokens_.next();
    waits_.start(std::move(a));
  }
  starting_.fetch_sub(1);  // after the wait queue has it (keys_waited())
}

void LockTable::answered_direct(const std::shared_ptr<Acquisition>& a, const Acquired& out, Clock::time_point sent) {
  Decisions::Scope scope(decisions_);  // acted on as the call ends
  parts_.events.wait_started(a->spec.key, a->spec.context, a->started);
  waits_.answered(a, out, sent);
}

std::shared_ptr<LeaseRecord> LockTable::grant_to_caller(const Acquisition& a, std::uint64_t fence,
                                                        Clock::time_point sent) {
  auto l = watchdog_.grant_to_caller(a, fence, sent);
  l->links = links_;
  return l;
}

void LockTable::adopt(const std::shared_ptr<Acquisition>& a, const std::shared_ptr<LeaseRecord>& l) {
  Decisions::Scope scope(decisions_);  // acted on as the call ends
  parts_.events.wait_started(a->spec.key, a->spec.context, a->started);
  parts_.events.acquired(a->spec.key, l->fencing_token(), l->granted_at - a->started, a->spec.pattern,
                         a->spec.context);
  adopt_lease(l);
}

void LockTable::adopt_lease(const std::shared_ptr<LeaseRecord>& l) {
  if (!l->adopted()) return;
  watchdog_.adopt(l);
  if (parts_.admission.stopping()) l->request_stop();
  if (stop_begun_) {
    // Granted as the stop began: given back as the stop gave back the
    // handles it found.
    watchdog_.lose(l, LostReason::kRuntimeStopped, "the runtime was destroyed and released the lock");
    work_ended(l);
    return;
  }
  reserve_ahead(l);
}

void LockTable::end_before_adoption(const std::shared_ptr<LeaseRecord>& l, Released status, const StoreError* why,
                                    Clock::time_point ended, Clock::time_point confirmed) {
  Decisions::Scope scope(decisions_);  // acted on as the call ends
  watchdog_.adopt(l);
  if (watchdog_.end_work(l, ended)) watchdog_.release_written(l, status, why, confirmed);
}

void LockTable::cancel(const std::shared_ptr<Acquisition>& a) {
  Decisions::Scope scope(decisions_);  // acted on as the call ends
  // Ended meanwhile (granted and given back, or failed), or one attempt
  // with no wait in flight (its answer finds it cancelled): nothing here.
  if (a->wait_over() || a->spec.wait == std::chrono::milliseconds(0)) return;
  waits_.cancel(a.get(), std::make_exception_ptr(Cancelled(a->spec.key)));
}

void LockTable::fail(const std::shared_ptr<Acquisition>& a, std::exception_ptr err, bool busy) {
  // The wait queue says whether it was busy: no exception is rethrown to
  // find out. A cancelled wait is neither.
  const auto waited = Clock::now() - a->started;
  if (a->completion.cancelled()) {
    parts_.events.wait_cancelled(a->spec.key, a->spec.context, waited);
  } else if (busy) {
    parts_.events.busy(a->spec.key, waited, a->spec.pattern, a->spec.context);
  } else {
    parts_.events.acquire_failed(a->spec.key, err, waited, a->spec.context);
  }
  a->end_wait(false);
  a->completion.fail(err);
  parts_.admission.end();
}

void LockTable::taken(const std::shared_ptr<Acquisition>& a, std::uint64_t fence, Clock::time_point sent) {
  auto l = watchdog_.grant(*a, fence, sent);
  start_lease(a, l);
  reserve_ahead(l);
}

void LockTable::start_lease(const std::shared_ptr<Acquisition>& a, const std::shared_ptr<LeaseRecord>& l) {
  parts_.events.acquired(a->spec.key, l->fencing_token(), l->granted_at - a->started, a->spec.pattern,
                         a->spec.context);
  if (parts_.admission.stopping()) l->request_stop();
  l->links = links_;
  // Nobody will hold it when its handle was cancelled while the grant was
  // on its way, or when it was granted after the stop began (nobody is left
  // to release it, and the stop would wait for it): it is given back at
  // once, as a dropped handle is. After the stop, its work never starts and
  // its call fails with RuntimeStopped, as waiting ones did.
  using Way = Completion::Way;
  HandleCall* handle = a->completion.handle();
  const bool after_stop = stop_begun_ && a->completion.way() != Way::kInline;
  const bool claimed = handle && handle->claim(HandleCall::kDone);
  if (after_stop || (handle && !claimed)) {
    if (claimed) {
      handle->acquisition.reset();
      handle->deliver(std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped while the lock was taken")),
                      LockHandle());
    } else if (!handle) {
      l->give_up_start();
      stopped_before_start(l);  // complete_call() fails the call so
    }
    work_ended(l);
    return;
  }
  switch (a->completion.way()) {
    case Way::kHandle:
      handle->acquisition.reset();
      // The handle lives only in what `complete` keeps (dropped with it, so
      // a future dropped unread releases the lock with it). Delivered at
      // the turn's end, as calls end (call_ended()).
      Loop::at_turn_end([a, l] { a->completion.handle()->deliver(nullptr, HandleAccess::make(l)); });
      break;
    case Way::kInline:
      a->completion.inline_wait()->granted.set_value(l);
      break;
    case Way::kPool:
      run_on_pool(l);
      break;
  }
}

void LockTable::stopped_before_start(const std::shared_ptr<LeaseRecord>& l) {
  // Its hold span ends here: a lost lease reports no release.
  if (l->mark_lost(LostReason::kRuntimeStopped))
    parts_.events.stopped_before_start(l->key(), l->context(), Clock::now() - l->granted_at, l->fencing_token());
}

void LockTable::run_on_pool(const std::shared_ptr<LeaseRecord>& l) {
  // The work's end comes back to the loop: adaptive polling waits for it
  // as for a reply (counted until the work's post is made).
  parts_.loop.expect(1);
  // The works granted in one turn go to the pool together at its end, so
  // that waking the workers does not preempt the loop at each grant.
  to_pool_.push_back(l);
  if (to_pool_.size() == 1) Loop::at_turn_end([this] { flush_to_pool(); });
}

void LockTable::flush_to_pool() {
  struct Expected {
    Loop& loop;
    explicit Expected(Loop& lp) : loop(lp) {}
    Expected(const Expected&) = delete;
    Expected& operator=(const Expected&) = delete;
    ~Expected() { loop.expect(-1); }
  };
  pool_tasks_.clear();
  for (const auto& l : to_pool_) {
    pool_tasks_.emplace_back([this, l] {
      Expected expected(parts_.loop);
      // Given up while it waited (Options::runtime.queue_timeout): answered already.
      if (!l->begin_work()) return;
      // A wait for a worker that used a fifth of the ttl or more is made
      // good before the work counts on remaining(): one round trip, on this
      // rare path only (bounded by the command timeout).
      if (l->remaining() < l->ttl() * 4 / 5) {
        auto answered = std::make_shared<std::promise<void>>();
        auto renewed = answered->get_future();
        if (parts_.loop.post([this, l, answered] { watchdog_.renew_at_start(l, answered); }))
          renewed.wait_for(parts_.options.connection.command_timeout + 2 * parts_.options.watchdog.tick);
      }
      {
        ThreadLeaseScope scope(parts_.runtime, l.get());
        l->call->run();
      }
      work_over(l);
    });
  }
  auto leases = std::move(to_pool_);
  to_pool_.clear();
  try {
    parts_.pool.post_all(pool_tasks_);
  } catch (...) {
    // The pool refused (stopping): no work ran; the locks go back.
    pool_tasks_.clear();
    for (const auto& l : leases) {
      parts_.loop.expect(-1);
      l->give_up_start();
      stopped_before_start(l);
      work_ended(l);
    }
  }
  pool_tasks_.clear();
  if (to_pool_.empty()) {  // its capacity serves the next turn
    leases.clear();
    to_pool_.swap(leases);
  }
}

void LockTable::work_over(const std::shared_ptr<LeaseRecord>& l) {
  // The loop would wake only to send the release: this thread writes it,
  // and the loop wakes for the answer alone.
  // Only with nobody waiting here (and none on the way to the wait queue,
  // read first): a waiter would be handed the key instead.
  const auto ended = Clock::now();
  if (lane_ != nullptr && lane_->lane_open_at(ended) && l->kind.exclusive_kind() && !l->lost() && nobody_waits() &&
      l->mark_release_written()) {
    const LeaseLock lock(parts_.store, *l);
    if (lane_->release_direct(lock.ref(), [this, l, ended](Released status, const StoreError* why) {
          released_direct(l, status, why, ended);
        }))
      return;
    l->unmark_release_written();
  }
  // Refused only once the runtime closed, after it released the lock.
  parts_.loop.post([this, l, ended] { work_ended(l, ended); });
}

void LockTable::released_direct(const std::shared_ptr<LeaseRecord>& l, Released status, const StoreError* why,
                                Clock::time_point ended) {
  Decisions::Scope scope(decisions_);  // acted on as the call ends
  // Ended meanwhile: the stop gave it back (the loop's own release answers).
  if (!watchdog_.end_work(l, ended)) return;
  watchdog_.release_written(l, status, why);
}

void LockTable::act() {
  if (acting_) return;  // the act under way takes what is written meanwhile
  acting_ = true;
  Decisions::Scope scope(decisions_);  // what the acting writes is taken below
  struct Done {
    bool& acting;
    ~Done() { acting = false; }
  } done{acting_};
  using Kind = Decisions::Decision::Kind;
  while (!decisions_.empty()) {
    Decisions::Decision d = decisions_.take();
    switch (d.kind) {
      case Kind::kTaken:
        taken(d.a, d.fence, d.sent);
        break;
      case Kind::kFailed:
        fail(d.a, std::move(d.error), d.busy);
        break;
      case Kind::kFinished:
        lease_finished(d.l);
        break;
    }
  }
}

void LockTable::lease_finished(const std::shared_ptr<LeaseRecord>& l) {
  waits_.on_lease_finished(store_name(parts_.store, *l).view(), l->kind, l->yield_on_release);
  call_ended(l);
}

void LockTable::call_ended(const std::shared_ptr<LeaseRecord>& l) {
  // At the turn's end (Loop::at_turn_end): the replies of one read end
  // their calls together. Admission is told after the caller, so a stop
  // that waits for the calls finds their outcomes given.
  Loop::at_turn_end([this, l] {
    l->complete_call();
    parts_.admission.end();
  });
}

void LockTable::begin_stop() {
  Decisions::Scope scope(decisions_);  // acted on as the call ends
  stop_begun_ = true;
  waits_.fail_all(std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped while waiting for the lock")));
  // Nobody may be left to release a handle: the runtime gives them back,
  // and a handle that outlives it reads lost (kRuntimeStopped) from now on,
  // so its remaining() no longer vouches for a lock it does not hold.
  for (auto& l : watchdog_.stop_all()) {
    watchdog_.lose(l, LostReason::kRuntimeStopped, "the runtime was destroyed and released the lock");
    work_ended(l);
  }
}

}  // namespace lockwatch::detail
