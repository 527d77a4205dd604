// lib/store/redis/scripts.hpp: the Lua scripts that make up the lock
// protocol, with their SHA-1 so they run by EVALSHA (falling back to EVAL
// on NOSCRIPT), and the readers of their replies.
//
// One script per operation. Acquire, renew and release take any number of
// locks (a lone lock is a batch of one), so a lone lock and a batch meet
// the same errors and send the same notices, and each answers one reply
// shape, read by one reader below: a bulk string with one entry per lock,
// in KEYS order. A reply of any other shape (another type, another number
// of entries, a status no script sends) is an error for the locks it
// cannot answer (StoreError kRefused, "unexpected reply to ..."), never a
// default result.
//
// Keys of one lock stay on one Redis Cluster slot (keys.hpp,
// docs/how-it-works.md "Redis layout"); a call of several locks names keys
// of several slots, so a Cluster node sends one call per slot group
// (RedisNodeStore::batch_by_slot(), and the cluster's renewals).
//
// Threading: script() any thread; the readers are plain values, used
// inside a reply's callback. Costs: a reader copies nothing from the reply
// on success; each failure costs its StoreError.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "store/capabilities.hpp"
#include "store/lock_store.hpp"
#include "store/store_error.hpp"

struct redisReply;  // hiredis

namespace lockwatch::detail {

struct Script {
  std::string_view source;
  std::string sha1;  // 40 lowercase hex characters
  // For errors: what the script is for ("acquire") and the commands it
  // calls ("SET, GET, ..."), which Redis's ACLs check as the user's own.
  std::string_view name;
  std::string_view calls;
};

enum class ScriptId : std::uint8_t {
  // KEYS: lock, its slot's counter, its old per-name counter, for each lock
  // in turn. ARGV: token, ttl ms for each. Entries, separated by '\n':
  // 't<fencing token>' taken, 'b<pttl>' busy, 'e<error line>' failed (a
  // counter Redis refuses, a key without expiry: Redis's own error, or one
  // with code LOCKWATCH). A lock that holds the token already (a retry) is
  // taken again: its ttl is set anew and its slot's counter answered as it
  // is. Several locks of one slot share its counter, counted in turn.
  kAcquire,
  // KEYS: locks. ARGV: token, ttl ms for each lock in turn. One byte per
  // lock: '1' renewed, '0' gone, 'x' other owner, 'e' Redis refused.
  kRenew,
  // KEYS: locks. ARGV: 's' to SPUBLISH (a cluster) or 'p' to PUBLISH; then
  // token, channel for each lock in turn ('' for a lock given back unused:
  // no one is woken for it). One byte per lock: '0' gone, 'x' another
  // owner's (or not a string: left alone), or released, by how many
  // subscribers of the node its notice reached: 'u' none (or no notice),
  // 'v' one, '1' more.
  kRelease,
  // KEYS: the lock's slot's counter. ARGV: token. Raises the counter to the
  // token if below it; answers 1.
  kRaiseFence,
  // KEYS: lock, its slot's counter. ARGV: its old per-name counter. Answers
  // {pttl (-2 absent), fencing counter (the higher of the two), owner or ''}.
  kInspect,
  // KEYS: lock. ARGV: channel, 's' SPUBLISH or 'p' PUBLISH. Deletes the
  // lock whoever owns it and publishes; answers 1 if it was held, else 0.
  kForceRelease,
  // Scheduled jobs. KEYS: lock, period. ARGV: token, period, the period's
  // start in ms since the epoch. Answers {status, seconds, microseconds,
  // last}, all as text: status '1' claimed, '0' already run (last: the last
  // period run), '2' not due yet, '-1' the lock is not ours; seconds and
  // microseconds are the server's TIME.
  kClaimPeriod,
  // Shared and permit locks (scripts.cpp says how they are kept). KEYS:
  // lock, its holders, its writer mark, its slot's counter. ARGV: token,
  // ttl ms, 's' or n. One entry as kAcquire's; a key held as another kind
  // is an error with code LOCKWATCH-KIND (StoreError kInvalid).
  kAcquireKind,
  // KEYS: lock, holders for each. ARGV: token, ttl ms, marker for each.
  // One byte per lease as kRenew's.
  kRenewKind,
  // KEYS: lock, holders for each. ARGV: 's' or 'p'; then token, channel,
  // marker for each. One byte per lease as kRelease's.
  kReleaseKind,
  // Fair locks (scripts.cpp says how they are kept); renewed and released
  // by kRenewKind and kReleaseKind with the marker 'lockwatch:fair'. KEYS:
  // lock, holders, queue, waiting, the slot's counter. ARGV: token, ttl ms,
  // channel, 's' or 'p', owner. One entry as kAcquireKind's: its script
  // (its five KEYS tell it a fair lock), named as the fair one in errors.
  kAcquireFair,
  // KEYS: lock, queue, waiting. ARGV: token, channel, 's' or 'p'. Answers
  // 1 if the token was queued, else 0.
  kWithdrawFair,
  // KEYS: lock, its slot's counter. ARGV: token, n. If the lock holds the
  // token, raises the counter by n and answers its new value; else 0.
  kReserveTokens,
  // The redisson layout (layout.hpp): Redisson's RLock commands, a batch of
  // locks per call, answering as the scripts above do. KEYS: lock, its
  // token counter (redisson_lock_token:{K}), the unlock latch of its owner
  // token for each. ARGV: owner field, ttl ms for each. Entries as
  // kAcquire's.
  kRedissonAcquire,
  // KEYS: locks. ARGV: owner field, ttl ms for each. Bytes as kRenew's.
  kRedissonRenew,
  // KEYS: lock, its unlock latch for each. ARGV: 's' or 'p'; then owner
  // field, channel ('' no notice: the store always gives one), the latch's
  // expiry in ms for each. Bytes as kRelease's.
  kRedissonRelease,
};

// The script `id`, its SHA-1 computed once (at first use); static storage.
const Script& script(ScriptId id);

// "EVALSHA of lockwatch's <name> script, which calls <calls>": what was
// sent, for an error saying the user's ACL refused it.
std::string running(const Script& s);

// The acquire script's reply (or `err`, the call's failure: every lock
// gets it) for a call of `locks` locks; next() answers each lock in turn,
// exactly `locks` times. `endpoint` names the node in errors and must
// outlive the reader.
class AcquireReply {
 public:
  AcquireReply(const redisReply* reply, const StoreError* err, std::size_t locks, std::string_view endpoint);
  Acquired next();

