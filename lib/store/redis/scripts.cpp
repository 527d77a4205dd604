#include "scripts.hpp"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <stdexcept>
#include <utility>

#include "core/whole_number.hpp"
#include "store/kind_rules.hpp"
#include "store/redis/redis_error.hpp"

namespace lockwatch::detail {
namespace {

// Each script's KEYS, ARGV and reply are its ScriptId's (scripts.hpp).
//
// Lua text that several scripts share is written once, as a fragment: a
// script names one as @name@ and script() splices it in as it composes the
// scripts at first use (the SHA-1 is the composed text's). Text, not a Lua
// function: a closure would be made anew on every call, which a lone lock
// pays for. A fragment uses the names the script defines before it.
struct Fragment {
  std::string_view name, lua;
};
constexpr Fragment kFragments[] = {
    {"ms", "tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)"},  // TIME's reply `now` in ms
    {"now", "local now = redis.call('time')\nnow = @ms@"},  // the server's clock in ms
    // Whether value `v` is held with `token`: the token up to the first
    // space (the owner record after it), or alone, as versions before wrote.
    {"ours", "(v == token or (type(v) == 'string' and string.sub(v, 1, #token + 1) == token .. ' '))"},
    // What the kind marker `v` (a string) says its key is held as, in an
    // error: fair, a semaphore of n permit(s), or false for another value.
    {"held_as",
     "(v == 'lockwatch:fair' and 'fair' or "
     "string.sub(v, 1, 18) == 'lockwatch:permits:' and 'a semaphore of ' .. string.sub(v, 19) .. ' permit(s)')"},
    // The error entry of `counter`, whose INCR or GET `f` Redis refused.
    {"counter_error", "f.err .. ' (' .. counter .. ' is not a fencing counter)'"},
    // The owner record of a holder of a kind (its grant time, its owner).
    {"record", "redis.pcall('hset', owners, token, string.format('%d', now) .. ' ' .. owner)"},
    // A release call's start: its notice command (ARGV[1]) and its entries.
    {"releases", "local publish = ARGV[1] == 's' and 'spublish' or 'publish'\nlocal out = {}"},
    // A release's entry, by how many subscribers its notice reached (`heard`).
    {"heard", "(heard == 0 and 'u' or (heard == 1 and 'v' or '1'))"},
    // A call's start, one lock a key: its entries, and its loop over them.
    {"each_key", "local out = {}\nfor i = 1, #KEYS do"},
    // The kinds' renewal or release of each `lock` and its `holders` in turn.
    {"each_kind",
     "@now@\nlocal out = {}\nfor i = 1, #KEYS / 2 do\n  local lock, holders = KEYS[2 * i - 1], KEYS[2 * i]"},
    // An acquisition's retry (see kAcquire): the lease set anew, answered
    // the slot's `counter` as it stands.
    {"retake", R"lua(f = redis.pcall('get', counter)
if type(f) == 'table' then
  err = @counter_error@
else
  redis.call('pexpire', lock, ttl)
  out[i] = 't' .. (f or '0')
end)lua"},
    // A renew or release call's end: its loop's, and its one byte per lock.
    {"statuses", "end\nreturn table.concat(out)"},
    // An acquire call's end: each failed lock's error entry, on one line.
    {"acquired", R"lua(  if err then out[i] = 'e' .. string.gsub(err, '[\r\n]', ' ') end
end
return table.concat(out, '\n'))lua"},
};

// The acquisitions of one call, any number of locks (a lone lock is a
// batch of one), each in turn. SET NX first, the one call a free lock
// needs before its counter: a busy lock is neither overwritten nor
// counted. The token is the slot's counter incremented; the name's own
// counter of versions before is folded in the first time (docs/how-it-
// works.md, "Upgrading from per-name counters"), a declared key, so that a
// cluster runs the script only where all three are. A counter Redis
// refuses (a key of another type, an old counter that is no number) gives
// the lock back and fails that lock alone: pcall, as a script's writes for
// the locks before it are not undone by a later error. A busy key without
// expiry is not ours (a user's key, or a lock someone made by hand) and is
// reported instead of waited on forever. A lock that already holds the
// caller's token is a retry of an acquisition whose reply was lost: it is
// taken again (the ttl set anew) with the slot's counter as it stands, at
// least the token the lost reply carried and below the next holder's;
// pcall on its GET: a key of another type is simply not ours. One entry
// per lock (one string, not an array: the client parses one reply object);
// a failure's entry is an error line, Redis's code first (or LOCKWATCH),
// on one line whatever the key's name holds. Tokens go out with %d: Lua
// would print 15 digits or more in exponent form. A writer's mark for
// readers (docs/kinds.md) is read, set and deleted by name, undeclared,
// with pcall: a node importing the slot (an ASK) refuses keys not
// declared, and the mark is a preference, never what exclusion rests on.
// Only a call that waits (its ttl sent as 'w<ms>') leaves one or looks for
// its own to delete. Who holds a lock is in its value (docs/kinds.md's
// table): the owner token, the grant time ('-' where TIME is refused) and
// the owner's name (the last ARGV), a space apart.
constexpr std::string_view kAcquire = R"lua(
local out = {}
local now = redis.pcall('time')
local record = ' ' .. (now.err and '-' or now[1] .. string.format('%03d', math.floor(tonumber(now[2]) / 1000))) ..
               ' ' .. (ARGV[#KEYS / 3 * 2 + 1] or '')
for i = 1, #KEYS / 3 do
  local lock, counter, legacy = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local token, ttl = ARGV[2 * i - 1], ARGV[2 * i]
  local waits = string.byte(ttl) == 119
  if waits then ttl = string.sub(ttl, 2) end
  local f, err
  if redis.call('set', lock, token .. record, 'NX', 'PX', ttl) then
    local old = redis.pcall('get', legacy)
    if type(old) == 'table' then
      err = old.err .. ' (' .. legacy .. ' is not a fencing counter)'
    elseif old and not string.match(old, '^%d+$') then
      err = 'LOCKWATCH ' .. legacy .. ' is not a fencing counter'
    else
      f = redis.pcall('incr', counter)
      if type(f) == 'table' then
        err = @counter_error@
      elseif old then
        if tonumber(old) >= f then
          redis.call('set', counter, old)
          f = redis.call('incr', counter)
        end
        redis.call('del', legacy)
      end
    end
    if err then
      redis.call('del', lock)
    else
      out[i] = 't' .. string.format('%d', f)
    end
    if waits then
      local mark = lock .. ':writer'
      if redis.pcall('get', mark) == token then redis.pcall('del', mark) end
    end
  else
    local t = redis.call('pttl', lock)
    local v = redis.pcall('get', lock)
    if t < 0 then
      err = 'LOCKWATCH ' .. lock .. ' exists without expiry: not a lockwatch lock'
    elseif @ours@ then
      @retake@
    elseif v == 'lockwatch:shared' then
      local mark, mark_ttl = lock .. ':writer', math.min(tonumber(ttl), 2000)
      if waits then
        local other = redis.pcall('get', mark)
        if not other or other == token then redis.pcall('set', mark, token, 'PX', mark_ttl) end
      end
      out[i] = 'b' .. math.min(t, math.max(1, math.floor(mark_ttl / 2)))
    elseif type(v) == 'string' and @held_as@ then
      err = 'LOCKWATCH-KIND ' .. lock .. ' is held as ' .. @held_as@ .. '; this call asked for it exclusive'
    else
      out[i] = 'b' .. t
    end
  end
@acquired@
)lua";

// The kinds of lock other than exclusive, each acquired by this script
// (kAcquireKind's arguments, or with five KEYS kAcquireFair's): their keys,
// markers and rules are docs/kinds.md's ("How the stores keep them").
// Holders are scored by their deadlines on the server's clock (TIME, in
// ms); one past its deadline is dead and pruned by the next script, so a
// crashed holder's share comes back after its ttl. Readers are answered the
// slot's counter as it stands; each permit's grant raises it, a retried
// one's too (other permits may have been granted since the lost reply: the
// counter as it stands may be another holder's token). A key held as
// another kind, or a semaphore of another n, is refused, never joined.
// A fair lock's holder is the one member of `<lock>:holders` (so renewals
// and releases are kRenewKind's and kReleaseKind's); its waiters are
// `<lock>:queue`, by arrival (the last score plus one: scripts run one at a
// time), and `<lock>:waiting`, by when their place runs out (the attempt's
// now + ttl: a waiter that tries again within its ttl keeps it), so a dead
// waiter stalls the queue for its ttl at most. Only a free lock is granted,
// and only to the first waiter; the busy answer is capped at ttl/3; when
// dropping dead waiters leaves the lock free for another first, the release
// channel wakes it. The queue's keys expire with its last place.
// First `lock`'s value `v` is read: an error or a busy answer for a key
// held as another kind than `marker` (`asked` names it); then `now`, and
// its `holders` past their deadline pruned.
constexpr std::string_view kAcquireKind = R"lua(
local lock, holders, counter, fair = KEYS[1], KEYS[2], KEYS[#KEYS], #KEYS == 5
local token, ttl, kind = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local owner, owners = ARGV[#KEYS] or '', lock .. ':owners'
local marker = fair and 'lockwatch:fair' or (kind == 's' and 'lockwatch:shared' or ('lockwatch:permits:' .. kind))
local asked = fair and 'fair' or (kind == 's' and 'shared' or (kind .. ' permit(s)'))
local v = redis.pcall('get', lock)
if type(v) == 'table' then return 'e' .. string.gsub(v.err .. ' (' .. lock .. ')', '[\r\n]', ' ') end
if v and v ~= marker then
  local held_as = v == 'lockwatch:shared' and 'shared' or @held_as@
  if not held_as then
    local t = redis.call('pttl', lock)
    if t < 0 then
      return 'eLOCKWATCH ' .. string.gsub(lock, '[\r\n]', ' ') .. ' exists without expiry: not a lockwatch lock'
    end
    if asked == 'shared' then return 'b' .. t end
    held_as = 'exclusive'
  end
  return 'eLOCKWATCH-KIND ' .. string.gsub(lock .. ' is held as ' .. held_as .. '; this call asked for it ' .. asked,
                                           '[\r\n]', ' ')
end
@now@
if not v then
  redis.call('del', holders)
  redis.pcall('del', owners)
end
redis.call('zremrangebyscore', holders, '-inf', now)
local mine = redis.call('zscore', holders, token)
local f, out
if fair then
  local queue, waiting, dropped = KEYS[3], KEYS[4], false
  while true do
    local w = redis.call('zrange', waiting, 0, 0, 'WITHSCORES')
    if #w == 0 or tonumber(w[2]) > now then break end
    redis.call('zrem', waiting, w[1])
    redis.call('zrem', queue, w[1])
    dropped = true
  end
  if mine then
    f = redis.pcall('get', counter)
  else
    if not redis.call('zscore', queue, token) then
      local last = redis.call('zrange', queue, -1, -1, 'WITHSCORES')
      local seq = #last > 0 and tonumber(last[2]) + 1 or 1
      redis.call('zadd', queue, string.format('%d', seq), token)
    end
    redis.call('zadd', waiting, string.format('%d', now + ttl), token)
    local first = redis.call('zrange', queue, 0, 0)[1]
    local holder = redis.call('zrange', holders, 0, 0, 'WITHSCORES')
    if #holder == 0 and first == token then
      f = redis.pcall('incr', counter)
      if type(f) ~= 'table' then
        redis.call('zrem', queue, token)
        redis.call('zrem', waiting, token)
      end
    else
      local left
      if #holder == 0 then
        left = tonumber(redis.call('zscore', waiting, first)) - now
        if dropped then redis.call(ARGV[4] == 's' and 'spublish' or 'publish', ARGV[3], '1') end
      else
        left = tonumber(holder[2]) - now
      end
      out = 'b' .. string.format('%d', math.max(1, math.min(left, math.floor(ttl / 3))))
    end
  end
elseif kind == 's' then
  if not mine then
    local w = redis.call('pttl', KEYS[3])
    if w > 0 then return 'b' .. w end
  end
  f = redis.pcall('get', counter)
else
  if not mine and redis.call('zcard', holders) >= tonumber(kind) then
    local first = redis.call('zrange', holders, 0, 0, 'WITHSCORES')
    return 'b' .. string.format('%d', math.max(1, tonumber(first[2]) - now))
  end
  f = redis.pcall('incr', counter)
end
if type(f) == 'table' then return 'e' .. @counter_error@ end
if not out then
  redis.call('zadd', holders, string.format('%d', now + ttl), token)
  local last = redis.call('zrange', holders, -1, -1, 'WITHSCORES')
  local px = string.format('%d', tonumber(last[2]) - now)
  redis.call('set', lock, marker, 'PX', px)
  redis.call('pexpire', holders, px)
  if not mine then
    if fair then redis.pcall('del', owners) end
    @record@
  end
  redis.pcall('pexpire', owners, px)
  out = 't' .. string.format('%d', tonumber(f or '0'))
end
if fair and not mine then
  local last = redis.call('zrange', KEYS[4], -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('del', KEYS[3], KEYS[4])
  else
    local px = string.format('%d', math.max(1, tonumber(last[2]) - now))
    redis.call('pexpire', KEYS[3], px)
    redis.call('pexpire', KEYS[4], px)
  end
end
return out
)lua";

// Renews shared and permit leases, any number in one call: a lease's
// deadline moves, and the lock's expiry is raised to it if lower; a lease
// past its deadline (or of a lock gone) is gone.
constexpr std::string_view kRenewKind = R"lua(
@each_kind@
  local token, ttl, marker = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  local v = redis.pcall('get', lock)
  if type(v) == 'table' then
    out[i] = 'e'
  elseif v ~= marker then
    out[i] = v and 'x' or '0'
  else
    local s = redis.pcall('zscore', holders, token)
    if type(s) == 'table' then
      out[i] = 'e'
    elseif not s or tonumber(s) <= now then
      out[i] = '0'
    else
      redis.call('zadd', holders, string.format('%d', now + tonumber(ttl)), token)
      if redis.call('pttl', lock) < tonumber(ttl) then
        redis.call('pexpire', lock, ttl)
        redis.call('pexpire', holders, ttl)
        redis.pcall('pexpire', lock .. ':owners', ttl)
      end
      out[i] = '1'
    end
  end
@statuses@
)lua";

// Releases shared and permit leases. The lock's expiry shrinks to its last
// live holder's deadline; the last holder's release deletes both keys. A
// permit's release wakes the waiters (one may take it), a reader's only
// when it was the last (a writer waits for that).
constexpr std::string_view kReleaseKind = R"lua(
local publish = ARGV[1] == 's' and 'spublish' or 'publish'
@each_kind@
  local token, channel, marker = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local v = redis.pcall('get', lock)
  if v ~= marker then
    out[i] = v and 'x' or '0'
  else
    redis.call('zremrangebyscore', holders, '-inf', now)
    local gone = redis.call('zrem', holders, token)
    local last = redis.call('zrange', holders, -1, -1, 'WITHSCORES')
    if #last == 0 then
      redis.call('del', lock, holders)
      redis.pcall('del', lock .. ':owners')
      if channel ~= '' then redis.call(publish, channel, '1') end
    else
      local px = string.format('%d', tonumber(last[2]) - now)
      redis.call('pexpire', lock, px)
      redis.call('pexpire', holders, px)
      redis.pcall('hdel', lock .. ':owners', token)
      redis.pcall('pexpire', lock .. ':owners', px)
      if channel ~= '' and marker ~= 'lockwatch:shared' then redis.call(publish, channel, '1') end
    end
    out[i] = gone == 1 and '1' or '0'
  end
@statuses@
)lua";

// A fair waiter gives up its place (FairQueue::withdraw). If it was first
// while the lock is free, the new first is woken.
constexpr std::string_view kWithdrawFair = R"lua(
local first = redis.call('zrange', KEYS[2], 0, 0)[1]
local gone = redis.call('zrem', KEYS[2], ARGV[1])
redis.call('zrem', KEYS[3], ARGV[1])
if gone == 1 and first == ARGV[1] and not redis.call('get', KEYS[1]) and redis.call('zcard', KEYS[2]) > 0 then
  redis.call(ARGV[3] == 's' and 'spublish' or 'publish', ARGV[2], '1')
end
return gone
)lua";

// Renews every lease due in one tick with one command. pcall: one key of
// the wrong type (or an OOM refusal) fails its own entry, not the batch.
// One string of bytes, not an array of integers: the client parses one
// reply, not one per lease.
constexpr std::string_view kRenew = R"lua(
@each_key@
  local v, token = redis.pcall('get', KEYS[i]), ARGV[2 * i - 1]
  if type(v) == 'table' and v.err then
    out[i] = 'e'
  elseif v and @ours@ then
    local ok = redis.pcall('pexpire', KEYS[i], ARGV[2 * i])
    if type(ok) == 'table' and ok.err then out[i] = 'e' else out[i] = '1' end
  else
    out[i] = v and 'x' or '0'
  end
@statuses@
)lua";

// The releases of one call, any number of locks, each in turn, told by
// SPUBLISH on a cluster, else PUBLISH (one node, Sentinel, Redlock). The
// channel shares the lock's hash tag and so its slot; it is not declared
// as a key: a declared key that is no key would make a migrating slot
// answer TRYAGAIN. A lock already gone answers '0', which a retry after a
// lost reply counts as released; a key of another type is not ours ('x':
// left alone). How many subscribers of this node the notice reached is
// PUBLISH's and SPUBLISH's answer.
constexpr std::string_view kRelease = R"lua(
@releases@
for i = 1, #KEYS do
  local v, token = redis.pcall('get', KEYS[i]), ARGV[2 * i]
  if @ours@ then
    redis.call('del', KEYS[i])
    local heard = ARGV[2 * i + 1] ~= '' and redis.call(publish, ARGV[2 * i + 1], '1') or 0
    out[i] = @heard@
  else
    out[i] = v and 'x' or '0'
  end
@statuses@
)lua";

