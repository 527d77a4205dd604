// lib/store/redis/scripts.hpp: the Lua scripts that make up the lock protocol, with
// their SHA-1 so they run by EVALSHA (falling back to EVAL on NOSCRIPT).
//
// Keys of one lock stay on one Redis Cluster slot: the lock itself,
// `<prefix>{<key>}`, its release channel `...:rel` (both with the hash tag
// <key>) and its slot's fencing counter `<prefix>fence:{<tag>}` (a tag of
// the same slot; never expiring, so tokens keep rising across holders). See
// keys.hpp.
#pragma once

#include <string>
#include <string_view>

namespace lockwatch::detail {

struct Script {
  std::string_view source;
  std::string sha1;  // 40 lowercase hex characters
};

// KEYS: lock, its slot's counter, its old per-name counter. ARGV: token,
// ttl ms. Returns {1, fencing token} when taken, {0, pttl} when busy. A lock
// that holds the token already (a retry) is taken again: its ttl is set
// anew and the slot's counter returned as it is.
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
// KEYS: lock, its slot's counter, its old per-name counter for each lock in
// turn. ARGV: token, ttl ms for each. Returns one entry per lock,
// space-separated: 't<fencing token>' taken, 'b<pttl>' busy, 'n' exists
// without expiry, 'e' the slot's counter was refused, 'o' the old one.
const Script& acquire_batch_script();
// KEYS: locks. ARGV: token, channel ('' for none) for each. Returns one byte
// per lock: '1' released, '0' gone, 'x' another owner's.
const Script& release_batch_script();

// KEYS: the lock's slot's counter. ARGV: token. Raises the counter to the
// token if below it.
const Script& raise_fence_script();

// KEYS: lock, its slot's counter. ARGV: its old per-name counter. Returns
// {pttl (-2 absent), fencing counter (the higher of the two), owner or ''}.
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
