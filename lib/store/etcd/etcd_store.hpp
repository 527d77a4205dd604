// lib/store/etcd/etcd_store.hpp: locks in an etcd cluster
// (etcd://host:port[,host:port...]), over etcd's v3 API (EtcdClient).
//
// A lock is a key (key_prefix + key) bound to an etcd lease of its own;
// the key's value is the owner token, a line break and the owner record
// ("<grant time, unix ms on the members' clock> <owner name>"): "ours"
// is a value that starts with our token and the line break (two compares
// in a transaction: above "<token>\n", below "<token>\v"). Each step:
//   acquire  LeaseGrant(the ttl, in whole seconds, rounded up), then one
//            transaction: if the key's create_revision is 0 (absent), Put
//            it with the token and the lease; else, in a nested
//            transaction, if its value is our token (a repeated request),
//            Range it and Put it again on the new lease (a Put keeps the
//            create_revision: the same acquisition, its fence, the new
//            ttl; the old lease is revoked), else Range it. Created: the
//            fencing token is the transaction's revision, which is the
//            key's create_revision. Held by another: busy for what its
//            lease has left (LeaseTimeToLive). A lease not used is
//            revoked.
//   renew    one LeaseKeepAlive stream per batch: every lease of the
//            tick's renewals written, each answer read; a lease answered
//            with a ttl <= 0 is gone (the key went with it).
//   release  a transaction: if the key's value is our token, DeleteRange
//            it, else Range it (gone, or another owner's); then the lease
//            is revoked. A first attempt without an answer within the
//            command timeout (a hung member) is made once more, on the
//            next member; the key then found gone (or another owner's)
//            is ours released. Still no answer: unconfirmed, and as a
//            new leader renews every lease (and none expires while there
//            is no leader), the runtime reports it to the caller as a lost
//            lease (expiry_bounded() is false), never as released; the
//            lease is revoked meanwhile, a few times if need be.
//
// The fencing token is the key's create_revision: etcd's revision counter
// is the cluster's, raised by every write and agreed by Raft, so a later
// acquisition of any key has a higher one.
//
// Release notices: a Watch on each waited-for key (deletions only), so a
// release wakes those waiting for that key only. release_events() is true.
// `subscribed` is reported when etcd confirms the watch; a watch whose
// stream ends reports `subscriptions_lost`, and the next subscribe()
// watches again.
//
// Connection events: a member that stops answering (a call to it got no
// answer) is reported down, and up when a call to it is answered again.
//
// Capabilities: OperatorTools (inspect: Range and LeaseTimeToLive;
// force_release: a transaction deleting the key if unchanged, then its
// lease revoked, so the holder's next renewal finds it gone). JobClaims:
//   server_time   the members' clock (EtcdClock: etcd's v3 API has none,
//                 so it is read from the Date headers of the members'
//                 HTTP answers, finer than their whole seconds, and kept
//                 as an offset; measured once when the store starts)
//   claim_period  the clock estimate must have reached the period's
//                 start (else kNotDue); then the job's period key
//                 (period_key(): the lock's name + ":period", the last
//                 period run, in decimal, on no lease) is read, and one
//                 transaction puts the period if the lock's key still
//                 holds our token and the period key's mod_revision is
//                 the one read (0: absent). Refused: the lock's key not
//                 ours is kNotLeader; else the period key moved, read
//                 again (a period >= ours: kAlreadyRun). At most once per
//                 period rests on that transaction alone, not on clocks.
// No FenceRaising: the revision is the cluster's, not a counter per name.
//
// Threading: as LockStore (loop thread, but encode()/check_key()). The
// destructor runs off the loop thread, after close().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "lockwatch/options.hpp"
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
  ~EtcdStore() override;

  // Any thread. InvalidArgument if the options do not suit this store.
  static void check_options(const EtcdTarget& target, const Options& options);
  // The ttl of a lock's lease: whole seconds, rounded up, at least one
  // (etcd raises it further to its own minimum).
  static std::int64_t lease_seconds(std::chrono::milliseconds ttl) noexcept;

  // Exclusive locks only (no FairQueue). Its traits: a lock may live its
  // lease's whole seconds plus kExpirySlack (expiry_bound()), and, since a
  // new leader renews every lease, past any bound (expiry_bounded() false:
  // an unconfirmed release is never counted done).
  void acquire(std::span<const LockRef> locks, AcquireDone done) override;
  std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) override;
  void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) override;
  void close() override;
  void subscribe(std::string_view name) override;
  void unsubscribe(std::string_view name) override;
  void inspect(std::string_view name, InspectDone done) override;
  void force_release(std::string_view name, ForceDone done) override;
  // A Range over the names under the prefix (pages, in key order), keys
  // on a lease only (a job's period key is on none), each lease's ttl asked.
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
  void busy(std::int64_t holder_lease, std::chrono::milliseconds ttl, AcquireOne done);
  // Revokes `lease` (0: none), trying again on no answer, `attempts_left` times in all.
  void revoke(std::int64_t lease, int attempts_left = 3);
  void force_release_attempt(std::string name, int attempt, ForceDone done);
  struct Releasing;
  void release_attempt(std::shared_ptr<Releasing> r);
  struct Claim;
  void claim_step(std::shared_ptr<Claim> c);
  struct Listing;
  void list_page(std::shared_ptr<Listing> listing);
  // What a lock of ours holds: the token and the owner record, now.
  std::string value_of(std::string_view token) const;
  // A lock's LockInfo from its key (held), the lease's ttl left to fill.
  LockInfo info_of(const mvccpb::KeyValue& kv) const;

  // Our lease for each name we hold, with the token it was taken with.
  struct Held {
    std::string token;
    std::int64_t lease = 0;
  };
  struct Watched {
    std::shared_ptr<EtcdClient::Watch> watch;
    std::uint64_t id = 0;  // tells a watch from a later one of the same name
    bool created = false;  // etcd confirmed it
  };
  // The watch of `name` numbered `id`, if it is still the one (and the
  // store open).
  Watched* watched(const std::string& name, std::uint64_t id);

  Loop& loop_;
  std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<EtcdClock> clock_;
  const std::string owner_;  // Options::runtime.owner_name, in each lock's value
  std::map<std::string, Held, std::less<>> held_;
  std::map<std::string, Watched, std::less<>> watched_;
  std::uint64_t next_watch_ = 1;
  bool closed_ = false;
};

}  // namespace lockwatch::detail
