/// @file
/// lockwatch/key_pattern.hpp: key patterns, how a locked call names its
/// lock from its arguments.
///
///   LOCKED("sku:{0}", 5s, 3) [&](int sku, int qty) { ... };  // sku 42: "sku:42"
///   lockwatch::locked("job:{}:{}", 10s, forever)(fn);         // checked at each call
///
/// The key expression of LOCKED and lockwatch::locked() (locked.hpp) is a
/// key pattern whose fields take the call's arguments, a constant string,
/// or a callable that takes the call's arguments and returns the key; each
/// key of lockwatch::all_of (lock_key.hpp) given to them is a pattern too.
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
/// Threading: everything here is a pure function of its arguments. The
/// names in lockwatch::detail are what LOCKED expands to; a program names
/// only the rules above and its own lockwatch_key().
#pragma once

#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "lockwatch/lock_key.hpp"

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

}  // namespace detail
}  // namespace lockwatch
