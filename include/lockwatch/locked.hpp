/// @file
/// lockwatch/locked.hpp: the LOCKED decorator.
///
///   auto reserve = LOCKED("sku:{0}", 5s, 3) [&](int sku, int qty) { ... };
///   std::future<int> left = reserve(42, 1);
///
/// LOCKED(key_expr, ttl, retries) wraps any callable: a lambda, a function,
/// a pointer to member function (called with the object first; `{0}` is then
/// the first declared parameter) or a function object. Calling the result
/// returns a std::future at once; the lock for the key built from the call's
/// arguments is taken asynchronously, the callable runs on the runtime's
/// thread pool while the watchdog renews the lease every ttl * weight (at
/// most `retries` times, or lockwatch::forever), and the lock is released
/// before the future becomes ready, also when the callable throws.
///
/// key_expr is a key pattern whose fields take the call's arguments, a
/// constant string, or a callable that takes the call's arguments and
/// returns the key. Key patterns ("sku:{0}", {} and {N} fields, what each
/// argument type becomes, lockwatch_key() for your own types) are described
/// in lockwatch/key_pattern.hpp. With LOCKED the pattern is checked at
/// compile time against the call's argument types (the error names the
/// rule: key_pattern_...); a pattern given to lockwatch::locked() is checked
/// at each call (InvalidArgument through the future).
///
/// LOCKED is shorthand for the builder lockwatch::locked(key_expr, ttl,
/// retries), which also offers .on(runtime), .wait(duration),
/// .renew_weight(w), .context(text) or .context_from(fn) (given back in the
/// lock's span events, observer.hpp), and the kind of lock (lock_kind.hpp): .shared() (a
/// reader of a read-write lock), .permits(n) (one of n permits) or .fair()
/// (one holder, granted in the order the callers came):
///   auto job = lockwatch::locked("job:{0}", 10s, 5).on(rt).wait(2s)(fn);
///   auto read = LOCKED("doc:{0}", 5s, forever, .shared()) [&](int id) { ... };
/// (LOCKED takes the modifiers as an optional fourth argument, see below.)
///
/// Errors reach the future: LockNotAcquired (busy past the wait), LeaseLost
/// (the lease could not be kept: the callable's result is discarded),
/// ConnectionError / AuthError / StoreRefused, InvalidArgument, RuntimeStopped,
/// and whatever the callable threw. Builder arguments are checked at once
/// (InvalidArgument is thrown).
///
/// Arguments are copied into the call, as std::async does; the object of a
/// member function passed as an lvalue is kept by reference and must outlive
/// the future. The callable is shared by all calls of one decorated object.
///
/// A callable returning asio::awaitable<T> (with <lockwatch/asio.hpp>
/// included) gives one returning asio::awaitable<T> instead of a future:
/// see that header.
///
/// A callable (not a member function) whose first parameter is a
/// `const lockwatch::Lease&` is given the call's lease there, ahead of the
/// call's arguments (which alone make the key: `{0}` is still the first of
/// them). A coroutine reaches its lease so (its fencing token,
/// remaining(), stop_token()), as this_lease() cannot follow it across
/// threads; a plain callable may use either:
///   auto pay = LOCKED("order:{0}", 5s, forever)
///       [&](const lockwatch::Lease& lease, int order) -> asio::awaitable<void> {
///         co_await db.write(order, lease.fencing_token());
///       };
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "lockwatch/errors.hpp"
#include "lockwatch/key_pattern.hpp"
#include "lockwatch/lease.hpp"
#include "lockwatch/locked_work.hpp"
#include "lockwatch/runtime.hpp"

namespace lockwatch {
namespace detail {

/// LOCKED's .context_from(fn): called on the caller's thread at each call.
using ContextFrom = std::shared_ptr<const std::function<std::string()>>;

/// One call's request: the decorated object's, with the key built from the
/// call's arguments and the context .context_from() gives. What that
/// function throws is the call's error (through its future).
template <class Key>
LockRequest call_request(const LockRequest& common, const ContextFrom& context_from, Key&& key,
                         std::exception_ptr& error) {
  LockRequest request = common;
  request.key = std::forward<Key>(key);
  if (context_from && !error) {
    try {
      request.context = (*context_from)();
    } catch (...) {
      error = std::current_exception();
    }
  }
  return request;
}

// --------------------------------------------------------------- the call

/// The object of a member function given as an lvalue, kept by reference.
/// Unlike std::reference_wrapper it is unwrapped before std::invoke sees it,
/// so the object may be anything std::invoke takes: a T, a pointer, a
/// std::shared_ptr / std::unique_ptr, a std::reference_wrapper.
template <class T>
class ObjectRef {
 public:
  explicit ObjectRef(T& obj) noexcept : obj_(&obj) {}
  T& get() const noexcept { return *obj_; }

