// lib/store/zookeeper/zk_store.hpp: locks on a ZooKeeper ensemble
// (zookeeper://host:port[,host:port...][/chroot]), with ZooKeeper's lock
// recipe on its asynchronous C client (libzookeeper_mt).
//
// A lock of name N is a directory /lockwatch/<N escaped> (persistent, made
// on first use and left in place) of ephemeral sequential nodes
// lock-<owner token>.<attempt>-<sequence>, each holding its owner token
// and ttl. The lowest sequence holds the lock:
//   acquire  creates our node, lists the directory: ours the lowest, the
//            lock is ours and its fencing token is our node's creation
//            zxid (czxid: strictly rising, as holders follow creation
//            order); otherwise our node is deleted (confirmed before the
//            answer, so that no forgotten node can come to hold the lock)
//            and the holder's node is read with a watch, whose firing is
//            the release notice. A repeat with the same token finds the
//            node it made: the same acquisition, the same fence.
//   renew    one multi of check operations per session and batch: answered
//            means the session is alive and the nodes are there.
//   expiry   a lock neither renewed nor released within its ttl (plus the
//            drift allowance) since the last renewal confirmed is removed
//            by the store itself, as a key with a ttl would expire: a
//            lease its watchdog gave up on (renewals spent, or unconfirmed
//            until its deadline) frees the lock although the session lives
//            on. Its watchdog's deadline came earlier (sent + ttl - drift);
//            a renewal answered after the removal reports the lock gone.
//   release  deletes every node of our token (found by the token in their
//            names: the held one, and any an earlier attempt whose answer
//            was lost made late). A release that could not be confirmed
//            ends the session that may hold the node (a node lives as long
//            as its session, and the runtime takes an unconfirmed lock for
//            gone after its ttl), looks for the node from another session
//            until that session's timeout has passed, and is answered
//            released when it finds the node gone (it went with the
//            session ended here, or with one the ensemble expired, never
//            before the lease's deadline), unconfirmed otherwise.
//   kinds    a node's name carries its kind after the attempt (".r" a
//            reader, ".p<n>" a permit of n, none a writer): a writer
//            holds as the lowest, a reader with no writer's node below,
//            a permit among the n lowest; a node below of the other
//            family (or another n) is InvalidArgument. A writer behind
//            readers only keeps its node while it waits (a mark that
//            stops later readers), removed by the store unless it tries
//            again within 2 s. A fair lock's node ("f") is its place in
//            the queue: the lowest holds; a waiter's node stays while it
//            tries again within its ttl, and goes with its session, when
//            it gives up (withdraw) or its span passes. Tokens: a writer's
//            (and a fair holder's) czxid, written to the
//            directory's `fence` node before its answer; a reader gets
//            that value (the last writer's); a permit the zxid of its
//            grant's write to `fence`. See docs/zookeeper.md.
//   claims   (JobClaims) the ensemble's clock is the mtime a write to
//            /lockwatch gets; a job's last period is the node `period` in
//            its lock's directory, set by a multi that checks our lock's
//            node and the version read.
//
// The session is the lease. Its timeout is the ttl: one session per ttl,
// made at the first lock of that ttl. The ensemble deletes a session's
// nodes when it has not heard from it for the session timeout; a renewal
// is confirmed only by an answer from the ensemble, sent after the
// renewal was, so the watchdog's local deadline (the renewal's send time
// + ttl - drift) comes before the ensemble can expire the session and
// give the lock to another. A session that reconnects within its timeout
// keeps its nodes and watches; an expired one loses them all (renewals
// answer kGone, subscriptions_lost is reported) and the next lock of that
// ttl makes a new session. The ensemble bounds the timeout (by default
// 2 to 20 ticks): a ttl above its maximum is refused (InvalidArgument)
// when the session is set up, a ttl below its minimum gets the minimum (a
// dead holder's lock then lasts that long).
//
// The client calls back on its own threads: every answer goes to the loop
// through Loop::post (Sink), where the store's state lives; a request
// unanswered after the command timeout (the connect timeout while a
// session was never up) fails as unavailable. Requests wait for their
// session to connect before they go to the client, which fails what it
// queued at every connection attempt that fails. zookeeper_init() looks
// host names up on the calling (loop) thread; numeric addresses cost
// nothing. zookeeper_close() blocks: handles close on a thread of the
// store's own.
//
// Costs: one session (two client threads) per distinct ttl; an acquisition
// three round trips (create, list, the fence; four when busy, a busy
// permit n + 3), a release two, renewals one request per session and 256
// locks.
//
// Threading: as LockStore (loop thread, but encode()/check_key()).
#pragma once

#include <uv.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/backoff.hpp"
#include "lockwatch/options.hpp"
#include "store/capabilities.hpp"
#include "store/store_base.hpp"
#include "store/zookeeper/zk_target.hpp"

typedef struct _zhandle zhandle_t;

