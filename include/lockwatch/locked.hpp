// lockwatch/locked.hpp: the LOCKED decorator.
//
//   auto reserve = LOCKED("sku:{0}", 5s, 3) [&](int sku, int qty) { ... };
//   std::future<int> left = reserve(42, 1);
//
// LOCKED(key_expr, ttl, retries) wraps any callable: a lambda, a function,
// a pointer to member function (called with the object first; `{0}` is then
// the first declared parameter) or a function object. Calling the result
// returns a std::future at once; the lock for the key built from the call's
// arguments is taken asynchronously, the callable runs on the runtime's
// thread pool while the watchdog renews the lease every ttl * weight (at
// most `retries` times, or lockwatch::forever), and the lock is released
// before the future becomes ready, also when the callable throws.
//
// key_expr is a fmt format string whose {N} refer to the call's arguments,
// a constant string, or a callable that takes the call's arguments and
// returns the key. With LOCKED, a format string that refers to an argument
// that cannot be formatted does not compile.
//
// LOCKED is shorthand for the builder lockwatch::locked(key_expr, ttl,
// retries), which also offers .on(runtime), .wait(duration) and
// .renew_weight(w):
//   auto job = lockwatch::locked("job:{0}", 10s, 5).on(rt).wait(2s)(fn);
//
// Errors reach the future: LockNotAcquired (busy past the wait), LeaseLost
// (the lease could not be kept: the callable's result is discarded),
// ConnectionError / AuthError / RedisError, InvalidArgument, RuntimeStopped,
// and whatever the callable threw. Builder arguments are checked at once
// (InvalidArgument is thrown).
//
// Arguments are copied into the call, as std::async does; the object of a
// member function passed as an lvalue is kept by reference and must outlive
// the future. The callable is shared by all calls of one decorated object.
//
// A callable returning asio::awaitable<T> (with <lockwatch/asio.hpp>
// included) gives one returning asio::awaitable<T> instead of a future:
// see that header.
#pragma once

#include <fmt/format.h>

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
#include <typeinfo>
#include <utility>

#include "lockwatch/errors.hpp"
#include "lockwatch/lease.hpp"
#include "lockwatch/runtime.hpp"

namespace lockwatch {
namespace detail {

// ------------------------------------------------------------ key patterns

// Stands in for an argument whose type has no fmt::formatter, so that such
// arguments can be passed along as long as the pattern does not use them.
template <class T>
struct Unformattable {
  const T* value;
};

template <class T>
inline constexpr bool key_formattable_v = fmt::is_formattable<std::remove_cvref_t<T>>::value;

template <class T>
using key_arg_t =
    std::conditional_t<key_formattable_v<T>, std::remove_cvref_t<T>, Unformattable<std::remove_cvref_t<T>>>;

template <class T>
decltype(auto) key_arg(const T& v) {
  if constexpr (key_formattable_v<T>) {
    return (v);
  } else {
    return Unformattable<T>{&v};
  }
}

// Not constexpr on purpose: reaching it while checking a pattern at compile
// time is the compile error, and its name is the message.
[[noreturn]] void key_pattern_refers_to_an_argument_that_cannot_be_formatted(std::size_t index);
[[noreturn]] void throw_unformattable_key_argument(const char* type_name);
[[noreturn]] void throw_bad_key_pattern(std::string_view pattern, const char* why);

// A key format string checked at compile time against the call's argument
// types (through LOCKED): syntax, argument count, and that every argument
// it refers to can be formatted.
template <class... A>
class KeyPattern {
 public:
  template <class S>
    requires std::is_convertible_v<const S&, std::string_view>
  consteval KeyPattern(const S& s)  // NOLINT: implicit from the literal
      : pattern_(s) {
    // fmt checks syntax and argument count; check() checks formattability.
    (void)fmt::format_string<key_arg_t<A>...>(s);
    check(pattern_);
  }
  std::string_view pattern() const { return pattern_; }