 private:
  T* obj_;
};

template <class S>
struct unwrapped {
  using type = S&&;
  static S&& get(S& s) noexcept { return std::move(s); }
};
template <class T>
struct unwrapped<ObjectRef<T>> {
  using type = T&;
  static T& get(ObjectRef<T>& r) noexcept { return r.get(); }
};
template <class S>
using unwrapped_t = typename unwrapped<S>::type;

/// How an argument waits for the work: a decayed copy, except the object of
/// a member function given as an lvalue, which is kept by reference.
template <bool ObjectSlot, class A>
using stored_t = std::conditional_t<ObjectSlot && std::is_lvalue_reference_v<A> &&
                                        !std::is_pointer_v<std::remove_cvref_t<A>>,
                                    ObjectRef<std::remove_reference_t<A>>, std::decay_t<A>>;

/// Whether a callable takes the call's lease first (`const Lease&`, then
/// the call's arguments A...), rather than the arguments alone.
template <class Fn, class... A>
inline constexpr bool takes_lease_v =
    !std::is_invocable_v<Fn&, A...> && std::is_invocable_v<Fn&, const Lease&, A...>;

/// What a decorated callable returns, called with the arguments A... (and
/// its lease first, if it takes one).
template <class Fn, class... A>
using locked_result_t = typename std::conditional_t<takes_lease_v<Fn, A...>, std::invoke_result<Fn&, const Lease&, A...>,
                                                    std::invoke_result<Fn&, A...>>::type;

/// Calls `fn` with the stored arguments, and `*lease` first if it takes one.
template <class R, bool WithLease, class Fn, class... S>
R invoke_locked(Fn& fn, const Lease* lease, std::tuple<S...>& args) {
  return std::apply(
      [&](S&... s) -> R {
        if constexpr (WithLease)
          return std::invoke(fn, *lease, unwrapped<S>::get(s)...);
        else
          return std::invoke(fn, unwrapped<S>::get(s)...);
      },
      args);
}

template <class R, bool WithLease, class Fn, class... S>
class CallImpl final : public LockedWork {
 public:
  template <class... A>
  explicit CallImpl(std::shared_ptr<Fn> fn, A&&... a) : fn_(std::move(fn)), args_(std::forward<A>(a)...) {}

  std::future<R> get_future() { return promise_.get_future(); }

