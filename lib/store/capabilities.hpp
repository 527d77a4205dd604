// lib/store/capabilities.hpp: what a store may offer beyond locking, each a
// small interface a store class derives from when it can and offers once
// in its constructor; how the runtime asks for one (capability<T>,
// require<T>): docs/how-it-works.md ("The store interface and the
// threads"). Each class's kName says what it offers.
//
// Threading and callbacks as in LockStore: loop thread only (but
// DirectLane's calls); a callback runs exactly once and never
// inside the call that registered it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "store/lock_store.hpp"
#include "store/store_error.hpp"

namespace lockwatch::detail {

// One holder of a lock as the store records it: its owner token, the owner
// name its runtime gave (Options::runtime.owner_name; empty where the store
// has none recorded) and its grant time on the store's clock, with how long
// ago that was on the same clock (so that hosts with skewed clocks agree).
struct HolderInfo {
  std::string token;
  std::string owner_name;
  std::chrono::system_clock::time_point since{};
  std::chrono::milliseconds held_for{0};
};

// What a store says of one lock right now (operators' view).
struct LockInfo {
  bool held = false;
  std::chrono::milliseconds ttl{0};  // remaining, when held
  std::uint64_t fencing_token = 0;   // the highest fencing token handed out (0: never locked)
  std::string owner;                 // the holder's token, when held (a single holder's)
  LockKind kind{};                   // how it is held, when held
  std::vector<HolderInfo> holders;   // when held: the holder, or each of a shared or permit lock's
  std::string key;                   // list_locks(): the user's key (encode() undone)
};

// An owner record as the Redis scripts and etcd values keep it, "<grant
// time in unix ms> <owner name>" ("-" for a time not to be had), into
// `out`'s owner name and grant time. False when no time was read (the
// name may still have been).
bool parse_owner_record(std::string_view text, HolderInfo& out);

// What a scheduled job's claim on a period found (claim_period). The
// store keeps, per job, the last period run; a claim sets it to `period`
// only when the job's lock holds our token, the store's clock has reached
// the period's start and the last period run is lower: one atomic step.
struct ClaimResult {
  enum class Status : std::uint8_t {
    kClaimed,     // ours to run: the store now records it as run
    kAlreadyRun,  // a period >= this one was run already (`last`)
    kNotDue,      // the store's clock is before the period's start
    kNotLeader,   // the job's lock is not ours (lost, expired, taken)
    kFailed,      // no answer could be had (`error`); nothing is known
  };
  Status status = Status::kFailed;
  std::int64_t last = 0;  // kAlreadyRun: the last period run
  // The store's clock when it decided (every status but kFailed).
  std::chrono::system_clock::time_point store_time{};
  StoreError error;  // kFailed: why
};

class FenceRaising {
 public:
  static constexpr FenceRaising* Capabilities::*kSlot = &Capabilities::fence_raising;
  static constexpr std::string_view kName = "fencing counters raised by a quorum";
  using RaiseDone = std::function<void(bool ok)>;
  // Raises the lock's fencing counter to at least `fence`.
  virtual void raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) = 0;

 protected:
  ~FenceRaising() = default;
};

class JobClaims {
 public:
  static constexpr JobClaims* Capabilities::*kSlot = &Capabilities::job_claims;
  static constexpr std::string_view kName = "scheduled jobs (a clock and period claims)";
  using TimeDone = std::function<void(std::chrono::system_clock::time_point now, const StoreError* error)>;
  using ClaimDone = std::function<void(const ClaimResult&)>;
  // The store's clock, so that processes with skewed clocks agree which
  // period is due; `error` (else null) when no answer could be had.
  virtual void server_time(TimeDone done) = 0;
  // Claims `period` of the job whose lock is `name` (encode()d), held with
  // `token`, if the store's clock has reached `start` (the period's start
  // on the store's clock). See ClaimResult. Not batched: one claim per run.
  virtual void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                            std::chrono::system_clock::time_point start, ClaimDone done) = 0;

 protected:
  ~JobClaims() = default;
};

