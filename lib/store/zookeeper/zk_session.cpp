#include "store/zookeeper/zk_session.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "core/countdown.hpp"
#include "core/loop.hpp"
#include "core/net.hpp"
#include "core/url.hpp"
#include "store/zookeeper/zk_error.hpp"
#include "store/zookeeper/zk_nodes.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

// ---- set-up

ZkSessions::ZkSessions(Loop& loop, const ZkTarget& target, const ConnectionOptions& connection,
                       const StoreEvents& events)
    : loop_(loop),
      connection_(connection),
      events_(events),
      target_(target),
      endpoint_(target_.name()),
      sink_(std::make_shared<ZkSink>(this, loop)),
      closer_(sink_) {}

ZkSessions::~ZkSessions() { close(); }

ZkSession* ZkSessions::session_for(milliseconds ttl) {
  const long long ms = std::max<long long>(ttl.count(), 1);
  auto& s = sessions_[ms];
  if (s != nullptr && (s->zh != nullptr || s->awaiting_names)) return s.get();
  // None, or its set-up failed: a new one (the old one's context goes with it).
  s = std::make_unique<ZkSession>(ZkSession{.serial = next_serial_++, .requested_ms = ms, .started = Clock::now()});
  look_up_names(*s);
  return s.get();
}

// Member names are looked up on libuv's thread pool (the client library
// would look them up in zookeeper_init(), on the loop), then the handle is
// made on their addresses.
void ZkSessions::look_up_names(ZkSession& s) {
  using Addresses = std::vector<std::string>;  // per member; empty: not resolved
  Addresses found;
  for (const auto& [host, port] : target_.hosts) found.push_back(numeric_host(host) ? host : std::string());
  const auto names = static_cast<std::size_t>(std::ranges::count(found, std::string()));
  if (names == 0) return open_handle(s, found);
  s.awaiting_names = true;
  auto all = Countdown<int, Addresses>::make(names, std::move(found), [sink = sink_, serial = s.serial](auto& c) {
    // Null once the store closed.
    if (ZkSessions* st = sink->sessions; st != nullptr) st->names_resolved(serial, c);
  });
  for (std::size_t i = 0; i < target_.hosts.size(); ++i) {
    if (!(*all)[i].empty()) continue;  // numeric: nothing to look up
    auto done = [all, i](int status, std::string address) {
      if (status == 0) (*all)[i] = std::move(address);
      all->answered();
    };
    if (resolve_host(loop_.uv(), target_.hosts[i].first, done) < 0) done(UV_EAI_NONAME, std::string());
  }
}

void ZkSessions::names_resolved(std::uint64_t serial, const std::vector<std::string>& addresses) {
  for (auto& [ms, s] : sessions_)
    if (s->serial == serial && !closed_ && std::exchange(s->awaiting_names, false)) return open_handle(*s, addresses);
}

void ZkSessions::open_handle(ZkSession& s, const std::vector<std::string>& addresses) {
  std::string hosts;
  for (std::size_t i = 0; i < addresses.size(); ++i)
    if (!addresses[i].empty()) hosts += (hosts.empty() ? "" : ",") + host_port(addresses[i], target_.hosts[i].second);
  if (!hosts.empty()) {
    s.watch_ctx = std::make_unique<ZkCtx>(ZkCtx{sink_, 0, s.serial, {}, {}});
    // The timeout is an int of ms; the ensemble bounds it anyway.
    const int timeout = static_cast<int>(std::min<long long>(s.requested_ms, 1LL << 30));
    // The client's own log lines are dropped.
    s.zh = zookeeper_init2((hosts + target_.chroot).c_str(), zk::on_global_watch, timeout, nullptr,
                           s.watch_ctx.get(), 0, [](const char*) {});
  }
  if (s.zh != nullptr && target_.digest()) {
    const std::string cred = target_.user + ":" + target_.password;
    // Digest authentication is not checked when it is added: it gives the
    // session an identity, which the nodes' ACLs then admit or refuse.
    zoo_add_auth(s.zh, "digest", cred.data(), static_cast<int>(cred.size()), nullptr, nullptr);
  }
  if (s.zh != nullptr) return;  // parked requests go once it connects
  // No member's name resolved (or no handle could be made): what waited
  // fails now (kNoHandle), and the next request starts over.
  for (auto& [id, issue] : std::exchange(s.parked, {})) issue_now(s, id, issue);
}

ZkSession* ZkSessions::any_session() {
  for (auto& [ms, s] : sessions_)
    if (s->zh != nullptr && s->up) return s.get();
  for (auto& [ms, s] : sessions_)
    if (s->zh != nullptr || s->awaiting_names) return s.get();
  return session_for(std::max(connection_.connect_timeout, milliseconds(2000)));
}

