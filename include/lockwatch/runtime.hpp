/// @file
/// lockwatch/runtime.hpp: the engine behind every locked call.
///
/// A Runtime owns one I/O thread (a libuv loop holding the Redis
/// connections and the watchdog's timer wheel), a thread pool for the work,
/// and the set of leases it holds. Calls from any thread are handed to the
/// I/O thread through one queue; commands from all of them are pipelined on
/// one connection per Redis endpoint.
///
/// LOCKED without .on(runtime) uses Runtime::default_runtime(), created on
/// first use from the environment (LOCKWATCH_STORE_URL).
///
/// Destruction stops in one order: new calls are refused (RuntimeStopped),
/// calls waiting for a lock fail with RuntimeStopped, running work is asked
/// to stop through its stop_token and awaited, held locks are released, the
/// connections are closed and the threads joined. Destroying a runtime from
/// one of its own pool threads is not allowed.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "lockwatch/errors.hpp"
#include "lockwatch/lock_handle.hpp"
#include "lockwatch/lock_key.hpp"
#include "lockwatch/lock_kind.hpp"
#include "lockwatch/lock_request.hpp"
#include "lockwatch/locked_work.hpp"
#include "lockwatch/observer.hpp"
#include "lockwatch/options.hpp"
#include "lockwatch/thread_pool.hpp"

namespace lockwatch {

namespace detail {
class RuntimeImpl;  ///< the runtime's inside (lib/runtime/runtime_impl.hpp)
struct HandleCall;  ///< a handle's acquisition on its way (lib/runtime/completion.hpp)
struct RuntimeAccess;
}  // namespace detail

/// What Runtime::async_acquire's handler is called with: the error (a
/// code of lockwatch's category, errors.hpp) and an empty handle, or no
/// error and the handle.
using AcquireHandler = std::function<void(std::error_code error, LockHandle handle)>;

/// Cancels an acquisition started with a handler (Runtime::async_acquire), as
/// Netty's Timeout cancels its task. Copyable; cancel() is safe from any
/// thread and may race with the grant: exactly one of the two wins.
class AcquireTicket {
 public:
  AcquireTicket() noexcept = default;
  /// True only for the call that won: the acquisition leaves the wait queue
  /// and its handler gets Cancelled (on the notifier thread, like any
  /// outcome). A lock granted in the race is given back, never reaches the
  /// handler, and is released a round trip later. False once the handler was
  /// called or is about to be (granted, failed) or it was cancelled already.
  bool cancel() noexcept;
  /// True when the ticket refers to an acquisition (not default-constructed).
  explicit operator bool() const noexcept { return call_ != nullptr; }

