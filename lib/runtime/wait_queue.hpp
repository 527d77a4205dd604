// lib/runtime/wait_queue.hpp: taking locks, and waiting for busy ones.
//
// A call without a wait makes one attempt. Calls that may wait queue per
// key in arrival order, and only the head talks to the store: a release
// wakes one caller, not all. The head sleeps until a release notice for the
// key (subscribed before it sleeps, and tried again once the subscription
// is confirmed, so a release in between is not missed), until the holder's
// ttl runs out (a holder that died never publishes), or, on a store without
// notices, until a bounded back-off. When one of our own leases on the key
// ends, the next in line goes at once (or, with Options::local_handoff, the
// runtime passes the lock to it without the store: take_next()). A waiter keeps its place through a
// connection blip and reports that error if its wait runs out meanwhile.
//
// Threading: loop thread only.
#pragma once

#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "lockwatch/options.hpp"
#include "runtime/acquisition.hpp"
#include "runtime/wheel_clock.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class WaitQueue {
 public:
  using Clock = std::chrono::steady_clock;
  struct Hooks {
    // The lock was taken for `a`, by a request sent at `sent`.
    std::function<void(const std::shared_ptr<Acquisition>& a, std::uint64_t fence, Clock::time_point sent)> taken;
    // `a` ends without the lock: busy past its wait (`busy`, and `error`
    // is LockNotAcquired), or an error, or stopping.
    std::function<void(const std::shared_ptr<Acquisition>& a, std::exception_ptr error, bool busy)> failed;
  };

  WaitQueue(LockStore& store, WheelClock& clock, const Options& options, Hooks hooks);
  ~WaitQueue();

  void start(std::shared_ptr<Acquisition> a);
  // Store events.
  void on_released(std::string_view name);
  void on_subscribed(std::string_view name);
  void on_subscriptions_lost();
  // One of our leases on `name` is over: our next waiter may take it. With
  // `yield` (a local hand-off streak reached its bound), it first sits out
  // a tick, so that other processes' waiters, woken by the release notice,
  // get their turn.
  void on_lease_finished(std::string_view name, bool yield = false);
  // Local hand-off: the waiter next in line for `name` (nullptr if none),
  // and taking it out of the queue, as if it took the lock (it is done; its
  // wait deadline is cancelled).
  Acquisition* next_waiter(std::string_view name) const;
  std::shared_ptr<Acquisition> take_next(std::string_view name);
  // Every waiter fails with `error` (the runtime stops).
  void fail_all(std::exception_ptr error);
  void clear();

 private:
  friend struct Acquisition;
  struct KeyWaiters;
  void attempt(const std::shared_ptr<Acquisition>& a, KeyWaiters* w);
  void attempt_head(std::string_view name);
  void on_outcome(const std::shared_ptr<Acquisition>& a, const Acquired& out, Clock::time_point sent, KeyWaiters* w);
  void on_wait_expired(Acquisition* a);
  void maybe_forget(KeyWaiters* w);
  void give_back(const Acquisition& a);

  LockStore& store_;
  WheelClock& clock_;
  const Options& options_;
  Hooks hooks_;
  // Looked up by any text, without making a string of it.
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::unique_ptr<KeyWaiters>, NameHash, std::equal_to<>> waiters_;  // by store name
};

}  // namespace lockwatch::detail