// A period claim as a store carries it between its steps, in a store that
// reads its clock apart from the claim (ZooKeeper, etcd): a store's own
// claim derives from it.
struct StoreClaim {
  std::string name, token;
  std::int64_t period = 0;
  JobClaims::ClaimDone done;
  int attempt = 0;  // reads of the last period run
  ClaimResult out{};

  void finish(ClaimResult::Status status, const StoreError* error = nullptr) {
    out.status = status;
    if (error != nullptr) out.error = *error;
    done(out);
  }
  void failed(const StoreError& error) { finish(ClaimResult::Status::kFailed, &error); }

  template <class Claim>
  static std::shared_ptr<Claim> make(std::string_view name, std::string_view token, std::int64_t period,
                                     JobClaims::ClaimDone done) {
    // A store's own claim type (derived) is made from its StoreClaim part, its own fields empty.
    return std::make_shared<Claim>(StoreClaim{std::string(name), std::string(token), period, std::move(done)});
  }
  // The answer of the store's clock for claim `c`: a period due by it
  // (the clock at `start` or later) goes on with `step`; else the claim
  // ends, failed (no clock) or not due.
  template <class Claim, class Step>
  static JobClaims::TimeDone when_due(std::shared_ptr<Claim> c, std::chrono::system_clock::time_point start,
                                      Step step) {
    return [c = std::move(c), start, step](std::chrono::system_clock::time_point now, const StoreError* error) {
      if (error != nullptr) return c->failed(*error);
      c->out.store_time = now;
      if (now < start) return c->finish(ClaimResult::Status::kNotDue);
      step(c);
    };
  }
};

class OperatorTools {
 public:
  static constexpr OperatorTools* Capabilities::*kSlot = &Capabilities::operator_tools;
  static constexpr std::string_view kName = "operators' inspect and force_release";
  using InspectDone = std::function<void(const LockInfo&, const StoreError* error)>;
  using ForceDone = std::function<void(bool was_held, const StoreError* error)>;
  // What the store holds for `name`; `error` (else null) when it could not answer.
  virtual void inspect(std::string_view name, InspectDone done) = 0;
  // Removes `name` whoever owns it, waking its waiters; the fencing counter stays.
  virtual void force_release(std::string_view name, ForceDone done) = 0;

 protected:
  ~OperatorTools() = default;
};

class LockListing {
 public:
  static constexpr LockListing* Capabilities::*kSlot = &Capabilities::lock_listing;
  static constexpr std::string_view kName = "listing the locks held under a prefix";
  using ListDone = std::function<void(std::vector<LockInfo> locks, const StoreError* error)>;
  // The locks held whose user key starts with `prefix`, at most `limit`,
  // in the store's order, each with its key and holders as inspect()
  // gives them. Bounded: the store reads in pages and stops at `limit`.
  virtual void list_locks(std::string_view prefix, std::size_t limit, ListDone done) = 0;

 protected:
  ~LockListing() = default;
};

// Keeps the most telling of several stores' failures in `kept`, the first
// among equals (store_error.cpp weighs them by kind).
void keep_most_telling(std::unique_ptr<StoreError>& kept, const StoreError& e);

// What the stores asked one call (a quorum's members, a cluster's masters)
// answered so far: the value of each that answered, a failure of the
// others (the most telling, or with `kMostTelling` false the first); and
// the caller.
template <class Value, class Done, bool kMostTelling = true>
struct Answers {
  explicit Answers(Done caller) : done(std::move(caller)) {}
  std::size_t replies = 0;
  std::vector<Value> values;
  std::unique_ptr<StoreError> error;
  Done done;

  // Counts one store's reply (`value` if it answered); true once all `n` replied.
  bool heard(const StoreError* err, std::size_t n, Value value) {
    replies++;
    if (!err) {
      values.push_back(std::move(value));
    } else if (kMostTelling || !error) {
      keep_most_telling(error, *err);
    }
    return replies == n;
  }
};

class FairQueue {
 public:
  static constexpr FairQueue* Capabilities::*kSlot = &Capabilities::fair_queue;
  static constexpr std::string_view kName = "fair locks (a queue of waiters in arrival order)";
  using WithdrawDone = std::function<void(const StoreError* error)>;
  // `lock` (fair; its acquire() answered busy, so it is queued) gives up its
  // place in the lock's queue. If it was first while the lock is free, the
  // new first is woken (a release notice). Removing a waiter that is not
  // queued is no error. A withdraw that fails leaves the waiter to be
  // dropped when its place runs out (its ttl after its last attempt). It
  // does not release a lock the token holds: release() does.
  virtual void withdraw(const LockRef& lock, WithdrawDone done) = 0;

