// lib/store/zookeeper/zk_session.hpp: the ZooKeeper store's sessions and
// its transport to the C client (zk_client.hpp): the bottom part of
// ZkStore, using none of the others. The session is the lease, one per
// ttl (docs/zookeeper.md, "The session is the lease", "Where it stops").
// A request unanswered after the command timeout (the connect timeout
// while a session was never up) fails as unavailable. What lives and
// dies with a session is kept here too: the nodes this store holds
// (ZkHolds) and the release notices.
//
// Costs: one session (two client threads) per distinct ttl; a request one
// entry in the pending table (and its context). Threading: the loop
// thread, but the ZkSink.
#pragma once

#include <map>
#include <set>

#include "lockwatch/options.hpp"
#include "store/lock_store.hpp"
#include "store/zookeeper/zk_client.hpp"
#include "store/zookeeper/zk_target.hpp"

namespace lockwatch::detail {

// The nodes this store holds or keeps waiting, by zk::hold_key(name,
// token); an entry goes with its session.
struct ZkHolds {
  // A held lock's node, or a waiting node kept (a writer's mark, a fair
  // waiter's place).
  struct Node {
    std::string path;
    std::uint64_t session = 0;  // ZkSession::serial
    std::int64_t czxid = 0;
    std::uint64_t attempt = 0;
    // Held: the last acquisition or renewal confirmed, sent + ttl + drift;
    // past it the store removes the node itself (see zk_renewal.hpp). A
    // mark: removed by the store then unless an attempt of the same
    // acquisition came.
    std::chrono::steady_clock::time_point until;
    std::uint64_t fence = 0;  // held: the token its grant answered (a repeat answers it again)
  };
  std::unordered_map<std::string, Node> held;
  std::unordered_map<std::string, Node> marks;
};

struct ZkSession {
  std::uint64_t serial = 0;
  long long requested_ms = 0;
  zhandle_t* zh = nullptr;
  std::unique_ptr<ZkCtx> watch_ctx{};  // the global watcher's context, handed to the closer with zh
  bool up = false;  // connected now: false until it first connects, and while its connection is lost
  int negotiated_ms = 0;
  std::uint32_t connects = 0;  // times it connected (again); 0: never yet
  bool awaiting_names = false;  // no handle yet: what is sent meanwhile is parked
  std::chrono::steady_clock::time_point started;
  // Requests made while it is not connected, sent once it is: the client
  // fails what it queued at every connection attempt that fails.
  std::vector<std::pair<std::uint64_t, ZkIssue>> parked{};
};

class ZkSessions {
 public:
  using Clock = std::chrono::steady_clock;

  // `events` are the store's, set when it starts: read only once something happens.
  ZkSessions(Loop& loop, const ZkTarget& target, const ConnectionOptions& connection, const StoreEvents& events);
  ~ZkSessions();

  // The session for locks of `ttl`, made (and connecting) if there is none.
  ZkSession* session_for(std::chrono::milliseconds ttl);
  // A connected session if there is one, else any, else a new one.
  ZkSession* any_session();
  // The session `serial` if it still has a handle.
  ZkSession* live(std::uint64_t serial);
  // Whether the ensemble said it expired `serial` (so its nodes are gone).
  bool expired(std::uint64_t serial) const { return expired_.count(serial) != 0; }
  // Ends `s` here: its parked requests fail, its handle closes, its holds
  // go (true if it held a lock). The ensemble removes its nodes once it
  // expires there.
  bool retire(ZkSession* s);
  // Connections made so far, over every session.
  std::uint64_t connections() const { return connections_; }