  void run() noexcept override {
    try {
      // run() is called within the lease's scope on this thread.
      const Lease* lease = WithLease ? &this_lease() : nullptr;
      if constexpr (std::is_void_v<R>) {
        invoke_locked<R, WithLease>(*fn_, lease, args_);
      } else if constexpr (std::is_reference_v<R>) {
        result_.emplace(&invoke_locked<R, WithLease>(*fn_, lease, args_));
      } else {
        result_.emplace(invoke_locked<R, WithLease>(*fn_, lease, args_));
      }
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  void finish(std::exception_ptr error) noexcept override {
    try {
      if (!error) error = error_;
      if (error) {
        promise_.set_exception(error);
      } else if constexpr (std::is_void_v<R>) {
        promise_.set_value();
      } else if constexpr (std::is_reference_v<R>) {
        promise_.set_value(**result_);
      } else {
        promise_.set_value(std::move(*result_));
      }
    } catch (...) {
      // Only a second finish() could get here, and the runtime never
      // makes one.
    }
  }

 private:
  using Kept = std::conditional_t<std::is_reference_v<R>, std::add_pointer_t<std::remove_reference_t<R>>, R>;
  std::shared_ptr<Fn> fn_;
  std::tuple<S...> args_;
  std::promise<R> promise_;
  std::conditional_t<std::is_void_v<R>, bool, std::optional<Kept>> result_{};
  std::exception_ptr error_;
};

/// A callable whose result is asynchronous (an Asio coroutine) gets its own
/// call path, defined by the header of its framework: lockwatch/asio.hpp
/// specialises this for asio::awaitable<T>. `start` returns what the
/// decorated callable returns.
template <class R>
struct AsyncCall {
  static constexpr bool enabled = false;
};

/// What looks like an Asio awaitable (its members, without naming Asio).
template <class R>
concept AwaitableLike = requires { typename R::value_type; typename R::executor_type; } &&
                        requires(R& r) { r.await_ready(); };

template <class K>
using key_holder_t = std::conditional_t<RuntimeString<std::decay_t<K>>, std::string, std::decay_t<K>>;

/// The builder's argument checks: InvalidArgument if they fail.
void check_builder_ttl(std::chrono::milliseconds ttl);
void check_renew_weight(double w);
/// A request's context (LockRequest::context): at most max_context_bytes,
/// no control characters.
void check_context(std::string_view context);

}  // namespace detail

/// A decorated callable: calling it takes the lock and runs the callable.
template <class K, class Fn>
class Locked {
 public:
  template <class... Args>
  /// Takes the lock on the key built from `args` and runs the callable with them on the runtime's
  /// pool: a std::future of its result (an asio::awaitable for a coroutine, with
  /// lockwatch/asio.hpp). Returns at once; errors come through the future, so dropping it is a
  /// compile warning (a busy lock, a lost lease would go unseen; an awaitable dropped never runs).
  [[nodiscard("the future is how the call's outcome, a busy lock or a lost lease reaches you")]] auto
  operator()(Args&&... args) const {
    if constexpr (std::is_member_pointer_v<Fn>) {
      return call_member(std::forward<Args>(args)...);
    } else if constexpr (detail::AsyncCall<detail::locked_result_t<Fn, std::decay_t<Args>&&...>>::enabled) {
      using R = detail::locked_result_t<Fn, std::decay_t<Args>&&...>;
      return start_async<R, detail::takes_lease_v<Fn, std::decay_t<Args>&&...>, std::decay_t<Args>...>(
          make_key(args...), std::forward<Args>(args)...);
    } else {
      using R = detail::locked_result_t<Fn, std::decay_t<Args>&&...>;
      static_assert(!detail::AwaitableLike<std::remove_cvref_t<R>>,
                    "LOCKED on a coroutine returning asio::awaitable needs #include <lockwatch/asio.hpp>");
      using Call =
          detail::CallImpl<R, detail::takes_lease_v<Fn, std::decay_t<Args>&&...>, Fn, std::decay_t<Args>...>;
      // The key first: the arguments are moved into the call after.
      auto [key, error] = make_key(args...);
      auto call = std::make_shared<Call>(fn_, std::forward<Args>(args)...);
      auto future = call->get_future();
      start(std::move(call), std::move(key), error);
      return future;
    }
  }

  /// The key a call with these arguments would lock (without the prefix).
  template <class... Args>
  auto key_for(const Args&... args) const {
    if constexpr (std::is_member_pointer_v<Fn>) {
      return key_skipping_object(args...);
    } else {
      return detail::format_key(key_, args...);
    }
  }

 private:
  template <class>
  friend class LockedBuilder;
  Locked(K key, LockRequest request, detail::ContextFrom context_from, Runtime* runtime, Fn fn)
      : key_(std::move(key)),
        request_(std::move(request)),
        context_from_(std::move(context_from)),
        runtime_(runtime),
        fn_(std::make_shared<Fn>(std::move(fn))) {}

  template <class Obj, class... Args>
  auto call_member(Obj&& obj, Args&&... args) const {
    using ObjT = detail::stored_t<true, Obj&&>;
    using R = std::invoke_result_t<Fn&, detail::unwrapped_t<ObjT>, std::decay_t<Args>&&...>;
    if constexpr (detail::AsyncCall<R>::enabled) {
      if constexpr (std::is_same_v<ObjT, detail::ObjectRef<std::remove_reference_t<Obj>>>) {
        return start_async<R, false, ObjT, std::decay_t<Args>...>(make_key(args...), ObjT(obj),
                                                                  std::forward<Args>(args)...);
      } else {
        return start_async<R, false, ObjT, std::decay_t<Args>...>(make_key(args...), std::forward<Obj>(obj),
                                                                  std::forward<Args>(args)...);
      }
    } else {
    static_assert(!detail::AwaitableLike<std::remove_cvref_t<R>>,
                  "LOCKED on a coroutine returning asio::awaitable needs #include <lockwatch/asio.hpp>");
    using Call = detail::CallImpl<R, false, Fn, ObjT, std::decay_t<Args>...>;
    auto [key, error] = make_key(args...);
    std::shared_ptr<Call> call;
    if constexpr (std::is_same_v<ObjT, detail::ObjectRef<std::remove_reference_t<Obj>>>) {
      call = std::make_shared<Call>(fn_, ObjT(obj), std::forward<Args>(args)...);
    } else {
      call = std::make_shared<Call>(fn_, std::forward<Obj>(obj), std::forward<Args>(args)...);
    }
    auto future = call->get_future();
    start(std::move(call), std::move(key), error);
    return future;
    }
  }

