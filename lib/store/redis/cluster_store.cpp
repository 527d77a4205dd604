#include "store/redis/cluster_store.hpp"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "core/loop.hpp"
#include "core/url.hpp"
#include "store/redis/connection.hpp"
#include "store/redis/node_store.hpp"
#include "store/redis/redis_error.hpp"
#include "store/redis/topology.hpp"

namespace lockwatch::detail {

using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------ parsing

ClusterSeeds ClusterSeeds::parse(const std::string& url) {
  if (!url.starts_with("rediss-cluster://") && !url.starts_with("redis-cluster://"))
    throw_bad_url(url, "expected redis-cluster:// or rediss-cluster://[user:password@]host:port[,host:port...]");
  const HostList list(url);
  if (!list.path.empty()) throw_bad_url(url, "a Redis Cluster has database 0 only: no /db after the seed nodes");
  if (list.hosts == std::vector<std::string>{""}) throw_bad_url(url, "no seed node");
  ClusterSeeds out;
  for (const auto& one : list.hosts) {
    if (one.empty()) throw_bad_url(url, "an empty seed in the list");
    // The redis:// parser checks host, port and credentials alike.
    out.seeds.push_back(Endpoint::parse(list.scheme + list.credentials + one));
  }
  return out;
}

std::string ClusterSeeds::names() const {
  std::string out;
  for (const auto& s : seeds) out += (out.empty() ? "" : ",") + s.name();
  return out;
}

namespace {

// The error in what a node answered a call (null: none), which follow()
// may act on: a lock's failed acquisition or unconfirmed release, a tool's
// error.
const StoreError* error_in(const StoreError* err) { return err; }
template <class Value>
const StoreError* error_in(const Value&, const StoreError* err) {
  return err;
}
const StoreError* error_in(const ClaimResult& r) {
  return r.status == ClaimResult::Status::kFailed ? &r.error : nullptr;
}
const StoreError* error_in(std::size_t, const Acquired& r) {
  return r.status == Acquired::Status::kFailed ? &r.error : nullptr;
}
const StoreError* error_in(std::size_t, Released status, const StoreError* why) {
  return status == Released::kUnconfirmed ? why : nullptr;
}

// A call's answer when it failed with `e` where no node answered it (or
// its error was not followed to the end).
void failed(const LockStore::AcquireDone& done, const StoreError& e) { done(0, Acquired::failed(e)); }
void failed(const LockStore::ReleaseDone& done, const StoreError& e) { done(0, Released::kUnconfirmed, &e); }
void failed(const JobClaims::ClaimDone& done, const StoreError& e) { done(ClaimResult{.error = e}); }
void failed(const std::function<void(const StoreError*)>& done, const StoreError& e) { done(&e); }
template <class Value>
void failed(const std::function<void(Value, const StoreError*)>& done, const StoreError& e) {
  done(std::decay_t<Value>{}, &e);
}

// A node's answer as the caller gets it. A release sent again after a
// lost reply that found the lock gone was released by the first run (or
// its ttl ran out just then): released, either way.
template <class Value>
const Value& settled(bool, const Value& v) {
  return v;
}
Released settled(bool resent, Released r) { return resent && r == Released::kGone ? Released::kYes : r; }

// Slots from..to belong to node `index`; false for a range out of bounds.
bool assign_slots(std::array<std::int16_t, kClusterSlots>& owners, long long from, long long to, std::int16_t index) {
  if (from < 0 || to >= kClusterSlots || from > to) return false;
  std::fill(owners.begin() + from, owners.begin() + to + 1, index);
  return true;
}

}  // namespace

// ------------------------------------------------------------------ the store

struct ClusterStore::Node {
  std::int16_t index;  // in nodes_, as owner_ names it
  Endpoint endpoint;   // the URL's credentials and TLS, at the master's address
  std::unique_ptr<RedisNodeStore> store;
};

// One call on the locks of one slot (an acquisition, a release, a
// renewal group, an operators' tool, a period claim), across its redirects.
struct ClusterStore::Call {
  std::string name;  // a lock of the call: its slot routes the call
  int hops = 0;
  std::size_t locks = 1;  // the metrics count a redirect once per lock
  // Safe to repeat (acquire with its token, release, inspect): a lost
  // reply is answered by sending it once more.
  bool idempotent = false;
  bool resent = false;  // it was, after a lost reply
  // The last send went out on a live connection: a connection error then
  // may have lost the reply of a call that ran. Sent while the node was
  // down, it waited for a connection that never came, and did not run.
  bool sent_live = false;
  // Sends the call to `node` (after the ASKING send_to() asked for, if
  // any); `self` is this call (taken as an argument, so that the call
  // does not own itself); returns the script calls written. The reply
  // handler hands a failure to follow() and reports only what follow()
  // does not take.
  std::function<std::size_t(RedisNodeStore& node, const std::shared_ptr<Call>& self)> send;
};

ClusterStore::ClusterStore(Loop& loop, ClusterSeeds seeds, const StoreSettings& settings, StoreLayout layout,
                           RedisReplicas replicas)
    : RedisStoreBase(layout, settings.key_prefix),
      loop_(loop),
      seeds_(std::move(seeds)),
      settings_(settings),
      layout_(std::move(layout)),
      replicas_(replicas) {
  owner_.fill(-1);
  topo_ = std::make_unique<RedisConnection>(loop_, seeds_.seeds.front(), settings_, RedisConnection::Mode::kCommands);
}

ClusterStore::~ClusterStore() = default;

void ClusterStore::started() {
  started_ = true;
  uv_timer_init(loop_.uv(), &refresh_timer_);
  refresh_timer_.data = this;
  uv_timer_init(loop_.uv(), &wait_timer_);
  wait_timer_.data = this;
  topo_->start();
  for (auto& n : nodes_) n->store->start(node_events(n.get()));
  start_refresh();
}

ClusterStore::Node* ClusterStore::node_at(const std::string& host, int port) {
  for (const auto& n : nodes_)
    if (n->endpoint.host == host && n->endpoint.port == port) return n.get();
  Endpoint ep = seeds_.seeds.front();  // credentials and TLS of the URL
  ep.host = host;
  ep.port = port;
  nodes_.push_back(std::make_unique<Node>(Node{
      static_cast<std::int16_t>(nodes_.size()), ep,
      std::make_unique<RedisNodeStore>(loop_, ep, settings_, RedisNodeStore::Notices::kSharded, layout_, replicas_)}));
  Node* node = nodes_.back().get();
  node->store->batch_by_slot();  // a script's keys share one slot
  node->store->set_dropped_hook(
      [this, node](std::string_view lock, const StoreError* why) { subscription_dropped(node, lock, why); });
  if (started_ && !closed_) node->store->start(node_events(node));
  return node;
}

StoreEvents ClusterStore::node_events(Node* node) {
  StoreEvents e = events_;
  // A node that went down may have failed over: read the map again.
  e.connection = [this, forward = events_.connection](const std::string& endpoint, bool up, const std::string& why) {
    if (!up) request_refresh();
    if (forward) forward(endpoint, up, why);
  };
  // A confirmation from a node the subscription has left since is stale.
  e.subscribed = [this, node, forward = events_.subscribed](std::string_view lock) {
    auto it = subscribed_.find(lock);
    if (it == subscribed_.end() || it->second.node != node) return;
    it->second.hops = 0;
    if (forward) forward(lock);
  };
  return e;
}

ClusterStore::Node* ClusterStore::owner_of(std::uint16_t slot) {
  std::int16_t i = owner_[slot];
  return i < 0 ? nullptr : nodes_[static_cast<std::size_t>(i)].get();
}

// ------------------------------------------------------------------ the map

void ClusterStore::when_mapped(MapWaiter fn) {
  if (closed_) {
    loop_.post([fn = std::move(fn)] {
      const StoreError closed = StoreError::unavailable("redis-cluster", "the store is closed");
      fn(&closed);
    });
    return;
  }
  if (mapped_) {
    fn(nullptr);
    return;
  }
  map_waiters_.push_back(Waiting{Clock::now() + settings_.connection.connect_timeout, std::move(fn)});
  if (started_ && !uv_is_active(reinterpret_cast<uv_handle_t*>(&wait_timer_)))
    uv_timer_start(&wait_timer_, &ClusterStore::on_wait_timer,
                   static_cast<std::uint64_t>(settings_.connection.connect_timeout.count()), 0);
  request_refresh();
}

void ClusterStore::on_wait_timer(uv_timer_t* t) { static_cast<ClusterStore*>(t->data)->expire_waiters(); }

void ClusterStore::expire_waiters() {
  const auto now = Clock::now();
  std::vector<Waiting> due, keep;
  for (auto& w : map_waiters_) (w.deadline <= now ? due : keep).push_back(std::move(w));
  map_waiters_ = std::move(keep);
  const StoreError err = StoreError::unavailable(
      seeds_.names(),
      fmt::format("no slot map within the connect timeout ({} ms){}", settings_.connection.connect_timeout.count(),
                  last_refresh_error_.empty() ? "" : ": " + last_refresh_error_));
  for (auto& w : due) w.fn(&err);
  if (!map_waiters_.empty()) {
    auto next = std::chrono::duration_cast<std::chrono::milliseconds>(map_waiters_.front().deadline - now);
    uv_timer_start(&wait_timer_, &ClusterStore::on_wait_timer,
                   static_cast<std::uint64_t>(std::max<long long>(1, next.count() + 1)), 0);
  }
}

void ClusterStore::request_refresh() {
  if (closed_ || !started_) return;
  if (refreshing_) {
    refresh_again_ = true;
    return;
  }
  const auto since = Clock::now() - last_refresh_;
  if (since >= kRefreshThrottle) {
    start_refresh();
    return;
  }
  auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(kRefreshThrottle - since).count() + 1;
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&refresh_timer_)) &&
      uv_timer_get_due_in(&refresh_timer_) <= static_cast<std::uint64_t>(wait))
    return;
  uv_timer_start(&refresh_timer_, &ClusterStore::on_refresh_timer, static_cast<std::uint64_t>(wait), 0);
}

