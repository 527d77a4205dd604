// lib/runtime/wait_queue.hpp: taking locks, and waiting for busy ones.
//
// A call without a wait makes one attempt. Calls that may wait queue per
// key in arrival order, and only the head talks to the store: a release
// wakes one caller, not all. The head sleeps until a release notice for the
// key (subscribed before it sleeps, and tried again once the subscription
// is confirmed, so a release in between is not missed), until the holder's
// ttl runs out (a holder that died never publishes), or, on a store without
// notices, until a bounded back-off. When one of our own leases on the key
// ends, the next in line goes at once (or, with Options::handoff.enabled, the
// runtime passes the lock to it without the store: take_next(), for
// exclusive locks only). Admission is per kind: while our own leases hold
// the key shared, a shared head goes to the store at once (a reader's grant
// lets the next head try too), and so does an exclusive head, so that the
// store stops new readers for it; a permit head goes while we hold fewer
// than n; nothing goes while we hold it exclusively. A waiter
// keeps its place through a connection blip shorter than the connect
// timeout (a wait is for a busy lock, not for a store that is down); past
// that, every waiter of the key fails with the connection error.
//
// An attempt whose answer never came (a timeout, a reset) may still have
// taken the lock: Redis runs a request it read before it hung once it goes
// on. A call that ends without the lock after such an attempt leaves its
// owner token here, and the queue gives it back (a release by that token)
// as soon as the store answers, retrying with a back-off until a release is
// answered or the attempt's ttl has surely run out. So a timed-out acquire
// leaves no lock that nobody owns for its whole ttl.
//
// Fair locks (LockKind::fair()) are queued by the store, in arrival order
// across processes, so every fair waiter asks the store itself: at once
// when it starts (taking its place there), then whenever the store's busy
// answer says (within a third of its ttl, which keeps its place), and, the
// first of ours in line only, on a release notice. A fair waiter that gives
// up, or whose call ends without the lock, withdraws from the store's queue
// (FairQueue::withdraw); a call without a wait withdraws after its one
// busy answer.
//
// Threading: loop thread only.
#pragma once

