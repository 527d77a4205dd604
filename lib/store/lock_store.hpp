// lib/store/lock_store.hpp: the one interface between the runtime and every
// place a lock can live (one Redis node, a node found through Sentinel, a
// quorum of stores for Redlock, a SQL table, a space in this process's
// memory, an in-memory store in the unit tests).
//
// The runtime knows what a lock means (admission, waiting, the watchdog);
// a store knows where it lives: connections, scripts, key names and reply
// formats stay behind this interface.
//
// Batch-first. acquire, renew and release take a batch of locks and answer
// through one callback that runs exactly once per lock, with the lock's
// index in the batch. A store may answer the locks of a batch at different
// times (a quorum decides each lock as soon as its votes allow), but never
// twice and never not at all.
//
// Threading: construction and encode()/check_key() on any thread; every
// other member, and every callback, on the loop thread only. A callback
// never runs inside the call that registered it (a store that can answer at
// once defers through Loop::post), so callers may hold state across a call.
//
// Errors are values here: a store never throws through the loop. A failure
// is a status with a StoreError (store_error.hpp): a kind, the server's code
// and message, and for a redirect its target. Callbacks that answer with or
// without one take it by pointer, null on success. The runtime decides by
// kind and alone turns it into the public exception (store_errors.hpp).
//
// Costs: one virtual call per batch; a store must not copy the names and
// tokens of a renewal batch (they stay valid while its keepalive lives).
//
// What not every store can do is not here: raising a fencing counter for a
// quorum, the scheduled jobs' period claims and clock, and the operators'
// inspect and force-release are small interfaces of their own
// (capabilities.hpp) that a store implements if it can. StoreBase
// (store_base.hpp) holds what most stores share: key rules, the events,
// no-op subscriptions.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "lockwatch/lock_kind.hpp"
#include "store/store_error.hpp"

namespace lockwatch::detail {

// One lock as a store sees it. The views are valid only during the call
// that takes them, except in renew(), where they stay valid while its
// keepalive lives.
struct LockRef {
  std::string_view name;    // LockStore::encode() of the user's key
  std::string_view token;   // the owner token (random, unique per acquisition)
  std::string_view ttl_ms;  // the ttl in milliseconds as decimal text, formatted once per lease
  std::chrono::milliseconds ttl{0};
  LockKind kind{};          // how it is held (a store takes only those supports() says)
  // acquire() only: the caller tries again, with this token, while the lock
  // is busy (it has a wait), so a store may keep it a place in line.
  bool waits = false;
};

struct Acquired {
  enum class Status : std::uint8_t { kTaken, kBusy, kFailed };
  Status status = Status::kFailed;
  std::uint64_t fence = 0;                 // kTaken: the fencing token
  std::chrono::milliseconds busy_for{0};   // kBusy: the holder's remaining ttl
  StoreError error;                        // kFailed: why (empty on success: no allocation)
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

class LockStore {
 public:
  using AcquireDone = std::function<void(std::size_t index, const Acquired& result)>;
  // `error`: why, for kTransient and kUnconfirmed (null otherwise); valid
  // during the callback only.
  using RenewDone = std::function<void(std::size_t index, Renewed status, const StoreError* error)>;
  using ReleaseDone = std::function<void(std::size_t index, Released status, const StoreError* error)>;

  virtual ~LockStore() = default;

  // Any thread. The store's name for a user's key (e.g. "lockwatch:{key}"),
  // computed once per acquisition and kept in the lease.
  virtual std::string encode(std::string_view key) const = 0;
  // Any thread. Why this store cannot hold a lock of this key (nullptr: it
  // can). Checked before anything starts; the runtime makes it InvalidArgument.
  virtual const char* check_key(std::string_view key) const noexcept = 0;
  // Whether the store reports releases (pub/sub). Without them waiters
  // retry on the holder's remaining ttl and a bounded back-off.
  virtual bool release_events() const noexcept = 0;
  // Any thread. Why this store cannot hold a lock of `kind` with its
  // guarantee (nullptr: it can). The runtime makes it Unsupported.
  virtual const char* check_kind(LockKind kind) const noexcept {
    if (kind.exclusive_kind()) return nullptr;
    return kind.mode() == LockKind::Mode::kFair ? "this store keeps no queue of waiters for fair locks"
                                                : "this store holds exclusive locks only";
  }

  // Any thread. How long after the last request that could have set or
  // extended it the server may still keep a lock of `ttl`: the ttl itself
  // where the server keeps it to the millisecond; longer where it rounds
  // it up (etcd's leases count whole seconds). The runtime waits this long
  // before it counts an unconfirmed release as done.
  virtual std::chrono::milliseconds expiry_bound(std::chrono::milliseconds ttl) const noexcept { return ttl; }
  // Any thread. False where the server may keep a lock past any bound the
  // client can know (etcd renews every lease when a new leader takes over,
  // and expires none while it has no leader): a release left unconfirmed is
  // then reported to its caller as a lost lease, never counted done.
  virtual bool expiry_bounded() const noexcept { return true; }

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
};

}  // namespace lockwatch::detail

// A store class declares LockStore's operations with these, named once
// here rather than in every store's header: LOCKWATCH_STORE_OPERATIONS;
// (acquire, renew, release, close) and, for a store with release notices,
// LOCKWATCH_STORE_NOTICES; (subscribe, unsubscribe).
#define LOCKWATCH_STORE_OPERATIONS                                                                           \
  void acquire(std::span<const ::lockwatch::detail::LockRef> locks, AcquireDone done) override;              \
  std::size_t renew(std::span<const ::lockwatch::detail::LockRef> locks, std::shared_ptr<const void> keepalive, \
                    RenewDone done) override;                                                                \
  void release(std::span<const ::lockwatch::detail::LockRef> locks, bool notify, ReleaseDone done) override; \
  void close() override
#define LOCKWATCH_STORE_NOTICES                  \
  void subscribe(std::string_view name) override; \
  void unsubscribe(std::string_view name) override