// The timer is armed only while no refresh is in flight, and
// start_refresh() stops it: when it fires, none is.
void ClusterStore::on_refresh_timer(uv_timer_t* t) { static_cast<ClusterStore*>(t->data)->start_refresh(); }

void ClusterStore::start_refresh() {
  if (closed_) return;
  uv_timer_stop(&refresh_timer_);
  refreshing_ = true;
  refresh_again_ = false;
  // Masters known from the map first, then the seeds.
  candidates_.clear();
  auto add = [&](const Endpoint& ep) {
    if (std::ranges::none_of(candidates_, [&](const Endpoint& c) { return c.host == ep.host && c.port == ep.port; }))
      candidates_.push_back(ep);
  };
  for (const auto& n : nodes_)
    if (std::find(owner_.begin(), owner_.end(), n->index) != owner_.end()) add(n->endpoint);
  for (const auto& s : seeds_.seeds) add(s);
  refresh_auth_error_.reset();
  refresh_from(0);
}

void ClusterStore::refresh_from(std::size_t i, bool slots) {
  if (closed_) return;
  if (i >= candidates_.size()) {
    refresh_failed(last_refresh_error_);
    return;
  }
  if (!slots) topo_->set_endpoint(candidates_[i]);
  const std::string where = candidates_[i].name();
  const char* command = slots ? "SLOTS" : "SHARDS";
  topo_->command({"CLUSTER", command}, [this, i, slots, where, command](const redisReply* r, const StoreError* err) {
    if (closed_) return;
    std::array<std::int16_t, kClusterSlots> next;
    next.fill(-1);
    if (!err && r->type == REDIS_REPLY_ARRAY && (slots ? read_slots(r, next) : read_shards(r, next))) {
      owner_ = next;
      refresh_done();
      return;
    }
    // Unavailable or refused credentials: not an answer, the node is unreachable.
    const bool answered =
        err != nullptr && err->kind != StoreError::Kind::kUnavailable && err->kind != StoreError::Kind::kAuth;
    if (err && err->kind == StoreError::Kind::kAuth) refresh_auth_error_ = *err;
    // An older server, or not a cluster node at all: CLUSTER SLOTS tells.
    if (answered && !slots) return refresh_from(i, true);
    last_refresh_error_ = !err      ? fmt::format("{} gave an unreadable CLUSTER {} reply", where, command)
                          : !answered ? err->describe()
                                      : fmt::format("{} is not a Redis Cluster node (CLUSTER SLOTS: {})", where,
                                                    err->message);
    refresh_from(i + 1, false);
  });
}

