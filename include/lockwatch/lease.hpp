/// @file
/// lockwatch/lease.hpp: the lease a locked call holds while it runs.
///
/// Inside a callable run by LOCKED (or Runtime::acquire's holder),
/// lockwatch::this_lease() gives the lease: its key, its fencing token, the
/// time left before the holder must assume it lost the lock, and a
/// std::stop_token that is triggered when the lease is lost or its renewals
/// are spent. Work that writes to an external store passes fencing_token()
/// along so the store can reject a holder that was paused past its lease.
///
/// Threading: every accessor is safe from any thread. The watchdog updates
/// the lease on the runtime's I/O thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>

#include "lockwatch/errors.hpp"

namespace lockwatch {

namespace detail {
struct LeaseWatcher;
struct LeaseAccess;
}

/// A handler waiting for a lease to end (Lease::on_lost). Copyable;
/// cancel() is safe from any thread.
class LeaseWatch {
 public:
  LeaseWatch() noexcept = default;
  /// True only for the call that won: the handler is then never called.
  /// False once it was called or is about to be.
  bool cancel() noexcept;
  /// True when the watch refers to a handler (not default-constructed).
  explicit operator bool() const noexcept { return watcher_ != nullptr; }

 private:
  friend class Lease;
  explicit LeaseWatch(std::shared_ptr<detail::LeaseWatcher> w) noexcept : watcher_(std::move(w)) {}
  std::shared_ptr<detail::LeaseWatcher> watcher_;
};

/// The lease a locked call holds while it runs (this_lease(), LockHandle::lease()): its key, its
/// fencing token, the time left, and a stop token that fires when it is lost. Every accessor is
/// safe from any thread; the watchdog updates it on the runtime's I/O thread.
class Lease {
 public:
  /// The clock of the local deadline (monotonic).
  using Clock = std::chrono::steady_clock;

  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  /// The key as the caller built it (without the runtime's prefix). For a
  /// set (lockwatch::all_of), how it is named in messages:
  /// "all_of(acct:1, acct:2)"; keys() lists its keys.
  const std::string& key() const noexcept { return key_; }
  /// The keys the lease holds, in canonical order: the one key, or a set's.
  std::span<const std::string> keys() const noexcept;
  /// Strictly increasing per key across every holder on every client. For
  /// a set, the token of its first key in canonical order: a set's writes
  /// check each key's own, fencing_token(key).
  std::uint64_t fencing_token() const noexcept { return fencing_token_; }
  /// The fencing token of `key`, one of keys() (as the caller built it).
  /// Throws InvalidArgument for a key the lease does not hold.
  std::uint64_t fencing_token(std::string_view key) const;
  /// Time left before the local deadline (zero once lost). The deadline
  /// moves forward with every confirmed renewal. For a set, the least of
  /// its keys'.
  std::chrono::milliseconds remaining() const noexcept;
  /// Triggered when the lease is lost; poll it or attach a stop_callback.
  std::stop_token stop_token() const noexcept;
  /// Whether the lease was lost, and why.
  bool lost() const noexcept { return lost_reason_.load(std::memory_order_acquire) >= 0; }
  /// The reason once lost; std::nullopt while held.
  std::optional<LostReason> lost_reason() const noexcept;
  /// The ttl the lease was taken with, and how many renewals succeeded.
  std::chrono::milliseconds ttl() const noexcept { return ttl_; }
  /// How many renewals the store confirmed (for a set, the fewest of its
  /// keys').
  std::uint64_t renewals() const noexcept;

  /// Calls `handler` once when the lease ends: with the reason when it is
  /// lost (as stop_token() fires), or with std::nullopt when it ends held
  /// (released, or passed on). At once (but never inside this call) if it
  /// is over already. The handler runs on the runtime's notifier thread
  /// (on a thread of its own once the runtime is gone): keep it short and
  /// non-blocking. Any thread. Costs one small block per call, kept until
  /// the lease ends.
  LeaseWatch on_lost(std::function<void(std::optional<LostReason>)> handler) const;

 protected:
  friend struct detail::LeaseAccess;
  /// Made by the runtime, which owns every lease.
  Lease(std::string key, std::uint64_t fencing_token, std::chrono::milliseconds ttl, Clock::time_point deadline);
  ~Lease() = default;

  /// Moves the local deadline (the watchdog, on a confirmed renewal).
  void set_deadline(Clock::time_point d) noexcept {
    deadline_ns_.store(d.time_since_epoch().count(), std::memory_order_release);
  }
  /// Marks the lease lost; returns false if it already was.
  bool mark_lost(LostReason reason) noexcept;
  /// Triggers stop_token() (its callbacks run on this thread).
  void request_stop() noexcept;

  /// The key as the caller built it.
  std::string key_;
  /// The token the store handed out with the lock.
  std::uint64_t fencing_token_;
  /// The ttl the lease was taken with.
  std::chrono::milliseconds ttl_;
  /// The local deadline, in Clock ticks since its epoch.
  std::atomic<Clock::rep> deadline_ns_;
  /// Renewals confirmed so far.
  std::atomic<std::uint64_t> renewals_{0};
  std::atomic<std::int8_t> lost_reason_{-1};  ///< a LostReason once lost
  /// A set's lease (lockwatch::all_of): its keys' leases answer for it.
  bool set_ = false;
  /// The hold histogram's label (LockRequest::metrics_pattern; 0: none),
  /// set by the runtime at grant.
  std::uint16_t metrics_pattern_ = 0;

 private:
  /// Made on the first stop_token(): most leases never hand one out, and a
  /// stop state is a heap block of its own.
  mutable bool stop_requested_ = false;
  mutable std::stop_source stop_{std::nostopstate};
};

/// The lease of the innermost locked call running on this thread. Throws
/// NoActiveLease outside a locked call.
const Lease& this_lease();
/// Like this_lease(), but nullptr outside a locked call.
const Lease* current_lease() noexcept;

}  // namespace lockwatch
