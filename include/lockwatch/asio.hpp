/// @file
/// lockwatch/asio.hpp: lockwatch for Asio (standalone Asio, namespace
/// `asio`, 1.22 or later): completion tokens, cancellation slots and
/// C++20 coroutines. Header only; the library itself does not link Asio.
///
///   asio::awaitable<void> handle(lockwatch::Runtime& rt) {
///     const lockwatch::LockRequest r{.key = "sku:42", .ttl = 5s, .wait = 2s};
///     lockwatch::LockHandle h = co_await lockwatch::async_lock(rt, r, asio::use_awaitable);
///     co_await write(h.lease().fencing_token());        // renewed meanwhile
///     co_await h.async_release(asio::use_awaitable);
///   }
///   auto reserve = LOCKED("sku:{0}", 5s, lockwatch::forever)
///       [&](int sku) -> asio::awaitable<int> { co_return co_await take(sku); };
///   int left = co_await reserve(42);                   // no thread blocks
///
/// Every operation follows Asio's rules: it takes any completion token
/// (asio::use_awaitable, asio::use_future, asio::experimental::deferred,
/// asio::redirect_error, asio::experimental::as_tuple, a callback), its
/// handler runs exactly once on the handler's associated executor (never
/// inside the initiating call), the executor's work is tracked while it is
/// pending, and the handler's associated cancellation slot is honoured.
/// Errors are std::error_code values of lockwatch's category
/// (lockwatch::errc, errors.hpp), first, as in any Asio library: with
/// asio::use_awaitable a failure throws std::system_error carrying the
/// code; with redirect_error or as_tuple it is a value to test
/// (`if (ec == lockwatch::errc::busy)`), which also lets a coroutine give a
/// first lock back when the second is busy without a catch block.
///
/// - async_lock(runtime, request, token) (LockRequest, lock_request.hpp;
///   or the shorthand async_lock(runtime, key, ttl, token)) completes with
///   void(std::error_code, LockHandle). In a coroutine, name the request
///   before the co_await (GCC 12, see async_lock). Any cancellation
///   type ends a pending wait with errc::cancelled; a lock granted in the
///   race is given back. A bad request completes with
///   errc::invalid_argument (or errc::unsupported), nothing thrown.
/// - LockHandle::async_release(token) completes with
///   void(std::error_code): errc::lease_lost if the lease was lost while
///   held.
/// - async_lost(lease, token) completes with
///   void(std::error_code, std::optional<LostReason>) when the lease ends:
///   the reason if it was lost, std::nullopt once it was released.
///   Cancellation: errc::cancelled.
/// - async_campaign(election, token) completes with
///   void(std::error_code, Leadership) once this candidate leads (see
///   Election::campaign). Any cancellation type gives the campaign up
///   (Election::resign()): it completes with errc::cancelled, and a
///   leadership won in the race is given back (its stop_token fired).
/// - async_resign(election, token) completes with void(std::error_code)
///   once the release is confirmed (see Election::resign).
/// - LOCKED / lockwatch::locked(...) (with .on(), .wait(),
///   .renew_weight()) on a callable returning asio::awaitable<T> (member
///   functions too) give a callable returning asio::awaitable<T>: awaiting
///   it takes the lock without blocking, runs the coroutine on the awaiting
///   coroutine's executor with the lease renewed across every suspension,
///   releases the lock when the coroutine finishes (also by an exception)
///   and only then completes. A callable whose first parameter is a
///   `const Lease&` gets its lease there. A lost lease cancels the coroutine
///   (cancellation_type::terminal through its cancellation state: the
///   operation it awaits fails with operation_aborted), and the caller gets
///   LeaseLost whatever the coroutine did. Cancelling the caller cancels the
///   wait for the lock (Cancelled) or, once it runs, the coroutine. Errors
///   are the same typed exceptions as the future form's (each with its
///   code()).
///
/// Threading: a coroutine and the cancellation it receives must share one
/// thread or strand (Asio's rule for cancellation signals); the runtime's
/// notifier thread only posts to the executor. Costs: per operation one
/// shared block and one post to the executor; LOCKED adds a coroutine frame
/// and a co_spawn for the callable.
#pragma once

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_state.hpp>
#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include "lockwatch/lockwatch.hpp"

