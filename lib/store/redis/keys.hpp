// lib/store/redis/keys.hpp: how a lock is named in Redis. The layout, and
// why every key of a lock shares its hash tag and so its Cluster slot (the
// lock `P{K}`, its channel `P{K}:rel`, its slot's fencing counter `P`
// `fence:{T}` with T = slot_tag(slot of K), the other kinds' `:holders`,
// `:writer`, `:queue`, `:waiting` and `:owners`): docs/how-it-works.md,
// "Redis layout", and docs/kinds.md, "How the stores keep them". Here, the
// names are made and the two keys that break a shared slot refused (a K
// that starts with '}', a P with '{' or '}'). No lock or channel name can
// be a counter's (a lock's name has '{' right after P, a counter's 'f'),
// and a lock's name ends in '}' where its companions' do not: no key's
// lock is one. The per-name counter of versions before is legacy_fence().
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

// prefix, infix, then `tag` as the hash tag: "<prefix><infix>{<tag>}".
inline std::string tagged(std::string_view prefix, std::string_view infix, std::string_view tag) {
  std::string out;
  out.reserve(prefix.size() + infix.size() + tag.size() + 2);
  out.append(prefix).append(infix).push_back('{');
  out.append(tag).push_back('}');
  return out;
}

inline std::string lock(std::string_view prefix, std::string_view key) { return tagged(prefix, {}, key); }

// The fencing counter of the slot of `lock_name` (a name lock() made with
// the same prefix).
inline std::string counter(std::string_view prefix, std::string_view lock_name) {
  return tagged(prefix, kCounterInfix, slot_tag(key_slot(lock_name)));
}
// The per-name counter of versions before the slot counters.
inline std::string legacy_fence(std::string_view lock_name) { return std::string(lock_name).append(kFenceSuffix); }
inline std::string period(std::string_view lock_name) { return std::string(lock_name).append(":period"); }
inline std::string channel(std::string_view lock_name) { return std::string(lock_name).append(kChannelSuffix); }
inline std::string holders(std::string_view lock_name) { return std::string(lock_name).append(":holders"); }
inline std::string writer_mark(std::string_view lock_name) { return std::string(lock_name).append(":writer"); }
inline std::string queue(std::string_view lock_name) { return std::string(lock_name).append(":queue"); }
inline std::string waiting(std::string_view lock_name) { return std::string(lock_name).append(":waiting"); }
// The kind argument of the kind scripts: 's', or n.
inline std::string kind_arg(const LockKind& kind) {
  return kind.mode() == LockKind::Mode::kShared ? std::string("s") : std::to_string(kind.permit_count());
}

// The lock's name for a release channel, or empty if it is not one.
inline std::string_view lock_of_channel(std::string_view channel) {
  if (channel.size() <= kChannelSuffix.size() || !channel.ends_with(kChannelSuffix)) return {};
  return channel.substr(0, channel.size() - kChannelSuffix.size());
}

inline const char* key_problem(std::string_view, std::string_view key) noexcept {
  if (!key.empty() && key.front() == '}')
    return "a key must not start with '}': Redis would hash the lock and its fencing counter to different slots";
  return nullptr;
}

// A store's key rules for Redis names: `prefix{key}`, no key starting with '}'.
inline KeyRules rules(std::string_view prefix) {
  return KeyRules{.prefix = std::string(prefix), .braces = true, .problem = key_problem};
}

inline const char* prefix_problem(std::string_view prefix) noexcept {
  if (prefix.find_first_of("{}") != std::string_view::npos)
    return "Options::runtime.key_prefix must not contain '{' or '}': the key's hash tag must decide its Redis Cluster "
           "slot";
  return nullptr;
}

}  // namespace lockwatch::detail::redis_keys
