// lib/store/redis/redis_error.hpp: Redis's error replies as StoreError
// values, and Redis Cluster's redirects, which stay inside the Redis
// stores (the shared StoreError carries only the reply's code and text).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "store/store_error.hpp"

namespace lockwatch::detail {

// A Redis error reply, classified: MOVED/ASK (well formed: slot and
// target) as kRedirect; TRYAGAIN, CLUSTERDOWN, LOADING, MASTERDOWN as
// kRetryLater; NOAUTH, WRONGPASS, NOPERM, and an ERR saying the user's ACL
// refused a command a script called, as kAuth; anything else kRefused.
// `code` is the reply's first word. A MOVED or ASK that cannot be parsed
// is kRefused.
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
inline bool is_ask(const StoreError& e) noexcept { return e.redirect() && e.code == "ASK"; }

}  // namespace lockwatch::detail
