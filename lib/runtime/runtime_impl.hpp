// lib/runtime/runtime_impl.hpp: the runtime's insides.
//
// detail::RuntimeImpl is admission and the stop order: it validates a
// call, runs reentrant and nested calls on the caller's thread, lets the
// rest in (Admission) and hands them to the loop, where the lock table
// (lock_table.hpp) owns each lock's life from then on; it wires the
// threads, the store and the wheel clock together, and stops them in
// order. Where a lock lives is the store's business (store/lock_store.hpp).
//
// Ownership by thread:
// - any thread: options, pool, loop.post, stats, events, admission;
// - loop thread: store, clock, the lock table, the metrics server, until
//   stop() has joined the loop; after that the destroying thread owns them.
#pragma once

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
#include "runtime/lock_table.hpp"
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

class detail::RuntimeImpl final : public std::enable_shared_from_this<detail::RuntimeImpl>, public detail::JobHost {
 public:
  using Clock = std::chrono::steady_clock;

  // Made shared (a lease reaches its runtime through a weak reference),
  // the lock table linked to it before any call.
  static std::shared_ptr<RuntimeImpl> make(Options opts, const detail::StoreFactory& make_store);
  RuntimeImpl(Options opts, const detail::StoreFactory& make_store);

  // JobHost (the scheduled jobs).
  std::string store_name(std::string_view key) const override { return store_->encode(key); }
  detail::JobClaims& job_claims() override;
  void check_lease(detail::LockSpec& spec) const override;
  detail::Events& job_events() noexcept override { return events_; }
  bool post(UniqueFunction task) override { return loop_.post(std::move(task)); }
  AcquireTicket acquire(detail::LockSpec spec, detail::AcquireCallback handler) override;
  void run_on_pool(UniqueFunction work) override { pool_.post(std::move(work)); }
  Timeout at(TimerTask& task, Clock::time_point when) override { return clock_.at(task, when); }
  void with_lease(const Lease& lease, const std::function<void()>& body) override;
  std::string owner_token(const Lease& lease) const override;

  // Admission, any thread: a call checked, let in and handed to the loop.
  void validate(detail::LockSpec& spec) const;
  // LOCKED's way in; a set's (runtime/lock_set.cpp).
  void dispatch(detail::LockSpec spec, std::shared_ptr<LockedWork> call);
  void dispatch_set(detail::LockSpec spec, std::shared_ptr<LockedWork> call);
  // A LockHandle's, as a future and with a handler (JobHost above; the
  // handler runs on the notifier thread).
  std::future<LockHandle> acquire(detail::LockSpec spec);
  // Runtime::lock(): a call without a wait for an exclusive lock, on a
  // store with a DirectLane, writes its request and reads the answer on
  // this thread (take_here()); any other goes the way of acquire().
  LockHandle lock(detail::LockSpec spec);
  // LockHandle::unlock() of a lease the loop has not taken in yet: its
  // release written and read on this thread, `handle` emptied. False
  // (nothing done) when it goes the way of release().
  bool release_here(const std::shared_ptr<detail::LeaseRecord>& l, LockHandle& handle);
  // Starts a handle's acquisition for each spec (one key each) in one task
  // of the loop; `each(i, error, handle)` runs on the notifier thread once
  // per spec. Throws only before anything starts (a bad spec).
  void acquire_together(std::vector<detail::LockSpec> specs, detail::AcquireEach each);
  // A cancelled handle's acquisition leaves the wait queue (on the loop).
  void cancel(std::shared_ptr<detail::Acquisition> a);
  // The work on a lease is over (a handle released, a nested call's or a
  // set's work done): on the loop, the lock table takes it from there.
  void end_work(std::shared_ptr<detail::LeaseRecord> l);
  void end_work(std::vector<std::shared_ptr<detail::LeaseRecord>> leases);
  // A set's keys renewed together now (on the loop).
  void renew_together(std::vector<std::shared_ptr<detail::LeaseRecord>> leases);

  // Operators' tools, any thread.
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