#include <atomic>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/backoff.hpp"
#include "lockwatch/options.hpp"
#include "runtime/acquisition.hpp"
#include "runtime/decisions.hpp"
#include "runtime/wheel_clock.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class WaitQueue {
 public:
  using Clock = std::chrono::steady_clock;
  // `stats.attempts_queued` counts the attempts that wait in the client for
  // the window (below).
  // What becomes of a call (taken, or failed: busy past its wait, with
  // LockNotAcquired, an error, or stopping) is written to `decisions`.
  WaitQueue(LockStore& store, WheelClock& clock, const Options& options, StatsCounters& stats, Decisions& decisions);
  ~WaitQueue();

  void start(std::shared_ptr<Acquisition> a);
  // The answer to the one attempt of a call without a wait, sent at `sent`
  // by its caller's thread (DirectLane): it goes on as if start() had
  // sent it.
  void answered(const std::shared_ptr<Acquisition>& a, const Acquired& out, Clock::time_point sent);
  // Store events.
  void on_released(std::string_view name);
  void on_subscribed(std::string_view name);
  void on_subscriptions_lost();
  // One of our leases on `name` is over: our next waiter may take it. With
  // `yield` (a local hand-off streak reached its bound), it first sits out
  // a tick, so that other processes' waiters, woken by the release notice,
  // get their turn.
  void on_lease_finished(std::string_view name, const LockKind& kind, bool yield = false);
  // A streak's end is being released: our waiters for `name` are held back
  // until on_lease_finished (which then makes them sit out the tick).
  void hold_back(std::string_view name);
  // Local hand-off: the waiter next in line for `name` (nullptr if none),
  // and taking it out of the queue, as if it took the lock (it is done; its
  // wait deadline is cancelled).
  Acquisition* next_waiter(std::string_view name) const;
  std::shared_ptr<Acquisition> take_next(std::string_view name);
  // `a` leaves the queue and fails with `error` (it was cancelled); a lock
  // its attempt in flight takes is given back.
  void cancel(Acquisition* a, std::exception_ptr error);
  // Every waiter fails with `error` (the runtime stops).
  void fail_all(std::exception_ptr error);
  // Observers: `look` runs (loop thread) on each release notice for
  // `name`, and when its subscription is confirmed (a release before it
  // may have gone unheard). The subscription lives while an observer or a
  // waiter needs it; a store without notices never calls `look`.
  // keep_observing() subscribes again after subscriptions were lost. The
  // caller picks the id (unique in this queue).
  void observe(std::uint64_t id, std::string_view name, std::function<void()> look);
  void keep_observing(std::uint64_t id);
  void unobserve(std::uint64_t id);
  void clear();
  // Any thread: how many keys have waiters or observers here now (a work's
  // thread writes its release itself only while none has: a waiter would
  // be handed the key instead). A snapshot: one that arrives right after
  // is woken by the release's answer, as any waiter of a key released.
  std::size_t keys_waited() const noexcept { return keys_.load(); }
  // Tokens of ended calls not yet given back (see above).
  std::size_t orphans() const noexcept { return orphans_.size() + orphans_sending_; }

  // At most this many attempts await the store's answer; the rest wait
  // here, oldest first (a head retried meanwhile waits behind them), and
  // are sent (their leases' clocks started) as earlier ones are answered.
  // A lease is renewed a fixed time after the request before it, so a
  // round of renewals repeats the pace at which the acquisitions were
  // sent: with the window, the server's own. (Fair attempts, which keep
  // a place in the store's queue, are sent at once.)
  static constexpr std::size_t kAttemptsInFlight = 16384;

 private:
  friend struct Acquisition;
  friend struct Acquisition::FairRetry;
  struct KeyWaiters;
  void attempt(const std::shared_ptr<Acquisition>& a, KeyWaiters* w);
  void attempt_head(std::string_view name);
  // A fair waiter's own attempt (see above), and its answer.
  void attempt_fair(const std::shared_ptr<Acquisition>& a);
  void on_fair_outcome(const std::shared_ptr<Acquisition>& a, const Acquired& out, Clock::time_point sent);
  void on_fair_retry(Acquisition* a);
  // A fair waiter leaves the store's queue (no answer awaited).
  void withdraw(const Acquisition& a);
  void on_outcome(const std::shared_ptr<Acquisition>& a, const Acquired& out, Clock::time_point sent, KeyWaiters* w);
  // on_outcome()'s two ends: taken or failed (the call ends), and busy
  // (`a` waits in `w`, or fails without a wait).
  void on_decided(const std::shared_ptr<Acquisition>& a, const Acquired& out, Clock::time_point sent, KeyWaiters* w);
  void on_busy(const std::shared_ptr<Acquisition>& a, const Acquired& out, KeyWaiters* w);
  void on_wait_expired(Acquisition* a);
  // `a` leaves the queue: with `error`, or busy past its wait (none).
  void end_wait(Acquisition* a, std::exception_ptr error);
  void maybe_forget(KeyWaiters* w);
  void tell_observers(std::string_view name);
  // `a` ended without the lock: if an attempt may have taken it, its token
  // is given back.
  void abandon(const Acquisition& a);
  void give_back_orphans();
  // Every waiter of `w` fails with `error` (the store cannot be reached).
  void fail_waiters(KeyWaiters* w, std::exception_ptr error);
  // A transient failure of the key's attempt sent at `sent`: kept as the
  // error a wait that runs out reports. False when the store has now been
  // unreachable for the connect timeout, and every waiter of the key has
  // failed with it.
  bool ride_out(KeyWaiters* w, const StoreError& error, Clock::time_point sent);

  LockStore& store_;
  WheelClock& clock_;
  const Options& options_;
  StatsCounters& stats_;
  Decisions& decisions_;
  // Looked up by any text, without making a string of it.
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::unique_ptr<KeyWaiters>, NameHash, std::equal_to<>> waiters_;  // by store name
  KeyWaiters& waiters_of(std::string_view name);
  std::unordered_map<std::uint64_t, std::string> observed_;  // observer id -> store name
  std::atomic<std::size_t> keys_{0};  // waiters_.size(), for keys_waited()

  // A token to give back, until `until` (the last attempt's ttl is over).
  struct Orphan {
    std::string name;
    OwnerToken token;
    TtlText ttl_ms;
    std::chrono::milliseconds ttl;
    LockKind kind;  // a reader's or a permit's token is given back as such
    Clock::time_point until;
    bool tried = false;
  };
  struct OrphanTimer final : TimerTask {
    WaitQueue* queue = nullptr;
    void run(Timeout) noexcept override { queue->give_back_orphans(); }
  };
  std::vector<Orphan> orphans_;        // waiting for their (next) release
  std::size_t orphans_sending_ = 0;    // in the release batch in flight
  Backoff orphan_backoff_;
  OrphanTimer orphan_timer_;
  Timeout orphan_retry_;
  bool stopping_ = false;  // fail_all ran: one last try, no more retries

  // The window (kAttemptsInFlight above).
  struct Deferred {
    std::shared_ptr<Acquisition> a;
    KeyWaiters* w;  // kept: its in_flight stays set meanwhile
  };
  void send_attempt(const std::shared_ptr<Acquisition>& a, KeyWaiters* w);
  void send_deferred();
  std::size_t attempts_in_flight_ = 0;
  std::deque<Deferred> deferred_;
  bool sending_deferred_ = false;  // an answer given inside the send lets the outer loop go on
};

}  // namespace lockwatch::detail