  /// An asynchronous callable (see detail::AsyncCall): the call keeps the
  /// arguments (stored as S...) and the callable until its result is done;
  /// `invoke(lease)` starts it, with the lease first if it takes one.
  template <class R, bool WithLease, class... S, class Key, class... A>
  auto start_async(std::pair<Key, std::exception_ptr> key, A&&... a) const {
    auto invoke = [fn = fn_, args = std::tuple<S...>(std::forward<A>(a)...)](const Lease& lease) mutable -> R {
      return detail::invoke_locked<R, WithLease>(*fn, &lease, args);
    };
    LockRequest request = detail::call_request(request_, context_from_, std::move(key.first), key.second);
    return detail::AsyncCall<R>::start(runtime_, std::move(request), key.second, std::move(invoke));
  }

  template <class Obj, class... Args>
  auto key_skipping_object(const Obj&, const Args&... args) const {
    return detail::format_key(key_, args...);
  }

  template <class... Args>
  auto make_key(const Args&... args) const {
    using Key = decltype(detail::format_key(key_, args...));
    try {
      return std::pair<Key, std::exception_ptr>{detail::format_key(key_, args...), nullptr};
    } catch (...) {
      return std::pair<Key, std::exception_ptr>{Key(), std::current_exception()};
    }
  }

  template <class Key>
  void start(std::shared_ptr<LockedWork> call, Key key, std::exception_ptr key_error) const {
    LockRequest request = detail::call_request(request_, context_from_, std::move(key), key_error);
    if (key_error) {
      call->finish(key_error);
      return;
    }
    Runtime* rt = runtime_;
    if (rt == nullptr) {
      try {
        rt = &Runtime::default_runtime();
      } catch (...) {
        call->finish(std::current_exception());
        return;
      }
    }
    rt->async_acquire(std::move(request), std::move(call));
  }

  K key_;
  LockRequest request_;  ///< all but the key, which each call builds
  detail::ContextFrom context_from_;
  Runtime* runtime_;
  std::shared_ptr<Fn> fn_;
};

/// The builder behind LOCKED. Immutable: each modifier returns a copy.
template <class K>
class LockedBuilder {
 public:
  /// Checks `ttl` (InvalidArgument); `retries` is a count or lockwatch::forever.
  LockedBuilder(K key, std::chrono::milliseconds ttl, Retries retries) : key_(std::move(key)) {
    detail::check_builder_ttl(ttl);
    request_.ttl = ttl;
    request_.retries = retries;
    if constexpr (std::is_same_v<K, std::string>) {
      request_.metrics_pattern = MetricsPattern(key_);
    } else if constexpr (std::is_same_v<K, LockKey>) {
      if (!key_.is_set()) {
        request_.metrics_pattern = MetricsPattern(key_.key());
      } else {
        std::string text = "all_of(";
        for (std::size_t i = 0; i < key_.keys().size(); ++i) text += (i ? ", " : "") + key_.keys()[i];
        request_.metrics_pattern = MetricsPattern(text + ")");
      }
    }
  }

  /// The `pattern` label of these calls' acquisition and hold histograms
  /// (Runtime::metrics_text): LOCKED gives its key expression as written,
  /// locked() its pattern string; a key function has none unless given
  /// here. Name a pattern, never a key: each distinct text is a series.
  LockedBuilder metrics_pattern(std::string_view text) const {
    LockedBuilder b = *this;
    b.request_.metrics_pattern = MetricsPattern(text);
    return b;
  }

  /// Attach `text` to every call's lock (LockRequest::context): given
  /// back in its span events (Observer::on_span). Checked at once
  /// (InvalidArgument past max_context_bytes or with a control character).
  LockedBuilder context(std::string_view text) const {
    detail::check_context(text);
    LockedBuilder b = *this;
    b.request_.context = std::string(text);
    b.context_from_ = nullptr;
    return b;
  }
  /// Attach what `fn()` returns at each call (on the calling thread, as the
  /// call starts): the caller's current trace context, say. Checked as
  /// .context(); a bad one, or what `fn` throws, fails that call.
  template <class F>
    requires std::is_convertible_v<std::invoke_result_t<const F&>, std::string>
  LockedBuilder context_from(F fn) const {
    LockedBuilder b = *this;
    b.request_.context.clear();
    b.context_from_ = std::make_shared<const std::function<std::string()>>(
        [fn = std::move(fn)]() -> std::string { return fn(); });
    return b;
  }