bool ClusterStore::read_shards(const redisReply* r, std::array<std::int16_t, kClusterSlots>& next) {
  for (std::size_t s = 0; s < r->elements; ++s) {
    const redisReply* shard = r->element[s];
    const redisReply* slots = field_of(shard, "slots");
    const redisReply* nodes = field_of(shard, "nodes");
    if (slots == nullptr || nodes == nullptr || slots->type != REDIS_REPLY_ARRAY || nodes->type != REDIS_REPLY_ARRAY)
      return false;
    std::int16_t master = -1;  // its node's index
    for (std::size_t n = 0; n < nodes->elements && master < 0; ++n) {
      const redisReply* node = nodes->element[n];
      if (text_of(field_of(node, "role")) != "master") continue;
      std::string host(text_of(field_of(node, "ip")));
      if (host.empty() || host == "?") host = text_of(field_of(node, "endpoint"));
      long long port = number_of(field_of(node, seeds_.seeds.front().tls ? "tls-port" : "port"));
      if (host.empty() || host == "?" || port <= 0 || port > 65535) continue;
      master = node_at(host, static_cast<int>(port))->index;
    }
    if (master < 0) continue;  // a shard without a master serves nothing now
    for (std::size_t k = 0; k + 1 < slots->elements; k += 2)
      if (!assign_slots(next, number_of(slots->element[k]), number_of(slots->element[k + 1]), master)) return false;
  }
  return true;
}

