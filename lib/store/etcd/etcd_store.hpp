// lib/store/etcd/etcd_store.hpp: locks in an etcd cluster
// (etcd://host:port[,host:port...]), over etcd's v3 API (EtcdClient).
//
// A lock is a key (key_prefix + key) bound to an etcd lease of its own;
// its value is the owner token, a line break and the owner record, and
// "ours" is a value that starts with our token and the line break (two
// compares in a transaction). Its fencing token is the key's
// create_revision. What each call sends, and why a release left
// unanswered is never counted done: docs/etcd.md ("How a lock is kept",
// "The fencing token", "Scheduled jobs").
//
// `subscribed` is reported when etcd confirms the watch; a watch whose
// stream ends reports `subscriptions_lost`, and the next subscribe()
// watches again. No FenceRaising: the revision is the cluster's, not a
// counter per name.
//
// Threading: as LockStore (loop thread, but encode()/check_key()). The
// destructor runs off the loop thread, after close().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "store/capabilities.hpp"
#include "store/etcd/etcd_client.hpp"
#include "store/etcd/etcd_clock.hpp"
#include "store/etcd/etcd_target.hpp"
#include "store/store_base.hpp"
#include "store/store_settings.hpp"

namespace lockwatch::detail {

class Loop;

class EtcdStore final : public StoreBase, public JobClaims, public OperatorTools, public LockListing {
 public:
  // The longest lock name (prefix + key) taken: a transaction names it
  // six times, and etcd refuses requests over 1.5 MiB by default.
  static constexpr std::size_t kMaxNameBytes = 32 * 1024;
  // How much longer than its granted ttl a lease may live on the server:
  // etcd looks for expired leases twice a second, and a new leader gives
  // every lease an election timeout more (one second by default).
  static constexpr std::chrono::milliseconds kExpirySlack{2000};

  EtcdStore(Loop& loop, EtcdTarget target, const StoreSettings& settings);

  // The ttl of a lock's lease: whole seconds, rounded up, at least one
  // (etcd raises it further to its own minimum).
  static std::int64_t lease_seconds(std::chrono::milliseconds ttl) noexcept;

  // Exclusive locks only (no FairQueue). A lock may live its lease's
  // whole seconds plus kExpirySlack, and, since a new leader renews every
  // lease, past any bound (an unconfirmed release is never counted done).
  void acquire(std::span<const LockRef> locks, AcquireDone done) override;
  std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) override;
  void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) override;
  void close() override;
  void subscribe(std::string_view name) override;
  void unsubscribe(std::string_view name) override;
  void inspect(std::string_view name, InspectDone done) override;
  void force_release(std::string_view name, ForceDone done) override;
  // Keys on a lease only (a job's period key is on none).
  void list_locks(std::string_view prefix, std::size_t limit, ListDone done) override;
  void server_time(TimeDone done) override;
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) override;

  // The key of the last period run of the job whose lock is `name`.
  static std::string period_key(std::string_view name) { return std::string(name) + ":period"; }

 private:
  void started() override;
  using AcquireOne = std::function<void(const Acquired&)>;
  void acquire_one(std::string name, std::string token, std::chrono::milliseconds ttl, AcquireOne done);
  // Revokes `lease` (0: none), trying again on no answer, `attempts_left` times in all.
  void revoke(std::int64_t lease, int attempts_left = 3);
  void force_release_attempt(std::string name, int attempt, ForceDone done);
  struct Releasing;
  void release_attempt(std::shared_ptr<Releasing> r);
  void claim_step(std::shared_ptr<StoreClaim> c);
  struct Listing;
  void list_page(std::shared_ptr<Listing> listing);
  // The token and the owner record, now.
  std::string value_of(std::string_view token) const;
  // A lock's LockInfo from its key (held), the lease's ttl left to fill.
  LockInfo info_of(const mvccpb::KeyValue& kv) const;

  struct Held {
    std::string token;
    std::int64_t lease = 0;
  };
  struct Watched {
    std::shared_ptr<EtcdClient::Watch> watch;
    bool created = false;  // etcd confirmed it
  };
  // The watch of `name`, if it is still `watch` and the store open.
  Watched* watched(const std::string& name, const EtcdClient::Watch* watch);

  Loop& loop_;
  std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<EtcdClock> clock_;
  const std::string owner_;  // Options::runtime.owner_name, in each lock's value
  std::map<std::string, Held, std::less<>> held_;
  std::map<std::string, Watched, std::less<>> watched_;
  bool closed_ = false;
};

}  // namespace lockwatch::detail