 private:
  friend struct detail::RuntimeAccess;
  explicit AcquireTicket(std::shared_ptr<detail::HandleCall> call) noexcept : call_(std::move(call)) {}
  std::shared_ptr<detail::HandleCall> call_;
};

/// One holder of a lock, as the store records it.
struct LockHolder {
  std::string owner;                              ///< its runtime's Options::runtime.owner_name (empty: not recorded)
  std::chrono::system_clock::time_point since{};  ///< its grant time, on the store's clock
  std::chrono::milliseconds held_for{0};          ///< how long ago, on the store's clock
  std::string token;  ///< its owner token (the store's record of who holds)
};

/// What the store says of a lock right now (an operator's view; no lease is
/// taken). Over Redlock: held when a majority holds it for one owner.
struct LockState {
  /// The key as asked for.
  std::string key;
  /// Whether the lock is held by anyone.
  bool held = false;
  std::chrono::milliseconds ttl{0};   ///< remaining ttl when held
  /// The highest fencing token handed out for the key, or above it: on
  /// Redis the counter of its Cluster slot, shared with the other keys of
  /// that slot (the highest token handed out in the slot); on SQL the key's
  /// own. The next holder's token is higher. 0 if nothing was ever locked
  /// there.
  std::uint64_t fencing_token = 0;
  /// How it is held, when held.
  LockKind kind{};
  /// The holder's Options::runtime.owner_name (of a shared or permit lock: the
  /// holder granted first); empty when not held, or where the store keeps
  /// none (the redisson layout).
  std::string owner;
  /// When that holder was granted the lock, on the store's clock.
  std::chrono::system_clock::time_point since{};
  /// How long ago that was, on the store's clock (hosts with skewed clocks
  /// agree on it).
  std::chrono::milliseconds held_for{0};
  /// When held: each holder (one for exclusive and fair locks), the first
  /// granted first.
  std::vector<LockHolder> holders;
};

/// Counters since the runtime started; each is read on its own (relaxed).
struct RuntimeStats {
  std::uint64_t held_leases = 0;     ///< held right now (neither released nor lost)
  std::uint64_t acquired = 0;        ///< leases taken
  std::uint64_t renewals_sent = 0;   ///< lease renewals sent
  std::uint64_t renew_commands = 0;  ///< commands that carried them (one per tick and chunk)
  std::uint64_t leases_lost = 0;     ///< leases reported lost
  std::uint64_t timer_wakeups = 0;   ///< times the watchdog's wheel woke the I/O thread
  /// Locks passed to the next caller waiting in this runtime without a
  /// release and a new acquisition (Options::handoff.enabled).
  std::uint64_t local_handoffs = 0;
  /// Blocks of fencing tokens reserved from the store for those hand-offs.
  std::uint64_t token_reservations = 0;
  /// Attempts to take a lock that waited in the client to be sent, because
  /// 16,384 already awaited the store's answer. Each is sent as an earlier
  /// one is answered, and its lease's ttl counts from then: many locks
  /// asked for at once are taken, and then renewed, at the store's pace.
  std::uint64_t attempts_queued = 0;
  /// The least time any lease had left before its local deadline when a
  /// renewal was confirmed (microseconds::max() until one is): how close the
  /// watchdog came to losing a lease. Alert on it falling towards zero.
  /// Negative: a confirmation was read only after the deadline had passed
  /// (a stalled process); it still counted, as Redis had kept the key.
  std::chrono::microseconds min_renewal_slack = std::chrono::microseconds::max();
};

/// Owns everything a lock needs: one I/O thread (a libuv loop holding the store's connections and
/// the watchdog's timer wheel), a thread pool for the locked work, and the leases. Its calls are
/// safe from any thread. Destroying it stops in one order: new calls fail with RuntimeStopped,
/// waiting calls fail, running work is asked to stop and awaited, held locks are released,
/// connections closed, threads joined.
class Runtime {
 public:
  /// Throws InvalidArgument for bad options, and ListenError when
  /// Options::observability.metrics_listen is set and the metrics endpoint cannot listen
  /// there (the port is taken, say). Connecting starts at once but never
  /// blocks: an unreachable Redis shows as ConnectionError on calls.
  explicit Runtime(Options options = Options::from_env());
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// The process-wide runtime used by LOCKED without .on(): created on first
  /// use from Options::from_env(); lives until the process exits.
  static Runtime& default_runtime();

  /// The options the runtime was made with.
  const Options& options() const noexcept;
  /// The pool that runs locked work.
  ThreadPool& pool() noexcept;

  /// Takes the lock `request` names, outside LOCKED: the future holds a
  /// LockHandle once acquired (renewed by the watchdog until released), or
  /// the error (LockNotAcquired after the wait, ConnectionError, LeaseLost,
  /// ...; each carries its code()). A bad request (InvalidArgument,
  /// Unsupported: see LockRequest) or a stopping runtime (RuntimeStopped) is
  /// thrown before anything starts. A key held as another kind (or a
  /// semaphore of another n) fails with InvalidArgument through the future,
  /// never admitting more holders. The handle makes no later call on this
  /// thread reentrant (see LockHandle::enter).
  ///
  ///   auto h = rt.acquire({.key = "sku:42", .ttl = 5s, .wait = 2s}).get();
  [[nodiscard]] std::future<LockHandle> acquire(LockRequest request);
  /// acquire(request).get() for a caller that blocks anyway: the same
  /// outcome, thrown. A request without a wait for an exclusive lock, on a
  /// single Redis node (plain TCP), is written and answered on the calling
  /// thread, on a connection of the runtime's that one caller at a time
  /// uses, as a raw Redis client would: no other thread wakes for it, and
  /// the watchdog takes the lease in before its first renewal is due.
  /// Others, or while that connection is in use, go the way of acquire().
  /// Pair it with LockHandle::unlock().
  ///
  ///   auto h = rt.lock({.key = "sku:42", .ttl = 5s});
  ///   ...
  ///   h.unlock();
  [[nodiscard]] LockHandle lock(LockRequest request);
  /// The same for an exclusive lock on `key` with a lease of `ttl`, renewed
  /// for as long as it is held, without waiting for a busy lock.
  [[nodiscard]] std::future<LockHandle> acquire(std::string key, std::chrono::milliseconds ttl);

