// tests/support/memory_store.hpp: an in-memory LockStore for unit tests of
// the runtime's logic (watchdog, wait queue, quorum) without a server.
//
// MemoryBackend is the "server": locks with an owner token, an expiry and a
// fencing counter, judged on a clock the test can move (advance()). Any
// number of MemoryStores (clients, each on its own runtime's loop) share
// one backend, so a test can play several processes, or several Redlock
// nodes. A release with notify reaches every client subscribed to the name.
//
// StoreScript is what a test does to one client: take it down (every
// request fails as unreachable (a StoreError of kind kUnavailable, which
// users see as ConnectionError), the backend untouched), delay its
// requests (processed and answered that much later, as behind a busy
// server's queue), lose replies (the request is applied, but the answer is
// kUnavailable, as after a command timeout), script the answer to a
// request, and count what it was asked. The test keeps the script after
// handing the store to a runtime.
//
// Like the real stores, a MemoryStore answers every lock of a request
// exactly once, on its loop thread, never inside the call.
//
// Threading: MemoryBackend and StoreScript are thread-safe (one mutex
// each); MemoryStore is a LockStore (loop thread).
#pragma once

#include <uv.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/loop.hpp"
#include "store/capabilities.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::testing {

class MemoryStore;

class MemoryBackend {
 public:
  using Clock = std::chrono::steady_clock;

  // The backend's clock: the steady clock plus what advance() added.
  Clock::time_point now() const;
  // Moves the backend's clock forward: locks expire that much sooner.
  void advance(std::chrono::milliseconds d);
  // The backend's wall clock (what TIME says): the system clock plus what
  // advance() added.
  std::chrono::system_clock::time_point system_now() const;
  // Scheduled jobs: the last period run of a job's lock (nullopt: never).
  std::optional<std::int64_t> last_period(const std::string& name) const;

  // The test's view and hand (as an operator with redis-cli would).
  std::optional<std::string> owner(const std::string& name) const;  // nullopt: free or expired
  std::uint64_t fence(const std::string& name) const;
  std::chrono::milliseconds ttl_left(const std::string& name) const;
  void set_owner(const std::string& name, const std::string& token, std::chrono::milliseconds ttl);
  void erase(const std::string& name);  // as if it expired
  // Deletes the lock and notifies subscribers, as another holder's release.
  void release_as_other(const std::string& name);
  // One holder releases (with a notice) and the next takes the lock in the
  // same step, so no waiter can slip in between.
  void hand_over(const std::string& name, const std::string& next_token, std::chrono::milliseconds ttl);

  // Used by MemoryStore.
  detail::Acquired acquire(const detail::LockRef& lock);
  detail::Renewed renew(const detail::LockRef& lock);
  detail::Released release(const detail::LockRef& lock, bool notify);
  void raise(const std::string& name, std::uint64_t fence);
  // Raises the counter by n if `lock` holds it; the new value, else 0.
  std::uint64_t reserve(const detail::LockRef& lock, std::uint32_t n);
  detail::LockInfo inspect(const std::string& name) const;
  bool force_release(const std::string& name);
  detail::ClaimResult claim(const std::string& name, const std::string& token, std::int64_t period,
                            std::chrono::system_clock::time_point start);
  void subscribe(MemoryStore* client, const std::string& name);
  void unsubscribe(MemoryStore* client, const std::string& name);
  void detach(MemoryStore* client);

 private:
  struct Lock {
    std::string owner;
    Clock::time_point expires;
  };
  bool held(const std::string& name, Clock::time_point now) const;
  void notify(const std::string& name);  // mu_ held

  mutable std::mutex mu_;
  std::chrono::milliseconds offset_{0};
  std::map<std::string, Lock> locks_;
  std::map<std::string, std::uint64_t> fences_;
  std::map<std::string, std::int64_t> periods_;
  std::map<std::string, std::set<MemoryStore*>> subscribers_;
};

enum class Op { kAcquire, kRenew, kRelease, kRaise, kInspect, kForceRelease, kSubscribe, kUnsubscribe, kTime, kClaim, kReserve };

class StoreScript {
 public:
  using Clock = std::chrono::steady_clock;
  struct Call {
    Op op;
    std::string name;
    Clock::time_point at;
    std::size_t batch = 1;  // locks in the request
  };

