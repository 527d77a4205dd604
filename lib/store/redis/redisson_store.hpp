// lib/store/redis/redisson_store.hpp: a Redis store in the redisson layout
// (layout.hpp), as the runtime sees it.
//
// It holds a RedisNodeStore or a ClusterStore made with that layout and
// passes every LockStore call through. What it adds is what it refuses:
// exclusive locks only (its traits' kinds: Redisson's read-write locks,
// semaphores and fair locks keep other layouts, which lockwatch does not
// write), and none of the capabilities (capabilities.hpp: the scheduled
// jobs' claims, operators' inspect and force-release, in-process token
// blocks, Redlock's fence raising), which rest on lockwatch's own layout;
// the runtime answers a call that needs one with Unsupported naming it.
//
// Threading and costs: as the store it holds; one more virtual call a batch.
#pragma once

#include <memory>

#include "store/lock_store.hpp"

namespace lockwatch::detail {

class RedissonStore final : public LockStore {
 public:
  // The inner store's traits (key rules, release events, expiry), with
  // the kinds refused; no capabilities are offered.
  explicit RedissonStore(std::unique_ptr<LockStore> inner)
      : LockStore(redisson_traits(inner->traits())), inner_(std::move(inner)) {}

  // Why a kind is refused (null for exclusive locks).
  static const char* kind_problem(LockKind kind) noexcept;

  void start(StoreEvents events) override { inner_->start(std::move(events)); }
  void acquire(std::span<const LockRef> locks, AcquireDone done) override { inner_->acquire(locks, std::move(done)); }
  std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) override {
    return inner_->renew(locks, std::move(keepalive), std::move(done));
  }
  void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) override {
    inner_->release(locks, notify, std::move(done));
  }
  void subscribe(std::string_view name) override { inner_->subscribe(name); }
  void unsubscribe(std::string_view name) override { inner_->unsubscribe(name); }
  void poll_replies() override { inner_->poll_replies(); }
  void close() override { inner_->close(); }

 private:
  static StoreTraits redisson_traits(StoreTraits t) {
    t.no_shared = kind_problem(LockKind::shared());
    t.no_permits = kind_problem(LockKind::permits(2));
    t.no_fair = kind_problem(LockKind::fair());
    return t;
  }

  std::unique_ptr<LockStore> inner_;
};

inline const char* RedissonStore::kind_problem(LockKind kind) noexcept {
  if (kind.exclusive_kind()) return nullptr;
  switch (kind.mode()) {
    case LockKind::Mode::kShared:
      return "the redisson layout holds exclusive locks only (Redisson's RLock); Redisson's RReadWriteLock keeps "
             "each reader's lease in a key of its own, renewed by a script that rewrites them all, which "
             "lockwatch does not write: see docs/redisson.md";
    case LockKind::Mode::kFair:
      return "the redisson layout holds exclusive locks only (Redisson's RLock); Redisson's RFairLock queue is "
             "not written by lockwatch: see docs/redisson.md";
    default:
      return "the redisson layout holds exclusive locks only (Redisson's RLock); Redisson's semaphores keep "
             "another layout, which lockwatch does not write: see docs/redisson.md";
  }
}

}  // namespace lockwatch::detail
