// lib/store/redis/redis_error.hpp: Redis's error replies as StoreError
// values, and Redis Cluster's redirects, which stay inside the Redis
// stores (the shared StoreError carries only the reply's code and text).
//
// A reply's code is its first word, as a RedisReply of the category
// "lockwatch.redis" (redis_category()): the prefixes lockwatch decides on
// or users meet, and kOther for any other. Threading: pure functions; the
// category is a constant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "store/store_error.hpp"

namespace lockwatch::detail {

// The first word of a Redis error reply. Never 0 (an error_code of 0 is
// no error).
enum class RedisReply {
  kErr = 1,        // ERR: the generic error (a wrong argument, a script's error)
  kWrongType,      // WRONGTYPE: the key holds another type of value
  kOom,            // OOM: over maxmemory
  kNoScript,       // NOSCRIPT: EVALSHA of a script the server does not have
  kBusy,           // BUSY: a script runs past lua-time-limit
  kReadOnly,       // READONLY: a replica was written to
  kNoReplicas,     // NOREPLICAS: fewer replicas than min-replicas-to-write
  kMasterDown,     // MASTERDOWN: a replica cut off from its master
  kLoading,        // LOADING: the dataset is being loaded
  kTryAgain,       // TRYAGAIN: Redis Cluster, a multi-key request during a resharding
  kClusterDown,    // CLUSTERDOWN: the cluster cannot serve the slot
  kMoved,          // MOVED: Redis Cluster, the slot is another master's
  kAsk,            // ASK: Redis Cluster, the slot is migrating
  kCrossSlot,      // CROSSSLOT: keys of several slots in one request
  kNoAuth,         // NOAUTH: no AUTH yet
  kWrongPass,      // WRONGPASS: the credentials were refused
  kNoPerm,         // NOPERM: the user's ACL refused a command or key
  kExecAbort,      // EXECABORT: a transaction refused
  kLockwatch,      // LOCKWATCH: lockwatch's scripts refusing a request
  kLockwatchKind,  // LOCKWATCH-KIND: a key held as another kind of lock
  kOther,          // any other first word
};

// The category of RedisReply codes: name() "lockwatch.redis", message()
// the prefix ("WRONGTYPE"; "another error reply" for kOther).
const StoreCategory& redis_category() noexcept;
inline std::error_code make_error_code(RedisReply r) noexcept { return {static_cast<int>(r), redis_category()}; }

// The RedisReply of an error reply's first word.
RedisReply redis_reply_code(std::string_view first_word) noexcept;

// A Redis error reply, classified: MOVED/ASK (well formed: slot and
// target) as kRedirect; TRYAGAIN, CLUSTERDOWN, LOADING, MASTERDOWN as
// kRetryLater; NOAUTH, WRONGPASS, NOPERM, and an ERR saying the user's ACL
// refused a command a script called, as kAuth; LOCKWATCH-KIND as kInvalid;
// anything else (a malformed MOVED or ASK too) kRefused. Its code: the first word.
StoreError redis_reply_error(std::string endpoint, std::string_view message);

// Where a Redis Cluster redirect sends a call: MOVED (the slot is the
// target's now) or ASK (the slot is migrating; ask the target once, after
// ASKING).
struct ClusterRedirect {
  bool ask = false;
  std::uint16_t slot = 0;
  std::string host;
  int port = 0;
};

// The redirect `e` is (a kRedirect error, read from its reply); nullopt
// for any other error.
std::optional<ClusterRedirect> cluster_redirect(const StoreError& e);
// Whether `e` is an ASK redirect.
bool is_ask(const StoreError& e) noexcept;
// Whether Redis's ACL refused a command (NOPERM, or a script's command
// refused), as opposed to refused credentials.
bool redis_acl_refusal(const StoreError& e) noexcept;

}  // namespace lockwatch::detail

template <>
struct std::is_error_code_enum<lockwatch::detail::RedisReply> : std::true_type {};