bool ClusterStore::read_slots(const redisReply* r, std::array<std::int16_t, kClusterSlots>& next) {
  for (std::size_t s = 0; s < r->elements; ++s) {
    const redisReply* range = r->element[s];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3) return false;
    long long from = number_of(range->element[0]), to = number_of(range->element[1]);
    const redisReply* m = range->element[2];
    if (m->type != REDIS_REPLY_ARRAY || m->elements < 2) return false;
    std::string host(text_of(m->element[0]));
    long long port = number_of(m->element[1]);
    if (host.empty() || port <= 0 || port > 65535) return false;
    if (!assign_slots(next, from, to, node_at(host, static_cast<int>(port))->index)) return false;
  }
  return true;
}

void ClusterStore::refresh_done() {
  refreshing_ = false;
  last_refresh_ = Clock::now();
  last_refresh_error_.clear();
  logged_refresh_error_.clear();
  mapped_ = true;
  uv_timer_stop(&wait_timer_);
  place_subscriptions();
  answer_waiters(nullptr, true);
  if (closed_) return;
  // refresh_again_ is cleared by the refresh this starts (now, or when
  // the throttle's timer fires).
  if (refresh_again_ || !refresh_waiters_.empty()) {
    request_refresh();
  } else if (!refreshing_) {
    uv_timer_start(&refresh_timer_, &ClusterStore::on_refresh_timer,
                   static_cast<std::uint64_t>(kRefreshInterval.count()), 0);
  }
}

