/// @file
/// lockwatch/locked_work.hpp: work to run under a lock, as LOCKED runs it.
///
/// Runtime::async_acquire(request, work) takes the lock, runs work->run()
/// on the runtime's pool while the watchdog renews the lease, releases the
/// lock, then calls work->finish() once with the outcome: what LOCKED does
/// with each call, for adapters of your own (another framework's futures, a
/// task system) that want the same thread hops as LOCKED (none through the
/// notifier thread) and the same reentrancy.
///
///   struct Count final : lockwatch::LockedWork {
///     int runs = 0;
///     std::promise<void> done;
///     void run() noexcept override { ++runs; }
///     void finish(std::exception_ptr error) noexcept override {
///       error ? done.set_exception(error) : done.set_value();
///     }
///   };
///   auto work = std::make_shared<Count>();
///   auto done = work->done.get_future();
///   rt.async_acquire({.key = "counter", .ttl = 5s}, work);
///
/// A call made inside another locked call (in run(), or in a LeaseScope)
/// runs on the calling thread instead: async_acquire() returns once it has
/// finished, and on a key the enclosing calls hold it is reentrant (no
/// round trip to the store). See Runtime::async_acquire.
#pragma once

#include <exception>

namespace lockwatch {

/// One locked call's work and its outcome (see the top of this file).
/// Shared with the runtime until finish() returned.
class LockedWork {
 public:
  virtual ~LockedWork() = default;

  /// Runs the work once the lock is held: on a pool thread, or on the
  /// calling thread for a nested call. Within the lease's scope:
  /// this_lease() is the call's lease, and a locked call on its key made
  /// here is reentrant. Keep the result (or the exception) for finish().
  /// Not called when no lock came, nor when the runtime stops first.
  virtual void run() noexcept = 0;

  /// Called exactly once: after the lock was released, or at once when
  /// no lock came or the lease was lost (its release then goes on in the
  /// background). `error` is why the call failed as a typed exception
  /// (LockNotAcquired, LeaseLost, ConnectionError, InvalidArgument,
  /// RuntimeStopped, ..., each with its code()), or null when run() ran
  /// under a lease kept to its end. On the thread that learnt the outcome
  /// (the runtime's I/O thread, a pool thread, or the caller's): keep it
  /// short, never block.
  virtual void finish(std::exception_ptr error) noexcept = 0;
};

}  // namespace lockwatch
