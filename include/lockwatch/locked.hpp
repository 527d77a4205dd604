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
/// returns the key.
///
/// Key patterns are lockwatch's own (a small part of std::format's syntax):
///   {}      the next argument (the first {} is argument 0)
///   {N}     argument N, from 0; a pattern uses {} or {N}, not both
///   {{ }}   a literal brace
/// A field takes no format spec ({0:x} is an error): a key is a name that
/// every process must spell alike, so its parts have one spelling each. For
/// another one, use a key function or give the type a lockwatch_key().
/// What an argument becomes:
///   integers, enums  decimal (an enum: its underlying value)
///   floating point   the shortest text that reads back as the same value
///                    (std::to_chars), fixed for decimal exponents -4 .. 15,
///                    else scientific (1e+16), as lockwatch always spelled it
///   bool, char       true / false; the character (signed and unsigned char
///                    are numbers)
///   strings          std::string, std::string_view, const char* (not null),
///                    char arrays
///   your type T      lockwatch_key(const T&), found by argument-dependent
///                    lookup (declare it next to T), returning std::string,
///                    std::string_view or const char*; it comes before the
///                    rules above (an enum's names, say)
/// No other type can be a key part; an argument the pattern does not use may
/// be of any type. With LOCKED the pattern is checked at compile time against
/// the call's argument types: a malformed pattern, a field without its
/// argument, or one whose argument cannot be a key part does not compile (the
/// error names the rule: key_pattern_...). A pattern given to
/// lockwatch::locked() is checked at each call: the same faults are an
/// InvalidArgument through the future. Costs: no iostream, no locale; the
/// key is sized first and written into one string (no allocation up to 15
/// bytes); a lockwatch_key() returning a std::string adds that string.
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

#include <charconv>
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

/// Only argument-dependent lookup finds a user's lockwatch_key: this
/// declaration stops ordinary lookup from looking further out.
namespace key_lookup {
void lockwatch_key() = delete;

template <class T>
concept HasLockwatchKey = requires(const T& v) {
  { lockwatch_key(v) } -> std::convertible_to<std::string_view>;
};

template <class T>
decltype(auto) lockwatch_key_of(const T& v) {
  return lockwatch_key(v);
}
}  // namespace key_lookup

/// Characters other than char: no key parts (a key is bytes, with no
/// encoding to write them in).
template <class T>
concept OtherCharacterType = std::is_same_v<T, wchar_t> || std::is_same_v<T, char8_t> ||
                             std::is_same_v<T, char16_t> || std::is_same_v<T, char32_t>;

/// What can be a key part (see the top of this file).
template <class T, class U = std::remove_cvref_t<T>>
concept KeyPart = key_lookup::HasLockwatchKey<U> || (std::is_arithmetic_v<U> && !OtherCharacterType<U>) ||
                  std::is_enum_v<U> ||
                  (!std::is_null_pointer_v<U> && std::is_convertible_v<const U&, std::string_view>);

enum class KeyPatternError : unsigned char {
  kNone,
  kUnclosedBrace,     ///< a '{' without its '}'
  kLoneClosingBrace,  ///< a '}' that closes no field ("}}" is a literal one)
  kBadField,          ///< a field other than {} and {N}
  kFormatSpec,        ///< {N:spec}
  kMixedIndexing,     ///< {} and {N} in one pattern
  kNoSuchArgument,    ///< {N} past the last argument, or one {} too many
  kNotAKeyPart,       ///< the argument's type cannot be a key part
};

struct KeyPatternFault {
  KeyPatternError error = KeyPatternError::kNone;
  std::size_t offset = 0;  ///< of the brace at fault in the pattern
  std::size_t index = 0;   ///< the argument (kNoSuchArgument, kNotAKeyPart)
};

