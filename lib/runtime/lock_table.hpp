// lib/runtime/lock_table.hpp: the life of every lock a runtime takes, from
// the moment admission hands a call over to the loop until it ends.
//
// One owner per key: the table owns each key's state in the runtime and
// is the only part that changes it:
//   - its waiters, their attempts, the release notices and the observers
//     (the wait queue, wait_queue.hpp);
//   - our leases on it, renewed until released or lost (the watchdog,
//     watchdog.hpp);
//   - the local hand-off streak and the fencing tokens reserved for it
//     (handoff.hpp; what happens when work ends is handoff.cpp);
//   - how each call ends: run on the pool, run inline, a handle delivered
//     (its Completion, completion.hpp).
// It drives the store, the wait queue and the watchdog downward; they
// call nothing up: what they decide (a lock taken, a call failed, a lease
// over) they write to the table's Decisions (decisions.hpp), which it acts
// on in order, after its own calls into them and at the end of the loop's
// turn for what an answer or a timer decided. Each lock's life goes through the steps of step.hpp (requested, waiting,
// held, releasing, ended). Admission and the stop order stay with the
// runtime (runtime_impl.hpp), which calls in here on the loop.
//
// Threading: the loop thread's, until the runtime's stop has joined the
// loop (then the stopping thread's); but for what a member says of itself.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/loop.hpp"
#include "core/token.hpp"
#include "lockwatch/options.hpp"
#include "lockwatch/thread_pool.hpp"
#include "ops/events.hpp"
#include "ops/stats.hpp"
#include "runtime/acquisition.hpp"
#include "runtime/admission.hpp"
#include "runtime/decisions.hpp"
#include "runtime/handoff.hpp"
#include "runtime/wait_queue.hpp"
#include "runtime/watchdog.hpp"
#include "runtime/wheel_clock.hpp"
#include "store/capabilities.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class LockTable {
 public:
  using Clock = std::chrono::steady_clock;

  // What the table works with, all the runtime's and outliving it.
  struct Parts {
    const Options& options;
    StatsCounters& stats;
    Events& events;
    Loop& loop;
    ThreadPool& pool;      // the work
    ThreadPool& notifier;  // stop callbacks and handlers
    LockStore& store;
    WheelClock& clock;
    Admission& admission;  // told as each call ends
    const void* runtime;   // the runtime's identity on a thread's held leases (ThreadLeaseScope)
  };
  explicit LockTable(Parts parts);

  // Any thread, once, before the first call reaches the loop: what every
  // lease granted here knows of the runtime.
  void set_links(std::weak_ptr<RuntimeImpl> runtime, std::weak_ptr<ThreadPool> notifier) {
    links_ = std::make_shared<const RuntimeLinks>(std::move(runtime), std::move(notifier), &watchdog_);
  }

  // Loop, as the store starts: its release notices go to the wait queue.
  void listen(StoreEvents& events) {
    events.released = [this](std::string_view name) {
      Decisions::Scope scope(decisions_);
      waits_.on_released(name);
    };
    events.subscribed = [this](std::string_view name) {
      Decisions::Scope scope(decisions_);
      waits_.on_subscribed(name);
    };
    events.subscriptions_lost = [this] {
      Decisions::Scope scope(decisions_);
      waits_.on_subscriptions_lost();
    };
  }
  // Any thread, before calls are handed to the loop to start(): counted
  // until they are in the wait queue (negative: handed back unstarted),
  // so that a work's thread that ends after them never releases past them
  // (work_over()).
  void will_start(std::ptrdiff_t n) noexcept { starting_.fetch_add(n); }
  // Loop: an admitted call starts waiting (requested -> waiting).
  void start(std::shared_ptr<Acquisition> a);
  // Loop: the answer to the one attempt of a call that its caller's thread
  // wrote itself (DirectLane), sent at `sent` with the call's token: the
  // call goes on as if it had started here.
  void answered_direct(const std::shared_ptr<Acquisition>& a, const Acquired& out, Clock::time_point sent);
  // Any thread: a blocking caller's own attempt (Runtime::lock) took the
  // lock with a request sent at `sent`: its lease, the caller's until the
  // loop adopts it, and counted as held.
  std::shared_ptr<LeaseRecord> grant_to_caller(const Acquisition& a, std::uint64_t fence, Clock::time_point sent);
  // Loop, before the lease's first renewal is due: what a lease of
  // grant_to_caller() owes the loop. Its acquisition's events; then, unless
  // its caller wrote its release first (end_before_adoption() follows),
  // the lease joins the watchdog as if it had been granted here.
  void adopt(const std::shared_ptr<Acquisition>& a, const std::shared_ptr<LeaseRecord>& l);
  // Loop: the lease alone joins the watchdog, if its caller has not written
  // its release (adopt() without the events: they were told).
  void adopt_lease(const std::shared_ptr<LeaseRecord>& l);
  // Loop: the release a blocking caller wrote and read itself before the
  // loop adopted its lease (LockHandle::unlock), its work over at `ended`,
  // answered at `confirmed`: the lease ends with that answer.
  void end_before_adoption(const std::shared_ptr<LeaseRecord>& l, Released status, const StoreError* why,
                           Clock::time_point ended, Clock::time_point confirmed);
  // Loop: a cancelled acquisition leaves the wait queue.
  void cancel(const std::shared_ptr<Acquisition>& a);
  // Loop: the work on `l` is over, at `ended` as its thread read the clock
  // (handoff.cpp): its key goes on to the next caller here (a local
  // hand-off), or back to the store.
  void work_ended(const std::shared_ptr<LeaseRecord>& l, Clock::time_point ended = Clock::now());
  // Any thread, the work's (a pool worker, a handle's releaser): the work
  // on `l` is over. With nobody waiting here for any key, an exclusive
  // lease's release is written by this thread (DirectLane), and the loop
  // learns the work's end with the release's answer (released_direct());
  // else the loop is told (work_ended()).
  void work_over(const std::shared_ptr<LeaseRecord>& l);
  // Any thread: nobody waits here for any key, nor is on the way to (read
  // in that order, as work_over() reads them).
  bool nobody_waits() const noexcept { return starting_.load() == 0 && waits_.keys_waited() == 0; }
  // Loop: leases renewed at once, together (a set's).
  void renew_together(const std::vector<std::shared_ptr<LeaseRecord>>& leases) { watchdog_.renew_together(leases); }
  // Loop: release notices for `name` run `look` (WaitQueue::observe).
  void observe(std::uint64_t id, std::string_view name, std::function<void()> look) {
    waits_.observe(id, name, std::move(look));
  }
  void keep_observing(std::uint64_t id) { waits_.keep_observing(id); }
  void unobserve(std::uint64_t id) { waits_.unobserve(id); }
  // Loop: the stop begins. Waiters fail with RuntimeStopped; held leases
  // are given back and read lost (kRuntimeStopped); a grant from now on
  // is given back at once.
  void begin_stop();
  // The stopping thread, once the loop has joined.
  void clear() {
    waits_.clear();
    watchdog_.clear();
    decisions_.clear();  // none left: the loop's last turn acted on them
  }
  // Any thread: the leases held now.
  std::size_t held() const noexcept { return watchdog_.held(); }

  // Tokens a hand-off reservation asks for, at most.
  static constexpr std::uint32_t kTokenBlock = 64;

 private:
  // An attempt took the lock, or the call ends without it.
  void taken(const std::shared_ptr<Acquisition>& a, std::uint64_t fence, Clock::time_point sent);
  void fail(const std::shared_ptr<Acquisition>& a, std::exception_ptr err, bool busy = false);
  // A granted lease goes on as its call's Completion says.
  void start_lease(const std::shared_ptr<Acquisition>& a, const std::shared_ptr<LeaseRecord>& l);
  void run_on_pool(const std::shared_ptr<LeaseRecord>& l);
  void flush_to_pool();
  // Loop: the answer to a release written by the work's thread, whose work
  // ended at `ended`: as work_ended() and then the release's answer (no
  // hand-off: nobody waited when it was written).
  void released_direct(const std::shared_ptr<LeaseRecord>& l, Released status, const StoreError* why,
                       Clock::time_point ended);
  // A lease whose work will never start as the runtime stops: lost.
  void stopped_before_start(const std::shared_ptr<LeaseRecord>& l);
  // The watchdog let go of `l` (ended): its call completes, our next
  // waiter for the key may go.
  void lease_finished(const std::shared_ptr<LeaseRecord>& l);
  // `l`'s call ended (the watchdog let go of it, or handed it on): its
  // caller learns the outcome at the turn's end, then admission.
  void call_ended(const std::shared_ptr<LeaseRecord>& l);
  // Local hand-offs (handoff.cpp; Options::handoff.enabled, a store with
  // TokenBlocks): the first caller waiting here fits (exclusive, same
  // ttl, renewals); tokens kept in stock while one waits; `l`'s work is
  // over: true if the key went on to the next caller here, or stays ours
  // until a reservation lets it (then its answer hands it on or releases it).
  bool hand_off_fits(const LeaseRecord& l) const;
  void reserve_ahead(const std::shared_ptr<LeaseRecord>& l);
  void reserve(const LeaseRecord& l, const std::shared_ptr<HandOffStreak>& s);
  bool try_hand_off(const std::shared_ptr<LeaseRecord>& l);

  // Acts on what the wait queue and the watchdog decided, in order (the
  // table's calls into them end with it; what a store's answer or a timer
  // decided waits for the turn's end).
  void act();

  Parts parts_;
  TokenBlocks* const token_blocks_;  // null: no hand-offs
  DirectLane* const lane_;           // null: every request goes from the loop
  Decisions decisions_;              // before the parts that write to it
  bool acting_ = false;              // act() is running
  Watchdog watchdog_;
  WaitQueue waits_;
  TokenGenerator tokens_;
  std::shared_ptr<const RuntimeLinks> links_;
  // Granted works for the pool, posted together at the turn's end
  // (flush_to_pool), and their tasks (both reused).
  std::vector<std::shared_ptr<LeaseRecord>> to_pool_;
  std::vector<UniqueFunction> pool_tasks_;
  bool stop_begun_ = false;
  std::atomic<std::ptrdiff_t> starting_{0};  // calls handed to the loop, not in the wait queue yet  // begin_stop() ran (a lease granted since is given back)
};

}  // namespace lockwatch::detail