namespace lockwatch::detail {

class Loop;

class ZkStore final : public StoreBase, public JobClaims, public OperatorTools, public LockListing, public FairQueue {
 public:
  // The longest lock name (key_prefix + key), in bytes; escaped, a node
  // name is at most three times as long.
  static constexpr std::size_t kMaxNameBytes = 255;
  // Where every lock's directory lives (under the URL's chroot).
  static constexpr const char* kRoot = "/lockwatch";

  ZkStore(Loop& loop, ZkTarget target, const Options& options);
  ~ZkStore() override;

  // Any thread. InvalidArgument if the options do not suit this store.
  static void check_options(const ZkTarget& target, const Options& options);
  // A name or token as node-name text: letters, digits and "_:-=" as
  // they are, any other byte as %XX.
  static std::string escape(std::string_view bytes);

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
  // JobClaims: the store's clock is the ensemble's, read as the mtime a
  // write to /lockwatch gets (the leader's clock when it ran it); a job's
  // last period is the data of a persistent node `period` in its lock's
  // directory, set by one multi that also checks our lock's node is there
  // (and the version read, so that two claims cannot both pass).
  void server_time(TimeDone done) override;
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) override;
  // OperatorTools: the holder is the lowest node (a shared lock's, the
  // readers below the first writer's node; permits(n)'s, the n lowest),
  // each with the owner name in its data and its ctime as the grant time;
  // a lock not held reports fencing token 0 (the ensemble keeps no counter
  // apart from the nodes).
  void inspect(std::string_view name, InspectDone done) override;
  void force_release(std::string_view name, ForceDone done) override;
  // LockListing: the children of /lockwatch under the prefix, in order,
  // inspected a window at a time until `limit` held ones are found.
  void list_locks(std::string_view prefix, std::size_t limit, ListDone done) override;

  struct Result;  // a ZooKeeper answer, copied off the client's thread
  struct Sink;    // how the client's threads reach the loop
  // On the loop, from what the client's threads post: a request's answer,
  // a session's state, a watch that fired.
  void complete(std::uint64_t id, const Result& r);
  void on_session_state(std::uint64_t serial, int state);
  void on_watch(int type, const std::string& path);

 private:
  using Clock = std::chrono::steady_clock;
  using Reply = std::function<void(const Result&)>;
  struct Session;
  struct AcquireOp;
  struct Listing;
  void list_window(std::shared_ptr<Listing> listing);
  // Reads the holders' nodes of `dir` (`nodes`, in order) into a LockInfo.
  void read_holders(std::uint64_t serial, const std::string& dir, std::vector<std::string> nodes, InspectDone done);
  struct Held {
    std::string path;
    std::uint64_t session = 0;  // Session::serial
    std::int64_t czxid = 0;
    std::uint64_t attempt = 0;
    std::chrono::milliseconds ttl{0};
    // The last acquisition or renewal confirmed, sent + ttl + drift: past
    // it the store removes the node itself (see above).
    Clock::time_point expires;
    std::uint64_t fence = 0;  // the token its grant answered (a repeat answers it again)
  };
  // A writer's node kept while it waits for readers (see above): removed
  // by the store at `until` unless an attempt of the same acquisition came.
  struct Mark {
    std::string path;
    std::uint64_t session = 0;
    std::int64_t czxid = 0;
    std::uint64_t attempt = 0;
    Clock::time_point until;
  };
  // Nodes to remove: of `token` under `name`, of one attempt (0: all), on
  // one session (0: any).
  struct Cleanup {
    std::string name;
    std::string token;
    std::uint64_t attempt = 0;
    std::uint64_t session = 0;
  };
  using Issue = std::function<int(zhandle_t*, void*)>;
  struct Pending {
    Clock::time_point deadline;
    Reply reply;
    // A read's call, made again when its connection is lost (see send_read):
    // on `session` once it has connected again (`connects` counts that).
    Issue again;
    std::uint64_t session = 0;
    std::uint32_t connects = 0;
  };

  void started() override;
  Session* session_for(std::chrono::milliseconds ttl);
  Session* any_session();
  Session* live(std::uint64_t serial);
  void retire(Session* s);
  // Sends one request on `s` (issue() makes the call with the context it
  // is given); `reply` runs once on the loop, with the answer or a
  // failure (ZOPERATIONTIMEOUT: no answer within the bound).
  void send(Session& s, Reply reply, Issue issue);
  // As send(), for a read (a listing, a node's data): one whose answer is
  // lost with its connection (ZCONNECTIONLOSS) is asked again on the same
  // session once it connects again, within the same bound. The session,
  // and so its nodes, outlived the connection; a write is not sent again
  // (it may have been applied).
  void send_read(Session& s, Reply reply, Issue issue);
  // A renewal's check of one held node: renew() sends them by session, in
  // chunks of one multi each; renew_answered() settles a chunk sent at
  // `sent` from the multi's answer.
  struct RenewCheck {
    std::size_t index;
    std::string path;
    std::string key;  // in held_
    std::uint64_t attempt;
    std::chrono::milliseconds ttl;
  };
  void renew_answered(const std::vector<RenewCheck>& chunk, const RenewDone& done, Clock::time_point sent,
                      const Result& r);
  void issue_now(Session& s, std::uint64_t id, const Issue& issue);
  // A read lost with its connection, sent again (true) or not (false:
  // past its bound, or its session is gone).
  bool resend(std::uint64_t id, Pending& p);
  static void on_sweep(uv_timer_t* t);
  StoreError error(int rc, const std::string& doing) const;
  // A call this store refuses (InvalidArgument), saying why.
  StoreError refusal(std::string why) const;

