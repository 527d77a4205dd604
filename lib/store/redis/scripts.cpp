#include "scripts.hpp"

#include <cstdint>

namespace lockwatch::detail {
namespace {

// SET NX first, the one call a free lock needs before its counter: a busy
// lock is neither overwritten nor counted. The token is the slot's counter
// (KEYS[2]) incremented; the name's own counter of versions before
// (KEYS[3], a declared key so that a cluster runs the script only where
// all three are, or nowhere) is folded in the first time: the slot's
// counter goes past it, so the name's tokens never go back across the
// upgrade, and it is deleted. A counter Redis refuses (a key of another
// type, an old counter that is no number) gives the lock back in the same
// script and fails; nothing else was written. A busy key without expiry is
// not ours (a user's key, or a lock someone made by hand) and is reported
// instead of waited on forever. A lock that already holds the caller's
// token is a retry of an acquisition whose reply was lost: it is taken
// again (the ttl set anew) with the slot's counter as it stands, at least
// the token the lost reply carried and below the next holder's, so
// retrying with the same token is safe. pcall: a key of another type is
// simply not ours.
constexpr std::string_view kAcquire = R"lua(
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local old = redis.pcall('get', KEYS[3])
  if type(old) == 'table' then
    redis.call('del', KEYS[1])
    return old
  end
  if old and not string.match(old, '^%d+$') then
    redis.call('del', KEYS[1])
    return redis.error_reply('LOCKWATCH ' .. KEYS[3] .. ' is not a fencing counter')
  end
  local f = redis.pcall('incr', KEYS[2])
  if type(f) == 'table' then
    redis.call('del', KEYS[1])
    return f
  end
  if old then
    if tonumber(old) >= f then
      redis.call('set', KEYS[2], old)
      f = redis.call('incr', KEYS[2])
    end
    redis.call('del', KEYS[3])
  end
  return {1, f}
end
local t = redis.call('pttl', KEYS[1])
if t < 0 then
  return redis.error_reply('LOCKWATCH ' .. KEYS[1] .. ' exists without expiry: not a lockwatch lock')
end
if redis.pcall('get', KEYS[1]) == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('get', KEYS[2]) or '0')}
end
return {0, t}
)lua";

// Renews every lease due in one tick with one command. pcall: one key of
// the wrong type (or an OOM refusal) fails its own entry, not the batch.
// One byte per lease, in KEYS order: '1' renewed, '0' gone, 'x' someone
// else's, 'e' Redis refused (one string instead of an array of integers:
// the client parses one reply, not one per lease).
constexpr std::string_view kRenew = R"lua(
local out = {}
for i = 1, #KEYS do
  local v = redis.pcall('get', KEYS[i])
  if type(v) == 'table' and v.err then
    out[i] = 'e'
  elseif v == ARGV[2 * i - 1] then
    local ok = redis.pcall('pexpire', KEYS[i], ARGV[2 * i])
    if type(ok) == 'table' and ok.err then out[i] = 'e' else out[i] = '1' end
  elseif v then
    out[i] = 'x'
  else
    out[i] = '0'
  end
end
return table.concat(out)
)lua";

// ARGV[2] is the channel ('' for a lock given back unused: nobody is
// woken), ARGV[3] how it is told: 's' SPUBLISH (a cluster), else PUBLISH
// (one node, Sentinel, Redlock). The channel shares the lock's hash tag and
// so its slot; it is not declared as a key: a declared key that is no key
// would make a migrating slot answer TRYAGAIN. A lock already gone answers
// 0, which a retry after a lost reply counts as released.
constexpr std::string_view kRelease = R"lua(
local v = redis.call('get', KEYS[1])
if v == ARGV[1] then
  redis.call('del', KEYS[1])
  if ARGV[2] ~= '' then
    if ARGV[3] == 's' then
      redis.call('spublish', ARGV[2], '1')
    else
      redis.call('publish', ARGV[2], '1')
    end
  end
  return 1
end
if v then return -1 end
return 0
)lua";

// The acquisitions of one loop iteration on one node, in one call: the
// acquire script for each lock in turn (a lock that holds the caller's
// token already is a retry: taken again with its slot's counter). pcall on
// the counters: a counter that is no counter fails its own lock, not the
// locks taken before it in the batch (a script's writes are not undone by
// a later error). Several locks of one slot share its counter, counted in
// turn. One entry per lock, separated by spaces: 't<fencing token>' taken,
// 'b<pttl>' busy, 'n' exists without expiry, 'e' Redis refused the slot's
// counter, 'o' the name's old counter is no counter.
constexpr std::string_view kAcquireBatch = R"lua(
local out = {}
local function take(lock, counter, legacy)
  local old = redis.pcall('get', legacy)
  if type(old) == 'table' or (old and not string.match(old, '^%d+$')) then
    redis.call('del', lock)
    return 'o'
  end
  local f = redis.pcall('incr', counter)
  if type(f) == 'table' then
    redis.call('del', lock)
    return 'e'
  end
  if old then
    if tonumber(old) >= f then
      redis.call('set', counter, old)
      f = redis.call('incr', counter)
    end
    redis.call('del', legacy)
  end
  return 't' .. f