  /// The same without a future, as an asynchronous operation: `handler` is
  /// called exactly once, with an error code (errc::busy, errc::unreachable,
  /// errc::cancelled, ...) and an empty handle, or with no error and the
  /// handle, on the runtime's notifier thread: never inside this call,
  /// never on the I/O thread. A bad request or a stopping runtime reaches
  /// the handler too (errc::invalid_argument, errc::unsupported,
  /// errc::runtime_stopped), and then the ticket is empty; nothing is
  /// thrown but for an empty handler (InvalidArgument). The handler should
  /// be short and not block (it delays the other handlers and the leases'
  /// stop callbacks): hand the outcome to your own executor. A handle the
  /// handler drops is released. Nothing is registered on the calling
  /// thread: LOCKED on the same key from this thread waits for the handle
  /// like any caller, unless it runs inside LockHandle::enter().
  AcquireTicket async_acquire(LockRequest request, AcquireHandler handler);
  /// The same operation with work as its completion, as LOCKED takes its
  /// locks (locked_work.hpp): once granted, work->run() runs on the pool
  /// with the lease renewed; the lock is released, then work->finish() is
  /// called once with the outcome. A lost lease finishes the work at once
  /// with LeaseLost. Made inside a locked call (within run(), or a
  /// LockHandle::enter() scope), the call runs on this thread instead and
  /// this returns once it finished: reentrant on a key held there, else
  /// waiting for its lock and holding it for run() alone. A bad request or
  /// a stopping runtime reaches finish() before this returns; nothing is
  /// thrown but for an empty `work` (InvalidArgument).
  void async_acquire(LockRequest request, std::shared_ptr<LockedWork> work);

  /// Operators' tools (the `lockwatch status` and `release --force`
  /// commands). inspect() says what the store holds for `key`;
  /// force_release() removes the lock whatever its owner and wakes its
  /// waiters (the fencing counter stays), and says whether one was held.
  /// A holder that loses its lock this way learns it at its next renewal.
  /// Errors (ConnectionError, ...) through the future; InvalidArgument or
  /// RuntimeStopped are thrown before anything starts.
  std::future<LockState> inspect(std::string key);
  /// The locks held whose key starts with `prefix` (empty: all of this
  /// runtime's key_prefix), at most `limit` (1 .. 10000, else
  /// InvalidArgument), each as inspect() describes it. The store is read
  /// in pages (SCAN on Redis, a range on etcd, a node's children on
  /// ZooKeeper, a query on SQL), never all at once; a store that cannot
  /// list throws Unsupported.
  std::future<std::vector<LockState>> list(std::string prefix, std::size_t limit = 100);
  /// Removes the lock whoever holds it (see inspect()): true when one was held.
  std::future<bool> force_release(std::string key);

  /// The runtime's metrics in the Prometheus text format 0.0.4 (every
  /// family from the start, with zeros; no label carries a key). Any thread;
  /// reads relaxed atomics, takes no lock the hot path takes.
  std::string metrics_text() const;
  /// The actual "host:port" the metrics endpoint listens on (useful with
  /// port 0), or empty when Options::observability.metrics_listen is empty.
  std::string metrics_address() const;
  /// Attaches an observer (see observer.hpp) for the runtime's life. Any
  /// thread; events that happen from now on reach it on the event thread.
  void add_observer(std::shared_ptr<Observer> observer);

  /// Leases held right now (acquired, neither released nor lost).
  std::size_t held_leases() const noexcept;
  /// The counters since the runtime started.
  RuntimeStats stats() const noexcept;

 private:
  using Impl = detail::RuntimeImpl;  ///< lib/runtime/runtime_impl.hpp
  friend struct detail::RuntimeAccess;
  explicit Runtime(std::shared_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;  ///< lock handles keep a weak reference
};

}  // namespace lockwatch
