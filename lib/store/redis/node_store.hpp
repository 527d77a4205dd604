// lib/store/redis/node_store.hpp: locks on one Redis master.
//
// Three connections: commands (acquire, release, operators' tools; pipelined
// from the whole runtime), renewals (so a renewal never queues behind a burst
// of acquisitions) and pub/sub (release notices for waiters). Each step is
// one Lua script (scripts.hpp); keys are named as keys.hpp says.
//
// Acquisitions and releases are batched: those asked for in one loop
// iteration go to the node as one script call each (at most kMaxBatch locks
// a call), written together just before the loop next polls. Nothing waits
// for a batch to fill; at most kMaxBatchesInFlight calls are unanswered at
// a time, the rest wait in the store. Releases go before acquisitions (a
// lock given back and taken again in one iteration is free for the taker,
// unless the release script met NOSCRIPT and went again as EVAL); other
// commands go out as they are made. A lone lock is a batch of one. On a
// node of a Redis Cluster (batch_by_slot()) a batch goes as one script call
// per slot group, all written together: a script's keys must share a slot,
// so the locks of one slot are taken (or released) by one atomic script.
// A call made right after send_asking() goes at once, alone: its ASKING
// must come right before its command.
//
// min_replicas (the URL's) and Sentinel, as a user sees them: docs/stores.md,
// "Sentinel". With min_replicas, acquisitions and their WAITs go on a fourth
// connection of their own (a WAIT blocks its connection). follow_sentinels()
// points every connection at the master its watcher learns, and each checks
// with ROLE that the address it was given is a master before it sends.
//
// Release notices are classic PUBLISH / SUBSCRIBE, or, for a node of a
// Redis Cluster (Notices::kSharded), SPUBLISH / SSUBSCRIBE on the node that
// serves the lock's slot; a subscription the node gives up (its slot moved)
// is reported through the dropped hook for the cluster to place elsewhere.
//
// In the redisson layout (layout.hpp) the acquire, renew
// and release calls run the kRedisson scripts instead, with the same
// batching, and notices are Redisson's channel and message.
//
// Threading: as LockStore (loop thread, but encode()/check_key()).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/small_string.hpp"
#include "core/turn_end.hpp"
#include "store/capabilities.hpp"
#include "store/redis/caller_line.hpp"
#include "store/redis/connection.hpp"
#include "store/redis/layout.hpp"
#include "store/store_base.hpp"
#include "store/store_settings.hpp"

namespace lockwatch::detail {

class Loop;
class SentinelWatcher;

class RedisNodeStore final : public RedisStoreBase, public DirectLane {
 public:
  enum class Notices : std::uint8_t { kClassic, kSharded };
  // `endpoint` with port 0: the address comes from follow_sentinels().
  RedisNodeStore(Loop& loop, Endpoint endpoint, const StoreSettings& settings, Notices notices = Notices::kClassic,
                 StoreLayout layout = {}, RedisReplicas replicas = {});
  ~RedisNodeStore() override;

  // Before start(): the master is wherever `watcher` says it is.
  void follow_sentinels(std::unique_ptr<SentinelWatcher> watcher);
  // Redis Cluster: the next call made (at once, on the loop) goes after an
  // ASKING on its connection, so that it runs on a slot this node is
  // importing (an ASK redirect).
  void send_asking() { asking_ = true; }
  // Before start(), for a store that is one node alone (not a Cluster's
  // or a quorum's, whose calls go through their own routing): exclusive
  // acquisitions and releases may be written by the calling thread (DirectLane), on
  // the command connection's direct lane; not with min_replicas (their
  // WAIT is a second request) nor Redisson's layout.
  void write_directly();
  // Open while the connection is idle, for a thread that does not call in
  // bursts (see the .cpp).
  bool lane_open_at(std::chrono::steady_clock::time_point now) const noexcept override;
  bool acquire_direct(const LockRef& lock, AcquiredDirect done) override;
  bool release_direct(const LockRef& lock, ReleasedDirect done) override;
  // On line_, while the lane is open: nothing of this process is then in
  // flight on the command connection that the call could overtake.
  bool acquire_blocking(const LockRef& lock, const AcquiredDirect& done) override;
  bool release_blocking(const LockRef& lock, const ReleasedDirect& done) override;
  // Before start(), for a node of a Redis Cluster: a batch goes as one
  // script call per slot group (a script's KEYS must share one slot).
  void batch_by_slot() { by_slot_ = true; }
  // raise_fence() with the reason it failed (null: raised), for a caller
  // that must tell a redirect from other failures.
  void raise_fence_or_error(std::string_view name, std::uint64_t fence, std::function<void(const StoreError*)> done);
  // Before start(), sharded notices: told when the node gave up the
  // subscription for lock `name` (`why`: Redis's error, e.g. a MOVED; null:
  // an unsolicited sunsubscribe); it is no longer wanted on this node.
  void set_dropped_hook(std::function<void(std::string_view name, const StoreError* why)> hook) {
    dropped_ = std::move(hook);
  }
  // Whether a call made now goes out at once on the command connection
  // (false while it is down or reconnecting).
  bool connected() const noexcept { return conn_->usable(); }

