// lib/store/lock_store.hpp: the one interface between the runtime and every
// place a lock can live. The runtime knows what a lock means, a store where
// it lives; the seam between them (data read once, capabilities offered
// once, 8 virtual operations): docs/how-it-works.md ("The store interface
// and the threads").
//
// Batch-first: acquire, renew and release answer through one callback that
// runs exactly once per lock, with its index in the batch; a store may
// answer a batch's locks at different times, never twice, never not at all.
//
// Threading: construction, traits(), capabilities() and the functions that
// read them (encode(), check_key(), check_kind(), ...) on any thread; every
// other member, and every callback, on the loop thread only. A callback
// never runs inside the call that registered it (a store that can answer at
// once defers through Loop::post), so callers may hold state across a call.
// Errors are values (a StoreError, by pointer, null on success), never
// thrown through the loop.
//
// Costs: one virtual call per batch; a store must not copy the names and
// tokens of a renewal batch (they stay valid while its keepalive lives).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "core/small_string.hpp"
#include "lockwatch/lock_kind.hpp"
#include "store/store_error.hpp"

namespace lockwatch::detail {

// One lock as a store sees it. The views are valid only during the call
// that takes them, except in renew(), where they stay valid while its
// keepalive lives.
struct LockRef {
  std::string_view name;    // LockStore::encode() of the user's key
  std::string_view token;   // the owner token (random, unique per acquisition)
  std::string_view ttl_ms;  // the ttl in milliseconds as decimal text
  std::chrono::milliseconds ttl{0};
  LockKind kind{};          // how it is held (a store takes only those check_kind() allows)
  // acquire() only: the caller tries again, with this token, while the lock
  // is busy (it has a wait), so a store may keep it a place in line.
  bool waits = false;
};

// A LockRef's strings kept, for a request that outlives the call (ref()
// views them).
struct OwnedLock {
  explicit OwnedLock(const LockRef& r) : name(r.name), token(r.token), ttl_ms(r.ttl_ms), ttl(r.ttl), kind(r.kind) {}
  LockRef ref() const { return LockRef{name, token, ttl_ms, ttl, kind}; }
  std::string name, token, ttl_ms;
  std::chrono::milliseconds ttl{0};
  LockKind kind{};
};

struct Acquired {
  enum class Status : std::uint8_t { kTaken, kBusy, kFailed };
  Status status = Status::kFailed;
  std::uint64_t fence = 0;                 // kTaken: the fencing token
  std::chrono::milliseconds busy_for{0};   // kBusy: the holder's remaining ttl
  StoreError error;                        // kFailed: why (empty on success: no allocation)

