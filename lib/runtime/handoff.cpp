// lib/runtime/handoff.cpp: what the runtime does when work on a lock
// ends, and the local hand-off (runtime/handoff.hpp).
#include "runtime/handoff.hpp"

#include <algorithm>

#include "runtime/lock_table.hpp"

namespace lockwatch::detail {

void LockTable::work_ended(const std::shared_ptr<LeaseRecord>& l, Clock::time_point ended) {
  Decisions::Scope scope(decisions_);  // acted on as the call ends
  if (!watchdog_.end_work(l, ended)) return;
  if (!try_hand_off(l)) watchdog_.release_ended(l);
}

bool LockTable::hand_off_fits(const LeaseRecord& l) const {
  const Acquisition* next = waits_.next_waiter(store_name(parts_.store, l).view());
  // A waiter with another ttl, or without renewals (it counts on a whole
  // ttl from its start), takes the lock from the store; so do shared and
  // permit holders (their leases are each their own in the store).
  return next != nullptr && next->spec.ttl == l.ttl() && next->spec.retries != 0 && l.kind.exclusive_kind() &&
         next->spec.kind.exclusive_kind() && next->spec.handoff && !l.no_handoff;
}

void LockTable::reserve_ahead(const std::shared_ptr<LeaseRecord>& l) {
  // Only while a caller here waits for the key, so that the next hand-off
  // finds its token in stock: nothing for a lock nobody else here wants.
  if (token_blocks_ == nullptr || !parts_.options.handoff.enabled || l->work_over() || l->lost() ||
      l->slot == LeaseRecord::kNoSlot || !hand_off_fits(*l))
    return;
  auto s = watchdog_.streak_of(*l);
  const std::uint64_t stock = s->in_stock();
  if (s->reserving || s->refused || stock > kTokenBlock / 2 || s->handoffs + stock >= parts_.options.handoff.max_streak)
    return;
  reserve(*l, s);
}

void LockTable::reserve(const LeaseRecord& l, const std::shared_ptr<HandOffStreak>& s) {
  // As many as the streak may still hand on, a block at most.
  const auto left = static_cast<std::uint64_t>(parts_.options.handoff.max_streak - s->handoffs);
  const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(
      kTokenBlock, left > s->in_stock() ? left - s->in_stock() : 1));
  s->reserving = true;
  parts_.stats.token_reservations.fetch_add(1, std::memory_order_relaxed);
  const LeaseLock lock(parts_.store, l);
  token_blocks_->reserve_tokens(lock.ref(), n, [this, s, n](std::uint64_t last, const StoreError* error) {
    Decisions::Scope scope(decisions_);
    s->reserving = false;
    if (error != nullptr || last < n) {
      // Not ours any more, or no answer: no hand-off in this streak (the
      // waiters take the key from the store).
      s->refused = true;
    } else {
      s->add(last - n + 1, last);
    }
    if (auto d = std::exchange(s->deferred, nullptr)) {
      d->awaiting_tokens = false;
      if (!try_hand_off(d)) watchdog_.release(d);
    }
  });
}

bool LockTable::try_hand_off(const std::shared_ptr<LeaseRecord>& l) {
  if (token_blocks_ == nullptr || !parts_.options.handoff.enabled || parts_.admission.stopping() || !hand_off_fits(*l))
    return false;
  auto now = Clock::now();
  if (!watchdog_.can_hand_off(*l, now)) return false;
  auto s = watchdog_.streak_of(*l);
  if (s->refused) return false;
  if (s->handoffs >= parts_.options.handoff.max_streak || now - s->started >= parts_.options.handoff.max_time) {
    // The streak is over: back to the store, and our waiters take their
    // turn with everyone else's.
    l->yield_on_release = true;
    waits_.hold_back(store_name(parts_.store, *l).view());
    return false;
  }
  const std::uint64_t fence = s->take();
  if (fence == 0) {
    // No token in stock: the key stays ours, renewed, until the
    // reservation answers (one round trip), then goes on or back.
    l->awaiting_tokens = true;
    s->deferred = l;
    if (!s->reserving) reserve(*l, s);
    return true;
  }
  ++s->handoffs;
  parts_.stats.local_handoffs.fetch_add(1, std::memory_order_relaxed);
  auto a = waits_.take_next(store_name(parts_.store, *l).view());
  auto handed = watchdog_.hand_off(l, *a, fence);
  call_ended(l);  // the hand-off was its release
  start_lease(a, handed);
  reserve_ahead(handed);
  return true;
}

}  // namespace lockwatch::detail