void ClusterStore::refresh_failed(const std::string& why) {
  refreshing_ = false;
  last_refresh_ = Clock::now();
  // Before the first map, a round that reached no usable node fails what
  // waits at once (no seed answers, or none is a cluster node).
  const StoreError err = refresh_auth_error_
                             ? *refresh_auth_error_
                             : StoreError::unavailable(seeds_.names(),
                                                       "could not read the cluster's slot map from any node: " + why);
  if (!mapped_) uv_timer_stop(&wait_timer_);
  answer_waiters(&err, !mapped_);
  if (closed_ || refreshing_) return;
  // Once per distinct reason, not once per retry.
  if (events_.log && why != logged_refresh_error_)
    events_.log(true, "redis-cluster: the slot map could not be read: " + why);
  logged_refresh_error_ = why;
  // Try again soon: a node may be failing over.
  uv_timer_start(&refresh_timer_, &ClusterStore::on_refresh_timer, 250, 0);
}

// ------------------------------------------------------------------ locks

template <class Done, class Send>
void ClusterStore::route(std::string_view name, bool idempotent, Done done, Send send) {
  auto answer = std::make_shared<Done>(std::move(done));
  auto call = std::make_shared<Call>();
  call->name = name;
  call->idempotent = idempotent;
  call->send = [this, answer, send = std::move(send)](RedisNodeStore& node, const std::shared_ptr<Call>& self) {
    std::invoke(send, node, self->name, [this, self, answer](const auto&... reply) {
      const StoreError* err = error_in(reply...);
      if (err == nullptr || !follow(self, *err, [answer, e = *err] { failed(*answer, e); }))
        (*answer)(settled(self->resent, reply)...);
    });
    return std::size_t{1};
  };
  when_mapped([this, call, answer](const StoreError* err) {
    Node* node = err ? nullptr : owner_of(key_slot(call->name));
    if (node != nullptr) {
      send_to(node, false, call);
      return;
    }
    if (!err) request_refresh();
    constexpr const char* kUnserved = "no master serves slot {} (of '{}') in the cluster's slot map";
    StoreError why =
        err ? *err : StoreError::unavailable(seeds_.names(), fmt::format(kUnserved, key_slot(call->name), call->name));
    loop_.post([answer, why = std::move(why)] { failed(*answer, why); });
  });
}

std::size_t ClusterStore::send_to(Node* node, bool asking, const std::shared_ptr<Call>& call) {
  call->sent_live = node->store->connected();
  if (asking) node->store->send_asking();
  return call->send(*node->store, call);
}

bool ClusterStore::follow(const std::shared_ptr<Call>& call, const StoreError& error, std::function<void()> give_up) {
  if (closed_) return false;
  using Kind = StoreError::Kind;
  if (error.kind == Kind::kRedirect || error.kind == Kind::kRetryLater) {
    // The map is wrong (MOVED) or the slot is in flux: read it again, also
    // when the budget is spent, so that the next call goes the right way.
    if (!is_ask(error)) request_refresh();
    if (++call->hops > kRedirectBudget) return false;
  } else if (error.kind != Kind::kUnavailable) {
    return false;
  } else if (!call->idempotent || call->resent || !call->sent_live) {
    // The node is down, or it failed over: the call may or may not have
    // run. One safe to repeat that went out on a live connection is sent
    // once more (below); the others fail.
    request_refresh();
    return false;
  } else {
    call->resent = true;
  }
  if (error.kind == Kind::kRedirect) {
    const auto to = cluster_redirect(error);
    if (!to) return false;
    if (events_.redirected)  // for the metrics
      for (std::size_t n = 0; n < call->locks; ++n) events_.redirected(to->ask);
    Node* target = node_at(to->host, to->port);
    // What a MOVED says holds until the next map (already asked for) says
    // otherwise: the calls and renewals made meanwhile go there directly.
    if (!to->ask) owner_[key_slot(call->name)] = target->index;
    send_to(target, to->ask, call);
    return true;
  }
  // A "retry later", or a lost reply: to the slot's owner once the next
  // refresh ended; with no owner then, `give_up` reports the failure.
  refresh_waiters_.push_back([this, call, give_up = std::move(give_up)](const StoreError*) {
    Node* owner = closed_ ? nullptr : owner_of(key_slot(call->name));
    if (owner != nullptr) {
      send_to(owner, false, call);
    } else {
      give_up();
    }
  });
  request_refresh();
  return true;
}

