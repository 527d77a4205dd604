// lib/store/memory/memory_space.hpp: the state behind memory://NAME, shared
// by the runtimes of one process that name the same space.
//
// A space holds what a lock server would, under one mutex (docs/stores.md,
// "In this process": what it keeps, how expiry is judged, how long it
// lives); an operation is a map lookup or two under it.
//
// A store hears from the space through its MemoryLink: posts to the
// store's loop that stop, atomically, when the store closes, so a runtime
// being torn down never gets a notice or an answer after close().
//
// Test hooks (steal, clear, pause/resume) let the shared suites play a
// server's faults on a space: pause() holds every request until resume()
// runs them in order (the stores fail them at their command timeout
// meanwhile, as clients of a hung server do).
//
// Threading: every member of MemorySpace and MemoryLink is thread-safe,
// except where a comment says loop thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/loop.hpp"
#include "store/capabilities.hpp"

namespace lockwatch::detail {

class MemoryStore;

// One store's way in from the space (and from other threads).
class MemoryLink {
 public:
  MemoryLink(Loop& loop, MemoryStore* store) : loop_(loop), store_(store) {}

  // Any thread. Runs `task` on the store's loop; false (dropped) once the
  // store closed.
  bool post(Loop::Task task);
  // Loop thread (or the store's destructor). No post lands after it returns.
  void close();
  // Loop thread: the store, or nullptr once it closed.
  MemoryStore* store() const noexcept { return store_; }

 private:
  Loop& loop_;
  std::mutex mu_;
  // Written by close() only, under mu_ (which post() reads it under); null once closed.
  MemoryStore* store_;
};

class MemorySpace {
 public:
  using Clock = std::chrono::steady_clock;

  // What an operation sees: the space's contents, its lock held.
  class State {
   public:
    // `owner_name` is recorded with a new grant, with the time.
    Acquired acquire(const LockRef& lock, std::string_view owner_name = {});
    Renewed renew(const LockRef& lock);
    // kYesUnheard when its notice reached no store but `self` (or none).
    Released release(const LockRef& lock, bool notify, const MemoryLink* self = nullptr);
    // A fair waiter gives up its place (FairQueue::withdraw).
    void withdraw(const LockRef& lock);
    void raise_fence(std::string_view name, std::uint64_t fence);
    // TokenBlocks::reserve_tokens: the counter's new value, 0 if not held with the token.
    std::uint64_t reserve_tokens(const LockRef& lock, std::uint32_t n);
    ClaimResult claim(std::string_view name, std::string_view token, std::int64_t period,
                      std::chrono::system_clock::time_point start);
    LockInfo inspect(std::string_view name) const;
    // The locks held whose name starts with `name_prefix`, at most `limit`,
    // each LockInfo::key its name past the first `key_from` bytes (the user's key).
    std::vector<LockInfo> list(std::string_view name_prefix, std::size_t key_from, std::size_t limit) const;
    bool force_release(std::string_view name);

