// lib/store/zookeeper/zk_store.hpp: locks on a ZooKeeper ensemble
// (zookeeper://host:port[,host:port...][/chroot]), with ZooKeeper's lock
// recipe on its asynchronous C client (libzookeeper_mt).
//
// A lock is a directory of ephemeral sequential nodes (zk_nodes.hpp); the
// session is the lease, one per ttl (zk_session.hpp). See docs/zookeeper.md.
//
// ZkStore is the LockStore the registry makes: it composes the parts
// (each file's role and costs: docs/how-it-works.md and the parts'
// headers) and the sweep that drives their timeouts, a twentieth of the
// shorter of the command and connect timeouts (5 to 50 ms). It keeps no
// state of its own beyond them.
//
// Threading: as LockStore (loop thread, but encode()/check_key()).
#pragma once

#include <uv.h>

#include "store/store_base.hpp"
#include "store/zookeeper/zk_claims.hpp"
#include "store/zookeeper/zk_lock_recipe.hpp"
#include "store/zookeeper/zk_operator_tools.hpp"
#include "store/zookeeper/zk_renewal.hpp"

namespace lockwatch::detail {

class ZkStore final : public StoreBase {
 public:
  ZkStore(Loop& loop, ZkTarget target, const StoreSettings& settings);

  // Every kind is taken (FairQueue: ZkRelease).
  void acquire(std::span<const LockRef> locks, AcquireDone done) override { recipe_.acquire(locks, std::move(done)); }
  std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) override {
    return renewal_.renew(locks, std::move(keepalive), std::move(done));
  }
  // `notify` changes nothing: every release wakes the holder's watchers
  // (zk_release.hpp).
  void release(std::span<const LockRef> locks, bool, ReleaseDone done) override {
    release_.release(locks, std::move(done));
  }
  void close() override;
  void subscribe(std::string_view name) override { sessions_.subscribe(name); }
  void unsubscribe(std::string_view name) override { sessions_.unsubscribe(name); }

 private:
  void started() override;
  static void on_sweep(uv_timer_t* t);

  const StoreSettings settings_;  // its parts read them by reference
  ZkSessions sessions_;
  ZkRelease release_;
  ZkLockRecipe recipe_;
  ZkRenewal renewal_;
  ZkClaims claims_;
  ZkOperatorTools tools_;
  uv_timer_t sweep_{};
  Loop& loop_;
};

}  // namespace lockwatch::detail