void ClusterStore::acquire(std::span<const LockRef> locks, AcquireDone done) {
  auto shared = std::make_shared<AcquireDone>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i) {
    // Sent again with the same token, the script answers with the fencing
    // token of the first run if that one took the lock; a redirected or
    // refused command did not run: sending it again cannot take it twice.
    route(locks[i].name, true, AcquireDone([i, shared](std::size_t, const Acquired& r) { (*shared)(i, r); }),
          [lock = OwnedLock(locks[i]), waits = locks[i].waits](RedisNodeStore& node, std::string_view, auto reply) {
            LockRef ref = lock.ref();
            ref.waits = waits;
            node.acquire(std::span<const LockRef>(&ref, 1), std::move(reply));
          });
  }
}

void ClusterStore::release(std::span<const LockRef> locks, bool notify, ReleaseDone done) {
  auto shared = std::make_shared<ReleaseDone>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i) {
    // A redirect did not run; a lost reply may have (the release ran):
    // sent again either way.
    route(locks[i].name, true,
          ReleaseDone([i, shared](std::size_t, Released status, const StoreError* why) { (*shared)(i, status, why); }),
          [lock = OwnedLock(locks[i]), notify](RedisNodeStore& node, std::string_view, auto reply) {
            const LockRef ref = lock.ref();
            node.release(std::span<const LockRef>(&ref, 1), notify, std::move(reply));
          });
  }
}

std::size_t ClusterStore::renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) {
  // Leases exist only once the map is known: a lock whose slot no master
  // serves (none yet, or the store is closed) is answered kTransient.
  auto shared = std::make_shared<RenewDone>(std::move(done));
  std::size_t commands = 0;
  // One script call per slot group, every node's calls queued now, so they
  // leave together and in parallel (each node's on its renewal connection).
  std::vector<std::uint16_t> slots(locks.size());
  std::ranges::transform(locks, slots.begin(), [](const LockRef& l) { return key_slot(l.name); });
  std::vector<std::size_t> unrouted;
  for (SlotGroup& group : group_by_slot(slots)) {
    Node* owner = closed_ ? nullptr : owner_of(group.slot);
    if (owner == nullptr) {
      unrouted.insert(unrouted.end(), group.at.begin(), group.at.end());
      continue;
    }
    auto g = std::make_shared<RenewGroup>();
    g->refs.reserve(group.at.size());
    for (std::size_t k : group.at) g->refs.push_back(locks[k]);
    g->indexes = std::move(group.at);
    commands += send_to(owner, false, renew_call(std::move(g), 0, keepalive, shared));
  }
  if (!unrouted.empty()) {
    if (!closed_) request_refresh();
    loop_.post([shared, unrouted, keepalive, where = seeds_.names()] {
      const StoreError why = StoreError::unavailable(where, "no master serves the lock's slot yet");
      for (std::size_t k : unrouted) (*shared)(k, Renewed::kTransient, &why);
    });
  }
  return commands;
}