   private:
    friend class MemorySpace;
    // One lock's record: its holders, whatever its kind (one for exclusive
    // and fair, any number of readers, n permits), its counter, its last
    // period and a fair lock's waiters.
    struct Entry {
      struct Holder {
        Clock::time_point until;  // held while in the future
        std::string owner_name;   // recorded with the grant, with its time ({}: unknown)
        std::chrono::system_clock::time_point since;
      };
      std::map<std::string, Holder, std::less<>> holders;  // by token
      LockKind kind{};  // what the holders (or a fair queue's waiters) hold it as
      std::uint64_t fence = 0;
      std::optional<std::int64_t> last_period;
      Clock::time_point writer_waits = Clock::time_point::min();  // no new reader until then
      // A fair lock's waiters in arrival order, each with the time its place
      // runs out (refreshed by each of its attempts).
      struct Waiter {
        std::string token;
        Clock::time_point until;
      };
      std::deque<Waiter> queue;
      // Forgets holders whose ttl ran out, and fair waiters whose place ran out.
      void purge(Clock::time_point now) {
        std::erase_if(holders, [now](const auto& h) { return h.second.until <= now; });
        std::erase_if(queue, [now](const Waiter& w) { return w.until <= now; });
      }
      // The shortest time a holder has left (a waiter's next try).
      std::chrono::milliseconds next_expiry(Clock::time_point now) const {
        if (holders.empty()) return std::chrono::milliseconds(0);
        const auto first = std::ranges::min_element(holders, {}, [](const auto& h) { return h.second.until; });
        return std::chrono::ceil<std::chrono::milliseconds>(first->second.until - now);
      }
      // `lock`'s holder (of its kind, exclusive or another), else end.
      auto mine(const LockRef& lock) {
        auto it = holders.find(lock.token);
        return it != holders.end() && kind.exclusive_kind() == lock.kind.exclusive_kind() ? it : holders.end();
      }
      // Holds it for `lock` till now + ttl; true for a new grant (not a retry's).
      bool hold(const LockRef& lock, Clock::time_point now) {
        auto [it, fresh] = holders.try_emplace(std::string(lock.token));
        it->second.until = now + lock.ttl;
        kind = lock.kind;
        return fresh;
      }
      // Grants it to `lock` with a new counter, or, to a retry after a lost
      // answer (the token holds it already), anew with the counter as it stands.
      Acquired grant(const LockRef& lock, Clock::time_point now) {
        if (hold(lock, now)) ++fence;
        return Acquired::taken(fence);
      }
    };
    Acquired acquire_exclusive(Entry& e, const LockRef& lock, Clock::time_point now);
    Acquired acquire_shared(Entry& e, const LockRef& lock, Clock::time_point now);
    Acquired acquire_fair(Entry& e, const LockRef& lock, Clock::time_point now);
    // `lock`'s entry, purged, if it has one.
    Entry* find(std::string_view name, Clock::time_point now);
    // The entry `token` holds exclusively (not expired), else null.
    Entry* owned(std::string_view name, std::string_view token);
    // Tells every subscribed store that `name` was released; whether any
    // store but `self` was told.
    bool notify(std::string_view name, const MemoryLink* self = nullptr);

    std::map<std::string, Entry, std::less<>> entries_;
    std::map<std::string, std::set<std::shared_ptr<MemoryLink>>, std::less<>> subscribers_;
  };
  using Op = std::function<void(State&)>;

  // The space named `name` ("" for memory:// alone), made if none lives.
  static std::shared_ptr<MemorySpace> open(const std::string& name);
  // The space named `name` if one lives (nullptr otherwise).
  static std::shared_ptr<MemorySpace> find(const std::string& name);

  const std::string& name() const noexcept { return name_; }

  // Runs `op` under the space's lock now and returns true, or, while the
  // space is paused, keeps it for resume() and returns false.
  bool run(const std::shared_ptr<MemoryLink>& from, Op op);
  // Release notices for `name` reach `link` (not held by pause()).
  void subscribe(const std::shared_ptr<MemoryLink>& link, std::string_view name);
  void unsubscribe(const std::shared_ptr<MemoryLink>& link, std::string_view name);
  // Forgets `link`: its subscriptions and its requests still held.
  void detach(const std::shared_ptr<MemoryLink>& link);

  // Test hooks (see above). `owner` holds `name` for `ttl`, whoever held it.
  void steal(std::string_view name, std::string_view owner, std::chrono::milliseconds ttl);
  // How many fair waiters `name`'s queue holds now (places not run out).
  std::size_t fair_waiters(std::string_view name) const;
  // The last period run of the job whose lock is `name` (nullopt: none).
  std::optional<std::int64_t> last_period(std::string_view name) const;
  // Loses every lock, counter and period (a server restarted empty).
  void clear();
  void pause();
  void resume();

  explicit MemorySpace(std::string name) : name_(std::move(name)) {}

 private:
  const std::string name_;
  mutable std::mutex mu_;
  State state_;  // guarded by mu_
  bool paused_ = false;  // guarded by mu_
  std::deque<std::pair<std::shared_ptr<MemoryLink>, Op>> held_;  // guarded by mu_
};

}  // namespace lockwatch::detail
