/// @file
/// lockwatch/lock_key.hpp: what a lock is taken on: one key, or a set of
/// keys taken all or none (lockwatch::all_of).
///
///   auto h = rt.acquire({.key = lockwatch::all_of("acct:1", "acct:2"), .ttl = 5s, .wait = 10s}).get();
///   auto transfer = LOCKED(lockwatch::all_of("acct:{0}", "acct:{1}"), 5s, lockwatch::forever, .wait(10s))
///       [&](int from, int to, long cents) { ... };
///
/// A set's keys are deduplicated (all_of("acct:7", "acct:7") is the one
/// key) and taken in one canonical order (byte order of the keys), whatever
/// order the caller names them in, so two callers naming the same accounts
/// in opposite orders cannot deadlock. The work starts only with every key
/// held; a call that ends without the whole set gives back every key it
/// took. The set is held under one lease: it is renewed together and lost
/// together (losing any key stops the work, and LeaseLost names that key).
/// Each key keeps its own fencing token: Lease::fencing_token(key).
/// docs/multi-key.md says how each store takes a set.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace lockwatch {

/// The most keys one set may name (after duplicates are dropped): more is
/// InvalidArgument before anything starts.
inline constexpr std::size_t max_set_keys = 64;

class LockKey;
template <class... K>
  requires(sizeof...(K) > 0 && (std::is_convertible_v<const K&, std::string_view> && ...))
LockKey all_of(const K&... keys);
LockKey all_of(std::vector<std::string> keys);

/// One key, or a set of keys (all_of). Implicit from a string, so a
/// LockRequest names one key as `.key = "sku:42"`.
class LockKey {
 public:
  /// No key (an empty key is InvalidArgument when a lock is asked for).
  LockKey() = default;
  /// One key: implicit, so a request names it as `.key = "sku:42"`.
  LockKey(std::string key) : key_(std::move(key)) {}           // NOLINT: implicit on purpose
  /// One key, from a C string.
  LockKey(const char* key) : key_(key) {}                      // NOLINT
  /// One key, from a string view.
  LockKey(std::string_view key) : key_(key) {}                 // NOLINT

  /// True when made by all_of (even of one key).
  bool is_set() const noexcept { return set_; }
  /// The one key (empty for a set).
  const std::string& key() const& noexcept { return key_; }
  /// The one key, moved out.
  std::string key() && noexcept { return std::move(key_); }
  /// A set's keys as the caller named them, before duplicates are dropped
  /// and the order is made canonical (empty for one key).
  const std::vector<std::string>& keys() const& noexcept { return keys_; }
  /// A set's keys, moved out.
  std::vector<std::string> keys() && noexcept { return std::move(keys_); }

 private:
  template <class... K>
    requires(sizeof...(K) > 0 && (std::is_convertible_v<const K&, std::string_view> && ...))
  friend LockKey all_of(const K&... keys);
  friend LockKey all_of(std::vector<std::string> keys);
  static LockKey of_set(std::vector<std::string> keys) {
    LockKey k;
    k.keys_ = std::move(keys);
    k.set_ = true;
    return k;
  }

  std::string key_;
  std::vector<std::string> keys_;
  bool set_ = false;
};

/// The set of `keys`, taken all or none under one lease. In LOCKED each is
/// a key pattern of the call's arguments ("acct:{0}"), checked when the
/// call is made (InvalidArgument through its future) rather than at compile
/// time. An empty set, or more than max_set_keys distinct keys, is
/// InvalidArgument before anything starts.
template <class... K>
  requires(sizeof...(K) > 0 && (std::is_convertible_v<const K&, std::string_view> && ...))
LockKey all_of(const K&... keys) {
  std::vector<std::string> v;
  v.reserve(sizeof...(K));
  (v.emplace_back(std::string_view(keys)), ...);
  return LockKey::of_set(std::move(v));
}

/// The same for a set whose size is known only at run time (the tenants a
/// migration locks, say).
inline LockKey all_of(std::vector<std::string> keys) { return LockKey::of_set(std::move(keys)); }

}  // namespace lockwatch