/// Walks `p` for a call of `args` arguments: on_text(view) for each run of
/// literal text (escapes undone), on_field(index) for each field, which
/// returns kNone or refuses the argument. Stops at the first fault. The same
/// walk checks a pattern at compile time and builds keys at run time.
template <class OnText, class OnField>
constexpr KeyPatternFault walk_key_pattern(std::string_view p, std::size_t args, OnText&& on_text,
                                           OnField&& on_field) {
  using enum KeyPatternError;
  constexpr std::size_t kIndexCap = 1u << 20;  // beyond any call; keeps the parse from overflowing
  bool automatic = false;
  bool manual = false;
  std::size_t next = 0;  // the argument of the next {}
  std::size_t text = 0;  // where the literal text not passed on yet starts
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c != '{' && c != '}') continue;
    if (i + 1 < p.size() && p[i + 1] == c) {  // "{{" or "}}": one brace of text
      on_text(p.substr(text, i + 1 - text));
      text = i + 2;
      ++i;
      continue;
    }
    if (c == '}') return {kLoneClosingBrace, i};
    if (i > text) on_text(p.substr(text, i - text));
    std::size_t j = i + 1;
    std::size_t index = 0;
    if (j < p.size() && p[j] >= '0' && p[j] <= '9') {
      for (; j < p.size() && p[j] >= '0' && p[j] <= '9'; ++j) {
        index = index * 10 + static_cast<std::size_t>(p[j] - '0');
        if (index > kIndexCap) index = kIndexCap;
      }
      manual = true;
    } else {
      index = next++;
      automatic = true;
    }
    if (j == p.size() || p[j] != '}') {
      if (p.find('}', j) == std::string_view::npos) return {kUnclosedBrace, i};
      return {p[j] == ':' ? kFormatSpec : kBadField, i};
    }
    if (automatic && manual) return {kMixedIndexing, i};
    if (index >= args) return {kNoSuchArgument, i, index};
    if (KeyPatternError e = on_field(index); e != kNone) return {e, i, index};
    text = j + 1;
    i = j;
  }
  if (text < p.size()) on_text(p.substr(text));
  return {};
}

/// Not constexpr on purpose, and never defined: reaching one while checking
/// a pattern at compile time is the compile error, and its name the message.
void key_pattern_has_an_unclosed_brace_write_two_for_a_literal_one();
void key_pattern_has_a_lone_closing_brace_write_two_for_a_literal_one();
void key_pattern_field_is_neither_empty_nor_an_argument_index();
void key_pattern_format_specs_are_not_supported();
void key_pattern_mixes_automatic_and_numbered_fields();
void key_pattern_refers_to_an_argument_the_call_does_not_have();
void key_pattern_refers_to_an_argument_that_cannot_be_a_key_part();

/// A pattern found faulty at run time: InvalidArgument saying what is wrong
/// where. `type_name`: the argument's, for kNotAKeyPart.
[[noreturn]] void throw_bad_key_pattern(std::string_view pattern, KeyPatternFault fault, std::size_t args,
                                        const char* type_name);
[[noreturn]] void throw_null_key_string();

/// A key pattern checked at compile time against the call's argument types
/// (through LOCKED).
template <class... A>
class KeyPattern {
 public:
  template <class S>
    requires std::is_convertible_v<const S&, std::string_view>
  consteval KeyPattern(const S& s)  // NOLINT: implicit from the literal
      : pattern_(s) {
    constexpr bool is_part[] = {KeyPart<A>..., true};
    const KeyPatternFault fault =
        walk_key_pattern(pattern_, sizeof...(A), [](std::string_view) {}, [&is_part](std::size_t i) {
          return is_part[i] ? KeyPatternError::kNone : KeyPatternError::kNotAKeyPart;
        });
    using enum KeyPatternError;
    switch (fault.error) {
      case kNone: break;
      case kUnclosedBrace: key_pattern_has_an_unclosed_brace_write_two_for_a_literal_one(); break;
      case kLoneClosingBrace: key_pattern_has_a_lone_closing_brace_write_two_for_a_literal_one(); break;
      case kBadField: key_pattern_field_is_neither_empty_nor_an_argument_index(); break;
      case kFormatSpec: key_pattern_format_specs_are_not_supported(); break;
      case kMixedIndexing: key_pattern_mixes_automatic_and_numbered_fields(); break;
      case kNoSuchArgument: key_pattern_refers_to_an_argument_the_call_does_not_have(); break;
      case kNotAKeyPart: key_pattern_refers_to_an_argument_that_cannot_be_a_key_part(); break;
    }
  }
  std::string_view pattern() const { return pattern_; }

 private:
  std::string_view pattern_;
};

/// A lockwatch_key returning a std::string (or another class) by value: the
/// text is kept in a KeyPartOwned until the key is written.
template <class T>
using lockwatch_key_t = decltype(key_lookup::lockwatch_key_of(std::declval<const T&>()));
template <class T>
concept KeyPartOwnsText = key_lookup::HasLockwatchKey<T> && std::is_class_v<lockwatch_key_t<T>> &&
                          !std::is_same_v<lockwatch_key_t<T>, std::string_view>;