// The redisson layout (layout.hpp), the commands of Redisson's RLock
// (RedissonLock.tryLockInnerAsync, RedissonBaseLock.renewExpirationAsync
// and unlockInnerAsync; the token as RedissonFencedLock takes it), each
// lock in turn, answering as the scripts above.
//
// Acquire: a free lock (no key) is taken as Redisson takes it, the owner
// field entered once (HINCRBY 1) and the lease set (PEXPIRE), and its
// token counter incremented (INCR, RFencedLock's token). A lock that holds
// the field already is a retry of this same acquisition (a lockwatch field
// is one lease's): taken again with the lease set anew, not entered twice,
// and answered the counter as it stands. Otherwise busy for its PTTL. A
// key of another type, or a hash without expiry, is no Redisson lock: an
// error, not a wait. TYPE first: HEXISTS on a string would abort the call.
// A take also deletes the latch an earlier release with the same owner
// token left (an acquisition that gave the lock back and tries again keeps
// its token): this grant's release must not be answered by that one's.
constexpr std::string_view kRedissonAcquire = R"lua(
local out = {}
for i = 1, #KEYS / 3 do
  local lock, counter, latch = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local field, ttl = ARGV[2 * i - 1], ARGV[2 * i]
  local f, err
  local t = redis.call('type', lock).ok
  if t == 'none' then
    f = redis.pcall('incr', counter)
    if type(f) == 'table' then
      err = @counter_error@
    else
      redis.call('del', latch)
      redis.call('hincrby', lock, field, 1)
      redis.call('pexpire', lock, ttl)
      out[i] = 't' .. string.format('%d', f)
    end
  elseif t ~= 'hash' then
    err = 'LOCKWATCH ' .. lock .. ' is a ' .. t .. ', not a Redisson lock'
  elseif redis.call('hexists', lock, field) == 1 then
    @retake@
  else
    local p = redis.call('pttl', lock)
    if p < 0 then
      err = 'LOCKWATCH ' .. lock .. ' exists without expiry: not a Redisson lock'
    else
      out[i] = 'b' .. p
    end
  end