  // The three answers; a busy one waits at least 1 ms (never a spin).
  static Acquired taken(std::uint64_t fence) { return {Status::kTaken, fence, {}, {}}; }
  static Acquired busy(std::chrono::milliseconds how_long) {
    return {Status::kBusy, 0, std::max(how_long, std::chrono::milliseconds(1)), {}};
  }
  static Acquired failed(StoreError why) { return {Status::kFailed, 0, {}, std::move(why)}; }
};

enum class Renewed : std::uint8_t {
  kYes,           // ours, and extended by the ttl
  kGone,          // the lock was not there: it expired
  kTakenByOther,  // another owner holds it
  kTransient,     // no answer could be had (a connection error, a refused command); try again
};

enum class Released : std::uint8_t {
  kYes,           // it was ours and is gone now
  kGone,          // it was gone already (expired)
  kTakenByOther,  // another owner held it: left alone
  kUnconfirmed,   // no answer could be had; it expires by its ttl
  // As kYes, and the store knows that its release notice reached no
  // subscriber but this store's own: nobody elsewhere waits for the key
  // with a confirmed subscription. Only a store that can count its
  // notice's listeners says so; kYes claims nothing about them.
  kYesUnheard,
};

// Whether a release found the lock ours (and so let it go).
constexpr bool was_ours(Released r) noexcept { return r == Released::kYes || r == Released::kYesUnheard; }

// Things a store reports on its own. Set once, by start().
struct StoreEvents {
  // A release notice for a name some subscribe() asked for.
  std::function<void(std::string_view name)> released;
  // A subscription is confirmed: releases from now on are reported.
  std::function<void(std::string_view name)> subscribed;
  // Every subscription is gone until `subscribed` confirms it again (a
  // connection dropped); a waiter must not count on a notice meanwhile.
  std::function<void()> subscriptions_lost;
  // A connection to `endpoint` went down (`why`) or came back up.
  std::function<void(const std::string& endpoint, bool up, const std::string& why)> connection;
  // Something an operator should know (e.g. Sentinel moved the master).
  std::function<void(bool warning, const std::string& line)> log;
  // Redis Cluster: a call or a lease's renewal was answered with a
  // redirect, MOVED (`ask` false) or ASK (true), and followed.
  std::function<void(bool ask)> redirected;
};

class FenceRaising;
class JobClaims;
class OperatorTools;
class LockListing;
class FairQueue;
class TokenBlocks;
class DirectLane;

// What a store offers beyond locking (capabilities.hpp), each null when
// it does not.
struct Capabilities {
  FenceRaising* fence_raising = nullptr;
  JobClaims* job_claims = nullptr;
  OperatorTools* operator_tools = nullptr;
  LockListing* lock_listing = nullptr;
  FairQueue* fair_queue = nullptr;  // fair locks: held iff offered
  TokenBlocks* token_blocks = nullptr;
  DirectLane* direct_lane = nullptr;
};

// The store's name for a key, inline when short (most are), so an
// acquisition and a lease's request need no heap block for it. 40 bytes: a longer
// name keeps a pointer to its own block in the first bytes of the inline
// space.
using StoreName = SmallString<36>;
static_assert(sizeof(StoreName) == 40);

// A store's name for a key is `prefix + key` (or, with braces, as Redis
// names it, `prefix{key}`), and a key is refused when problem says why.
struct KeyRules {
  using Problem = const char* (*)(std::string_view prefix, std::string_view key) noexcept;

  static const char* any(std::string_view, std::string_view) noexcept { return nullptr; }

  // The name of `key` in its pieces, in order.
  std::array<std::string_view, 4> name_parts(std::string_view key) const noexcept {
    return {prefix, braces ? "{" : "", key, braces ? "}" : ""};
  }

  std::string prefix;
  bool braces = false;  // the key between braces (a Redis Cluster hash tag)
  Problem problem = any;
  // The longest name (prefix + key, in bytes) the store takes, and why
  // (0: no bound beyond Options::runtime.max_key_bytes).
  std::size_t max_name = 0;
  const char* too_long = nullptr;
};

// What is constant per store, given to LockStore at construction and read
// through its non-virtual members.
struct StoreTraits {
  static constexpr const char* kExclusiveOnly = "this store holds exclusive locks only";
  static constexpr const char* kNoFairQueue = "this store keeps no queue of waiters for fair locks";

  KeyRules keys{};
  // Whether the store reports releases (pub/sub). Without them waiters
  // retry on the holder's remaining ttl and a bounded back-off.
  bool release_events = false;

  // How long after the last request that could have set or extended it
  // the server may still keep a lock of a ttl: the ttl itself where the
  // server keeps it to the millisecond; longer where it rounds it up
  // (etcd's leases count whole seconds) or keeps it a while past it.
  struct Expiry {
    // The ttl rounded up to a whole number of these, at least one (0: not rounded).
    std::chrono::milliseconds unit{0};
    // And this much more.
    std::chrono::milliseconds slack{0};
    // False where the server may keep a lock past any bound the client can
    // know (etcd renews every lease when a new leader takes over, and
    // expires none while it has no leader).
    bool bounded = true;
  } expiry{};

  // Why the store cannot hold shared locks, permits (null: it can). The
  // runtime makes it Unsupported. Exclusive locks every store holds.
  const char* no_shared = kExclusiveOnly;
  const char* no_permits = kExclusiveOnly;
  // Why it cannot hold fair locks, when it offers no FairQueue (one that
  // offers it holds them).
  const char* no_fair = kNoFairQueue;
};

class LockStore {
 public:
  using AcquireDone = std::function<void(std::size_t index, const Acquired& result)>;
  // `error`: why, for kTransient and kUnconfirmed (null otherwise); valid
  // during the callback only.
  using RenewDone = std::function<void(std::size_t index, Renewed status, const StoreError* error)>;
  using ReleaseDone = std::function<void(std::size_t index, Released status, const StoreError* error)>;