template <class T>
struct KeyPartOwned {};
template <KeyPartOwnsText T>
struct KeyPartOwned<T> {
  std::string text;
};

/// Room for any number's text: a 128-bit integer, a long double's 21 digits
/// with its sign, point and exponent.
using KeyDigits = char[48];

template <class S>
std::string_view key_string(const S& s) {
  if constexpr (std::is_convertible_v<const S&, const char*>) {
    const char* p = s;
    if (p == nullptr) throw_null_key_string();
    return p;
  } else {
    return s;
  }
}

/// The shortest text that reads back as `v`, in fixed notation for decimal
/// exponents -4 .. 15 and in scientific otherwise: the spelling of keys made
/// by earlier lockwatch versions, which a process must still match while
/// others run them. std::to_chars picks the shorter notation, which is that
/// one for most values; the others are written a second time.
template <class F>
std::string_view key_float(KeyDigits& out, F v) {
  char* const end = std::to_chars(out, out + sizeof out, v).ptr;
  const char* digits = out + (out[0] == '-' ? 1 : 0);
  if (digits == end || *digits < '0' || *digits > '9') return {out, static_cast<std::size_t>(end - out)};  // inf, nan
  const char* e = digits;
  while (e != end && *e != 'e') ++e;
  const bool scientific = e != end;
  int exponent = 0;
  if (scientific) {
    for (const char* d = e + 2; d != end; ++d) exponent = exponent * 10 + (*d - '0');
    if (e[1] == '-') exponent = -exponent;
  } else if (digits[0] == '0' && digits + 1 != end) {  // 0.000ddd
    const char* d = digits + 2;
    while (d != end && *d == '0') ++d;
    exponent = -static_cast<int>(d - (digits + 1));
  } else {  // ddd or ddd.ddd
    const char* point = digits;
    while (point != end && *point != '.') ++point;
    exponent = static_cast<int>(point - digits) - 1;
  }
  const bool want_scientific = exponent < -4 || exponent >= 16;
  if (want_scientific == scientific) return {out, static_cast<std::size_t>(end - out)};
  const auto format = want_scientific ? std::chars_format::scientific : std::chars_format::fixed;
  return {out, static_cast<std::size_t>(std::to_chars(out, out + sizeof out, v, format).ptr - out)};
}

