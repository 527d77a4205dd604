// lib/store/redis/cluster_store.hpp: locks on a Redis Cluster. The URL, the
// slot map's sources and schedule, redirects, lost replies and sharded
// release notices, as a user sees them: docs/stores.md, "Redis Cluster".
//
// Topology. The map is read on the loop through a connection of its own to
// a known master or a seed, one refresh in flight at a time (throttled to
// kRefreshThrottle, and every kRefreshInterval). Requests made before the
// first map is known wait for it, at most connect_timeout, then fail as
// unavailable naming the seeds.
//
// Routing. Every lock lives in the slot of `P{K}`. Each master gets one
// RedisNodeStore (its command, renewal and sharded pub/sub connections),
// made when the map first names it and kept after. Acquisitions and
// releases are routed one by one; each master's node store batches what
// reaches it in one loop iteration by slot (batch_by_slot(): a script's
// KEYS must share one slot). Renewals are grouped by slot here, one call
// per group, all queued in one iteration; a failure on one node or slot
// answers only its own leases (kTransient, retried by the watchdog).
//
// Redirects. Each call has a budget of kRedirectBudget hops. A MOVED also
// puts the slot on the node named in our map until the refresh. A slot
// group's call answered so answers each of its locks, each with its own
// hop count: after a MOVED (at once) or a TRYAGAIN (after the refresh)
// they are sent on in one loop iteration, so they reach the next node's
// batch together; after an ASK each goes alone, right after its ASKING. A
// renewal group answered MOVED or ASK is sent on at once, as one call.
//
// Lost replies. An acquire, release, inspect or withdraw that went out on
// a live connection and failed with a connection error is sent once more
// after the next refresh (Call::idempotent); one that waited for a
// connection that never came did not run and is reported at once.
//
// Notices. A waiter's subscription is placed on the pub/sub connection of
// the master that serves its slot now, reported `subscribed` only once that
// node confirms it, and placed again when the node gives it up or a
// refreshed map moves the slot; `subscriptions_lost` is reported whenever
// one is gone.
//
// Threading: as LockStore (loop thread, but encode()/check_key()).
// Costs: one array of 16384 node indexes; per batch, one sort to group.
#pragma once

#include <uv.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockwatch/options.hpp"
#include "store/capabilities.hpp"
#include "store/redis/cluster_slot.hpp"
#include "store/redis/layout.hpp"
#include "store/store_base.hpp"
#include "store/store_settings.hpp"

struct redisReply;  // hiredis

namespace lockwatch::detail {

class Loop;
class RedisConnection;
class RedisNodeStore;

// What a redis-cluster:// or rediss-cluster:// URL names.
struct ClusterSeeds {
  std::vector<Endpoint> seeds;  // with the URL's credentials (and TLS) each
  // Throws InvalidArgument naming what is wrong.
  static ClusterSeeds parse(const std::string& url);
  // "host:port,host:port" for error messages.
  std::string names() const;
};

class ClusterStore final : public RedisStoreBase {
 public:
  static constexpr int kRedirectBudget = 5;
  static constexpr std::chrono::milliseconds kRefreshInterval{5000};
  static constexpr std::chrono::milliseconds kRefreshThrottle{100};

  // `layout`: every node's (layout.hpp), one client id for them all.
  ClusterStore(Loop& loop, ClusterSeeds seeds, const StoreSettings& settings, StoreLayout layout = {},
               RedisReplicas replicas = {});
  ~ClusterStore() override;