  /// Use this runtime instead of the process-wide default.
  LockedBuilder on(Runtime& runtime) const {
    LockedBuilder b = *this;
    b.runtime_ = &runtime;
    return b;
  }
  /// Wait up to `d` for a busy lock (woken by its release, not by polling)
  /// instead of failing at once.
  LockedBuilder wait(std::chrono::milliseconds d) const {
    if (d < std::chrono::milliseconds(0)) throw InvalidArgument("wait must not be negative");
    LockedBuilder b = *this;
    b.request_.wait = d;
    return b;
  }
  /// Take the key in read mode: many shared holders at once, none while an
  /// exclusive one (a call without .shared()) holds it; a waiting exclusive
  /// caller stops new shared ones. See lock_kind.hpp.
  LockedBuilder shared() const {
    LockedBuilder b = *this;
    b.request_.kind = LockKind::shared();
    return b;
  }
  /// Up to `n` holders of the key at once (a semaphore): each holds a permit
  /// of its own, leased and renewed like a lock. Every caller of the key must
  /// name the same n (another n fails with InvalidArgument). n >= 1.
  LockedBuilder permits(std::uint32_t n) const {
    if (n == 0) throw InvalidArgument("permits(n) needs n >= 1");
    LockedBuilder b = *this;
    b.request_.kind = LockKind::permits(n);
    return b;
  }
  /// One holder at a time, granted in the order the callers began to wait,
  /// across processes (a fair lock): see lock_kind.hpp. Combine with
  /// .wait(d): a caller that does not wait leaves the queue at once. A
  /// store that keeps no queue of waiters fails the call with Unsupported.
  LockedBuilder fair() const {
    LockedBuilder b = *this;
    b.request_.kind = LockKind::fair();
    return b;
  }
  /// Renew at ttl * w (default: the runtime's Options::watchdog.renew_weight, 0.9).
  LockedBuilder renew_weight(double w) const {
    detail::check_renew_weight(w);
    LockedBuilder b = *this;
    b.request_.renew_weight = w;
    return b;
  }

  template <class F>
  /// Decorates `fn`: a Locked that takes the lock for each call.
  Locked<K, std::decay_t<F>> operator()(F&& fn) const {
    return Locked<K, std::decay_t<F>>(key_, request_, context_from_, runtime_, std::forward<F>(fn));
  }
  /// LOCKED(...) ends in `+`, so the callable written after it is applied.
  template <class F>
  friend Locked<K, std::decay_t<F>> operator+(const LockedBuilder& b, F&& fn) {
    return b(std::forward<F>(fn));
  }

 private:
  K key_;
  LockRequest request_;  ///< all but the key, which each call builds
  detail::ContextFrom context_from_;
  Runtime* runtime_ = nullptr;
};

/// The builder LOCKED is shorthand for: lockwatch::locked(key_expr, ttl, retries)(fn). `key_expr`
/// is a key pattern ("sku:{0}"), a constant string, or a callable taking the call's arguments and
/// returning the key; a pattern is checked at each call (InvalidArgument through the future).
/// Throws InvalidArgument for a bad ttl.
template <class K>
LockedBuilder<detail::key_holder_t<K>> locked(K&& key_expr, std::chrono::milliseconds ttl, Retries retries) {
  return LockedBuilder<detail::key_holder_t<K>>(detail::key_holder_t<K>(std::forward<K>(key_expr)), ttl, retries);
}

}  // namespace lockwatch

/// LOCKED(key_expr, ttl, retries) callable: see the top of this file. The
/// key expression is evaluated inside a lambda instantiated with the call's
/// argument types, which is what lets a literal pattern be checked at compile
/// time; anything else it names is captured by copy. An optional fourth
/// argument is the builder's modifiers, written as they are chained (the
/// macro ends in `+`, so nothing can be chained after it):
///   LOCKED("doc:{0}", 5s, forever, .shared()) [&](int id) { ... };
///   LOCKED("gpu", 30s, forever, .permits(4).wait(10s).on(rt)) [&] { ... };
///   LOCKED("queue", 5s, forever, .fair().wait(1min)) [&] { ... };
#define LOCKED(key_expr, ttl, retries, ...)                                                     \
  ::lockwatch::locked(                                                                          \
      [=](const auto&... lockwatch_key_args_) {                                                 \
        return ::lockwatch::detail::format_key(key_expr, lockwatch_key_args_...);               \
      },                                                                                        \
      ttl, retries)                                                                             \
      .metrics_pattern(::lockwatch::detail::pattern_text(#key_expr)) __VA_ARGS__ +
