// lib/store/redis/scripts.hpp: the Lua scripts that make up the lock protocol, with
// their SHA-1 so they run by EVALSHA (falling back to EVAL on NOSCRIPT).
//
// Keys of one lock share a hash tag, `<prefix>{<key>}`, so they stay on one
// Redis Cluster slot: the lock itself, `...:fence` (the fencing counter,
// never expiring, so tokens keep rising across holders) and the release
// channel `...:rel`.
#pragma once

#include <string>
#include <string_view>

namespace lockwatch::detail {

struct Script {
  std::string_view source;
  std::string sha1;  // 40 lowercase hex characters
};

// KEYS: lock, fence. ARGV: token, ttl ms.
// Returns {1, fencing token} when taken, {0, pttl} when busy. A lock that
// holds the token already (a retry) is taken again: its ttl is set anew
// and the fencing counter returned as it is.
const Script& acquire_script();
// KEYS: locks. ARGV: token, ttl ms for each lock in turn. Returns a string
// of one byte per lock: '1' renewed, '0' gone, 'x' other owner, 'e' Redis
// refused.
const Script& renew_script();
// KEYS: lock. ARGV: token, channel ('' for a lock given back unused: no
// one is woken for it), 's' to SPUBLISH (a cluster) rather than PUBLISH.
// Returns 1 released (and published), 0 gone, -1 other owner.
const Script& release_script();

// Many locks in one call (the requests of one loop iteration on one node).
// KEYS: lock, fence for each lock in turn. ARGV: token, ttl ms for each.
// Returns one entry per lock, space-separated: 't<fencing token>' taken,
// 'b<pttl>' busy, 'n' exists without expiry, 'e' the counter was refused.
const Script& acquire_batch_script();
// KEYS: locks. ARGV: token, channel ('' for none) for each. Returns one byte
// per lock: '1' released, '0' gone, 'x' another owner's.
const Script& release_batch_script();

// KEYS: fence. ARGV: token. Raises the counter to the token if below it.
const Script& raise_fence_script();

// KEYS: lock, fence. Returns {pttl (-2 absent), fencing counter, owner or ''}.
const Script& inspect_script();
// KEYS: lock. ARGV: channel, 's' SPUBLISH or 'p' PUBLISH. Deletes the lock
// whoever owns it and publishes; returns 1 if it was held.
const Script& force_release_script();

// Scheduled jobs. KEYS: lock, period. ARGV: token, period, the period's
// start in ms since the epoch. Returns {status, seconds, microseconds,
// last}, all as text: status '1' claimed, '0' already run (last: the last
// period run), '2' not due yet, '-1' the lock is not ours; seconds and
// microseconds are the server's TIME.
const Script& claim_period_script();

std::string sha1_hex(std::string_view data);

}  // namespace lockwatch::detail
