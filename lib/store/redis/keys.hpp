// lib/store/redis/keys.hpp: how a lock is named in Redis.
//
// For a user's key K and the prefix P (Options::runtime.key_prefix): the lock is
// `P{K}` (a string holding the owner token, with the ttl as its expiry) and
// its release channel `P{K}:rel`. Its fencing counter is its Redis Cluster
// slot's, `P` `fence:{T}` with T = slot_tag(slot of K): one counter per
// slot, on every topology, so what the store keeps stays bounded (at most
// 16384 counters, however many names are locked) while each name's tokens
// still rise, since its slot's counter only rises. The counter never
// expires. All of them share K's slot, so one script may touch them
// together on a cluster. Two keys break that and are refused: a K that
// starts with '}' (the tag would be empty, so Redis would hash each whole
// name on its own), and a P with '{' or '}' (its tag would win, pinning
// every lock to one slot). No lock or channel name can be a counter's: a
// lock's name has '{' right after P, a counter's has 'f'.
//
// Shared and permit locks (lock_kind.hpp) keep their holders beside the
// lock, in `P{K}:holders` (a sorted set of tokens by deadline), and a
// writer waiting for readers leaves `P{K}:writer`; the lock itself then
// holds a marker (marker()) instead of an owner token. Same hash tag, same
// slot. A lock's name ends in '}', these do not: no key's lock is one.
//
// Fair locks keep their holder in `P{K}:holders` too (the lock holding
// the marker 'lockwatch:fair'), and their waiters in `P{K}:queue` (by
// arrival) and `P{K}:waiting` (by the time each one's place runs out).
// Same hash tag, same slot.
//
// Versions before kept one counter per name, `P{K}:fence`
// (legacy_fence()); the acquire script folds it into the slot's counter
// the first time K is locked again, then deletes it.
#pragma once

#include <string>
#include <string_view>

#include "lockwatch/lock_kind.hpp"
#include "store/redis/cluster_slot.hpp"
#include "store/store_base.hpp"

namespace lockwatch::detail::redis_keys {

inline constexpr std::string_view kCounterInfix = "fence:";
inline constexpr std::string_view kFenceSuffix = ":fence";
inline constexpr std::string_view kChannelSuffix = ":rel";
inline constexpr std::string_view kPeriodSuffix = ":period";

inline std::string lock(std::string_view prefix, std::string_view key) {
  std::string out;
  out.reserve(prefix.size() + key.size() + 2);
  out.append(prefix);
  out.push_back('{');
  out.append(key);
  out.push_back('}');
  return out;
}

// The fencing counter of the slot of `lock_name` (a name lock() made with
// the same prefix).
inline std::string counter(std::string_view prefix, std::string_view lock_name) {
  const std::string_view tag = slot_tag(key_slot(lock_name));
  std::string out;
  out.reserve(prefix.size() + kCounterInfix.size() + tag.size() + 2);
  out.append(prefix).append(kCounterInfix).push_back('{');
  out.append(tag).push_back('}');
  return out;
}
// The per-name counter of versions before the slot counters.
inline std::string legacy_fence(std::string_view lock_name) { return std::string(lock_name).append(kFenceSuffix); }
inline std::string period(std::string_view lock_name) { return std::string(lock_name).append(kPeriodSuffix); }
inline std::string channel(std::string_view lock_name) { return std::string(lock_name).append(kChannelSuffix); }
inline std::string holders(std::string_view lock_name) { return std::string(lock_name).append(":holders"); }
inline std::string writer_mark(std::string_view lock_name) { return std::string(lock_name).append(":writer"); }
inline std::string queue(std::string_view lock_name) { return std::string(lock_name).append(":queue"); }
inline std::string waiting(std::string_view lock_name) { return std::string(lock_name).append(":waiting"); }
// What the lock's key holds while held as `kind` (not exclusive): no owner
// token (32 hex characters) can be one.
inline std::string marker(const LockKind& kind) {
  if (kind.mode() == LockKind::Mode::kFair) return "lockwatch:fair";
  return kind.mode() == LockKind::Mode::kShared ? std::string("lockwatch:shared")
                                                : "lockwatch:permits:" + std::to_string(kind.permit_count());
}
// The kind argument of the kind scripts: 's', or n.
inline std::string kind_arg(const LockKind& kind) {
  return kind.mode() == LockKind::Mode::kShared ? std::string("s") : std::to_string(kind.permit_count());
}

// The lock's name for a release channel, or empty if it is not one.
inline std::string_view lock_of_channel(std::string_view channel) {
  if (channel.size() <= kChannelSuffix.size() || !channel.ends_with(kChannelSuffix)) return {};
  return channel.substr(0, channel.size() - kChannelSuffix.size());
}

inline const char* key_problem(std::string_view key) noexcept {
  if (!key.empty() && key.front() == '}')
    return "a key must not start with '}': Redis would hash the lock and its fencing counter to different slots";
  return nullptr;
}

// A store's key rules for Redis names: `prefix{key}`, no key starting with '}'.
inline KeyRules rules(std::string_view prefix) {
  return KeyRules{.prefix = std::string(prefix),
                  .braces = true,
                  .problem = [](std::string_view, std::string_view key) noexcept { return key_problem(key); }};
}

inline const char* prefix_problem(std::string_view prefix) noexcept {
  if (prefix.find_first_of("{}") != std::string_view::npos)
    return "Options::runtime.key_prefix must not contain '{' or '}': the key's hash tag must decide its Redis Cluster "
           "slot";
  return nullptr;
}

}  // namespace lockwatch::detail::redis_keys
