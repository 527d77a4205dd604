// lib/store/zookeeper/zk_store.hpp: locks on a ZooKeeper ensemble
// (zookeeper://host:port[,host:port...][/chroot]), with ZooKeeper's lock
// recipe on its asynchronous C client (libzookeeper_mt).
//
// A lock of name N is a directory /lockwatch/<N escaped> (persistent, made
// on first use and left in place) of ephemeral sequential nodes
// lock-<owner token>.<attempt>-<sequence>, each holding its owner token
// and ttl. The lowest sequence holds the lock. The session is the lease:
// one session per ttl, whose timeout is the ttl. See docs/zookeeper.md.
//
// ZkStore is the LockStore the registry makes; it composes parts with one
// role each, every one using only those below it:
//   ZkSessions       (zk_session, zk_client) sessions per ttl, the
//                    transport to the C client, connect and expiry, the
//                    nodes held on each session, release notices
//   ZkRelease        (zk_release) releases, withdrawals, the cleanups of
//                    nodes whose removal found no answer, the give-up
//                    machine for an unconfirmed release
//   ZkLockRecipe     (zk_lock_recipe) acquisitions: the recipe, the kinds,
//                    the fair queue, the fencing tokens
//   ZkRenewal        (zk_renewal) renewals, and the store's own expiry of
//                    what it holds
//   ZkClaims         (zk_claims) scheduled jobs' claims (JobClaims)
//   ZkOperatorTools  (zk_operator_tools) inspection, forced release,
//                    listing (OperatorTools, LockListing)
// and how a lock lies on the ensemble is zk_nodes. Each part's header
// says its share of the design. ZkStore owns the parts and the sweep
// that drives their timeouts; it keeps no state of its own beyond them.
//
// Costs: one session (two client threads) per distinct ttl; an acquisition
// three round trips (create, list, the fence; four when busy, a busy
// permit n + 3), a release two, renewals one request per session and 256
// locks; a sweep every 5 to 50 ms (a twentieth of the shorter of the
// command and connect timeouts).
//
// Threading: as LockStore (loop thread, but encode()/check_key()).
#pragma once

#include <uv.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "lockwatch/options.hpp"
#include "store/capabilities.hpp"
#include "store/store_base.hpp"
#include "store/store_settings.hpp"
#include "store/zookeeper/zk_claims.hpp"
#include "store/zookeeper/zk_lock_recipe.hpp"
#include "store/zookeeper/zk_nodes.hpp"
#include "store/zookeeper/zk_operator_tools.hpp"
#include "store/zookeeper/zk_release.hpp"
#include "store/zookeeper/zk_renewal.hpp"
#include "store/zookeeper/zk_session.hpp"
#include "store/zookeeper/zk_target.hpp"

namespace lockwatch::detail {

class Loop;

class ZkStore final : public StoreBase, public JobClaims, public OperatorTools, public LockListing, public FairQueue {
 public:
  // The longest lock name (key_prefix + key), in bytes; escaped, a node
  // name is at most three times as long.
  static constexpr std::size_t kMaxNameBytes = zk::kMaxNameBytes;
  // Where every lock's directory lives (under the URL's chroot).
  static constexpr const char* kRoot = zk::kRoot;

  ZkStore(Loop& loop, ZkTarget target, const StoreSettings& settings);
  ~ZkStore() override;

  // Any thread. InvalidArgument if the options do not suit this store.
  static void check_options(const ZkTarget& target, const Options& options);
  // A name or token as node-name text: letters, digits and "_:-=" as
  // they are, any other byte as %XX.
  static std::string escape(std::string_view bytes) { return zk::escape(bytes); }

  // LockStore: ZkLockRecipe acquires, ZkRenewal renews, ZkRelease
  // releases, ZkSessions reports release notices.
  void acquire(std::span<const LockRef> locks, AcquireDone done) override;
  std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) override;
  void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) override;
  void close() override;
  void subscribe(std::string_view name) override;
  void unsubscribe(std::string_view name) override;
  // Exclusive, shared (a read-write lock), permits and fair: every kind.
  // FairQueue: a waiter that gives up deletes its node (the next one's
  // watch fires: its notice).
  void withdraw(const LockRef& lock, WithdrawDone done) override;
  // JobClaims (ZkClaims): the ensemble's clock, and a job's last period in
  // its lock's directory.
  void server_time(TimeDone done) override;
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) override;
  // OperatorTools, LockListing (ZkOperatorTools).
  void inspect(std::string_view name, InspectDone done) override;
  void force_release(std::string_view name, ForceDone done) override;
  void list_locks(std::string_view prefix, std::size_t limit, ListDone done) override;

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
  bool started_ = false;
};

}  // namespace lockwatch::detail