  virtual ~LockStore() = default;
  LockStore(const LockStore&) = delete;
  LockStore& operator=(const LockStore&) = delete;

  // ---- data, read once (any thread)

  const StoreTraits& traits() const noexcept { return traits_; }
  // What the store offers beyond locking (null members: not offered).
  const Capabilities& capabilities() const noexcept { return capabilities_; }

  // The store's name for a user's key (e.g. "lockwatch:{key}"), for the
  // operators' tools and listings.
  std::string encode(std::string_view key) const {
    std::string name;
    for (std::string_view part : traits_.keys.name_parts(key)) name.append(part);
    return name;
  }
  // The same into `out`, with no heap block for a name of up to N bytes:
  // computed once per acquisition, and again for each request of its lease
  // (which keeps only the key).
  template <std::size_t N>
  void encode(std::string_view key, SmallString<N>& out) const {
    out.assign_joined(traits_.keys.name_parts(key));
  }
  // Why this store cannot hold a lock of this key (nullptr: it can).
  // Checked before anything starts; the runtime makes it InvalidArgument.
  const char* check_key(std::string_view key) const noexcept {
    const KeyRules& k = traits_.keys;
    if (k.max_name != 0 && k.prefix.size() + key.size() > k.max_name) return k.too_long;
    return k.problem(k.prefix, key);
  }
  // Whether the store reports releases (StoreTraits::release_events).
  bool release_events() const noexcept { return traits_.release_events; }
  // Why this store cannot hold a lock of `kind` with its guarantee
  // (nullptr: it can). The runtime makes it Unsupported.
  const char* check_kind(LockKind kind) const noexcept {
    switch (kind.mode()) {
      case LockKind::Mode::kExclusive: return nullptr;
      case LockKind::Mode::kShared: return traits_.no_shared;
      case LockKind::Mode::kPermits: return traits_.no_permits;
      case LockKind::Mode::kFair: return capabilities_.fair_queue != nullptr ? nullptr : traits_.no_fair;
    }
    return traits_.no_permits;
  }
  // StoreTraits::Expiry for a lock of `ttl`: the runtime waits this long
  // before it counts an unconfirmed release as done.
  std::chrono::milliseconds expiry_bound(std::chrono::milliseconds ttl) const noexcept {
    const auto& e = traits_.expiry;
    if (e.unit.count() > 0) ttl = std::max(e.unit, (ttl + e.unit - std::chrono::milliseconds(1)) / e.unit * e.unit);
    return ttl + e.slack;
  }
  // False where the server may keep a lock past any bound: a release left
  // unconfirmed is then reported to its caller as a lost lease, never
  // counted done.
  bool expiry_bounded() const noexcept { return traits_.expiry.bounded; }

  // ---- operations (loop thread)

  virtual void start(StoreEvents events) = 0;

  // Takes each lock that is free, with its token and ttl, and raises its
  // fencing counter; a busy lock reports the holder's remaining ttl.
  virtual void acquire(std::span<const LockRef> locks, AcquireDone done) = 0;
  // Extends each lock that is still ours by its ttl. `keepalive` keeps the
  // views alive until every lock was answered. Returns the number of
  // commands the batch went out in (for the stats).
  virtual std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive,
                            RenewDone done) = 0;
  // Deletes each lock that is ours; with `notify`, tells waiters (a lock
  // given back unused notifies nobody). The fencing counter stays.
  virtual void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) = 0;
  // Release notices for `name` (no-ops without release_events()).
  virtual void subscribe(std::string_view name) = 0;
  virtual void unsubscribe(std::string_view name) = 0;

  // Reads and dispatches renewal replies already received, now: before a
  // lease is declared lost after a stall, its confirmation may be waiting.
  // Never from inside one of this store's callbacks.
  virtual void poll_replies() {}

  // Fails what is pending (each callback still runs once) and closes the
  // store's handles; the loop then drains. Nothing may be called after.
  virtual void close() = 0;

 protected:
  explicit LockStore(StoreTraits traits) : traits_(std::move(traits)) {}
  // Once, in the store's constructor: the capabilities it offers.
  void offer(const Capabilities& capabilities) noexcept { capabilities_ = capabilities; }

 private:
  const StoreTraits traits_;
  Capabilities capabilities_;
};

}  // namespace lockwatch::detail