std::shared_ptr<ClusterStore::Call> ClusterStore::renew_call(std::shared_ptr<const RenewGroup> g, int hops,
                                                             std::shared_ptr<const void> keepalive,
                                                             std::shared_ptr<RenewDone> done) {
  auto call = std::make_shared<Call>();
  call->name = g->refs.front().name;
  call->hops = hops;
  call->locks = g->refs.size();
  call->send = [this, g, keepalive, done](RedisNodeStore& node, const std::shared_ptr<Call>& self) {
    // A redirect answers the group's one script call, so every lock of the
    // group gets it: they are gathered over the group's answers and sent on
    // together, as one call, once the last answer is in: a group of their
    // own.
    struct Redirect : RenewGroup {
      std::size_t answered = 0;
      StoreError to;  // the redirect (kRedirect: cluster_redirect() reads where to)
    };
    auto r = std::make_shared<Redirect>();
    return node.renew(g->refs, keepalive, [this, self, g, keepalive, done, r](std::size_t k, Renewed status,
                                                                      const StoreError* why) {
      const bool last = ++r->answered == g->refs.size();
      if (status == Renewed::kTransient && !closed_ && why != nullptr && why->redirect()) {
        r->to = *why;
        r->indexes.push_back(g->indexes[k]);
        r->refs.push_back(g->refs[k]);
      } else {
        // A "retry later" says the map is wrong, and a node that cannot be
        // reached may have failed over, and only a new map names the
        // replica that took its slots: the map is read again (throttled).
        // Its loss alone asks once, before the replica is promoted.
        if (status == Renewed::kTransient && why != nullptr && !closed_) request_refresh();
        (*done)(g->indexes[k], status, why);
      }
      if (!last || r->refs.empty()) return;
      // MOVED: the slot is the target's now (the map is read again too);
      // ASK: the slot is migrating and the keys are on the target already,
      // renewed there after ASKING while the map stays as it is. Either way
      // at once, not at the watchdog's next try: a moved slot costs a round
      // trip, not the lease's remaining time.
      auto give_up = [r, done] {
        for (std::size_t index : r->indexes) (*done)(index, Renewed::kTransient, &r->to);
      };
      if (!follow(renew_call(r, self->hops, keepalive, done), r->to, give_up)) give_up();
    });
  };
  return call;
}

// ------------------------------------------------------------------ the rest, routed by slot

void ClusterStore::raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) {
  route(name, false, std::function<void(const StoreError*)>([done = std::move(done)](const StoreError* err) {
          done(err == nullptr);
        }),
        [fence](RedisNodeStore& node, std::string_view lock, auto reply) {
          node.raise_fence_or_error(lock, fence, std::move(reply));
        });
}

void ClusterStore::server_time(TimeDone done) {
  when_mapped([this, done = std::move(done)](const StoreError* failed) mutable {
    auto served = failed ? owner_.end() : std::find_if(owner_.begin(), owner_.end(), [](auto i) { return i >= 0; });
    if (served != owner_.end()) {
      nodes_[static_cast<std::size_t>(*served)]->store->server_time(std::move(done));
      return;
    }
    StoreError err = failed ? *failed : StoreError::unavailable(seeds_.names(), "no master serves any slot");
    loop_.post([done = std::move(done), err = std::move(err)] { done({}, &err); });
  });
}

void ClusterStore::claim_period(std::string_view name, std::string_view token, std::int64_t period,
                                std::chrono::system_clock::time_point start, ClaimDone done) {
  route(name, false, std::move(done),
        [token = std::string(token), period, start](RedisNodeStore& node, std::string_view lock, auto reply) {
          node.claim_period(lock, token, period, start, std::move(reply));
        });
}

void ClusterStore::reserve_tokens(const LockRef& lock, std::uint32_t n, ReserveDone done) {
  route(lock.name, false, std::move(done),
        [lock = OwnedLock(lock), n](RedisNodeStore& node, std::string_view, auto reply) {
          node.reserve_tokens(lock.ref(), n, std::move(reply));
        });
}

void ClusterStore::inspect(std::string_view name, InspectDone done) {
  route(name, true, std::move(done), &RedisNodeStore::inspect);
}

void ClusterStore::list_locks(std::string_view prefix, std::size_t limit, ListDone done) {
  when_mapped([this, prefix = std::string(prefix), limit, done = std::move(done)](const StoreError* err) mutable {
    if (err) return done({}, err);
    std::set<Node*> masters;
    for (std::int16_t at : owner_)
      if (at >= 0) masters.insert(nodes_[static_cast<std::size_t>(at)].get());
    // Every master's listing, or the first failure.
    auto merge = std::make_shared<Answers<std::vector<LockInfo>, ListDone, false>>(std::move(done));
    if (masters.empty()) {  // no slot served: nothing held, answered on the next turn (never inside the call)
      loop_.post([merge] { merge->done({}, nullptr); });
      return;
    }
    for (Node* node : masters)
      node->store->list_locks(prefix, limit, [merge, limit, n = masters.size()](std::vector<LockInfo> locks,
                                                                                 const StoreError* e) {
        if (!merge->heard(e, n, std::move(locks))) return;
        if (merge->error) return merge->done({}, merge->error.get());
        std::vector<LockInfo> found;
        for (auto& each : merge->values)
          for (auto& l : each) found.push_back(std::move(l));
        std::ranges::sort(found, {}, &LockInfo::key);
        if (found.size() > limit) found.resize(limit);
        merge->done(std::move(found), nullptr);
      });
  });
}