 protected:
  ~FairQueue() = default;
};

class TokenBlocks {
 public:
  static constexpr TokenBlocks* Capabilities::*kSlot = &Capabilities::token_blocks;
  static constexpr std::string_view kName = "fencing tokens reserved by a holder (in-process hand-off)";
  // `last`: the counter's new value, or 0 when the lock is not held with
  // the token (any more); `error` (else null): no answer could be had.
  using ReserveDone = std::function<void(std::uint64_t last, const StoreError* error)>;
  // If exclusive `lock` is held with its token, raises its fencing counter
  // by `n` (> 0) and answers the new value: the tokens last - n + 1 .. last
  // are the holder's to hand to the next holders of the lock while its
  // token holds it without a break. Each is above every token handed out
  // before and below every token the store hands out after. One atomic step.
  virtual void reserve_tokens(const LockRef& lock, std::uint32_t n, ReserveDone done) = 0;

 protected:
  ~TokenBlocks() = default;
};

class DirectLane {
 public:
  static constexpr DirectLane* Capabilities::*kSlot = &Capabilities::direct_lane;
  static constexpr std::string_view kName = "requests written by the calling thread";
  using AcquiredDirect = std::function<void(const Acquired& out)>;
  using ReleasedDirect = std::function<void(Released status, const StoreError* error)>;
  // Any thread. Writes the acquisition of `lock` (exclusive, not fair), or
  // its release (with a release notice), now, as acquire() and release()
  // would send it; true once written: `done` runs with its answer on the
  // loop thread, exactly once (an error within the command timeout). False
  // when it cannot be written now (the connection is not usable, or
  // requests are in flight on it: the loop, which wakes for their answers
  // anyway, sends it with others), and `done` is dropped unrun: the
  // caller goes through acquire() or release() on the loop.
  // lane_open(): false when a request written now would surely be refused
  // (requests in flight), so that the caller builds none. A hint: true does
  // not promise that the write is taken. lane_open_at(): the same, with the
  // time of the call as the caller read it last (one clock read a call).
  bool lane_open() const noexcept { return lane_open_at(std::chrono::steady_clock::now()); }
  virtual bool lane_open_at(std::chrono::steady_clock::time_point now) const noexcept = 0;
  virtual bool acquire_direct(const LockRef& lock, AcquiredDirect done) = 0;
  virtual bool release_direct(const LockRef& lock, ReleasedDirect done) = 0;
  // Any thread: the calling thread's own round trip, on a connection no
  // other thread uses meanwhile, for a caller that blocks until the answer
  // (Runtime::lock(), LockHandle::unlock()): written as acquire_direct()
  // and release_direct() write it, and answered on this thread, so that no
  // other thread wakes. True once `done` ran, here, before the return (with
  // an error when the answer did not come in the command timeout: then it
  // may have run). False when nothing ran (the connection is in use, down,
  // or the lane is closed), and `done` did not run: the caller goes another
  // way.
  virtual bool acquire_blocking(const LockRef& lock, const AcquiredDirect& done) = 0;
  virtual bool release_blocking(const LockRef& lock, const ReleasedDirect& done) = 0;

 protected:
  ~DirectLane() = default;
};

// `store` as a T, or null when it does not offer T.
template <class T>
T* capability(const LockStore& store) noexcept {
  return store.capabilities().*T::kSlot;
}

// Throws lockwatch::Unsupported: `store_kind` (e.g. "mysql://") offers no `what`.
[[noreturn]] void throw_unsupported(std::string_view store_kind, std::string_view what);

// `store` as a T; throws Unsupported naming T when it does not offer it.
template <class T>
T& require(const LockStore& store, std::string_view store_kind) {
  if (T* t = capability<T>(store)) return *t;
  throw_unsupported(store_kind, T::kName);
}

}  // namespace lockwatch::detail