 private:
  static consteval void check(std::string_view s) {
    constexpr bool ok[] = {key_formattable_v<A>..., true};
    std::size_t next = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] != '{') continue;
      if (i + 1 < s.size() && s[i + 1] == '{') {
        ++i;
        continue;
      }
      std::size_t idx = 0;
      std::size_t j = i + 1;
      if (j < s.size() && s[j] >= '0' && s[j] <= '9') {
        while (j < s.size() && s[j] >= '0' && s[j] <= '9') idx = idx * 10 + static_cast<std::size_t>(s[j++] - '0');
      } else {
        idx = next++;
      }
      if (idx < sizeof...(A) && !ok[idx]) key_pattern_refers_to_an_argument_that_cannot_be_formatted(idx);
    }
  }
  std::string_view pattern_;
};

template <class S>
concept RuntimeString = !std::is_array_v<std::remove_cvref_t<S>> && std::is_convertible_v<const S&, std::string_view>;

// Three ways to make a key: a pattern checked at compile time (a literal),
// a pattern known only at run time, or a key function.
template <class... A>
std::string format_key(KeyPattern<std::type_identity_t<A>...> pattern, const A&... a) {
  return fmt::vformat(pattern.pattern(), fmt::make_format_args(key_arg(a)...));
}

template <RuntimeString S, class... A>
std::string format_key(const S& pattern, const A&... a) {
  std::string_view p(pattern);
  try {
    return fmt::vformat(p, fmt::make_format_args(key_arg(a)...));
  } catch (const fmt::format_error& e) {
    throw_bad_key_pattern(p, e.what());
  }
}

template <class F, class... A>
  requires(!RuntimeString<F> && std::invocable<const F&, const A&...>)
std::string format_key(const F& key_fn, const A&... a) {
  return std::string(std::invoke(key_fn, a...));
}

// --------------------------------------------------------------- the call

// The object of a member function given as an lvalue, kept by reference.
// Unlike std::reference_wrapper it is unwrapped before std::invoke sees it,
// so the object may be anything std::invoke takes: a T, a pointer, a
// std::shared_ptr / std::unique_ptr, a std::reference_wrapper.
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

// How an argument waits for the work: a decayed copy, except the object of
// a member function given as an lvalue, which is kept by reference.
template <bool ObjectSlot, class A>
using stored_t = std::conditional_t<ObjectSlot && std::is_lvalue_reference_v<A> &&
                                        !std::is_pointer_v<std::remove_cvref_t<A>>,
                                    ObjectRef<std::remove_reference_t<A>>, std::decay_t<A>>;

template <class R, class Fn, class... S>
class CallImpl final : public Call {
 public:
  template <class... A>
  explicit CallImpl(std::shared_ptr<Fn> fn, A&&... a) : fn_(std::move(fn)), args_(std::forward<A>(a)...) {}

  std::future<R> get_future() { return promise_.get_future(); }