@acquired@
)lua";

// Renew: the lease is extended only while the field is ours, as
// Redisson's watchdog does (HEXISTS, then PEXPIRE). '1' renewed, '0' the
// lock is gone, 'x' held without our field (or a key of another type).
constexpr std::string_view kRedissonRenew = R"lua(
@each_key@
  local h = redis.pcall('hexists', KEYS[i], ARGV[2 * i - 1])
  if h == 1 then
    redis.call('pexpire', KEYS[i], ARGV[2 * i])
    out[i] = '1'
  else
    out[i] = (type(h) == 'table' or redis.call('exists', KEYS[i]) == 1) and 'x' or '0'
  end
@statuses@
)lua";

// Release: Redisson's unlock. A latch already set answers for the first
// call (a retried release: '1'). A lock without our field is another's
// ('x') or gone ('0'). Else the field is left once (HINCRBY -1): at zero
// the lock is deleted, the unlock message 0 published on its channel, and
// the latch set to 1; above zero (someone entered our field again: never a
// lockwatch lease) the lock stays and the latch is 0. The latch expires by
// its PX.
constexpr std::string_view kRedissonRelease = R"lua(
@releases@
for i = 1, #KEYS / 2 do
  local lock, latch = KEYS[2 * i - 1], KEYS[2 * i]
  local field, channel, keep = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  if redis.call('get', latch) then
    out[i] = '1'
  else
    local h = redis.pcall('hexists', lock, field)
    if h ~= 1 then
      out[i] = (type(h) == 'table' or redis.call('exists', lock) == 1) and 'x' or '0'
    elseif redis.call('hincrby', lock, field, -1) > 0 then
      redis.call('set', latch, '0', 'PX', keep)
      out[i] = '1'
    else
      redis.call('del', lock)
      local heard = channel ~= '' and redis.call(publish, channel, '0') or 0
      redis.call('set', latch, '1', 'PX', keep)
      out[i] = @heard@
    end
  end