ZkSession* ZkSessions::live(std::uint64_t serial) {
  for (auto& [ms, s] : sessions_)
    if (s->serial == serial) return s->zh != nullptr ? s.get() : nullptr;
  return nullptr;
}

bool ZkSessions::retire(ZkSession* s) {
  for (auto& [id, issue] : std::exchange(s->parked, {})) fail_later(id, ZSESSIONEXPIRED);
  closer_.close_later(s->zh, std::move(s->watch_ctx));
  // Its holds go with it.
  std::erase_if(holds.marks, [&](const auto& m) { return m.second.session == s->serial; });
  const bool had_locks = std::erase_if(holds.held, [&](const auto& h) { return h.second.session == s->serial; }) != 0;
  sessions_.erase(s->requested_ms);
  return had_locks;
}

// ---- what the client tells

void ZkSessions::on_session_state(std::uint64_t serial, int state) {
  ZkSession* s = live(serial);  // a session's events come from its handle
  if (s == nullptr || closed_) return;
  if (state == ZOO_CONNECTED_STATE) {
    connected(*s);
  } else if (state == ZOO_CONNECTING_STATE || state == ZOO_ASSOCIATING_STATE) {
    // Told once, when it was up.
    if (!std::exchange(s->up, false)) return;
    if (events_.connection) events_.connection(endpoint_, false, "connection to the ensemble lost");
    wake_waiters();
  } else if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
    ended(*s, state);
  }
}

void ZkSessions::connected(ZkSession& s) {
  const bool was_up = std::exchange(s.up, true);
  ++s.connects;
  ++connections_;
  s.negotiated_ms = zoo_recv_timeout(s.zh);
  const auto now = Clock::now();
  for (auto& [id, issue] : std::exchange(s.parked, {})) {
    auto p = pending_.find(id);
    if (p == pending_.end()) continue;  // timed out meanwhile
    p->second.deadline = std::max(p->second.deadline, now + connection_.command_timeout);
    p->second.late = false;
    issue_now(s, id, issue);
  }
  if (!was_up && events_.connection) events_.connection(endpoint_, true, "");
}

void ZkSessions::ended(ZkSession& s, int state) {
  if (state == ZOO_EXPIRED_SESSION_STATE) expired_.insert(s.serial);  // the ensemble says its nodes are gone
  const bool had_locks = retire(&s);
  if (events_.connection)
    events_.connection(endpoint_, false,
                       state == ZOO_EXPIRED_SESSION_STATE ? "the session expired" : "authentication failed");
  if (events_.log && had_locks)
    events_.log(true, fmt::format("{}: a session expired; its locks are lost", endpoint_));
  if (events_.subscriptions_lost) events_.subscriptions_lost();
  wake_waiters();
}

// A waiter told "busy" sleeps until its watch fires or the holder's ttl
// runs out. A watch set through a session that lost its connection fires
// only once it is back (or never: it expired), so every waiter looks
// again now, as ZooKeeper's lock recipe has a watcher do on a session
// event: its attempt waits for the connection within the command
// timeout, and a wait that runs out meanwhile reports the ensemble's
// error rather than a lock held by another owner, which nobody knows.
void ZkSessions::wake_waiters() {
  if (!events_.released) return;
  // A copy: a waiter's attempt may end its wait and unsubscribe.
  const std::vector<std::string> names(subscribed_.begin(), subscribed_.end());
  for (const auto& name : names)
    if (!closed_ && subscribed_.count(name) != 0) events_.released(name);
}

void ZkSessions::on_watch(int type, const std::string& path) {
  if (closed_ || (type != ZOO_DELETED_EVENT && type != ZOO_CHANGED_EVENT)) return;
  // /lockwatch/<name escaped>/lock-...
  const std::string root = std::string(zk::kRoot) + "/";
  if (path.compare(0, root.size(), root) != 0) return;
  auto slash = path.find('/', root.size());
  if (slash == std::string::npos) return;
  std::string name;
  if (!zk::unescape(std::string_view(path).substr(root.size(), slash - root.size()), name)) return;
  if (subscribed_.count(name) != 0 && events_.released) events_.released(name);
}

// ---- release notices

void ZkSessions::subscribe(std::string_view name) {
  if (closed_) return;
  subscribed_.emplace(name);
  // Every busy answer comes after the holder's node is watched: confirmed
  // at once (on the next turn, never inside the call).
  post([this, n = std::string(name)] {
    if (subscribed_.count(n) != 0 && events_.subscribed) events_.subscribed(n);
  });
}

void ZkSessions::unsubscribe(std::string_view name) {
  if (auto it = subscribed_.find(name); it != subscribed_.end()) subscribed_.erase(it);
}