  void run() noexcept override {
    try {
      if constexpr (std::is_void_v<R>) {
        std::apply([this](S&... s) { std::invoke(*fn_, unwrapped<S>::get(s)...); }, args_);
      } else if constexpr (std::is_reference_v<R>) {
        result_.emplace(
            &std::apply([this](S&... s) -> R { return std::invoke(*fn_, unwrapped<S>::get(s)...); }, args_));
      } else {
        result_.emplace(std::apply([this](S&... s) -> R { return std::invoke(*fn_, unwrapped<S>::get(s)...); }, args_));
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

// A callable whose result is asynchronous (an Asio coroutine) gets its own
// call path, defined by the header of its framework: lockwatch/asio.hpp
// specialises this for asio::awaitable<T>. `start` returns what the
// decorated callable returns.
template <class R>
struct AsyncCall {
  static constexpr bool enabled = false;
};

// What looks like an Asio awaitable (its members, without naming Asio).
template <class R>
concept AwaitableLike = requires { typename R::value_type; typename R::executor_type; } &&
                        requires(R& r) { r.await_ready(); };

template <class K>
using key_holder_t = std::conditional_t<RuntimeString<std::decay_t<K>>, std::string, std::decay_t<K>>;

}  // namespace detail

// A decorated callable: calling it takes the lock and runs the callable.
template <class K, class Fn>
class Locked {
 public:
  Locked(K key, detail::LockSpec spec, Runtime* runtime, Fn fn)
      : key_(std::move(key)), spec_(std::move(spec)), runtime_(runtime), fn_(std::make_shared<Fn>(std::move(fn))) {}

  template <class... Args>
  auto operator()(Args&&... args) const {
    if constexpr (std::is_member_pointer_v<Fn>) {
      return call_member(std::forward<Args>(args)...);
    } else if constexpr (detail::AsyncCall<std::invoke_result_t<Fn&, std::decay_t<Args>&&...>>::enabled) {
      using R = std::invoke_result_t<Fn&, std::decay_t<Args>&&...>;
      return start_async<R, std::decay_t<Args>...>(make_key(args...), std::forward<Args>(args)...);
    } else {
      using R0 = std::invoke_result_t<Fn&, std::decay_t<Args>&&...>;
      static_assert(!detail::AwaitableLike<std::remove_cvref_t<R0>>,
                    "LOCKED on a coroutine returning asio::awaitable needs #include <lockwatch/asio.hpp>");
      using Call = detail::CallImpl<std::invoke_result_t<Fn&, std::decay_t<Args>&&...>, Fn, std::decay_t<Args>...>;
      // The key first: the arguments are moved into the call after.
      auto [key, error] = make_key(args...);
      auto call = std::make_shared<Call>(fn_, std::forward<Args>(args)...);
      auto future = call->get_future();
      start(call, std::move(key), error);
      return future;
    }
  }

  // The key a call with these arguments would lock (without the prefix).
  template <class... Args>
  std::string key_for(const Args&... args) const {
    if constexpr (std::is_member_pointer_v<Fn>) {
      return key_skipping_object(args...);
    } else {
      return detail::format_key(key_, args...);
    }
  }

 private:
  template <class Obj, class... Args>
  auto call_member(Obj&& obj, Args&&... args) const {
    using ObjT = detail::stored_t<true, Obj&&>;
    using R = std::invoke_result_t<Fn&, detail::unwrapped_t<ObjT>, std::decay_t<Args>&&...>;
    if constexpr (detail::AsyncCall<R>::enabled) {
      if constexpr (std::is_same_v<ObjT, detail::ObjectRef<std::remove_reference_t<Obj>>>) {
        return start_async<R, ObjT, std::decay_t<Args>...>(make_key(args...), ObjT(obj), std::forward<Args>(args)...);
      } else {
        return start_async<R, ObjT, std::decay_t<Args>...>(make_key(args...), std::forward<Obj>(obj),
                                                           std::forward<Args>(args)...);
      }
    } else {
    static_assert(!detail::AwaitableLike<std::remove_cvref_t<R>>,
                  "LOCKED on a coroutine returning asio::awaitable needs #include <lockwatch/asio.hpp>");
    using Call = detail::CallImpl<R, Fn, ObjT, std::decay_t<Args>...>;
    auto [key, error] = make_key(args...);
    std::shared_ptr<Call> call;
    if constexpr (std::is_same_v<ObjT, detail::ObjectRef<std::remove_reference_t<Obj>>>) {
      call = std::make_shared<Call>(fn_, ObjT(obj), std::forward<Args>(args)...);
    } else {
      call = std::make_shared<Call>(fn_, std::forward<Obj>(obj), std::forward<Args>(args)...);
    }
    auto future = call->get_future();
    start(call, std::move(key), error);
    return future;
    }
  }

  // An asynchronous callable (see detail::AsyncCall): the call keeps the
  // arguments (stored as S...) and the callable until its result is done.
  template <class R, class... S, class... A>
  auto start_async(std::pair<std::string, std::exception_ptr> key, A&&... a) const {
    auto invoke = [fn = fn_, args = std::tuple<S...>(std::forward<A>(a)...)]() mutable -> R {
      return std::apply([&fn](S&... s) -> R { return std::invoke(*fn, detail::unwrapped<S>::get(s)...); }, args);
    };
    detail::LockSpec spec = spec_;
    spec.key = std::move(key.first);
    return detail::AsyncCall<R>::start(runtime_, std::move(spec), key.second, std::move(invoke));
  }

  template <class Obj, class... Args>
  std::string key_skipping_object(const Obj&, const Args&... args) const {
    return detail::format_key(key_, args...);
  }

  template <class... Args>
  std::pair<std::string, std::exception_ptr> make_key(const Args&... args) const {
    try {
      return {detail::format_key(key_, args...), nullptr};
    } catch (...) {
      return {std::string(), std::current_exception()};
    }
  }

  void start(const std::shared_ptr<detail::Call>& call, std::string key, std::exception_ptr key_error) const {
    if (key_error) {
      call->finish(key_error);
      return;
    }
    try {
      detail::LockSpec spec = spec_;
      spec.key = std::move(key);
      Runtime& rt = runtime_ ? *runtime_ : Runtime::default_runtime();
      rt.dispatch(std::move(spec), call);
    } catch (...) {
      // dispatch() throws only before anything started.
      call->finish(std::current_exception());
    }
  }

  K key_;
  detail::LockSpec spec_;
  Runtime* runtime_;
  std::shared_ptr<Fn> fn_;
};

// The builder behind LOCKED. Immutable: each modifier returns a copy.
template <class K>
class LockedBuilder {
 public:
  LockedBuilder(K key, std::chrono::milliseconds ttl, Retries retries) : key_(std::move(key)) {
    if (ttl <= std::chrono::milliseconds(0))
      throw InvalidArgument(fmt::format("ttl must be positive, got {} ms", ttl.count()));
    spec_.ttl = ttl;
    spec_.retries = retries.count();
  }

  // Use this runtime instead of the process-wide default.
  LockedBuilder on(Runtime& runtime) const {
    LockedBuilder b = *this;
    b.runtime_ = &runtime;
    return b;
  }
  // Wait up to `d` for a busy lock (woken by its release, not by polling)
  // instead of failing at once.
  LockedBuilder wait(std::chrono::milliseconds d) const {
    if (d < std::chrono::milliseconds(0)) throw InvalidArgument("wait must not be negative");
    LockedBuilder b = *this;
    b.spec_.wait = d;
    return b;
  }
  // Renew at ttl * w (default: the runtime's Options::renew_weight, 0.9).
  LockedBuilder renew_weight(double w) const {
    if (!(w > 0 && w < 1)) throw InvalidArgument(fmt::format("renewal weight must be in (0, 1), got {}", w));
    LockedBuilder b = *this;
    b.spec_.renew_weight = w;
    return b;
  }

  template <class F>
  Locked<K, std::decay_t<F>> operator()(F&& fn) const {
    return Locked<K, std::decay_t<F>>(key_, spec_, runtime_, std::forward<F>(fn));
  }
  // LOCKED(...) ends in `+`, so the callable written after it is applied.
  template <class F>
  friend Locked<K, std::decay_t<F>> operator+(const LockedBuilder& b, F&& fn) {
    return b(std::forward<F>(fn));
  }

 private:
  K key_;
  detail::LockSpec spec_;
  Runtime* runtime_ = nullptr;
};

template <class K>
LockedBuilder<detail::key_holder_t<K>> locked(K&& key_expr, std::chrono::milliseconds ttl, Retries retries) {
  return LockedBuilder<detail::key_holder_t<K>>(detail::key_holder_t<K>(std::forward<K>(key_expr)), ttl, retries);
}

}  // namespace lockwatch

template <class T>
struct fmt::formatter<lockwatch::detail::Unformattable<T>> {
  constexpr auto parse(fmt::format_parse_context& ctx) -> decltype(ctx.begin()) { return ctx.begin(); }
  template <class Ctx>
  auto format(const lockwatch::detail::Unformattable<T>&, Ctx& ctx) const -> decltype(ctx.out()) {
    lockwatch::detail::throw_unformattable_key_argument(typeid(T).name());
  }
};

// LOCKED(key_expr, ttl, retries) callable: see the top of this file. The
// key expression is evaluated inside a lambda instantiated with the call's
// argument types, which is what lets a literal pattern be checked at compile
// time; anything else it names is captured by copy.
#define LOCKED(key_expr, ttl, retries)                                                          \
  ::lockwatch::locked(                                                                          \
      [=](const auto&... lockwatch_key_args_) {                                                 \
        return ::lockwatch::detail::format_key(key_expr, lockwatch_key_args_...);               \
      },                                                                                        \
      ttl, retries) +