@statuses@
)lua";

// Redlock: raises a node's counter of the lock's slot to the token handed
// out, so any later majority (which shares a node with this one) counts
// past it. The acquisition that handed the token out folded the name's old
// counter into the slot's on each of these nodes already.
constexpr std::string_view kRaiseFence = R"lua(
local c = tonumber(redis.call('get', KEYS[1]) or '0')
local f = tonumber(ARGV[1])
if c < f then redis.call('set', KEYS[1], ARGV[1]) end
return 1
)lua";

// Tokens for the next holders in the holder's process (an in-process
// hand-off): while the lock holds the caller's token, the slot's counter
// goes up by n, and the holder hands out the n values below the new one,
// in order. Every later acquisition counts past them. GET and SET (the
// counter stays a decimal string, as INCR leaves it), which the ACL rule
// for the acquire script allows already.
constexpr std::string_view kReserveTokens = R"lua(
local v, token = redis.call('get', KEYS[1]), ARGV[1]
if not @ours@ then return 0 end
local c = tonumber(redis.call('get', KEYS[2]) or '0') + tonumber(ARGV[2])
redis.call('set', KEYS[2], string.format('%d', c))
return c
)lua";

// Operators' view of one lock: {pttl (-2 absent, -1 no expiry), fencing
// counter, owner token or marker or '', holders, the server's TIME in ms
// ('' when TIME is refused)}. Holders: token, owner record ("<unix ms>
// <owner name>", '' when none) in turn; the token of an exclusive lock
// (its value up to the first space, the record the rest; a value without
// one, as versions before wrote, has its record in `:owners`), or the live
// members of `:holders` of the other kinds, their records in `:owners`.
// The counter is the slot's, or the name's old counter (ARGV[1]) if that
// is higher: the next token is above both.
// The old counter is read without being declared, so that a slot in
// migration, where it is almost never present, does not turn every
// inspect into TRYAGAIN; where Redis will not serve it (mid-migration on a
// cluster) it is left out: the view decides nothing.
constexpr std::string_view kInspect = R"lua(
local t = redis.call('pttl', KEYS[1])
local f = tonumber(redis.call('get', KEYS[2]) or '0')
local old = redis.pcall('get', ARGV[1])
local o = type(old) == 'string' and tonumber(old)
if o and o > f then f = o end
local v = redis.call('get', KEYS[1]) or ''
local record
if string.sub(v, 1, 10) ~= 'lockwatch:' then
  local token, rest = string.match(v, '^(.-) (.*)$')
  if token then v, record = token, rest end