namespace lockwatch {
namespace detail {

/// A completion handler waiting for the runtime: it keeps the handler's
/// executor busy (work guard) until complete() posts it there, once.
template <class Handler, class... Args>
class AsioCompletion {
 public:
  explicit AsioCompletion(Handler h)
      : work_(asio::make_work_guard(asio::get_associated_executor(h))), handler_(std::move(h)) {}

  /// Any thread, once: the handler runs on its executor with `args`, after
  /// its cancellation slot is cleared (the slot's handler may refer to it).
  void complete(Args... args) {
    auto ex = work_.get_executor();
    asio::post(ex, [h = std::move(handler_), w = std::move(work_), ... a = std::move(args)]() mutable {
      asio::get_associated_cancellation_slot(h).clear();
      std::move(h)(std::move(a)...);
    });
  }

 private:
  asio::executor_work_guard<asio::associated_executor_t<Handler>> work_;
  Handler handler_;
};

/// A cancel that may come before the runtime handed out what cancels (a
/// ticket or a watch): it is applied as soon as that is known.
template <class Canceller>
class PendingCancel {
 public:
  /// Any thread: the operation should end.
  void request() {
    Canceller c;
    {
      std::lock_guard lk(mu_);
      requested_ = true;
      c = canceller_;
    }
    if (c) after_cancel(c.cancel());
  }
  void set(Canceller c) {
    bool requested;
    {
      std::lock_guard lk(mu_);
      canceller_ = c;
      requested = requested_;
    }
    if (requested) after_cancel(c.cancel());
  }
  /// What to do when a cancel won (async_lost completes the handler itself).
  std::function<void()> on_won;