  // Acquisitions and releases batched per loop iteration on the command
  // connection (see above), renewals on their own; notices on the third.
  // Shared and permit locks (every kind is held) go one script call
  // each (kAcquireKind, kRenewKind, kReleaseKind; a call's renewals and
  // releases of them together), beside the exclusive batches.
  void acquire(std::span<const LockRef> locks, AcquireDone done) override;
  std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) override;
  void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) override;
  void close() override;
  void subscribe(std::string_view name) override;
  void unsubscribe(std::string_view name) override;
  void poll_replies() override { renew_->poll_replies(); }  // the renewal connection's
  // Capabilities, each one script call on the command connection.
  void raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) override;
  void server_time(TimeDone done) override;
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) override;
  void inspect(std::string_view name, InspectDone done) override;
  void force_release(std::string_view name, ForceDone done) override;
  // SCAN of the lock names under the prefix (pages of 1000), each page's
  // locks inspected in one pipelined round.
  void list_locks(std::string_view prefix, std::size_t limit, ListDone done) override;
  void reserve_tokens(const LockRef& lock, std::uint32_t n, ReserveDone done) override;
  // Fair locks: acquired by kAcquireFair (one call each), renewed and
  // released as the other kinds; a waiter that gives up, kWithdrawFair.
  void withdraw(const LockRef& lock, WithdrawDone done) override;

  static constexpr std::size_t kMaxBatch = 256;
  // Batch calls written and not answered yet, at most. More wait here, not
  // in Redis's input buffer, so that a burst of a million locks cannot keep
  // a reply past command_timeout (which would reset the connection and fail
  // everything in flight): 64 full calls are some 50 ms of Redis's time,
  // and 64 callers with a lock each never wait for one another.
  static constexpr int kMaxBatchesInFlight = 64;

 private:
  void started() override;
  // The release scripts' notice argument: "s" SPUBLISH, "p" PUBLISH.
  std::string notice() const;
  // A subscription refused or dropped for `why`: logged as a warning when
  // the user's ACL refused it.
  void refused_notices(const StoreError& why);
  // The `done` of one acquire() or release() call: a lone lock's (the
  // usual call) is kept in its queued lock, the locks of a larger call
  // share theirs; a lone lock costs no heap block for it.
  template <class Done>
  class CallDone {
   public:
    explicit CallDone(Done own) : own_(std::move(own)) {}
    explicit CallDone(std::shared_ptr<Done> shared) : shared_(std::move(shared)) {}
    // The call's `done`, shared by `n` locks: its own for one.
    static CallDone of(std::size_t n, Done& done) {
      return n > 1 ? CallDone(std::make_shared<Done>(std::move(done))) : CallDone(std::move(done));
    }
    template <class... A>
    void operator()(A&&... a) const {
      if (shared_)
        (*shared_)(std::forward<A>(a)...);
      else
        own_(std::forward<A>(a)...);
    }

   private:
    Done own_;
    std::shared_ptr<Done> shared_;
  };
  // Kept inline (core/small_string.hpp): a queued lock costs no heap block
  // for the usual name and token.
  struct QueuedAcquire {
    SmallString<40> name;
    SmallString<32> token;
    SmallString<16> ttl_ms;
    std::size_t index;
    CallDone<AcquireDone> done;
    LockKind kind{};
    bool waits = false;  // LockRef::waits
  };
  struct QueuedRelease {
    SmallString<40> name;
    SmallString<32> token;
    bool notify;  // the script publishes the release on the lock's channel
    std::size_t index;
    CallDone<ReleaseDone> done;
  };
  // The acquire script's answer for one lock, then WAIT for replicas when
  // asked (short of them, the lock is given back and the call fails).
  void acquired(Acquired out, QueuedAcquire a);
  // `a`'s lock given back on the acquisitions' connection, `answer` called
  // with the release's reply (a failed WAIT, or an acquisition with no answer).
  template <class Answer>
  void give_back_on_acquire_line(const QueuedAcquire& a, Answer answer);
  // A shared, permit or fair lock's kAcquireKind or kAcquireFair call
  // (send_batch() sends it alone).
  EvalRequest kind_acquire_call(const QueuedAcquire& a) const;
  // renew() without the wait for replicas (the URL's min_replicas) that
  // renew() adds after it.
  std::size_t renew_now(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done);
  // renew_now() of a batch with shared or permit leases in it.
  std::size_t renew_mixed(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done);
  // Shared and permit releases of one call: one kReleaseKind call on `c`.
  void send_kind_release(RedisConnection& c, std::span<const LockRef> locks, std::vector<std::size_t> indexes,
                         bool notify, CallDone<ReleaseDone> done);
  RedisConnection& for_acquire() { return acquire_ ? *acquire_ : *conn_; }
  // A tool's one script call on `on` (null: the command connection), after
  // an ASKING when asked for: answer(reply, err, endpoint) reads its reply
  // (scripts.hpp's readers) and answers the caller.
  template <class Answer>
  void eval_tool(EvalRequest request, Answer answer, RedisConnection* on = nullptr);
  // `f` for each connection, in this order (acquire_ only with min_replicas).
  template <class F>
  void each_connection(F f) {
    for (RedisConnection* c : {conn_.get(), renew_.get(), acquire_.get(), sub_.get()})
      if (c != nullptr) f(*c);
  }
  // `c`, after an ASKING when send_asking() asked for one.
  RedisConnection& with_asking(RedisConnection& c);
  // Sends what is queued, kMaxBatchesInFlight calls at most (`all`: every
  // call, as the store closes).
  void send_batches(bool all = false);
  // The first kMaxBatch requests of `queue`, taken out of it and sent as
  // one script call, or, batch_by_slot(), as one call per slot group;
  // returns the calls sent.
  template <class T>
  int send_queued(std::deque<T>& queue);
  // A batch's reply came: the next queued batch may go.
  void batch_answered();
  // One script call for `batch` (a lone lock is a batch of one, a kind's
  // lock always alone); `counted`: sent by send_batches(), and so counted
  // in flight.
  void send_batch(std::vector<QueuedAcquire> batch, bool counted = true);
  void send_batch(std::vector<QueuedRelease> batch, bool counted = true);
  // WAIT on `c` for `needed` replicas: `done` is told null once they have
  // what `c` wrote before, else why not (`c`'s error, or "the <what>
  // reached <acks> of the <needed> replicas required").
  void wait_replicas(RedisConnection& c, long long needed, std::string_view what,
                     std::function<void(const StoreError*)> done);

  // The layout's channel of lock `name`, and the lock a channel is for.
  std::string channel_of(std::string_view name) const;
  std::string_view lock_of(std::string_view channel) const;
  // The layout's acquire and release script calls for `locks` (a batch, or
  // a lone lock: queued, or a LockRef).
  template <class Locks>
  EvalRequest acquire_call(const Locks& locks) const;
  template <class Locks, class Notify>
  EvalRequest release_call(const Locks& locks, Notify notify) const;
  EvalRequest release_one(const LockRef& lock) const;
  // The caller's line may take a call on `lock` now.
  bool line_open_for(const LockRef& lock) const;
  struct Listing;
  void scan_page(std::shared_ptr<Listing> listing);

  const std::string key_prefix_;  // Options::runtime.key_prefix
  const std::chrono::milliseconds command_timeout_;
  const std::string owner_;  // Options::runtime.owner_name, recorded with each grant
  const Notices notices_;
  const StoreLayout layout_;
  const RedisReplicas replicas_;  // the URL's min_replicas and replica_ack_timeout
  std::function<void(std::string_view, const StoreError*)> dropped_;
  std::unique_ptr<RedisConnection> conn_;   // commands, pipelined
  std::unique_ptr<RedisConnection> renew_;  // renewals only
  std::unique_ptr<RedisConnection> sub_;    // release notices
  // The blocking callers' (DirectLane::acquire_blocking), for a plain TCP
  // endpoint given (not Sentinel's); used while the command connection's
  // lane (write_directly()) is open and idle.
  std::unique_ptr<CallerLine> line_;
  // With min_replicas: acquisitions and their WAITs, so that a WAIT holds
  // up nothing else (null without).
  std::unique_ptr<RedisConnection> acquire_;
  bool asking_ = false;  // send_asking(): the next call goes after an ASKING
  std::unique_ptr<SentinelWatcher> sentinel_;
  bool by_slot_ = false;  // batch_by_slot()
  // Sends the batches of this turn at its end, before the connections
  // flush (core/turn_end.hpp); before the store is started, the call
  // itself sends them.
  TurnEnd batch_turn_{[this] { send_batches(); }};
  std::deque<QueuedAcquire> acquire_batch_;
  std::deque<QueuedRelease> release_batch_;
  int batches_in_flight_ = 0;
  // The names whose notices the node confirmed it sends to sub_ (until an
  // unsubscribe, a drop or the connection going down): a release notice
  // that reached one subscriber there reached ours.
  std::set<std::string, std::less<>> listening_;
  // The release script's reply on the command connection for `locks` locks.
  ReleaseReply release_reply(const redisReply* r, const StoreError* err, std::size_t locks);
  // The next lock's answer in `reply` (`*why` as ReleaseReply::next's),
  // with what its notice reached: kYesUnheard when it reached no subscriber
  // of the node, or only our own.
  Released heard_by(std::string_view name, ReleaseReply& reply, const StoreError** why) const;
  void erase_listening(std::string_view name);
};

}  // namespace lockwatch::detail