end
local now = redis.pcall('time')
if now.err then return {t, f, v, {}, ''} end
now = @ms@
local hs = {}
if t > 0 then
  local owners = KEYS[1] .. ':owners'
  local tokens = {v}
  if string.sub(v, 1, 10) == 'lockwatch:' then
    tokens = redis.pcall('zrangebyscore', KEYS[1] .. ':holders', '(' .. string.format('%d', now), '+inf')
    if tokens.err then tokens = {} end
  end
  for _, token in ipairs(tokens) do
    local r = record or redis.pcall('hget', owners, token)
    hs[#hs + 1] = token
    hs[#hs + 1] = type(r) == 'string' and r or ''
  end
end
return {t, f, v, hs, string.format('%d', now)}
)lua";

// Operators' removal of a lock whoever holds it; the fencing counter stays.
// A shared or permit lock's holders and a writer's mark go too (undeclared,
// with pcall: a node importing the slot refuses them, and the next
// acquisition clears holders left without their lock).
constexpr std::string_view kForceRelease = R"lua(
redis.pcall('del', KEYS[1] .. ':holders', KEYS[1] .. ':writer', KEYS[1] .. ':owners')
if redis.call('del', KEYS[1]) == 1 then
  redis.call(ARGV[2] == 's' and 'spublish' or 'publish', ARGV[1], '1')
  return 1
end
return 0
)lua";

// A scheduled job's run: the leader's lease check, the store's clock and
// the at-most-once record in one step. TIME is read inside the script:
// since Redis 5 scripts replicate their effects, so a clock read before a
// write is allowed. Periods stay below 2^53, so Lua numbers hold them.
constexpr std::string_view kClaimPeriod = R"lua(
local now = redis.call('time')
local v, token = redis.call('get', KEYS[1]), ARGV[1]
if not @ours@ then return {'-1', now[1], now[2], '0'} end
if @ms@ < tonumber(ARGV[3]) then return {'2', now[1], now[2], '0'} end
local last = redis.call('get', KEYS[2])
if last and tonumber(last) >= tonumber(ARGV[2]) then return {'0', now[1], now[2], last} end
redis.call('set', KEYS[2], ARGV[2])
return {'1', now[1], now[2], ARGV[2]}
)lua";

// `source` with each @name@ in it replaced by that fragment, composed too,
// appended to `out`.
void compose(std::string_view source, std::string& out) {
  for (std::size_t at = source.find('@'); at != std::string_view::npos; at = source.find('@')) {
    const std::size_t end = source.find('@', at + 1);
    const std::string_view name = source.substr(at + 1, end - at - 1);
    const Fragment* f = std::ranges::find(kFragments, name, &Fragment::name);
    if (end == std::string_view::npos || f == std::end(kFragments))
      throw std::logic_error("a script names a fragment that does not exist");
    compose(f->lua, out.append(source.substr(0, at)));
    source.remove_prefix(end + 1);
  }
  out.append(source);
}

}  // namespace

