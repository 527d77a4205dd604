/// @file
/// lockwatch/mutex.hpp: a distributed lock as a standard Lockable.
///
///   lockwatch::mutex inventory(runtime, "inventory", 10s);
///   {
///     std::unique_lock lk(inventory);              // waits for the lock
///     write(inventory.lease().fencing_token());
///   }                                              // released
///   std::scoped_lock both(m1, m2);                 // std::lock's deadlock avoidance
///   if (std::unique_lock lk(m, std::try_to_lock); lk) { ... }   // busy: not owned
///
/// A mutex names one lock (a key) on one runtime and models the standard
/// Lockable and TimedLockable requirements, so std::unique_lock,
/// std::scoped_lock, std::lock and std::condition_variable_any work with it.
/// lock() waits for the lock without polling (release notices, as .wait()
/// does), try_lock() makes one attempt and is false when the lock is busy,
/// try_lock_for()/try_lock_until() wait up to a bound, unlock() releases.
/// While it is held the watchdog renews it (at most `retries` times), and
/// lease() gives the lease: its fencing token, remaining(), stop_token().
///
/// It is a lease, not a thread's lock: unlock() may come from any thread,
/// and lock() while the object is held (from any thread) waits for that
/// unlock(), as a binary semaphore does. It is not reentrant: a LOCKED
/// call on the same key from the locking thread waits like any other
/// caller.
///
/// Errors: lock() and the try_ forms throw what the store reports
/// (ConnectionError, StoreRefused, RuntimeStopped...); only "busy" is a
/// false. unlock() never throws and does not wait for the store: a lease
/// lost while held is seen in lease().lost() / stop_token() before it.
///
/// Threading: any thread; the blocking calls must not run on the runtime's
/// own threads (its notifier delivers their outcome). Costs: one
/// acquisition per lock, as Runtime::acquire.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "lockwatch/lease.hpp"
#include "lockwatch/lock_handle.hpp"
#include "lockwatch/runtime.hpp"

namespace lockwatch {

/// A distributed lock as a standard Lockable and TimedLockable, for std::unique_lock and
/// std::scoped_lock. A lease, not a thread's lock: unlock() may come from any thread. Its blocking
/// calls must not run on the runtime's own threads.
class mutex {  // NOLINT: named as std::mutex, whose role it takes
 public:
  /// Throws InvalidArgument for an empty key or a bad ttl (checked at the
  /// first lock, as every acquisition's are).
  mutex(Runtime& runtime, std::string key, std::chrono::milliseconds ttl, Retries retries = forever);
  mutex(const mutex&) = delete;
  mutex& operator=(const mutex&) = delete;
  /// Releases the lock if it is held (without waiting).
  ~mutex();

  /// Takes the lock, waiting for it without polling. Throws what the acquisition failed with
  /// (ConnectionError, ...).
  void lock();
  /// One try: false when the lock is busy; other failures are thrown.
  bool try_lock();
  template <class Rep, class Period>
  /// Waits up to `d` for a busy lock: false when still busy.
  bool try_lock_for(const std::chrono::duration<Rep, Period>& d) {
    return try_lock_wait(std::chrono::ceil<std::chrono::milliseconds>(d));
  }
  template <class Clock, class Duration>
  /// Waits until `t` for a busy lock: false when still busy.
  bool try_lock_until(const std::chrono::time_point<Clock, Duration>& t) {
    return try_lock_wait(std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()));
  }
  /// Releases the lock; never throws and does not wait for the store.
  void unlock() noexcept;

  /// The held lock's lease; valid until unlock(). Throws NoActiveLease when
  /// the mutex is not held.
  const Lease& lease() const;
  /// Whether the mutex is held (by any thread).
  bool locked() const noexcept;
  /// The lock's key.
  const std::string& key() const noexcept { return key_; }

 private:
  /// One acquisition with a wait of `wait` (clamped to 0 .. max_wait):
  /// true when taken, false when busy past it.
  bool try_lock_wait(std::chrono::milliseconds wait);

  Runtime& runtime_;
  const std::string key_;
  const std::chrono::milliseconds ttl_;
  const Retries retries_;
  mutable std::mutex mu_;
  LockHandle held_;  ///< guarded by mu_
};

}  // namespace lockwatch
