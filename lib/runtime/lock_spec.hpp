// What the runtime asks of itself for one lock: a LockRequest (public,
// lockwatch/lock_request.hpp) once checked, plus what only the library
// sets (an election's leaders take the key without the local hand-off).
// Low-level: it includes only the public value types it is made of.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lockwatch/lock_key.hpp"
#include "lockwatch/lock_kind.hpp"

namespace lockwatch::detail {

struct LockSpec {
  /// The key; for a set (lockwatch::all_of), how the set is named in
  /// messages, once the runtime has checked it.
  std::string key;
  /// A set's keys (empty for one key): as the caller named them until the
  /// runtime checks the spec, then distinct and in canonical order.
  std::vector<std::string> set;
  std::chrono::milliseconds ttl{0};
  std::int64_t retries = 0;  ///< < 0: forever
  double renew_weight = 0;   ///< 0: the runtime's Options::watchdog.renew_weight
  std::chrono::milliseconds wait{0};
  LockKind kind{};           ///< exclusive unless shared, permits(n) or fair
  /// false: never passed on within the runtime (Options::handoff.enabled), to
  /// it or from it; each holder takes the key from the store with an owner
  /// token of its own (an Election's leaders, whom the owner token names).
  bool handoff = true;
  /// The `pattern` label of the call's acquisition and hold histograms
  /// (LockRequest::metrics_pattern; 0: none).
  std::uint16_t pattern = 0;
  /// LockRequest::context: given back in the lock's span events.
  std::string context;
};

/// Puts a request's key (one, or a set) into a spec.
inline void put_key(LockSpec& spec, LockKey key) {
  if (key.is_set())
    spec.set = std::move(key).keys();
  else
    spec.key = std::move(key).key();
}

}  // namespace lockwatch::detail
