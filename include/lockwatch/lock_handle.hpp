/// @file
/// lockwatch/lock_handle.hpp: a lock held outside LOCKED.
///
///   lockwatch::LockHandle h = runtime.acquire("report:daily", 30s).get();
///   ... h.lease().fencing_token(), h.lease().stop_token() ...
///   h.release().get();   // or let the handle go: it releases (without waiting)
///
/// For code that cannot be shaped as one callable (a lock held across
/// several steps, a benchmark of the bare protocol). The watchdog renews the
/// lease exactly as for LOCKED until release(); a lost lease shows in
/// lease().lost() / stop_token(), and release() then reports LeaseLost.
///
/// Taking a handle makes nothing reentrant by itself: a LOCKED call on its
/// key from the same thread waits like any other caller (two requests
/// served by one worker thread are still two holders). Code that should
/// run within the handle's holding says so with enter().
///
/// A handle of a set (lockwatch::all_of) holds every key of the set: its
/// lease() is the set's, release() gives back every key.
///
/// Threading: a handle is used by one thread at a time; lease() accessors
/// are safe from any thread. Move-only.
#pragma once

#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <system_error>

#include "lockwatch/lease.hpp"

namespace lockwatch {

namespace detail {
struct HandleState;
struct HandleAccess;
}  // namespace detail

class LockHandle;

/// A handle's lease handed over to the code of one scope on one thread
/// (LockHandle::enter()): while it lives, this_lease() returns that lease,
/// and a locked call on its key (LOCKED, lockwatch::mutex) made on the
/// thread runs within the holding instead of waiting for it, as a LOCKED
/// call nested in another does. Destroy it on the thread that made it,
/// before the handle is released. Neither copyable nor movable.
class [[nodiscard]] LeaseScope {
 public:
  ~LeaseScope();
  LeaseScope(const LeaseScope&) = delete;
  LeaseScope& operator=(const LeaseScope&) = delete;

 private:
  friend class LockHandle;
  LeaseScope(const void* runtime, const Lease* lease);
  const Lease* lease_;
  std::size_t entries_ = 1;  ///< one per key (a set's several)
};

/// A lock held outside a callable (Runtime::acquire, async_lock): renewed by the watchdog until
/// release(), or released when the handle is destroyed. Move-only; release() and the destructor
/// never throw.
class LockHandle {
 public:
  LockHandle() noexcept = default;
  /// Takes over `other`'s lock; `other` is left empty.
  LockHandle(LockHandle&&) noexcept = default;
  /// Releases the lock this handle held (without waiting), then takes over `other`'s.
  LockHandle& operator=(LockHandle&& other) noexcept;
  LockHandle(const LockHandle&) = delete;
  LockHandle& operator=(const LockHandle&) = delete;
  /// Releases the lock if release() was not called; does not wait.
  ~LockHandle();

  /// True until release() (or a move) takes the lock away.
  explicit operator bool() const noexcept { return state_ != nullptr; }
  /// Precondition: *this holds a lock.
  const Lease& lease() const noexcept;
  /// Hands this handle's lease to the calling thread for the scope's life
  /// (see LeaseScope). Taking a handle alone makes no later call on its
  /// thread reentrant: reentrancy follows a lease handed over explicitly,
  /// never the thread that happened to take it. Throws InvalidArgument on
  /// an empty handle.
  LeaseScope enter() const;
  /// Releases the lock. The future becomes ready once the store confirmed
  /// the release (or the key has surely expired), with LeaseLost if the
  /// lease was lost while held, or if the release could not be confirmed
  /// while the key may still outlive any bound (a store without one, or a
  /// renewal sent before the release still unanswered).
  /// Throws InvalidArgument on an empty handle.
  std::future<void> release();
  /// release().get() for a caller that blocks anyway: the same outcome,
  /// thrown. A handle of Runtime::lock() released before the watchdog took
  /// it in (before its first renewal was due) is released on the calling
  /// thread, as lock() took it.
  void unlock();
  /// The same with a handler instead of a future: called once with the
  /// error (errc::lease_lost) or none, on the runtime's notifier thread
  /// (never inside this call). Throws InvalidArgument on an empty handle
  /// (the handler is then never called).
  void release(std::function<void(std::error_code)> handler);
  /// The empty handle an asynchronous acquisition (Runtime::async_acquire,
  /// async_lock) completed with beside an error code: that error as its
  /// typed exception, for code that wants more than the code (a
  /// ConnectionError's endpoint and backend_code(), the store's message,
  /// how long LockNotAcquired waited): `std::rethrow_exception(h.failure())`.
  /// Null for any other handle.
  std::exception_ptr failure() const noexcept { return failure_; }
  /// Asio: release() with a completion token, completing with
  /// void(std::error_code). Defined by <lockwatch/asio.hpp>.
  template <class CompletionToken>
  auto async_release(CompletionToken&& token);

 private:
  friend struct detail::HandleAccess;
  explicit LockHandle(std::shared_ptr<detail::HandleState> state, bool set = false) noexcept
      : state_(std::move(state)), set_(set) {}
  explicit LockHandle(std::exception_ptr failure) noexcept : failure_(std::move(failure)) {}
  std::shared_ptr<detail::HandleState> state_;
  std::exception_ptr failure_;  ///< see failure()
  bool set_ = false;            ///< a set's handle (lockwatch::all_of)
};

}  // namespace lockwatch