end
for i = 1, #KEYS / 3 do
  local lock, counter, token, ttl = KEYS[3 * i - 2], KEYS[3 * i - 1], ARGV[2 * i - 1], ARGV[2 * i]
  if redis.call('set', lock, token, 'NX', 'PX', ttl) then
    out[i] = take(lock, counter, KEYS[3 * i])
  else
    local t = redis.call('pttl', lock)
    if t < 0 then
      out[i] = 'n'
    elseif redis.pcall('get', lock) == token then
      local f = redis.pcall('get', counter)
      if type(f) == 'table' then
        out[i] = 'e'
      else
        redis.call('pexpire', lock, ttl)
        out[i] = 't' .. (f or '0')
      end
    else
      out[i] = 'b' .. t
    end
  end
end
return table.concat(out, ' ')
)lua";

// The releases of one loop iteration on one node: the release script for
// each lock in turn. One byte per lock: '1' released (and published), '0'
// gone, 'x' another owner's (or not a string: left alone).
constexpr std::string_view kReleaseBatch = R"lua(
local out = {}
for i = 1, #KEYS do
  local v = redis.pcall('get', KEYS[i])
  if type(v) == 'table' then
    out[i] = 'x'
  elseif v == ARGV[2 * i - 1] then
    redis.call('del', KEYS[i])
    if ARGV[2 * i] ~= '' then redis.call('publish', ARGV[2 * i], '1') end
    out[i] = '1'
  elseif v then
    out[i] = 'x'
  else
    out[i] = '0'
  end
end
return table.concat(out)
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

// Operators' view of one lock: {pttl (-2 absent, -1 no expiry), fencing
// counter, owner token or ''}. The counter is the slot's, or the name's
// old counter (ARGV[1]) if that is higher: the next token is above both.
// The old counter is read without being declared, so that a slot in
// migration, where it is almost never present, does not turn every
// inspect into TRYAGAIN; where Redis will not serve it (mid-migration on a
// cluster) it is left out: the view decides nothing.
constexpr std::string_view kInspect = R"lua(
local t = redis.call('pttl', KEYS[1])
local f = tonumber(redis.call('get', KEYS[2]) or '0')
local old = redis.pcall('get', ARGV[1])
if type(old) == 'string' then
  local o = tonumber(old)
  if o and o > f then f = o end
end
local v = redis.call('get', KEYS[1]) or ''
return {t, f, v}
)lua";

// Operators' removal of a lock whoever holds it; the fencing counter stays.
// ARGV: the channel, and 's' (SPUBLISH) or 'p' (PUBLISH).
constexpr std::string_view kForceRelease = R"lua(
if redis.call('del', KEYS[1]) == 1 then
  if ARGV[2] == 's' then
    redis.call('spublish', ARGV[1], '1')
  else
    redis.call('publish', ARGV[1], '1')
  end
  return 1
end
return 0
)lua";

// A scheduled job's run: the leader's lease check, the store's clock and
// the at-most-once record in one step. TIME is read inside the script:
// since Redis 5 scripts replicate their effects, so a clock read before a
// write is allowed. Periods stay below 2^53, so Lua numbers hold them.
constexpr std::string_view kClaimPeriod = R"lua(
local t = redis.call('time')
if redis.call('get', KEYS[1]) ~= ARGV[1] then return {'-1', t[1], t[2], '0'} end
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now_ms < tonumber(ARGV[3]) then return {'2', t[1], t[2], '0'} end
local last = redis.call('get', KEYS[2])
if last and tonumber(last) >= tonumber(ARGV[2]) then return {'0', t[1], t[2], last} end
redis.call('set', KEYS[2], ARGV[2])
return {'1', t[1], t[2], ARGV[2]}
)lua";

inline std::uint32_t rol(std::uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

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
    for (int i = 16; i < 80; ++i) w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; ++i) {
      std::uint32_t f, k;
      if (i < 20) {
        f = (b & c) | (~b & d);
        k = 0x5A827999u;
      } else if (i < 40) {
        f = b ^ c ^ d;
        k = 0x6ED9EBA1u;
      } else if (i < 60) {
        f = (b & c) | (b & d) | (c & d);
        k = 0x8F1BBCDCu;
      } else {
        f = b ^ c ^ d;
        k = 0xCA62C1D6u;
      }
      std::uint32_t t = rol(a, 5) + f + e + k + w[i];
      e = d;
      d = c;
      c = rol(b, 30);
      b = a;
      a = t;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::uint32_t v : h)
    for (int i = 28; i >= 0; i -= 4) out.push_back(kHex[(v >> i) & 15]);
  return out;
}

const Script& acquire_script() {
  static const Script s{kAcquire, sha1_hex(kAcquire)};
  return s;
}
const Script& renew_script() {
  static const Script s{kRenew, sha1_hex(kRenew)};
  return s;
}
const Script& raise_fence_script() {
  static const Script s{kRaiseFence, sha1_hex(kRaiseFence)};
  return s;
}
const Script& inspect_script() {
  static const Script s{kInspect, sha1_hex(kInspect)};
  return s;
}
const Script& force_release_script() {
  static const Script s{kForceRelease, sha1_hex(kForceRelease)};
  return s;
}
const Script& claim_period_script() {
  static const Script s{kClaimPeriod, sha1_hex(kClaimPeriod)};
  return s;
}
const Script& acquire_batch_script() {
  static const Script s{kAcquireBatch, sha1_hex(kAcquireBatch)};
  return s;
}
const Script& release_batch_script() {
  static const Script s{kReleaseBatch, sha1_hex(kReleaseBatch)};
  return s;
}
const Script& release_script() {
  static const Script s{kRelease, sha1_hex(kRelease)};
  return s;
}

}  // namespace lockwatch::detail
