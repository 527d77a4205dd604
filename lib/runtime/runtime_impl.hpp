// lib/runtime/runtime_impl.hpp: the runtime's insides.
//
// detail::RuntimeImpl is admission and wiring: it validates a call, runs
// reentrant and nested calls on the caller's thread, hands the rest to the
// loop, dispatches granted work to the pool, and owns the stop order. What
// a lock means lives in three parts it wires together: the wait queue
// (taking locks), the watchdog (keeping them) and the wheel clock (their
// timer). Where a lock lives is the store's business (store/lock_store.hpp).
//
// Ownership by thread:
// - any thread: options, pool, loop.post, stats, the mutex-guarded
//   active_calls, stopping;
// - loop thread: store, clock, watchdog, waits, tokens (every member
//   function marked "loop" below), until stop() has joined the loop; after
//   that the destroying thread owns them.
#pragma once

#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>

#include "core/loop.hpp"
#include "core/token.hpp"
#include "ops/events.hpp"
#include "ops/metrics_server.hpp"
#include "lockwatch/runtime.hpp"
#include "runtime/acquisition.hpp"
#include "runtime/job_host.hpp"
#include "ops/stats.hpp"
#include "runtime/wait_queue.hpp"
#include "runtime/watchdog.hpp"
#include "runtime/wheel_clock.hpp"
#include "store/capabilities.hpp"
#include "store/lock_store.hpp"

namespace lockwatch {

namespace detail {
// Builds the store a runtime talks to; called once, on the constructing
// thread, before the loop uses it.
using StoreFactory = std::function<std::unique_ptr<LockStore>(Loop& loop, const Options& options)>;
// What inspect() and list() answer of a store's LockInfo (list.cpp).
LockState to_lock_state(std::string key, const LockInfo& info);
}  // namespace detail

struct detail::RuntimeImpl final : std::enable_shared_from_this<detail::RuntimeImpl>, detail::JobHost {
  using Clock = std::chrono::steady_clock;

  RuntimeImpl(Options opts, const detail::StoreFactory& make_store);

  // JobHost (the scheduled jobs).
  std::string store_name(std::string_view key) const override { return store->encode(key); }
  detail::JobClaims& job_claims() override;
  void check_lease(detail::LockSpec& spec) const override;
  detail::Events& job_events() noexcept override { return events; }
  bool post(UniqueFunction task) override { return loop.post(std::move(task)); }
  AcquireTicket acquire(detail::LockSpec spec, detail::AcquireCallback handler) override;
  void run_on_pool(UniqueFunction work) override { pool.post(std::move(work)); }
  Timeout at(TimerTask& task, Clock::time_point when) override { return clock.at(task, when); }
  void with_lease(const Lease& lease, const std::function<void()>& body) override;
  std::string owner_token(const Lease& lease) const override;

  // Any thread.
  void validate(detail::LockSpec& spec) const;
  void check_key(const std::string& key) const;
  // A set's keys made distinct and canonical (one key left: the spec names
  // it alone); InvalidArgument for an empty or oversized set or a bad key.
  void check_set(detail::LockSpec& spec) const;
  std::shared_ptr<detail::Acquisition> make_acquisition(detail::LockSpec spec, detail::Completion how);
  void dispatch(detail::LockSpec spec, std::shared_ptr<detail::Call> call);
  // A LOCKED call on a set (runtime/lock_set.cpp).
  void dispatch_set(detail::LockSpec spec, std::shared_ptr<detail::Call> call);
  // The lease of a LockHandle that this thread asked for on `key` and still
  // holds (nullptr if none).
  std::future<LockHandle> acquire(detail::LockSpec spec);
  // The handler form (JobHost above): `handler` runs on the notifier thread.
  // Loop: a cancelled acquisition leaves the wait queue.
  void cancel_acquire(const std::shared_ptr<detail::Acquisition>& a);
  std::string operator_name(const std::string& key) const;
  // "the mysql:// store", for messages.
  std::string store_kind() const;
  std::future<LockState> inspect(std::string key);
  // list.cpp: the locks held under `prefix` (Runtime::list).
  std::future<std::vector<LockState>> list(std::string prefix, std::size_t limit);
  // The store's whole view of `key`, its holder's owner token included
  // (Election reads who leads).
  std::future<detail::LockInfo> inspect_info(std::string key);
  std::future<bool> force_release(std::string key);
  // Release notices for `key` (Election::on_change): `look` runs on the
  // loop thread on each one (WaitQueue::observe). Returns the observer's
  // id, or 0 when the store reports no releases or the runtime stops.
  std::uint64_t observe_releases(const std::string& key, std::function<void()> look);
  // Subscribes again if the store's subscriptions were lost meanwhile.
  void keep_observing(std::uint64_t id);
  void unobserve_releases(std::uint64_t id);
  void call_done();
  // Starts a handle's acquisition for each spec (one key each) in one task
  // of the loop; `each(i, error, handle)` runs on the notifier thread once
  // per spec. Throws only before anything starts (a bad spec).
  void acquire_together(std::vector<detail::LockSpec> specs, detail::AcquireEach each);
  // Starts a handle's acquisition (both forms of acquire).
  std::shared_ptr<detail::Acquisition> start_handle(detail::LockSpec spec, const std::shared_ptr<detail::HandleCall>& call);
  void stop();
  std::string render_metrics() const;

