// lib/store/redis/layout.hpp: how a Redis store lays its locks out, chosen
// per runtime by the URL's `layout` parameter (`redis://...?layout=...`),
// and the Redis URL's other settings (its query, parsed once here); and
// RedisStoreBase, what a node's and a Cluster's store are alike.
//
// - kLockwatch (the default; no parameter): keys.hpp's layout.
// - kRedisson: exclusive locks as Redisson's RLock keeps them, so a Java
//   service (or any Redisson port) and lockwatch can share a lock: the
//   mapping (the lock a hash under the key's own name, its owner field,
//   channel, message, fencing counter and unlock latch) and the owner
//   field's client id and thread id are docs/redisson.md's.
//
// Threading: pure functions, any thread (RedisStoreBase: as LockStore).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "store/redis/cluster_slot.hpp"
#include "store/redis/keys.hpp"
#include "store/store_base.hpp"

namespace lockwatch::detail {

enum class RedisLayout : std::uint8_t { kLockwatch, kRedisson };

// What a lock write waits for before it counts (`min_replicas`): that many
// replicas acknowledging it (WAIT), within `replica_ack_timeout`.
struct RedisReplicas {
  int min = 0;
  std::chrono::milliseconds ack_timeout{200};
};

// A Redis URL's settings, from its query: `layout` (lockwatch|redisson),
// `min_replicas` (0..16), `replica_ack_timeout` (milliseconds, 1..60000),
// and for Sentinel the sentinels' own credentials `sentinel_user` and
// `sentinel_password` (an ACL user on the sentinels other than the
// master's; %-escaped like any value).
struct RedisUrl {
  std::string url;  // without its query
  RedisLayout layout = RedisLayout::kLockwatch;
  RedisReplicas replicas;
  std::string sentinel_user;
  std::string sentinel_password;
};
// Throws InvalidArgument for an unknown parameter (naming the ones a
// Redis URL takes), one given twice, or a bad value.
RedisUrl split_redis_url(const std::string& url);

// A store's layout, with what it needs: in the redisson layout, the client
// id of every owner field it writes (one per runtime: the nodes of a
// cluster share it, so a lease keeps its field when its slot moves).
struct StoreLayout {
  RedisLayout kind = RedisLayout::kLockwatch;
  std::string client_id;  // kRedisson: a random version-4 UUID, 36 characters

  bool redisson() const noexcept { return kind == RedisLayout::kRedisson; }
  // The redisson layout with a fresh client id.
  static StoreLayout make_redisson();
  // The owner field of the lease with owner token `token`:
  // `<client id>:<thread id>`, the thread id the decimal value of the
  // token's first 15 hex digits (60 random bits; a token that does not
  // start with them, as tests may use, is hashed instead).
  std::string field(std::string_view token) const;
};

namespace redisson_keys {

inline constexpr std::string_view kChannelPrefix = "redisson_lock__channel";
inline constexpr std::string_view kTokenPrefix = "redisson_lock_token";
inline constexpr std::string_view kLatchPrefix = "redisson_unlock_latch";
// RedissonLock.UNLOCK_MESSAGE, as Redisson's LongCodec writes it.
inline constexpr std::string_view kUnlockMessage = "0";

// RedissonObject.prefixName: `prefix:{name}`, or `prefix:name` when the
// name holds a '{' (its own hash tag then decides the slot).
inline std::string prefix_name(std::string_view prefix, std::string_view name) {
  if (name.find('{') == std::string_view::npos) return redis_keys::tagged(prefix, ":", name);
  std::string out;
  out.reserve(prefix.size() + name.size() + 3);
  out.append(prefix).push_back(':');
  return out.append(name);
}
inline std::string channel(std::string_view lock) { return prefix_name(kChannelPrefix, lock); }
inline std::string token_counter(std::string_view lock) { return prefix_name(kTokenPrefix, lock); }
// The latch of one unlock request (Redisson: a random id per unlock call;
// lockwatch: the lease's owner token, released once).
inline std::string latch(std::string_view lock, std::string_view request) {
  return prefix_name(kLatchPrefix, lock).append(":").append(request);
}

// `{K}` where K holds no brace.
inline bool whole_tag(std::string_view s) noexcept {
  return s.size() >= 2 && s.front() == '{' && s.back() == '}' &&
         s.substr(1, s.size() - 2).find_first_of("{}") == std::string_view::npos;
}

// The lock a release channel is for (empty: not one). prefix_name() is
// undone: `{K}` -> K when K holds no brace; problem() refuses the keys for
// which that would be ambiguous.
inline std::string_view lock_of_channel(std::string_view ch) {
  if (ch.size() <= kChannelPrefix.size() + 1 || !ch.starts_with(kChannelPrefix) || ch[kChannelPrefix.size()] != ':')
    return {};
  const std::string_view rest = ch.substr(kChannelPrefix.size() + 1);
  return whole_tag(rest) ? rest.substr(1, rest.size() - 2) : rest;
}

inline const char* problem(std::string_view, std::string_view key) noexcept {
  if (key.empty()) return "a key must not be empty";
  if (whole_tag(key))
    return "in the redisson layout a key must not be '{name}' alone: Redisson gives it the release channel of "
           "the key 'name'";
  if (key_slot(key) != key_slot(channel(key)))
    return "in the redisson layout a key with '{' must carry a whole hash tag: Redisson's release channel of "
           "this key would hash to another Redis Cluster slot than the lock";
  return nullptr;
}

// The lock is the key itself: Redisson names it so (no prefix).
inline KeyRules rules() {
  return KeyRules{.prefix = {}, .problem = problem};
}

}  // namespace redisson_keys

// What a Redis store (one node, a Cluster) is: its layout's key rules, and
// every kind and capability (FullStore); in the redisson layout exclusive
// locks only (Redisson's read-write locks, semaphores and fair locks keep
// other layouts, which lockwatch does not write) and none of the
// capabilities (capabilities.hpp), which rest on lockwatch's own layout:
// the runtime answers a call that needs one with Unsupported naming it.
class RedisStoreBase : public FullStore {
 protected:
  RedisStoreBase(const StoreLayout& layout, std::string_view key_prefix)
      : FullStore(layout.redisson() ? redisson_traits() : every_kind(redis_keys::rules(key_prefix)),
                  !layout.redisson()) {}

 private:
  static StoreTraits redisson_traits() {
    return {.keys = redisson_keys::rules(),
            .release_events = true,
            .no_shared = "the redisson layout holds exclusive locks only (Redisson's RLock); Redisson's "
                         "RReadWriteLock keeps each reader's lease in a key of its own, renewed by a script that "
                         "rewrites them all, which lockwatch does not write: see docs/redisson.md",
            .no_permits = "the redisson layout holds exclusive locks only (Redisson's RLock); Redisson's semaphores "
                          "keep another layout, which lockwatch does not write: see docs/redisson.md",
            .no_fair = "the redisson layout holds exclusive locks only (Redisson's RLock); Redisson's RFairLock "
                       "queue is not written by lockwatch: see docs/redisson.md"};
  }
};

}  // namespace lockwatch::detail