// ---- requests

void ZkSessions::post(std::function<void()> f) {
  sink_->post([f = std::move(f)](ZkSessions&) { f(); });
}

void ZkSessions::make_node(ZkSession& s, std::string path, std::function<void(int rc)> done) {
  request(
      s, [done = std::move(done)](const ZkResult& r) { done(r.rc == ZNODEEXISTS ? ZOK : r.rc); }, false, zoo_acreate,
      std::move(path), "", 0, acl(), ZOO_PERSISTENT, zk::on_created_path);
}

bool ZkSessions::resend(std::uint64_t id, Pending& p) {
  ZkSession* s = closed_ || Clock::now() >= p.deadline ? nullptr : live(p.session);
  if (s == nullptr) return false;
  if (s->up && s->connects != p.connects)
    issue_now(*s, id, p.again);  // it connected again before this answer came
  else
    s->parked.emplace_back(id, p.again);  // sent when it connects (connected())
  return true;
}

void ZkSessions::send(ZkSession& s, ZkReply reply, ZkIssue issue, bool read) {
  const std::uint64_t id = next_id_++;
  // A request parked on a session that is not connected fails at this
  // deadline (sooner on one that never connected: the connect timeout
  // bounds that); one sent when the session connects has the command
  // timeout from then (see connected()).
  auto deadline = Clock::now() + connection_.command_timeout;
  if (s.connects == 0) deadline = std::min(deadline, s.started + connection_.connect_timeout);
  pending_.emplace(id, Pending{deadline, std::move(reply), read ? issue : ZkIssue{}, s.serial, 0});
  if (!closed_ && (s.zh != nullptr || s.awaiting_names) && !s.up) {
    s.parked.emplace_back(id, std::move(issue));  // sent on connecting, or timed out
    return;
  }
  issue_now(s, id, issue);
}

void ZkSessions::issue_now(ZkSession& s, std::uint64_t id, const ZkIssue& issue) {
  int rc = closed_ ? ZCLOSING : zk::kNoHandle;
  if (!closed_ && s.zh != nullptr) {
    if (auto p = pending_.find(id); p != pending_.end()) p->second.connects = s.connects;
    auto* ctx = sink_->new_ctx(id, s.serial);
    rc = issue(s.zh, ctx);
    if (rc != ZOK) sink_->release_ctx(ctx);
  }
  // Never inside the call: the answer goes round the loop.
  if (rc != ZOK) fail_later(id, rc);
}

void ZkSessions::fail_later(std::uint64_t id, int rc) {
  sink_->post([id, rc](ZkSessions& st) { st.complete(id, ZkResult{rc}); });
}

void ZkSessions::complete(std::uint64_t id, ZkResult r) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;  // timed out already
  if (r.rc == ZCONNECTIONLOSS && it->second.again && resend(id, it->second)) return;
  ZkReply reply = std::move(it->second.reply);
  r.session = live(it->second.session);
  pending_.erase(it);
  reply(r);
}

void ZkSessions::time_out(Clock::time_point now) {
  std::vector<std::uint64_t> late;
  for (auto& [id, p] : pending_) {
    if (p.late) late.push_back(id);
    p.late = p.deadline <= now;
  }
  std::sort(late.begin(), late.end());
  for (auto id : late) complete(id, ZkResult{ZOPERATIONTIMEOUT});
}

// ---- close

void ZkSessions::stop_requests() {
  closed_ = true;
  while (!pending_.empty()) complete(pending_.begin()->first, ZkResult{ZCLOSING});
}

void ZkSessions::close() {
  sink_->sessions = nullptr;
  for (auto& [ms, s] : sessions_) closer_.close_later(s->zh, std::move(s->watch_ctx));
  sessions_.clear();
  holds = {};
}

// ---- errors

ACL_vector* ZkSessions::acl() const { return target_.digest() ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE; }

StoreError ZkSessions::refusal(std::string why) const {
  return StoreError::invalid(endpoint_, std::move(why));
}

StoreError ZkSessions::error(int rc, const std::string& doing) const {
  const char* text = rc == ZOPERATIONTIMEOUT ? "no answer within the timeout"
                     : rc == zk::kNoHandle   ? "no session could be started (no member's name resolves?)"
                                             : zerror(rc);
  std::string message = doing.empty() ? std::string(text) : fmt::format("{}: {}", doing, text);
  if (zk::unreachable(rc)) return StoreError::unavailable(endpoint_, message, zookeeper_code(rc));
  if (rc == ZNOAUTH || rc == ZAUTHFAILED) return StoreError::auth(endpoint_, message, zookeeper_code(rc));
  return StoreError::refused(endpoint_, message, zookeeper_code(rc));
}

}  // namespace lockwatch::detail