void ClusterStore::force_release(std::string_view name, ForceDone done) {
  route(name, false, std::move(done), &RedisNodeStore::force_release);
}

void ClusterStore::withdraw(const LockRef& lock, WithdrawDone done) {
  // A token withdrawn twice is withdrawn: safe to repeat.
  route(lock.name, true, std::move(done), [lock = OwnedLock(lock)](RedisNodeStore& node, std::string_view, auto reply) {
    node.withdraw(lock.ref(), std::move(reply));
  });
}

void ClusterStore::subscribe(std::string_view name) {
  when_mapped([this, lock = std::string(name)](const StoreError* err) {
    if (err || closed_ || subscribed_.count(lock) > 0) return;
    Node* node = owner_of(key_slot(lock));
    subscribed_.emplace(lock, Subscription{node, 0});
    if (node != nullptr) {
      node->store->subscribe(lock);
    } else {
      request_refresh();  // placed by the refresh; the waiter falls back to the holder's ttl meanwhile
    }
  });
}

void ClusterStore::unsubscribe(std::string_view name) {
  when_mapped([this, lock = std::string(name)](const StoreError*) {
    auto it = subscribed_.find(lock);
    if (it == subscribed_.end()) return;
    if (!closed_ && it->second.node != nullptr) it->second.node->store->unsubscribe(lock);
    subscribed_.erase(it);
  });
}

void ClusterStore::subscription_dropped(Node* node, std::string_view name, const StoreError* why) {
  if (closed_) return;
  auto it = subscribed_.find(name);
  if (it == subscribed_.end() || it->second.node != node) return;
  // No notice for it until it is confirmed again: the waiter counts on the
  // holder's ttl meanwhile.
  it->second.node = nullptr;
  if (events_.subscriptions_lost) events_.subscriptions_lost();
  request_refresh();
  const auto to = why != nullptr ? cluster_redirect(*why) : std::nullopt;
  if (to && !to->ask && ++it->second.hops <= kRedirectBudget) {
    Node* target = node_at(to->host, to->port);
    it->second.node = target;
    target->store->subscribe(it->first);
  }
  // Otherwise place_subscriptions() puts it on the slot's owner.
}

void ClusterStore::place_subscriptions() {
  if (closed_) return;
  bool moved = false;
  for (auto& [lock, sub] : subscribed_) {
    Node* owner = owner_of(key_slot(lock));
    if (owner == sub.node) continue;
    if (sub.node != nullptr) {
      sub.node->store->unsubscribe(lock);
      moved = true;
    }
    sub.node = owner;
    if (owner != nullptr) owner->store->subscribe(lock);
  }
  if (moved && events_.subscriptions_lost) events_.subscriptions_lost();
}

void ClusterStore::poll_replies() {
  for (auto& n : nodes_) n->store->poll_replies();
}

void ClusterStore::close() {
  if (closed_) return;
  closed_ = true;
  topo_->close();
  for (auto& n : nodes_) n->store->close();
  if (started_) {
    uv_close(reinterpret_cast<uv_handle_t*>(&refresh_timer_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&wait_timer_), nullptr);
  }
  const StoreError err = StoreError::unavailable(seeds_.names(), "the store is closed");
  answer_waiters(&err, true);
}

void ClusterStore::answer_waiters(const StoreError* err, bool map_waiters) {
  auto mapped = map_waiters ? std::exchange(map_waiters_, {}) : std::vector<Waiting>();
  auto refreshed = std::exchange(refresh_waiters_, {});
  for (auto& w : mapped) w.fn(err);
  for (auto& w : refreshed) w(err);
}

}  // namespace lockwatch::detail