  // Sends one request on `s` (issue() makes the call with the context it
  // is given); `reply` runs once on the loop, with the answer or a
  // failure (ZOPERATIONTIMEOUT: no answer within the bound). A `read`
  // whose answer is lost with its connection (ZCONNECTIONLOSS) is asked
  // again on the same session once it connects again, within the same
  // bound; a write is not sent again (it may have been applied).
  void send(ZkSession& s, ZkReply reply, ZkIssue issue, bool read = false);
  // send() of the client's `call(zh, args..., ctx)`, a std::string passed as
  // its c_str() (the arguments kept until the call is made).
  template <class Call, class... Args>
  void request(ZkSession& s, ZkReply reply, bool read, Call call, Args... args) {
    send(
        s, std::move(reply),
        [call, ... args = std::move(args)](zhandle_t* zh, void* ctx) { return call(zh, zk::c_arg(args)..., ctx); },
        read);
  }
  void list(ZkSession& s, std::string path, ZkReply reply) {
    request(s, std::move(reply), true, zoo_aget_children, std::move(path), 0, zk::on_strings);
  }
  void read(ZkSession& s, std::string path, bool watch, ZkReply reply) {
    request(s, std::move(reply), true, zoo_aget, std::move(path), watch ? 1 : 0, zk::on_data);
  }
  // Makes the persistent node `path` (no data) on `s`; `done` gets ZOK once
  // it is there (made, or found made), else the failure.
  void make_node(ZkSession& s, std::string path, std::function<void(int rc)> done);
  // Runs `f` on the loop's next turn, unless the store closed meanwhile.
  void post(std::function<void()> f);
  // Fails the requests whose deadline passed on an earlier call too: an
  // answer that came while the loop was starved is taken in first (it is
  // posted, and the loop reads its posts after its timers).
  void time_out(Clock::time_point now);

  // Release notices: a watch on a lock's node that fires reports a
  // release of that name while subscribed.
  void subscribe(std::string_view name);
  void unsubscribe(std::string_view name);

  // Closing, in two steps: no request is taken any more and every one
  // still waiting is answered (unavailable), once; then the handles close
  // and every session is gone.
  void stop_requests();
  void close();
  bool closed() const { return closed_; }

  StoreError error(int rc, const std::string& doing) const;
  // Calls `done(values..., &error(rc, doing))`.
  template <class Done, class... Values>
  void answer_failed(const Done& done, int rc, const std::string& doing, Values&&... values) const {
    const StoreError e = error(rc, doing);
    done(std::forward<Values>(values)..., &e);
  }
  // InvalidArgument, saying why.
  StoreError refusal(std::string why) const;
  const ZkTarget& target() const { return target_; }
  const std::string& endpoint() const { return endpoint_; }
  // The creator's with digest authentication, else open.
  ACL_vector* acl() const;

  // On the loop, from what the client's threads post.
  void complete(std::uint64_t id, ZkResult r);
  void on_session_state(std::uint64_t serial, int state);
  void on_watch(int type, const std::string& path);

  ZkHolds holds;

 private:
  struct Pending {
    Clock::time_point deadline;
    ZkReply reply;
    // A read's call, made again when its connection is lost (see send()):
    // on `session` (the one it was sent on) once it has connected again
    // (`connects` counts that).
    ZkIssue again;
    std::uint64_t session = 0;
    std::uint32_t connects = 0;
    bool late = false;  // past its deadline at a time_out(): failed at the next
  };

  void look_up_names(ZkSession& s);
  // For the session `serial`, if it is still waiting.
  void names_resolved(std::uint64_t serial, const std::vector<std::string>& addresses);
  // Makes `s`'s handle on the members' `addresses` (numeric; empty where
  // a name did not resolve), or fails what it parked if it makes none.
  void open_handle(ZkSession& s, const std::vector<std::string>& addresses);
  void connected(ZkSession& s);
  void ended(ZkSession& s, int state);
  // Every subscribed name's waiters look again (a lost connection's
  // watches cannot fire meanwhile).
  void wake_waiters();
  void issue_now(ZkSession& s, std::uint64_t id, const ZkIssue& issue);
  // A read lost with its connection, sent again (true) or not (false:
  // past its bound, or its session is gone).
  bool resend(std::uint64_t id, Pending& p);
  void fail_later(std::uint64_t id, int rc);

  Loop& loop_;
  const ConnectionOptions& connection_;
  const StoreEvents& events_;
  const ZkTarget target_;
  const std::string endpoint_;
  std::shared_ptr<ZkSink> sink_;
  std::map<long long, std::unique_ptr<ZkSession>> sessions_;  // by requested timeout (ms)
  std::uint64_t next_serial_ = 1;
  std::uint64_t connections_ = 0;
  std::set<std::uint64_t> expired_;  // sessions the ensemble said it expired
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::uint64_t next_id_ = 1;
  std::set<std::string, std::less<>> subscribed_;
  bool closed_ = false;
  ZkCloser closer_;  // last: joined first, while the rest is still there
};

}  // namespace lockwatch::detail