  std::string dir_of(std::string_view name) const;
  void acquire_one(std::shared_ptr<AcquireOp> op);
  void create_node(std::shared_ptr<AcquireOp> op, bool parents_made);
  void make_parents(std::shared_ptr<AcquireOp> op, int step);
  void list_nodes(std::shared_ptr<AcquireOp> op);
  // The decision on a listing in which our node is at `at`.
  void decide(const std::shared_ptr<AcquireOp>& op, const std::vector<std::string>& nodes, std::size_t at);
  void grant(const std::shared_ptr<AcquireOp>& op);
  void refuse_kind(const std::shared_ptr<AcquireOp>& op, LockKind held_as);
  // Busy: our node goes (or stays, a writer's mark), `watch` is read with
  // watches, and the answer is busy for their shortest ttl (at most `cap`).
  void wait_behind(const std::shared_ptr<AcquireOp>& op, std::vector<std::string> watch, bool keep_node,
                   std::chrono::milliseconds cap);
  // Sets the directory's `fence` node to `data` (made if missing); `done`
  // gets the outcome and the write's zxid.
  void write_fence(Session& s, const std::string& dir, std::string data,
                   std::function<void(int rc, std::int64_t zxid)> done, bool made = false);
  void forget(const AcquireOp& op);
  void finish(const std::shared_ptr<AcquireOp>& op, const Acquired& out);
  void fail(const std::shared_ptr<AcquireOp>& op, const StoreError& e);
  // Deletes the nodes `c` names.
  void delete_nodes(const Cleanup& c, std::function<void(Released, const StoreError*)> done);
  void abandon_attempt(const std::shared_ptr<AcquireOp>& op);
  void delete_paths(Session& s, std::vector<std::string> paths, std::function<void(int rc)> done);
  void remember_cleanup(Cleanup c);
  // A release given up on: see release() in the .cpp.
  struct GiveUp {
    Cleanup c;
    StoreError why;
    std::function<void(const StoreError&)> answer;  // unconfirmed, after `until`
    std::function<void(Released)> answer_confirmed;  // found gone or removed meanwhile
    Clock::time_point until;
    bool answered = false;
  };
  void give_up_release(const Cleanup& c, StoreError why, std::function<void(const StoreError&)> answer,
                       std::function<void(Released)> confirmed);
  void retry_give_up(std::shared_ptr<GiveUp> g);
  void run_cleanups();
  static void on_cleanup(uv_timer_t* t);
  void close_later(zhandle_t* zh, void* watch_ctx);
  // Makes `s`'s handle on "h:p,h:p[/chroot]" (addresses, or names only
  // where they are numeric already).
  void open_handle(Session& s, const std::string& hosts);
  // The members' addresses (empty where a name did not resolve) for the
  // session of `ms` with `serial`, if it is still the one waiting.
  void names_resolved(long long ms, std::uint64_t serial, const std::vector<std::string>& addresses);
  struct Claim;
  void claim_step(std::shared_ptr<Claim> c);
  void expire_held(Clock::time_point now);

  Loop& loop_;
  const Options options_;
  const std::string owner_;  // Options::owner_name, in each node's data
  const ZkTarget target_;
  const std::string endpoint_;
  std::shared_ptr<Sink> sink_;
  std::map<long long, std::unique_ptr<Session>> sessions_;  // by requested timeout (ms)
  std::uint64_t next_serial_ = 1;
  std::set<std::uint64_t> expired_;  // sessions the ensemble said it expired
  std::unordered_map<std::string, Held> held_;  // by name + '\0' + token
  std::unordered_map<std::string, Mark> marks_;  // by name + '\0' + token
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::uint64_t next_id_ = 1;
  std::set<std::string, std::less<>> subscribed_;
  std::vector<Cleanup> cleanups_;  // nodes whose removal is unconfirmed
  // Answers due later (give_up_release), run by the sweep.
  std::vector<std::pair<Clock::time_point, std::function<void()>>> deferred_;
  std::uint64_t next_attempt_ = 1;
  bool cleaning_ = false;
  Backoff cleanup_backoff_{options_.reconnect_min, options_.reconnect_max};
  uv_timer_t sweep_{};
  Clock::time_point next_expiry_scan_{};
  uv_timer_t cleanup_{};
  bool started_ = false;
  bool closed_ = false;

  // zookeeper_close() blocks (it says goodbye to the ensemble and joins the
  // client's threads): handles are closed on a thread of their own.
  std::mutex closer_mu_;
  std::condition_variable closer_cv_;
  std::vector<std::pair<zhandle_t*, void*>> to_close_;
  bool closer_stop_ = false;
  std::thread closer_;
};

}  // namespace lockwatch::detail