 private:
  std::string_view rest_;
  std::string_view endpoint_;
  std::optional<StoreError> failed_;  // the whole call's failure: `err`, or a reply of another shape
};

// The renew or release script's reply: one status byte per lock.
class StatusReply {
 protected:
  // `refusals`: the script answers 'e' for a lock whose command Redis refused.
  // `statuses`: the bytes the script answers, "10x" (done, gone, another
  // owner's) and any of its own after them.
  StatusReply(const redisReply* reply, const StoreError* err, std::size_t locks, std::string_view endpoint,
              std::string_view script, bool refusals, std::string_view statuses = "10x");
  // The next lock's status as its place in the statuses, or their count
  // with `*why` set: the call failed, Redis refused the lock's command, or
  // the byte is no status the script sends. `*why` is valid until the next
  // call.
  std::size_t next_index(const StoreError** why);

 private:
  std::string_view statuses_;
  std::string_view bytes_;
  std::size_t at_ = 0;
  std::string_view endpoint_;
  std::string_view script_;
  bool refusals_;
  std::optional<StoreError> failed_;  // the whole call's failure: `err`, or a reply of another shape
  std::optional<StoreError> entry_;   // the last entry's failure
};

// The renew script's reply for `locks` leases. next() answers each in turn;
// `*why` is the reason for kTransient (null otherwise), valid until the
// next call.
class RenewReply : StatusReply {
 public:
  RenewReply(const redisReply* reply, const StoreError* err, std::size_t locks, std::string_view endpoint)
      : StatusReply(reply, err, locks, endpoint, "renewal", true) {}
  Renewed next(const StoreError** why);
};

// The release script's reply for `locks` locks, as RenewReply; `*why` is
// the reason for kUnconfirmed.
class ReleaseReply : StatusReply {
 public:
  ReleaseReply(const redisReply* reply, const StoreError* err, std::size_t locks, std::string_view endpoint)
      : StatusReply(reply, err, locks, endpoint, "release", false, "10xuv") {}
  // kYesUnheard: the notice reached no subscriber of the node. With
  // `heard_once`, whether it reached exactly one (the answer is kYes): the
  // caller's own subscription, if it has one confirmed there.
  Released next(const StoreError** why, bool* heard_once = nullptr);
};

// The other scripts' replies, one lock each. Each answers the error the
// call ended with (`err`), or the one a reply of another shape is; nothing
// when the reply reads as the script promises.

// raise_fence: 1.
std::optional<StoreError> read_raise_fence(const redisReply* reply, const StoreError* err, std::string_view endpoint);
// reserve_tokens: the counter's new value (0: the lock is not held with the
// token), or the error.
std::uint64_t read_reserve_tokens(const redisReply* reply, const StoreError* err, std::string_view endpoint,
                                  std::optional<StoreError>& error);
// inspect, into `info`. A lock without expiry is not a lockwatch lock: an
// error, as the acquire script would answer (code LOCKWATCH).
std::optional<StoreError> read_inspect(const redisReply* reply, const StoreError* err, std::string_view endpoint,
                                       std::string_view lock, LockInfo& info);
// force_release: whether the lock was held, into `held`.
std::optional<StoreError> read_force_release(const redisReply* reply, const StoreError* err, std::string_view endpoint,
                                             bool& held);
// withdraw: 0 or 1.
std::optional<StoreError> read_withdraw(const redisReply* reply, const StoreError* err, std::string_view endpoint);
// claim_period: the whole result (its error when kFailed).
ClaimResult read_claim_period(const redisReply* reply, const StoreError* err, std::string_view endpoint);

std::string sha1_hex(std::string_view data);

// Reading any reply: the scripts' above, and the commands' the stores send
// (TIME, ROLE, SCAN, CLUSTER SHARDS, SENTINEL). A null reply is one of
// another shape.
bool is_string(const redisReply* r) noexcept;                     // a bulk string
bool is_array_of(const redisReply* r, std::size_t n) noexcept;    // an array of n elements
std::string_view text_of(const redisReply* r) noexcept;           // a string's or status's text, else ""
// An integer, or a string or status that starts with a decimal number; -1
// for any other reply.
long long number_of(const redisReply* r) noexcept;
// A RESP2 map (a flat array of key, value): the value of `key`, or null.
const redisReply* field_of(const redisReply* map, std::string_view key) noexcept;
// The server's clock as TIME (and the period claim) give it: seconds and
// microseconds since the epoch.
std::chrono::system_clock::time_point server_clock(long long seconds, long long micros);

}  // namespace lockwatch::detail