/// One argument's text (see the top of this file), viewing the argument,
/// `digits` or `owned`.
template <class T>
std::string_view key_part_text(KeyDigits& digits, KeyPartOwned<T>& owned, const T& v) {
  if constexpr (!KeyPart<T>) {
    return {};  // never asked for: the walk refuses its field
  } else if constexpr (KeyPartOwnsText<T>) {
    owned.text = std::string(key_lookup::lockwatch_key_of(v));
    return owned.text;
  } else if constexpr (key_lookup::HasLockwatchKey<T>) {
    return key_string(key_lookup::lockwatch_key_of(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, char>) {
    digits[0] = v;
    return {digits, 1};
  } else if constexpr (std::is_floating_point_v<T>) {
    return key_float(digits, v);
  } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) {
    const char* end;
    if constexpr (std::is_enum_v<T>) {
      end = std::to_chars(digits, digits + sizeof digits, static_cast<std::underlying_type_t<T>>(v)).ptr;
    } else {
      end = std::to_chars(digits, digits + sizeof digits, v).ptr;
    }
    return {digits, static_cast<std::size_t>(end - digits)};
  } else {
    return key_string(v);
  }
}

template <std::size_t... I, class... A>
std::string build_key(std::string_view pattern, std::index_sequence<I...>, const A&... a) {
  constexpr std::size_t n = sizeof...(A);
  constexpr bool is_part[] = {KeyPart<A>..., true};
  // First walk: which arguments the fields use, and the length of the text.
  std::size_t uses[n + 1] = {};
  std::size_t size = 0;
  const KeyPatternFault fault = walk_key_pattern(
      pattern, n, [&size](std::string_view t) { size += t.size(); },
      [&uses, &is_part](std::size_t i) {
        if (!is_part[i]) return KeyPatternError::kNotAKeyPart;
        ++uses[i];
        return KeyPatternError::kNone;
      });
  if (fault.error != KeyPatternError::kNone) {
    const std::type_info* types[] = {&typeid(A)..., nullptr};
    throw_bad_key_pattern(pattern, fault, n, fault.index < n ? types[fault.index]->name() : "");
  }
  // The used arguments' texts (none without arguments), then the key,
  // written into one string of the right size.
  [[maybe_unused]] KeyDigits digits[n + 1];
  [[maybe_unused]] std::tuple<KeyPartOwned<A>...> owned;
  std::string_view texts[n + 1];
  ((uses[I] != 0 ? (void)(texts[I] = key_part_text(digits[I], std::get<I>(owned), a), size += uses[I] * texts[I].size())
                 : (void)0),
   ...);
  std::string key(size, '\0');
  char* out = key.data();
  const auto put = [&out](std::string_view t) {
    out = std::char_traits<char>::copy(out, t.data(), t.size()) + t.size();
  };
  walk_key_pattern(pattern, n, put, [&put, &texts](std::size_t i) {
    put(texts[i]);
    return KeyPatternError::kNone;
  });
  return key;
}

template <class S>
concept RuntimeString = !std::is_array_v<std::remove_cvref_t<S>> && std::is_convertible_v<const S&, std::string_view>;

/// Three ways to make a key: a pattern checked at compile time (a literal),
/// a pattern known only at run time, or a key function.
template <class... A>
std::string format_key(KeyPattern<std::type_identity_t<A>...> pattern, const A&... a) {
  return build_key(pattern.pattern(), std::index_sequence_for<A...>{}, a...);
}

template <RuntimeString S, class... A>
std::string format_key(const S& pattern, const A&... a) {
  return build_key(std::string_view(pattern), std::index_sequence_for<A...>{}, a...);
}

/// A set (lockwatch::all_of): each of its keys is a pattern, checked at
/// run time.
template <class K, class... A>
  requires std::same_as<K, LockKey>
LockKey format_key(const K& patterns, const A&... a) {
  if (!patterns.is_set()) return build_key(std::string_view(patterns.key()), std::index_sequence_for<A...>{}, a...);
  std::vector<std::string> keys;
  keys.reserve(patterns.keys().size());
  for (const auto& p : patterns.keys()) keys.push_back(build_key(std::string_view(p), std::index_sequence_for<A...>{}, a...));
  return all_of(std::move(keys));
}

template <class F, class... A>
  requires(!RuntimeString<F> && !std::is_same_v<F, LockKey> && std::invocable<const F&, const A&...>)
auto format_key(const F& key_fn, const A&... a) {
  if constexpr (std::is_same_v<std::remove_cvref_t<std::invoke_result_t<const F&, const A&...>>, LockKey>)
    return LockKey(std::invoke(key_fn, a...));
  else
    return std::string(std::invoke(key_fn, a...));
}

/// Puts a built key (a string, or a set) into a spec.
inline void put_built_key(LockSpec& spec, std::string&& key) { spec.key = std::move(key); }
inline void put_built_key(LockSpec& spec, LockKey&& key) { put_key(spec, std::move(key)); }

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
class CallImpl final : public Call {
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

/// The id of a key pattern's text in the metrics' `pattern` label
/// (process-wide, interned on first use; 0 for empty text; past 62
/// patterns, one id shown as "other"). Any thread.
std::uint16_t pattern_id(std::string_view text) noexcept;

/// The text LOCKED's key expression was written as (`#key_expr`): a
/// literal's without its quotes.
constexpr std::string_view pattern_text(std::string_view written) noexcept {
  if (written.size() >= 2 && written.front() == '"' && written.back() == '"' &&
      written.substr(1, written.size() - 2).find('"') == std::string_view::npos)
    return written.substr(1, written.size() - 2);
  return written;
}

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
  /// lockwatch/asio.hpp). Returns at once; errors come through the future.
  auto operator()(Args&&... args) const {
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
      start(call, std::move(key), error);
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
  Locked(K key, detail::LockSpec spec, Runtime* runtime, Fn fn)
      : key_(std::move(key)), spec_(std::move(spec)), runtime_(runtime), fn_(std::make_shared<Fn>(std::move(fn))) {}

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
    start(call, std::move(key), error);
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
    detail::LockSpec spec = spec_;
    detail::put_built_key(spec, std::move(key.first));
    return detail::AsyncCall<R>::start(runtime_, std::move(spec), key.second, std::move(invoke));
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
  void start(const std::shared_ptr<detail::Call>& call, Key key, std::exception_ptr key_error) const {
    if (key_error) {
      call->finish(key_error);
      return;
    }
    try {
      detail::LockSpec spec = spec_;
      detail::put_built_key(spec, std::move(key));
      Runtime& rt = runtime_ ? *runtime_ : Runtime::default_runtime();
      detail::DispatchAccess::dispatch(rt, std::move(spec), call);
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

/// The builder behind LOCKED. Immutable: each modifier returns a copy.
template <class K>
class LockedBuilder {
 public:
  /// Checks `ttl` (InvalidArgument); `retries` is a count or lockwatch::forever.
  LockedBuilder(K key, std::chrono::milliseconds ttl, Retries retries) : key_(std::move(key)) {
    detail::check_builder_ttl(ttl);
    spec_.ttl = ttl;
    spec_.retries = retries.count();
    if constexpr (std::is_same_v<K, std::string>) {
      spec_.pattern = detail::pattern_id(key_);
    } else if constexpr (std::is_same_v<K, LockKey>) {
      if (!key_.is_set()) {
        spec_.pattern = detail::pattern_id(key_.key());
      } else {
        std::string text = "all_of(";
        for (std::size_t i = 0; i < key_.keys().size(); ++i) text += (i ? ", " : "") + key_.keys()[i];
        spec_.pattern = detail::pattern_id(text + ")");
      }
    }
  }

  /// The `pattern` label of these calls' acquisition and hold histograms
  /// (Runtime::metrics_text): LOCKED gives its key expression as written,
  /// locked() its pattern string; a key function has none unless given
  /// here. Name a pattern, never a key: each distinct text is a series.
  LockedBuilder metrics_pattern(std::string_view text) const {
    LockedBuilder b = *this;
    b.spec_.pattern = detail::pattern_id(text);
    return b;
  }

  /// Attach `text` to every call's lock (LockRequest::context): given
  /// back in its span events (Observer::on_span). Checked at once
  /// (InvalidArgument past max_context_bytes or with a control character).
  LockedBuilder context(std::string_view text) const {
    detail::check_context(text);
    LockedBuilder b = *this;
    b.spec_.context = std::string(text);
    b.spec_.context_from = nullptr;
    return b;
  }
  /// Attach what `fn()` returns at each call (on the calling thread, as the
  /// call starts): the caller's current trace context, say. Checked as
  /// .context(); a bad one, or what `fn` throws, fails that call.
  template <class F>
    requires std::is_convertible_v<std::invoke_result_t<const F&>, std::string>
  LockedBuilder context_from(F fn) const {
    LockedBuilder b = *this;
    b.spec_.context.clear();
    b.spec_.context_from = std::make_shared<const std::function<std::string()>>(
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
    b.spec_.wait = d;
    return b;
  }
  /// Take the key in read mode: many shared holders at once, none while an
  /// exclusive one (a call without .shared()) holds it; a waiting exclusive
  /// caller stops new shared ones. See lock_kind.hpp.
  LockedBuilder shared() const {
    LockedBuilder b = *this;
    b.spec_.kind = LockKind::shared();
    return b;
  }
  /// Up to `n` holders of the key at once (a semaphore): each holds a permit
  /// of its own, leased and renewed like a lock. Every caller of the key must
  /// name the same n (another n fails with InvalidArgument). n >= 1.
  LockedBuilder permits(std::uint32_t n) const {
    if (n == 0) throw InvalidArgument("permits(n) needs n >= 1");
    LockedBuilder b = *this;
    b.spec_.kind = LockKind::permits(n);
    return b;
  }
  /// One holder at a time, granted in the order the callers began to wait,
  /// across processes (a fair lock): see lock_kind.hpp. Combine with
  /// .wait(d): a caller that does not wait leaves the queue at once. A
  /// store that keeps no queue of waiters fails the call with Unsupported.
  LockedBuilder fair() const {
    LockedBuilder b = *this;
    b.spec_.kind = LockKind::fair();
    return b;
  }
  /// Renew at ttl * w (default: the runtime's Options::renew_weight, 0.9).
  LockedBuilder renew_weight(double w) const {
    detail::check_renew_weight(w);
    LockedBuilder b = *this;
    b.spec_.renew_weight = w;
    return b;
  }

  template <class F>
  /// Decorates `fn`: a Locked that takes the lock for each call.
  Locked<K, std::decay_t<F>> operator()(F&& fn) const {
    return Locked<K, std::decay_t<F>>(key_, spec_, runtime_, std::forward<F>(fn));
  }
  /// LOCKED(...) ends in `+`, so the callable written after it is applied.
  template <class F>
  friend Locked<K, std::decay_t<F>> operator+(const LockedBuilder& b, F&& fn) {
    return b(std::forward<F>(fn));
  }

 private:
  K key_;
  detail::LockSpec spec_;
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