// FIPS 180-4 SHA-1; used only to name scripts for EVALSHA.
std::string sha1_hex(std::string_view data) {
  std::uint32_t h[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
  std::string msg(data);
  std::uint64_t bits = static_cast<std::uint64_t>(data.size()) * 8;
  msg.push_back(static_cast<char>(0x80));
  while (msg.size() % 64 != 56) msg.push_back('\0');
  for (int i = 7; i >= 0; --i) msg.push_back(static_cast<char>((bits >> (i * 8)) & 0xff));
  for (std::size_t off = 0; off < msg.size(); off += 64) {
    std::uint32_t w[80];
    for (int i = 0; i < 16; ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(msg.data() + off + 4 * i);
      w[i] = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
    }
    for (int i = 16; i < 80; ++i) w[i] = std::rotl(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    static constexpr std::uint32_t kK[4] = {0x5A827999u, 0x6ED9EBA1u, 0x8F1BBCDCu, 0xCA62C1D6u};
    std::uint32_t v[5] = {h[0], h[1], h[2], h[3], h[4]};  // a, b, c, d, e
    for (int i = 0; i < 80; ++i) {
      const std::uint32_t b = v[1], c = v[2], d = v[3];
      const std::uint32_t f = i < 20 ? (b & c) | (~b & d) : (i / 20 == 2) ? (b & c) | (b & d) | (c & d) : b ^ c ^ d;
      const std::uint32_t t = std::rotl(v[0], 5) + f + v[4] + kK[i / 20] + w[i];
      // a, b, c, d, e become t, a, b rotated by 30, c, d.
      std::rotate(v, v + 4, v + 5);
      v[0] = t;
      v[2] = std::rotl(v[2], 30);
    }
    for (int i = 0; i < 5; ++i) h[i] += v[i];
  }
  return fmt::format("{:08x}{:08x}{:08x}{:08x}{:08x}", h[0], h[1], h[2], h[3], h[4]);
}

const Script& script(ScriptId id) {
  // In ScriptId's order.
  struct Named {
    std::string_view source, name, calls;
  };
  static constexpr Named kScripts[] = {
      {kAcquire, "acquire", "SET, GET, INCR, DEL, PTTL, PEXPIRE"},
      {kRenew, "renew", "GET, PEXPIRE"},
      {kRelease, "release", "GET, DEL, PUBLISH or SPUBLISH"},
      {kRaiseFence, "raise-fence", "GET, SET"},
      {kInspect, "inspect", "PTTL, GET"},
      {kForceRelease, "force-release", "DEL, PUBLISH or SPUBLISH"},
      {kClaimPeriod, "period claim", "TIME, GET, SET"},
      {kAcquireKind, "shared or permit acquire",
       "GET, SET, DEL, INCR, PTTL, PEXPIRE, TIME, ZADD, ZCARD, ZRANGE, ZREMRANGEBYSCORE, ZSCORE"},
      {kRenewKind, "shared or permit renew", "GET, PTTL, PEXPIRE, TIME, ZADD, ZSCORE"},
      {kReleaseKind, "shared or permit release",
       "GET, DEL, PEXPIRE, TIME, ZRANGE, ZREM, ZREMRANGEBYSCORE, PUBLISH or SPUBLISH"},
      {kAcquireKind, "fair acquire",
       "GET, SET, DEL, INCR, PTTL, PEXPIRE, TIME, ZADD, ZCARD, ZRANGE, ZREM, ZREMRANGEBYSCORE, ZSCORE, PUBLISH or "
       "SPUBLISH"},
      {kWithdrawFair, "fair withdraw", "GET, ZCARD, ZRANGE, ZREM, PUBLISH or SPUBLISH"},
      {kReserveTokens, "token reservation", "GET, SET"},
      {kRedissonAcquire, "redisson acquire", "TYPE, HEXISTS, HINCRBY, PEXPIRE, PTTL, INCR, GET, DEL"},
      {kRedissonRenew, "redisson renew", "HEXISTS, PEXPIRE, EXISTS"},
      {kRedissonRelease, "redisson release", "GET, SET, HEXISTS, HINCRBY, EXISTS, DEL, PUBLISH or SPUBLISH"},
  };
  static const auto table = [] {
    static std::array<std::string, std::size(kScripts)> composed;  // each Script's source
    std::array<Script, std::size(kScripts)> t;
    for (std::size_t i = 0; i < t.size(); ++i) {
      compose(kScripts[i].source, composed[i]);
      t[i] = Script{composed[i], sha1_hex(composed[i]), kScripts[i].name, kScripts[i].calls};
    }
    return t;
  }();
  return table[static_cast<std::size_t>(id)];
}

std::string running(const Script& s) {
  return fmt::format("EVALSHA of lockwatch's {} script, which calls {}", s.name, s.calls);
}

namespace {

// What a reply is, for the error that says it was not what was asked for.
std::string shape_of(const redisReply* r) {
  if (r == nullptr) return "no reply";
  switch (r->type) {
    case REDIS_REPLY_STRING: return "a string of " + std::to_string(r->len) + " bytes";
    case REDIS_REPLY_ARRAY: return "an array of " + std::to_string(r->elements);
    case REDIS_REPLY_INTEGER: return "the integer " + std::to_string(r->integer);
    case REDIS_REPLY_NIL: return "nil";
    case REDIS_REPLY_STATUS: return "a status";
    default: return "a reply of type " + std::to_string(r->type);
  }
}

StoreError unexpected_reply(std::string_view endpoint, std::string_view script, std::string_view what) {
  return StoreError::refused(std::string(endpoint), fmt::format("unexpected reply to the {} script: {}", script, what));
}

// An entry as the error says it, cut short.
std::string quoted(std::string_view entry) {
  constexpr std::size_t kShown = 40;
  return "'" + std::string(entry.substr(0, kShown)) + (entry.size() > kShown ? "...'" : "'");
}

}  // namespace

bool is_string(const redisReply* r) noexcept { return r != nullptr && r->type == REDIS_REPLY_STRING; }

bool is_array_of(const redisReply* r, std::size_t n) noexcept {
  return r != nullptr && r->type == REDIS_REPLY_ARRAY && r->elements == n;
}

std::string_view text_of(const redisReply* r) noexcept {
  if (r == nullptr || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS)) return {};
  return std::string_view(r->str, r->len);
}

long long number_of(const redisReply* r) noexcept {
  if (r != nullptr && r->type == REDIS_REPLY_INTEGER) return r->integer;
  const std::string_view text = text_of(r);
  long long n = -1;
  std::from_chars(text.data(), text.data() + text.size(), n);
  return n;
}

const redisReply* field_of(const redisReply* map, std::string_view key) noexcept {
  if (map == nullptr || map->type != REDIS_REPLY_ARRAY) return nullptr;
  for (std::size_t i = 0; i + 1 < map->elements; i += 2)
    if (is_string(map->element[i]) && text_of(map->element[i]) == key) return map->element[i + 1];
  return nullptr;
}

std::chrono::system_clock::time_point server_clock(long long seconds, long long micros) {
  return std::chrono::system_clock::time_point(std::chrono::seconds(seconds) + std::chrono::microseconds(micros));
}

AcquireReply::AcquireReply(const redisReply* reply, const StoreError* err, std::size_t locks, std::string_view endpoint)
    : endpoint_(endpoint) {
  if (err != nullptr) {
    failed_ = *err;
  } else if (!is_string(reply)) {
    failed_ = unexpected_reply(endpoint, "acquire", shape_of(reply));
  } else {
    rest_ = text_of(reply);
    const std::size_t separators = static_cast<std::size_t>(std::count(rest_.begin(), rest_.end(), '\n'));
    const std::size_t entries = rest_.empty() ? 0 : separators + 1;
    if (entries != locks)
      failed_ = unexpected_reply(endpoint, "acquire", fmt::format("{} entries for {} locks", entries, locks));
  }
}

Acquired AcquireReply::next() {
  if (failed_) return Acquired::failed(*failed_);
  Acquired out;
  const std::size_t end = std::min(rest_.find('\n'), rest_.size());
  const std::string_view entry = rest_.substr(0, end);
  rest_.remove_prefix(std::min(rest_.size(), end + 1));
  const std::string_view value = entry.empty() ? entry : entry.substr(1);
  const char status = entry.empty() ? '\0' : entry.front();
  long long busy = 0;
  if (status == 't' && whole_number(value, out.fence)) {
    out.status = Acquired::Status::kTaken;
  } else if (status == 'b' && whole_number(value, busy) && busy >= 0) {
    out.status = Acquired::Status::kBusy;
    out.busy_for = std::chrono::milliseconds(busy);
  } else if (status == 'e' && !value.empty()) {
    out.error = redis_reply_error(std::string(endpoint_), value);
    if (redis_acl_refusal(out.error)) out.error.message += " (sent: " + running(script(ScriptId::kAcquire)) + ")";
  } else {
    out.error = unexpected_reply(endpoint_, "acquire", "entry " + quoted(entry));
  }
  return out;
}

StatusReply::StatusReply(const redisReply* reply, const StoreError* err, std::size_t locks, std::string_view endpoint,
                         std::string_view script, bool refusals, std::string_view statuses)
    : statuses_(statuses), endpoint_(endpoint), script_(script), refusals_(refusals) {
  if (err != nullptr) {
    failed_ = *err;
  } else if (!is_string(reply) || reply->len != locks) {
    failed_ = unexpected_reply(endpoint, script,
                               fmt::format("{} for {} locks (one byte each)", shape_of(reply), locks));
  } else {
    bytes_ = text_of(reply);
  }
}

std::size_t StatusReply::next_index(const StoreError** why) {
  *why = failed_ ? &*failed_ : nullptr;
  if (failed_) return statuses_.size();
  const char status = bytes_[at_++];
  const std::size_t at = statuses_.find(status);
  if (at != std::string_view::npos) return at;
  if (status == 'e' && refusals_) {
    entry_ = StoreError::refused(std::string(endpoint_), "Redis refused the " + std::string(script_));
  } else {
    entry_ = unexpected_reply(endpoint_, script_, "status " + quoted(std::string_view(&status, 1)));
  }
  *why = &*entry_;
  return statuses_.size();
}

Renewed RenewReply::next(const StoreError** why) {
  static constexpr Renewed kByIndex[] = {Renewed::kYes, Renewed::kGone, Renewed::kTakenByOther, Renewed::kTransient};
  return kByIndex[next_index(why)];
}

Released ReleaseReply::next(const StoreError** why, bool* heard_once) {
  // The release script's "10x" and its listeners: 'u' none, 'v' one.
  static constexpr Released kByIndex[] = {Released::kYes,         Released::kGone, Released::kTakenByOther,
                                          Released::kYesUnheard, Released::kYes,  Released::kUnconfirmed};
  const std::size_t at = next_index(why);
  if (heard_once != nullptr) *heard_once = at == 4;
  return kByIndex[at];
}

namespace {

// An integer reply from `lo` to `hi` (null), or why not.
std::optional<StoreError> read_integer(const redisReply* reply, const StoreError* err, std::string_view endpoint,
                                       std::string_view script, long long lo, long long hi) {
  if (err != nullptr) return *err;
  if (reply == nullptr || reply->type != REDIS_REPLY_INTEGER || reply->integer < lo || reply->integer > hi)
    return unexpected_reply(endpoint, script, shape_of(reply));
  return std::nullopt;
}

}  // namespace

std::optional<StoreError> read_raise_fence(const redisReply* reply, const StoreError* err, std::string_view endpoint) {
  return read_integer(reply, err, endpoint, "fence raising", 1, 1);
}

std::uint64_t read_reserve_tokens(const redisReply* reply, const StoreError* err, std::string_view endpoint,
                                  std::optional<StoreError>& error) {
  error = read_integer(reply, err, endpoint, "token reservation", 0, std::numeric_limits<long long>::max());
  return error ? 0 : static_cast<std::uint64_t>(reply->integer);
}

std::optional<StoreError> read_inspect(const redisReply* reply, const StoreError* err, std::string_view endpoint,
                                       std::string_view lock, LockInfo& info) {
  info = LockInfo{};
  if (err != nullptr) return *err;
  if (!is_array_of(reply, 5) || reply->element[0]->type != REDIS_REPLY_INTEGER ||
      reply->element[1]->type != REDIS_REPLY_INTEGER || !is_string(reply->element[2]) ||
      reply->element[1]->integer < 0 || reply->element[3]->type != REDIS_REPLY_ARRAY ||
      reply->element[3]->elements % 2 != 0 || !is_string(reply->element[4]))
    return unexpected_reply(endpoint, "inspect", shape_of(reply));
  const long long pttl = reply->element[0]->integer;
  if (pttl == -1) {
    // The acquire script would refuse it the same way.
    return redis_reply_error(std::string(endpoint),
                             "LOCKWATCH " + std::string(lock) + " exists without expiry: not a lockwatch lock");
  }
  info.held = pttl > 0;
  info.ttl = std::chrono::milliseconds(pttl > 0 ? pttl : 0);
  info.fencing_token = static_cast<std::uint64_t>(reply->element[1]->integer);
  const std::string_view value = text_of(reply->element[2]);
  if (!info.held) return std::nullopt;
  info.kind = kinds::kind_of_marker(value);
  if (info.kind.exclusive_kind()) info.owner.assign(value);
  std::int64_t now_ms = -1;
  (void)whole_number(text_of(reply->element[4]), now_ms);
  const redisReply* holders = reply->element[3];
  for (std::size_t i = 0; i + 1 < holders->elements; i += 2) {
    if (!is_string(holders->element[i]) || !is_string(holders->element[i + 1]))
      return unexpected_reply(endpoint, "inspect", "a holder that is not a string");
    HolderInfo h;
    h.token.assign(text_of(holders->element[i]));
    if (parse_owner_record(text_of(holders->element[i + 1]), h) && now_ms >= 0)
      h.held_for = std::max(std::chrono::milliseconds(0),
                            std::chrono::milliseconds(now_ms) - std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                    h.since.time_since_epoch()));
    info.holders.push_back(std::move(h));
  }
  if (info.kind.mode() == LockKind::Mode::kFair && !info.holders.empty()) info.owner = info.holders.front().token;
  return std::nullopt;
}