  // Loop.
  void start_acquire(std::shared_ptr<detail::Acquisition> a);
  void taken(const std::shared_ptr<detail::Acquisition>& a, std::uint64_t fence, Clock::time_point sent);
  void fail(const std::shared_ptr<detail::Acquisition>& a, std::exception_ptr err, bool busy = false);
  void start_lease(const std::shared_ptr<detail::Acquisition>& a, const std::shared_ptr<detail::LeaseRecord>& l);
  // What every lease granted here knows of the runtime (made at the first
  // grant, loop thread).
  std::shared_ptr<const detail::RuntimeLinks> links;
  void run_on_pool(const std::shared_ptr<detail::LeaseRecord>& l);
  // A lease whose work will never start as the runtime stops: lost.
  void stopped_before_start(const std::shared_ptr<detail::LeaseRecord>& l);
  // Loop thread: the work on `l` is over (runtime/handoff.cpp): its key goes
  // on to the next caller here (a local hand-off), or back to the store.
  void work_ended(const std::shared_ptr<detail::LeaseRecord>& l);
  // Local hand-offs (Options::handoff.enabled) on a store with TokenBlocks:
  // the first caller waiting here fits (exclusive, same ttl, renewals).
  bool hand_off_fits(const detail::LeaseRecord& l) const;
  // Asks the store for the streak's next tokens when a caller waits here
  // and the stock is low (one request at a time).
  void reserve_ahead(const std::shared_ptr<detail::LeaseRecord>& l);
  void reserve(const detail::LeaseRecord& l, const std::shared_ptr<detail::HandOffStreak>& s);
  // `l`'s work is over: true if the key went on to the next caller here,
  // or stays ours until a reservation lets it (then the answer hands it on
  // or releases it).
  bool try_hand_off(const std::shared_ptr<detail::LeaseRecord>& l);
  // Tokens a reservation asks for, at most.
  static constexpr std::uint32_t kTokenBlock = 64;
  void lease_finished(const std::shared_ptr<detail::LeaseRecord>& l);
  void begin_stop();
  void close_all();

  const Options options;
  detail::StatsCounters stats;
  ThreadPool pool;
  // Runs stop callbacks and completion handlers: user code never runs on
  // the loop. Shared: a lease outliving the runtime reaches it (shut down
  // by then) through a weak reference.
  std::shared_ptr<ThreadPool> notifier_pool =
      std::make_shared<ThreadPool>(1, std::chrono::microseconds{}, "lw-notify");
  ThreadPool& notifier = *notifier_pool;
  ThreadPool event_thread{1, {}, "lw-events"};  // observers and the log sink: they never delay a stop callback
  detail::Events events;
  detail::Loop loop{options.runtime.busy_poll};
  std::unique_ptr<detail::LockStore> store;
  detail::TokenBlocks* const token_blocks = detail::capability<detail::TokenBlocks>(*store);  // null: no hand-offs
  detail::WheelClock clock;
  detail::Watchdog watchdog;
  detail::WaitQueue waits;
  detail::TokenGenerator tokens;
  std::unique_ptr<detail::MetricsServer> metrics_server;  // loop thread

  std::atomic<bool> stopping{false};
  bool stop_begun = false;  // loop: begin_stop() ran (a lease granted since is given back)
  std::atomic<std::uint64_t> next_observer{1};
  std::mutex mu;
  std::condition_variable cv;
  std::size_t active_calls = 0;  // guarded by mu
};

namespace detail {
// A call inside one holding its key runs within that holding when the
// holding covers its kind; InvalidArgument otherwise.
void check_reentrant(const std::string& key, const LockKind& held, const LockKind& asked);

// Internal constructors of a Runtime (the unit tests give it a store).
struct RuntimeAccess {
  static std::unique_ptr<Runtime> make(Options options, const StoreFactory& make_store);
  // What parts of the library built on the runtime (the scheduler) use.
  static detail::RuntimeImpl& impl(Runtime& runtime) noexcept { return *runtime.impl_; }
  static AcquireTicket ticket(std::shared_ptr<HandleCall> call) noexcept { return AcquireTicket(std::move(call)); }
};
}  // namespace detail

}  // namespace lockwatch