  // Every request fails with ConnectionError while down.
  void set_down(bool down);
  // Replies are delivered this much later.
  void set_delay(std::chrono::milliseconds d);
  void set_delay(Op op, std::chrono::milliseconds d);
  // The next `n` requests of `op` are applied, but answered with a
  // ConnectionError (the reply was lost).
  void lose_replies(Op op, int n);
  // Answers instead of the backend, while they return a value (the backend
  // is not touched then).
  void script_acquire(std::function<std::optional<detail::Acquired>(const std::string& name)> fn);
  void script_renew(std::function<std::optional<detail::Renewed>(const std::string& name)> fn);
  void script_release(std::function<std::optional<detail::Released>(const std::string& name)> fn);
  // Whether the store reports releases (default true). Read when a store
  // is made, as the other traits below.
  void set_release_events(bool on) { release_events_ = on; }
  bool release_events() const { return release_events_; }
  // How much longer than its ttl the store says it may keep a lock
  // (LockStore::expiry_bound; default 0: the ttl, to the millisecond).
  void set_expiry_slack(std::chrono::milliseconds slack) { expiry_slack_ms_ = slack.count(); }
  std::chrono::milliseconds expiry_slack() const { return std::chrono::milliseconds(expiry_slack_ms_.load()); }
  // Whether a lock surely expires within expiry_bound() (LockStore::
  // expiry_bounded; default true; false as on etcd).
  void set_expiry_bounded(bool bounded) { expiry_bounded_ = bounded; }
  bool expiry_bounded() const { return expiry_bounded_.load(); }

  // What the store was asked, in order.
  std::vector<Call> calls() const;
  std::size_t count(Op op) const;      // requests
  std::size_t locks(Op op) const;      // locks over all requests
  // Waits (at most `bound`) until `count(op) >= n`.
  bool wait_for(Op op, std::size_t n, std::chrono::milliseconds bound = std::chrono::seconds(20)) const;

  // Used by MemoryStore.
  struct Plan {
    bool down = false;
    bool lose = false;
    std::chrono::milliseconds delay{0};
  };
  Plan plan(Op op, const std::string& name, std::size_t batch);
  std::optional<detail::Acquired> scripted_acquire(const std::string& name);
  std::optional<detail::Renewed> scripted_renew(const std::string& name);
  std::optional<detail::Released> scripted_release(const std::string& name);

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool down_ = false;
  std::chrono::milliseconds delay_{0};
  std::map<Op, std::chrono::milliseconds> op_delay_;
  std::map<Op, int> lose_;
  std::function<std::optional<detail::Acquired>(const std::string&)> acquire_fn_;
  std::function<std::optional<detail::Renewed>(const std::string&)> renew_fn_;
  std::function<std::optional<detail::Released>(const std::string&)> release_fn_;
  std::atomic<bool> release_events_{true};
  std::atomic<long long> expiry_slack_ms_{0};
  std::atomic<bool> expiry_bounded_{true};
  std::vector<Call> calls_;
};

class MemoryStore final : public detail::LockStore,
                          public detail::FenceRaising,
                          public detail::JobClaims,
                          public detail::OperatorTools,
                          public detail::TokenBlocks {
 public:
  MemoryStore(detail::Loop& loop, std::shared_ptr<MemoryBackend> backend, std::shared_ptr<StoreScript> script,
              std::string prefix = "lockwatch:");
  ~MemoryStore() override;

  // Its traits are read from `script` here, once: the key rules (keys
  // starting with "refused:" are refused), release events, expiry slack
  // and bound. Exclusive locks only.
  void start(detail::StoreEvents events) override;
  void acquire(std::span<const detail::LockRef> locks, AcquireDone done) override;
  std::size_t renew(std::span<const detail::LockRef> locks, std::shared_ptr<const void> keepalive,
                    RenewDone done) override;
  void release(std::span<const detail::LockRef> locks, bool notify, ReleaseDone done) override;
  void close() override;
  void subscribe(std::string_view name) override;
  void unsubscribe(std::string_view name) override;
  void raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) override;
  void server_time(TimeDone done) override;
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) override;
  void inspect(std::string_view name, InspectDone done) override;
  void force_release(std::string_view name, ForceDone done) override;
  void reserve_tokens(const detail::LockRef& lock, std::uint32_t n, ReserveDone done) override;

  // Any thread (the backend): a release notice for `name`.
  void notice(const std::string& name);
  // Loop thread: as if the connection carrying the subscriptions dropped.
  void drop_subscriptions();
  // Any thread: the same, posted to the store's loop.
  void drop_subscriptions_soon();

 private:
  // Runs `answer` on the loop after the plan's delay (a posted task, or a
  // uv timer): never inside the caller's call.
  void deliver(std::chrono::milliseconds delay, std::function<void()> answer);
  static detail::StoreError down_error();
  // A request's lock, owned until its answer is delivered.
  struct Owned {
    explicit Owned(const detail::LockRef& r)
        : name(r.name), token(r.token), ttl_ms(r.ttl_ms), ttl(r.ttl) {}
    detail::LockRef ref() const { return detail::LockRef{name, token, ttl_ms, ttl}; }
    std::string name, token, ttl_ms;
    std::chrono::milliseconds ttl;
  };

  detail::Loop& loop_;
  std::shared_ptr<MemoryBackend> backend_;
  std::shared_ptr<StoreScript> script_;
  detail::StoreEvents events_;
  bool closed_ = false;
  std::set<std::string> subscribed_;
  std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
};

}  // namespace lockwatch::testing