  // Each lock routed to its slot's master (once the map is known), and
  // followed across MOVED and ASK.
  // Every kind: a lock's keys (lock, holders, writer mark, counter) share
  // its hash tag, so one slot, and its node's scripts keep them.
  void acquire(std::span<const LockRef> locks, AcquireDone done) override;
  std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) override;
  void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) override;
  void close() override;
  void poll_replies() override;  // every node's
  // Notices are sharded: SSUBSCRIBE on the node of each name's slot.
  void subscribe(std::string_view name) override;
  void unsubscribe(std::string_view name) override;
  // Capabilities, on the node of the name's slot (TIME: any node).
  void raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) override;
  void server_time(TimeDone done) override;
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) override;
  void inspect(std::string_view name, InspectDone done) override;
  void force_release(std::string_view name, ForceDone done) override;
  // Every master's SCAN (each node store's listing), merged by key.
  void list_locks(std::string_view prefix, std::size_t limit, ListDone done) override;
  void reserve_tokens(const LockRef& lock, std::uint32_t n, ReserveDone done) override;
  // A fair waiter leaves its lock's queue, on the slot's node (its keys
  // share the lock's hash tag); redirects followed as for the others.
  void withdraw(const LockRef& lock, WithdrawDone done) override;

 private:
  void started() override;
  struct Node;
  struct Call;
  // Runs `fn` once the map is known (at once if it is), or with an error
  // when it could not be had within connect_timeout.
  using MapWaiter = std::function<void(const StoreError*)>;
  void when_mapped(MapWaiter fn);
  void request_refresh();
  void start_refresh();
  // Asks candidate `candidate` for CLUSTER SHARDS (`slots`: CLUSTER SLOTS,
  // for a server without SHARDS), the next candidate when it cannot tell.
  void refresh_from(std::size_t candidate, bool slots = false);
  void refresh_failed(const std::string& why);
  void refresh_done();
  // Answers what waits for the next refresh, and (`map_waiters`) for the
  // first map, with `err` (null: the map is known).
  void answer_waiters(const StoreError* err, bool map_waiters);
  // The map a CLUSTER SHARDS (or SLOTS) array reply gives, into `next`;
  // false for a reply that cannot be read.
  bool read_shards(const ::redisReply* r, std::array<std::int16_t, kClusterSlots>& next);
  bool read_slots(const ::redisReply* r, std::array<std::int16_t, kClusterSlots>& next);
  void expire_waiters();
  // The events node `node`'s store reports through: ours, a lost
  // connection asks for a refresh (the node may have failed over), and a
  // subscription is confirmed only by the node it is placed on now.
  StoreEvents node_events(Node* node);
  // Node `node` gave up the subscription for `name` (its slot moved, or its
  // SSUBSCRIBE was answered `why`, e.g. MOVED): placed again, at the node a
  // MOVED names or at the slot's owner after the next refresh.
  void subscription_dropped(Node* node, std::string_view name, const StoreError* why);
  // After a refresh: each subscription on the master that serves its slot
  // now (moved ones are reported lost until confirmed again).
  void place_subscriptions();
  // The node store for the master at host:port, made (and started) on first use.
  Node* node_at(const std::string& host, int port);
  // The master of slot `slot` (key_slot() of a lock's name); null when no
  // node serves it.
  Node* owner_of(std::uint16_t slot);
  // The one way a call reaches a node: a call on lock `name` (`idempotent`:
  // see Call) goes to the master of its slot once the map is known, where
  // `send(node, name, reply)` makes it (std::invoke: a RedisNodeStore
  // member, or a function); the error error_in() finds in what `reply` is
  // told is followed (follow()), and what is not followed answers `done`. A
  // call that finds no map or no master, or gives up, answers `done` as
  // failed() says.
  template <class Done, class Send>
  void route(std::string_view name, bool idempotent, Done done, Send send);
  // `call` to `node` (after an ASKING there if `asking`); returns the
  // script calls sent.
  std::size_t send_to(Node* node, bool asking, const std::shared_ptr<Call>& call);
  // What a failed call's error asks for, by its kind. True: the call was
  // sent on (a redirect, a "retry later" retried after the next refresh,
  // or a call whose reply was lost resent once) and the caller reports
  // nothing now; should the retry find no owner, `give_up` reports the
  // failure. False: the caller reports it (a refusal, or the hop budget is
  // spent); an unreachable node also asks for a refresh.
  bool follow(const std::shared_ptr<Call>& call, const StoreError& error, std::function<void()> give_up);
  // One slot group of a renewal batch: its locks (views that the batch's
  // keepalive, holding the leases, keeps valid) and their indexes in it.
  struct RenewGroup {
    std::vector<std::size_t> indexes;
    std::vector<LockRef> refs;
  };
  // The call that renews group `g` as one script call, `hops` redirects
  // from its first; a MOVED or ASK answering its locks sends them on
  // together, at once, as one call (follow()).
  std::shared_ptr<Call> renew_call(std::shared_ptr<const RenewGroup> g, int hops,
                                   std::shared_ptr<const void> keepalive, std::shared_ptr<RenewDone> done);

  static void on_refresh_timer(uv_timer_t* t);
  static void on_wait_timer(uv_timer_t* t);

  Loop& loop_;
  const ClusterSeeds seeds_;
  const StoreSettings settings_;  // each node store is made with them
  const StoreLayout layout_;
  const RedisReplicas replicas_;  // each master's, from the URL
  bool started_ = false;
  bool closed_ = false;

  std::vector<std::unique_ptr<Node>> nodes_;
  std::array<std::int16_t, kClusterSlots> owner_{};  // node index, -1: not served
  bool mapped_ = false;
  std::string last_refresh_error_;
  std::string logged_refresh_error_;
  std::optional<StoreError> refresh_auth_error_;  // a node refused the credentials

  std::unique_ptr<RedisConnection> topo_;  // CLUSTER SHARDS / SLOTS
  bool refreshing_ = false;
  bool refresh_again_ = false;
  std::vector<Endpoint> candidates_;  // of the refresh in flight
  std::chrono::steady_clock::time_point last_refresh_{};
  uv_timer_t refresh_timer_{};
  uv_timer_t wait_timer_{};

  struct Waiting {
    std::chrono::steady_clock::time_point deadline;
    MapWaiter fn;
  };
  std::vector<Waiting> map_waiters_;   // until the first map
  std::vector<MapWaiter> refresh_waiters_;  // until the next refresh ends
  struct Subscription {
    Node* node = nullptr;  // where it is placed; null: to be placed after a refresh
    int hops = 0;          // MOVED followed since the last confirmation
  };
  std::map<std::string, Subscription, std::less<>> subscribed_;  // by lock name
};

}  // namespace lockwatch::detail