  // What the public Runtime shows, any thread.
  const Options& options() const noexcept { return options_; }
  ThreadPool& pool() noexcept { return pool_; }
  const std::shared_ptr<ThreadPool>& notifier() const noexcept { return notifier_pool_; }
  const detail::StatsCounters& stats() const noexcept { return stats_; }
  std::size_t held() const noexcept { return table_.held(); }
  void add_observer(std::shared_ptr<Observer> observer) { events_.add(std::move(observer)); }
  std::string render_metrics() const;
  std::string metrics_address() const;
  // The stop order: waiters fail, leases are given back, running work is
  // awaited, then the threads and the store close. Once.
  void stop();

 private:
  friend struct detail::RuntimeAccess;  // the unit tests reach the lock table
  void check_key(const std::string& key) const;
  // A set's keys made distinct and canonical (one key left: the spec names
  // it alone); InvalidArgument for an empty or oversized set or a bad key.
  void check_set(detail::LockSpec& spec) const;
  std::shared_ptr<detail::Acquisition> make_acquisition(detail::LockSpec spec, detail::Completion how);
  // Starts a handle's acquisition (both forms of acquire).
  std::shared_ptr<detail::Acquisition> start_handle(detail::LockSpec spec, const std::shared_ptr<detail::HandleCall>& call);
  // An admitted call on its way: its one attempt written by this thread
  // (DirectLane: a call that does not wait, exclusive, on a store that
  // offers it), else handed to the loop, which starts it there.
  void begin(const std::shared_ptr<detail::Acquisition>& a);
  bool write_directly(const std::shared_ptr<detail::Acquisition>& a);
  // lock()'s attempt on this thread: the lease, the caller's until the loop
  // takes it in; or null, the call gone the loop's way (its future tells).
  std::shared_ptr<detail::LeaseRecord> take_here(const std::shared_ptr<detail::Acquisition>& a,
                                                 detail::HandleCall& call);
  // A handle's call whose future its promise fulfils.
  static std::pair<std::shared_ptr<detail::HandleCall>, std::future<LockHandle>> promised_call(const std::string& key);
  // Hands admitted calls to the loop, in one task; false (each failed
  // with RuntimeStopped) when the loop takes no more.
  bool post_start(std::vector<std::shared_ptr<detail::Acquisition>> made);
  bool post_start(std::shared_ptr<detail::Acquisition> a);  // one: no vector made
  void refuse_start(const std::shared_ptr<detail::Acquisition>& a);  // the loop takes no more
  std::string operator_name(const std::string& key) const;
  // "the mysql:// store", for messages.
  std::string store_kind() const;
  void close_all();

  const Options options_;
  detail::StatsCounters stats_;
  ThreadPool pool_;
  // Runs stop callbacks and completion handlers: user code never runs on
  // the loop. Shared: a lease outliving the runtime reaches it (shut down
  // by then) through a weak reference.
  std::shared_ptr<ThreadPool> notifier_pool_ =
      std::make_shared<ThreadPool>(1, std::chrono::microseconds{}, "lw-notify");
  ThreadPool event_thread_{1, {}, "lw-events"};  // observers and the log sink: they never delay a stop callback
  detail::Events events_;
  detail::Loop loop_{options_.runtime.busy_poll};
  std::unique_ptr<detail::LockStore> store_;
  detail::WheelClock clock_;
  detail::Admission admission_;
  detail::LockTable table_;  // loop thread
  detail::DirectLane* const direct_ = detail::capability<detail::DirectLane>(*store_);
  std::mutex direct_tokens_mu_;
  detail::TokenGenerator direct_tokens_;  // the owner tokens of attempts written by callers (under the mutex)
  std::unique_ptr<detail::MetricsServer> metrics_server_;  // loop thread
  std::atomic<std::uint64_t> next_observer_{1};
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
  // The unit tests: the runtime's lock table (loop thread only).
  static LockTable& table(Runtime& runtime) noexcept { return runtime.impl_->table_; }
  static AcquireTicket ticket(std::shared_ptr<HandleCall> call) noexcept { return AcquireTicket(std::move(call)); }
};
}  // namespace detail

}  // namespace lockwatch