 private:
  void after_cancel(bool won) {
    if (won && on_won) on_won();
  }
  std::mutex mu_;
  bool requested_ = false;
  Canceller canceller_;
};

template <class Handler, class Canceller>
void connect_cancel(Handler& handler, const std::shared_ptr<PendingCancel<Canceller>>& cancel) {
  auto slot = asio::get_associated_cancellation_slot(handler);
  if (slot.is_connected()) {
    slot.assign([cancel](asio::cancellation_type_t type) {
      if (type != asio::cancellation_type::none) cancel->request();
    });
  }
}

/// A lock taken as async_lock takes it, the error as the typed exception
/// (LockHandle::failure()): what LOCKED on a coroutine awaits.
template <class CompletionToken>
auto async_lock_typed(Runtime& runtime, LockRequest request, CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, void(std::exception_ptr, LockHandle)>(
      [](auto handler, Runtime* rt, LockRequest request) {
        using Done = AsioCompletion<decltype(handler), std::exception_ptr, LockHandle>;
        auto cancel = std::make_shared<PendingCancel<AcquireTicket>>();
        connect_cancel(handler, cancel);
        auto done = std::make_shared<Done>(std::move(handler));
        // A refused request reaches the handler too (an empty ticket).
        cancel->set(rt->async_acquire(std::move(request), [done](std::error_code ec, LockHandle h) {
          std::exception_ptr e = h.failure();
          if (ec && !e) e = std::make_exception_ptr(std::system_error(ec));
          done->complete(e, ec ? LockHandle() : std::move(h));
        }));
      },
      token, &runtime, std::move(request));
}

/// The state a LOCKED coroutine shares with the lease's loss handler and
/// the caller's cancellation; touched on the coroutine's executor only.
template <class Executor>
struct LockedRun {
  explicit LockedRun(Executor e) : ex(std::move(e)) {}
  Executor ex;
  asio::cancellation_signal signal;  ///< the callable's cancellation
  bool done = false;                 ///< the callable finished: nothing more to cancel
  /// Why the lease was lost (a LostReason; -1 while held): written on the
  /// notifier thread, which tells a loss before the release's outcome.
  std::atomic<int> lost{-1};
};

template <class T, class Executor, class Invoke>
asio::awaitable<T, Executor> run_locked(Runtime* rt, LockRequest request, std::exception_ptr key_error, Invoke invoke) {
  if (key_error) std::rethrow_exception(key_error);
  // The release below must run even when the caller was cancelled.
  const bool throw_if_cancelled = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  Runtime& runtime = rt ? *rt : Runtime::default_runtime();
  std::exception_ptr error;
  LockHandle h;
  try {
    h = co_await async_lock_typed(runtime, std::move(request), asio::use_awaitable_t<Executor>{});
  } catch (...) {
    error = std::current_exception();
  }
  if (error) {
    co_await asio::this_coro::throw_if_cancelled(throw_if_cancelled);
    std::rethrow_exception(error);
  }
  auto ex = co_await asio::this_coro::executor;
  auto run = std::make_shared<LockedRun<Executor>>(ex);
  // A lost lease cancels the callable, on its executor.
  LeaseWatch watch = h.lease().on_lost([run](std::optional<LostReason> reason) {
    if (!reason) return;
    run->lost.store(static_cast<int>(*reason), std::memory_order_release);
    asio::post(run->ex, [run] {
      if (!run->done) run->signal.emit(asio::cancellation_type::terminal);
    });
  });
  // So does the caller's cancellation (its slot is free while the callable
  // runs on a slot of its own).
  asio::cancellation_state cs = co_await asio::this_coro::cancellation_state;
  using Value = std::conditional_t<std::is_void_v<T>, bool, T>;
  std::optional<Value> value;
  if (cs.cancelled() != asio::cancellation_type::none) {
    error = std::make_exception_ptr(Cancelled(h.lease().key()));  // granted as it was cancelled
  } else {
    auto caller = cs.slot();  // unconnected when the caller cannot be cancelled
    if (caller.is_connected()) {
      caller.assign([run](asio::cancellation_type_t type) {
        if (!run->done) run->signal.emit(type);
      });
    }
    try {
      if constexpr (std::is_void_v<T>) {
        co_await asio::co_spawn(ex, invoke(h.lease()), asio::bind_cancellation_slot(run->signal.slot(), asio::use_awaitable_t<Executor>{}));
        value.emplace(true);
      } else {
        value.emplace(co_await asio::co_spawn(
            ex, invoke(h.lease()), asio::bind_cancellation_slot(run->signal.slot(), asio::use_awaitable_t<Executor>{})));
      }
    } catch (...) {
      error = std::current_exception();
    }
    if (caller.is_connected()) caller.clear();
  }
  run->done = true;
  // Released before the caller goes on; a lease lost while held overrides
  // whatever the callable did. The watch stays until the release's
  // outcome: it names the loss's reason.
  const std::string key = h.lease().key();
  const std::optional<LostReason> lost_before = h.lease().lost_reason();
  std::error_code release_code;
  co_await h.async_release(asio::redirect_error(asio::use_awaitable_t<Executor>{}, release_code));
  watch.cancel();
  std::exception_ptr release_error;
  if (release_code == errc::lease_lost) {
    const int lost = run->lost.load(std::memory_order_acquire);
    release_error = std::make_exception_ptr(
        LeaseLost(key, lost >= 0 ? static_cast<LostReason>(lost) : lost_before.value_or(LostReason::kExpired)));
  } else if (release_code) {
    release_error = std::make_exception_ptr(std::system_error(release_code));
  }
  co_await asio::this_coro::throw_if_cancelled(throw_if_cancelled);
  if (release_error) std::rethrow_exception(release_error);
  if (error) std::rethrow_exception(error);
  if constexpr (!std::is_void_v<T>) co_return std::move(*value);
}

template <class T, class Executor>
struct AsyncCall<asio::awaitable<T, Executor>> {
  static constexpr bool enabled = true;
  template <class Invoke>
  static asio::awaitable<T, Executor> start(Runtime* rt, LockRequest request, std::exception_ptr key_error,
                                            Invoke invoke) {
    return run_locked<T, Executor>(rt, std::move(request), std::move(key_error), std::move(invoke));
  }
};

}  // namespace detail

/// Takes the lock `request` names (see Runtime::async_acquire);
/// completes with void(std::error_code, LockHandle).
///
/// GCC 12 destroys the temporaries of a co_await expression twice when one
/// of them is a braced aggregate (a compiler bug, fixed in GCC 13): inside
/// a coroutine, name the request before awaiting,
///   const lockwatch::LockRequest r{.key = "sku:42", .ttl = 5s, .wait = 2s};
///   auto h = co_await lockwatch::async_lock(rt, r, asio::use_awaitable);
/// never `co_await async_lock(rt, {.key = ...}, token)`; outside a
/// coroutine a braced request is fine.
template <class CompletionToken>
auto async_lock(Runtime& runtime, LockRequest request, CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, void(std::error_code, LockHandle)>(
      [](auto handler, Runtime* rt, LockRequest request) {
        using Done = detail::AsioCompletion<decltype(handler), std::error_code, LockHandle>;
        auto cancel = std::make_shared<detail::PendingCancel<AcquireTicket>>();
        detail::connect_cancel(handler, cancel);
        auto done = std::make_shared<Done>(std::move(handler));
        // A refused request reaches the handler too (an empty ticket).
        cancel->set(rt->async_acquire(std::move(request),
                                      [done](std::error_code ec, LockHandle h) { done->complete(ec, std::move(h)); }));
      },
      token, &runtime, std::move(request));
}

/// The shorthand: an exclusive lock on `key` with a lease of `ttl`, renewed
/// for as long as it is held, without waiting (as Runtime::acquire(key, ttl)).
template <class CompletionToken>
auto async_lock(Runtime& runtime, std::string key, std::chrono::milliseconds ttl, CompletionToken&& token) {
  LockRequest request;
  request.key = std::move(key);
  request.ttl = ttl;
  return async_lock(runtime, std::move(request), std::forward<CompletionToken>(token));
}

/// Completes when `lease` ends: void(std::error_code, std::optional<LostReason>),
/// the reason if it was lost, std::nullopt if it was released. The lease
/// must outlive the call (not the operation).
template <class CompletionToken>
auto async_lost(const Lease& lease, CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, void(std::error_code, std::optional<LostReason>)>(
      [](auto handler, const Lease* lease) {
        using Done = detail::AsioCompletion<decltype(handler), std::error_code, std::optional<LostReason>>;
        auto cancel = std::make_shared<detail::PendingCancel<LeaseWatch>>();
        auto slot = asio::get_associated_cancellation_slot(handler);
        auto done = std::make_shared<Done>(std::move(handler));
        cancel->on_won = [done] { done->complete(errc::cancelled, std::nullopt); };
        if (slot.is_connected()) {
          slot.assign([cancel](asio::cancellation_type_t type) {
            if (type != asio::cancellation_type::none) cancel->request();
          });
        }
        cancel->set(lease->on_lost([done](std::optional<LostReason> reason) { done->complete({}, reason); }));
      },
      token, &lease);
}

/// Campaigns in `election` (Election::campaign); completes with
/// void(std::error_code, Leadership). The election must outlive the
/// operation.
template <class CompletionToken>
auto async_campaign(Election& election, CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, void(std::error_code, Leadership)>(
      [](auto handler, Election* election) {
        auto slot = asio::get_associated_cancellation_slot(handler);
        auto done =
            std::make_shared<detail::AsioCompletion<decltype(handler), std::error_code, Leadership>>(std::move(handler));
        try {
          election->campaign([done](std::error_code e, Leadership won) { done->complete(e, std::move(won)); });
        } catch (...) {
          // Refused before anything started: through the handler, on its executor.
          done->complete(detail::code_of(std::current_exception()), Leadership());
          return;
        }
        if (slot.is_connected()) {
          slot.assign([election](asio::cancellation_type_t type) {
            if (type != asio::cancellation_type::none) (void)election->resign();
          });
        }
      },
      token, &election);
}

/// Resigns from `election` (Election::resign); completes with
/// void(std::error_code) once the release is confirmed.
template <class CompletionToken>
auto async_resign(Election& election, CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, void(std::error_code)>(
      [](auto handler, Election* election) {
        auto done = std::make_shared<detail::AsioCompletion<decltype(handler), std::error_code>>(std::move(handler));
        election->resign([done](std::error_code e) { done->complete(e); });
      },
      token, &election);
}

template <class CompletionToken>
auto LockHandle::async_release(CompletionToken&& token) {
  if (!state_) throw InvalidArgument("LockHandle::async_release() on a handle that holds no lock");
  return asio::async_initiate<CompletionToken, void(std::error_code)>(
      [](auto handler, LockHandle handle) {
        auto done = std::make_shared<detail::AsioCompletion<decltype(handler), std::error_code>>(std::move(handler));
        handle.release([done](std::error_code e) { done->complete(e); });
      },
      token, std::move(*this));
}

}  // namespace lockwatch