std::optional<StoreError> read_force_release(const redisReply* reply, const StoreError* err,
                                             std::string_view endpoint, bool& held) {
  auto failed = read_integer(reply, err, endpoint, "force release", 0, 1);
  held = !failed && reply->integer == 1;
  return failed;
}

std::optional<StoreError> read_withdraw(const redisReply* reply, const StoreError* err, std::string_view endpoint) {
  return read_integer(reply, err, endpoint, "fair withdraw", 0, 1);
}

ClaimResult read_claim_period(const redisReply* reply, const StoreError* err, std::string_view endpoint) {
  if (err != nullptr) return ClaimResult{.error = *err};
  const bool fields_ok = is_array_of(reply, 4) && std::all_of(reply->element, reply->element + 4, is_string);
  long long seconds = 0, micros = 0;
  std::int64_t last = 0;
  if (!fields_ok || !whole_number(text_of(reply->element[1]), seconds) ||
      !whole_number(text_of(reply->element[2]), micros) || !whole_number(text_of(reply->element[3]), last))
    return ClaimResult{.error = unexpected_reply(endpoint, "period claim", shape_of(reply))};
  using Status = ClaimResult::Status;
  static constexpr std::pair<std::string_view, Status> kStatuses[] = {
      {"1", Status::kClaimed}, {"0", Status::kAlreadyRun}, {"2", Status::kNotDue}, {"-1", Status::kNotLeader}};
  const std::string_view status = text_of(reply->element[0]);
  const auto* known = std::ranges::find(kStatuses, status, &std::pair<std::string_view, Status>::first);
  if (known == std::end(kStatuses))
    return ClaimResult{.error = unexpected_reply(endpoint, "period claim", "status " + quoted(status))};
  ClaimResult out;
  out.status = known->second;
  out.last = last;
  out.store_time = server_clock(seconds, micros);
  return out;
}

}  // namespace lockwatch::detail
