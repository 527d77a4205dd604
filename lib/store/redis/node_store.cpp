#include "store/redis/node_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <optional>

#include "store/kind_rules.hpp"
#include "store/redis/cluster_slot.hpp"
#include "store/redis/keys.hpp"
#include "store/redis/redis_error.hpp"
#include "store/redis/scripts.hpp"
#include "store/redis/sentinel.hpp"

namespace lockwatch::detail {

namespace {

// The kinds' renew or release call (kRenewKind, kReleaseKind) on `c` for
// the locks at `at`: KEYS each one's lock and holders; ARGV `head` first
// when given (the release's notice), then each one's token, `second(lock)`
// (the renewal's ttl, the release's channel) and marker. Each lock's status
// in the reply (a `Reply`) goes to done(at[k], status, why); `keepalive`
// lives until then.
template <class Reply, class Done, class Second>
void kinds_call(RedisConnection& c, ScriptId id, std::span<const LockRef> locks, std::vector<std::size_t> at,
                std::string_view head, Second second, Done done, std::shared_ptr<const void> keepalive = {}) {
  std::size_t bytes = head.size();
  for (std::size_t i : at) bytes += 4 * locks[i].name.size() + locks[i].token.size() + 64;
  EvalRequest request(script(id), 2 * at.size(), 5 * at.size() + (head.empty() ? 0 : 1), bytes);
  for (std::size_t i : at) request.arg(locks[i].name).arg(redis_keys::holders(locks[i].name));
  if (!head.empty()) request.arg(head);
  for (std::size_t i : at) request.arg(locks[i].token).arg(second(locks[i])).arg(kinds::marker(locks[i].kind));
  c.eval(std::move(request), [&c, at = std::move(at), done = std::move(done), keepalive = std::move(keepalive)](
                                 const redisReply* r, const StoreError* err) {
    Reply reply(r, err, at.size(), c.name());
    for (std::size_t i : at) {
      const StoreError* why = nullptr;
      const auto status = reply.next(&why);
      done(i, status, why);
    }
  });
}

// `text` as literal text of a SCAN MATCH pattern.
std::string glob_escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// What a reader's error gives a callback: null for none.
const StoreError* or_null(const std::optional<StoreError>& e) { return e ? &*e : nullptr; }

}  // namespace

RedisNodeStore::RedisNodeStore(Loop& loop, Endpoint endpoint, const StoreSettings& settings, Notices notices,
                               StoreLayout layout, RedisReplicas replicas)
    : RedisStoreBase(layout, settings.key_prefix),
      key_prefix_(settings.key_prefix),
      command_timeout_(settings.connection.command_timeout),
      owner_(settings.owner_name),
      notices_(notices),
      layout_(std::move(layout)),
      replicas_(replicas) {
  using Mode = RedisConnection::Mode;
  if (endpoint.port > 0 && !endpoint.tls)
    line_ = std::make_unique<CallerLine>(endpoint, settings.connection);
  conn_ = std::make_unique<RedisConnection>(loop, endpoint, settings, Mode::kCommands);
  renew_ = std::make_unique<RedisConnection>(loop, endpoint, settings, Mode::kCommands);
  if (replicas_.min > 0) acquire_ = std::make_unique<RedisConnection>(loop, endpoint, settings, Mode::kCommands);
  const bool sharded = notices_ == Notices::kSharded;
  RedisConnection::Hooks hooks;
  hooks.on_message = [this, sharded](std::string_view kind, std::string_view channel, std::string_view payload) {
    std::string_view name = lock_of(channel);
    if (name.empty()) return;
    // Redisson's channel carries its unlock message only; anything else
    // is no release.
    if (kind == (sharded ? "smessage" : "message") && events_.released &&
        (!layout_.redisson() || payload == redisson_keys::kUnlockMessage))
      events_.released(name);
    if (kind == (sharded ? "ssubscribe" : "subscribe")) {
      if (listening_.find(name) == listening_.end()) listening_.emplace(name);
      if (events_.subscribed) events_.subscribed(name);
    }
    if (kind == (sharded ? "sunsubscribe" : "unsubscribe")) erase_listening(name);
  };
  hooks.on_down = [this] {
    listening_.clear();
    if (events_.subscriptions_lost) events_.subscriptions_lost();
  };
  hooks.on_dropped = [this](std::string_view channel, const StoreError* why) {
    std::string_view name = lock_of(channel);
    erase_listening(name);
    if (why != nullptr) refused_notices(*why);
    if (!name.empty() && dropped_) dropped_(name, why);
  };
  hooks.on_refused = [this](const StoreError& why) { refused_notices(why); };
  sub_ = std::make_unique<RedisConnection>(loop, endpoint, settings, sharded ? Mode::kShardedPubSub : Mode::kPubSub,
                                           std::move(hooks));
}

RedisNodeStore::~RedisNodeStore() = default;

void RedisNodeStore::refused_notices(const StoreError& why) {
  // Nothing fails for it, so nothing else would tell.
  if (redis_acl_refusal(why) && events_.log)
    events_.log(true, why.describe() + ": no release notices; waiters wait for the holder's ttl to run out instead");
}

void RedisNodeStore::follow_sentinels(std::unique_ptr<SentinelWatcher> watcher) {
  sentinel_ = std::move(watcher);
  sentinel_->on_master([this](const Endpoint& master) {
    if (master.name() != conn_->name() && events_.log)
      events_.log(true, fmt::format("the sentinels give {} as the master (was {})", master.name(), conn_->name()));
    each_connection([&](RedisConnection& c) { c.set_endpoint(master); });
  });
  for (RedisConnection* c : {conn_.get(), renew_.get(), acquire_.get()})
    if (c != nullptr) c->require_master();
  conn_->set_down_hook([this] { sentinel_->refresh(); });
}

void RedisNodeStore::started() {
  // The command connection speaks for the node (three would repeat it).
  conn_->set_state_hook([this](bool up, const std::string& why) {
    if (events_.connection) events_.connection(conn_->name(), up, why);
  });
  batch_turn_.open();
  each_connection([](RedisConnection& c) { c.start(); });
  if (sentinel_) sentinel_->start();
}

void RedisNodeStore::acquire(std::span<const LockRef> locks, AcquireDone done) {
  auto each = CallDone<AcquireDone>::of(locks.size(), done);
  // After send_asking() the call goes at once, alone: its ASKING must come
  // right before it.
  const bool queued = !asking_;
  for (std::size_t i = 0; i < locks.size(); ++i) {
    const LockRef& l = locks[i];
    // A lone lock's queued lock takes the call's `done`; larger calls' share it.
    QueuedAcquire a{SmallString<40>(l.name), SmallString<32>(l.token), SmallString<16>(l.ttl_ms), i,
                    locks.size() == 1 ? std::move(each) : each, l.kind, l.waits};
    if (queued && l.kind.exclusive_kind()) {
      acquire_batch_.push_back(std::move(a));
    } else {
      std::vector<QueuedAcquire> alone;  // a kind's lock, or a call after an ASKING
      alone.push_back(std::move(a));
      send_batch(std::move(alone), false);
    }
  }
  if (queued) batch_turn_.request();
}

void RedisNodeStore::write_directly() {
  if (replicas_.min > 0 || layout_.redisson()) return;
  Capabilities offered = capabilities();
  offered.direct_lane = this;
  offer(offered);
  conn_->enable_lane();
}

// A thread that makes its calls in bursts (a fan-out's rounds: one thread
// asking for many locks at once, or a pool worker releasing the works it
// ran one after another) is kept off the lane for a while after each
// burst: its calls join the loop's batches, one script call for a round,
// where a round's first call written alone would cost a call of its own.
// A thread that calls one at a time (a lone caller, each of many blocking
// threads) keeps the lane.
bool RedisNodeStore::lane_open_at(std::chrono::steady_clock::time_point at) const noexcept {
  using Ticks = std::chrono::steady_clock::rep;
  constexpr Ticks kBurst = std::chrono::steady_clock::duration(std::chrono::microseconds(10)).count();
  constexpr Ticks kQuiet = std::chrono::steady_clock::duration(std::chrono::milliseconds(5)).count();
  thread_local Ticks last_call = 0;
  thread_local Ticks quiet_until = 0;
  const Ticks now = at.time_since_epoch().count();
  if (now - last_call < kBurst) quiet_until = now + kQuiet;
  last_call = now;
  return now >= quiet_until && conn_->lane_idle();
}

bool RedisNodeStore::acquire_direct(const LockRef& l, AcquiredDirect done) {
  if (!l.kind.exclusive_kind()) return false;  // the kinds' scripts go from the loop
  EvalRequest request = acquire_call(std::span(&l, 1));
  ReplyCallback cb = [c = conn_.get(), done = std::move(done)](const redisReply* r, const StoreError* err) {
    done(AcquireReply(r, err, 1, c->name()).next());
  };
  return conn_->send_direct(request, cb);
}

bool RedisNodeStore::release_direct(const LockRef& l, ReleasedDirect done) {
  if (!l.kind.exclusive_kind()) return false;
  EvalRequest request = release_one(l);
  ReplyCallback cb = [this, name = SmallString<40>(l.name), done = std::move(done)](const redisReply* r,
                                                                                     const StoreError* err) {
    ReleaseReply reply = release_reply(r, err, 1);
    const StoreError* why = nullptr;
    const Released status = heard_by(name, reply, &why);
    done(status, why);
  };
  return conn_->send_direct(request, cb);
}

bool RedisNodeStore::line_open_for(const LockRef& l) const {
  // The command connection's lane is idle only once write_directly() enabled it.
  return line_ != nullptr && l.kind.exclusive_kind() && conn_->lane_idle();
}

bool RedisNodeStore::acquire_blocking(const LockRef& l, const AcquiredDirect& done) {
  if (!line_open_for(l)) return false;
  const auto answered = [&](const redisReply* r, const StoreError* err) {
    done(AcquireReply(r, err, 1, line_->name()).next());
  };
  // Without an answer, the lock is given back behind the request.
  return line_->call(acquire_call(std::span(&l, 1)), answered, [&] { return release_one(l); }) !=
         CallerLine::Outcome::kNotSent;
}

bool RedisNodeStore::release_blocking(const LockRef& l, const ReleasedDirect& done) {
  if (!line_open_for(l)) return false;
  return line_->call(release_one(l), [&](const redisReply* r, const StoreError* err) {
           // As release_reply() and heard_by() without what is the loop's
           // (its log, its subscriptions): a notice heard once reads kYes.
           ReleaseReply reply(r, err, 1, line_->name());
           const StoreError* why = nullptr;
           const Released status = reply.next(&why);
           done(status, why);
         }) != CallerLine::Outcome::kNotSent;
}

void RedisNodeStore::release(std::span<const LockRef> locks, bool notify, ReleaseDone done) {
  auto each = CallDone<ReleaseDone>::of(locks.size(), done);
  const bool queued = !asking_;  // as acquire()
  std::vector<std::size_t> kinds;
  for (std::size_t i = 0; i < locks.size(); ++i) {
    if (!locks[i].kind.exclusive_kind()) {
      kinds.push_back(i);
      continue;
    }
    QueuedRelease r{SmallString<40>(locks[i].name), SmallString<32>(locks[i].token), notify, i,
                    locks.size() == 1 ? std::move(each) : each};
    if (queued) {
      release_batch_.push_back(std::move(r));
    } else {
      send_batch({std::move(r)}, false);
    }
  }
  if (!kinds.empty()) send_kind_release(with_asking(*conn_), locks, std::move(kinds), notify, std::move(each));
  if (queued) batch_turn_.request();
}

EvalRequest RedisNodeStore::kind_acquire_call(const QueuedAcquire& a) const {
  // KEYS: lock, holders, then a shared or permit lock's writer mark, a fair
  // one's queue and waiting, then the counter. ARGV: token, ttl, then the
  // kind argument, or a fair lock's channel and notice, then the owner.
  const bool fair = a.kind.mode() == LockKind::Mode::kFair;
  EvalRequest request(script(fair ? ScriptId::kAcquireFair : ScriptId::kAcquireKind), fair ? 5 : 4, fair ? 10 : 8,
                      owner_.size() + 8 * a.name.size() + a.token.size() + a.ttl_ms.size() + 128);
  request.arg(a.name).arg(redis_keys::holders(a.name));
  if (fair)
    request.arg(redis_keys::queue(a.name)).arg(redis_keys::waiting(a.name));
  else
    request.arg(redis_keys::writer_mark(a.name));
  request.arg(redis_keys::counter(key_prefix_, a.name)).arg(a.token).arg(a.ttl_ms);
  if (fair)
    request.arg(redis_keys::channel(a.name)).arg(notice());
  else
    request.arg(redis_keys::kind_arg(a.kind));
  request.arg(owner_);
  return request;
}

template <class Answer>
void RedisNodeStore::eval_tool(EvalRequest request, Answer answer, RedisConnection* on) {
  RedisConnection& c = with_asking(on != nullptr ? *on : *conn_);
  c.eval(std::move(request), [&c, answer = std::move(answer)](const redisReply* r, const StoreError* err) mutable {
    answer(r, err, std::string_view(c.name()));
  });
}

void RedisNodeStore::withdraw(const LockRef& lock, WithdrawDone done) {
  const std::string_view name = lock.name;
  eval_tool(EvalRequest::of(script(ScriptId::kWithdrawFair), 3, name, redis_keys::queue(name), redis_keys::waiting(name),
                            lock.token, redis_keys::channel(name), notice()),
            [done = std::move(done)](auto r, auto err, auto at) { done(or_null(read_withdraw(r, err, at))); });
}

void RedisNodeStore::send_kind_release(RedisConnection& c, std::span<const LockRef> locks,
                                       std::vector<std::size_t> indexes, bool notify,
                                       CallDone<ReleaseDone> done) {
  kinds_call<ReleaseReply>(
      c, ScriptId::kReleaseKind, locks, std::move(indexes), notice(),
      [notify](const LockRef& l) { return notify ? redis_keys::channel(l.name) : std::string(); }, std::move(done));
}

template <class T>
int RedisNodeStore::send_queued(std::deque<T>& queue) {
  const auto n = static_cast<std::ptrdiff_t>(std::min(queue.size(), kMaxBatch));
  std::vector<T> batch(std::make_move_iterator(queue.begin()), std::make_move_iterator(queue.begin() + n));
  queue.erase(queue.begin(), queue.begin() + n);
  if (!by_slot_ || batch.size() == 1) {
    send_batch(std::move(batch));
    return 1;
  }
  std::vector<std::uint16_t> slots(batch.size());
  std::ranges::transform(batch, slots.begin(), [](const T& q) { return key_slot(q.name); });
  const auto groups = group_by_slot(slots);
  for (const SlotGroup& g : groups) {
    std::vector<T> part;
    part.reserve(g.at.size());
    for (std::size_t i : g.at) part.push_back(std::move(batch[i]));
    send_batch(std::move(part));
  }
  return static_cast<int>(groups.size());
}

void RedisNodeStore::send_batches(bool all) {
  // Releases first: a lock given back and asked for again in one iteration
  // is free for the one who asks. Each script call counts in flight (a
  // batch split by slot may overshoot the bound by up to kMaxBatch calls).
  while (all || batches_in_flight_ < kMaxBatchesInFlight) {
    if (!release_batch_.empty()) {
      batches_in_flight_ += send_queued(release_batch_);
    } else if (!acquire_batch_.empty()) {
      batches_in_flight_ += send_queued(acquire_batch_);
    } else {
      break;
    }
  }
}

void RedisNodeStore::batch_answered() {
  --batches_in_flight_;
  send_batches();
}

void RedisNodeStore::send_batch(std::vector<QueuedAcquire> batch, bool counted) {
  // Either layout's script for a batch, or a kind's for its lock alone:
  // each answers one entry per lock, and each lock is handed its answer.
  EvalRequest request = batch.front().kind.exclusive_kind() ? acquire_call(batch) : kind_acquire_call(batch.front());
  RedisConnection& c = with_asking(for_acquire());
  c.eval(std::move(request),
         [this, &c, counted, batch = std::move(batch)](const redisReply* r, const StoreError* err) mutable {
           if (counted) batch_answered();
           AcquireReply reply(r, err, batch.size(), c.name());
           for (auto& a : batch)
             acquired(reply.next(), std::move(a));
         });
}

void RedisNodeStore::send_batch(std::vector<QueuedRelease> batch, bool counted) {
  // Either layout's script answers one entry per lock, and how many heard
  // its notice; each lock is handed its answer.
  EvalRequest request = release_call(batch, [](const QueuedRelease& r) { return r.notify; });
  with_asking(*conn_).eval(std::move(request),
                           [this, counted, batch = std::move(batch)](const redisReply* r, const StoreError* err) {
                             if (counted) batch_answered();
                             ReleaseReply reply = release_reply(r, err, batch.size());
                             for (const QueuedRelease& q : batch) {
                               const StoreError* why = nullptr;
                               const Released status = heard_by(q.name, reply, &why);
                               q.done(q.index, status, why);
                             }
                           });
}

void RedisNodeStore::acquired(Acquired out, QueuedAcquire a) {
  if (replicas_.min > 0 && out.status == Acquired::Status::kFailed && out.error.unavailable()) {
    // No answer on the acquisitions' own connection: the server may still
    // run the request once it reads it. The runtime's give-back goes on the
    // command connection, already open, which the server may read first;
    // this one goes behind the request on its own connection, after the
    // reconnect's handshake, which the server answers only once it has
    // read the old connection (see docs/how-it-works.md, "No answer").
    give_back_on_acquire_line(a, [](auto&&...) {});
  }
  if (out.status != Acquired::Status::kTaken || replicas_.min <= 0) {
    a.done(a.index, out);
    return;
  }
  // The lock write must reach min_replicas replicas before the lease is
  // handed out, so a failover right after cannot drop it.
  // On the acquisitions' own connection: WAIT counts that connection's
  // writes, and blocks only it (never a release or a renewal).
  wait_replicas(for_acquire(), replicas_.min, "lock write", [this, a = std::move(a), out](const StoreError* short_of) {
    if (short_of == nullptr) {
      a.done(a.index, out);
      return;
    }
    const Acquired failed = Acquired::failed(*short_of);
    // Give the lock back before the caller hears of the failure.
    give_back_on_acquire_line(a, [index = a.index, done = a.done, failed](auto&&...) { done(index, failed); });
  });
}

template <class Answer>
void RedisNodeStore::give_back_on_acquire_line(const QueuedAcquire& a, Answer answer) {
  const LockRef ref{a.name, a.token, {}, {}, a.kind};
  if (!a.kind.exclusive_kind()) {
    send_kind_release(for_acquire(), std::span<const LockRef>(&ref, 1), {0}, false,
                      CallDone<ReleaseDone>(std::move(answer)));
    return;
  }
  // Without a notice in the lockwatch layout.
  for_acquire().eval(release_call(std::span<const LockRef>(&ref, 1), [](const LockRef&) { return false; }),
                     std::move(answer));
}

std::size_t RedisNodeStore::renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive,
                                  RenewDone done) {
  if (replicas_.min <= 0) return renew_now(locks, std::move(keepalive), std::move(done));
  // With min_replicas a renewal counts only once the replicas the master
  // lists have it (ROLE, then WAIT, on the renewal connection; the answers
  // are kept until then): why, docs/stores.md, "Sentinel".
  struct Batch {
    std::vector<std::pair<Renewed, std::optional<StoreError>>> answers;  // each lease's status and why
    std::shared_ptr<const void> keepalive;  // the caller's views live until the last answer
    RenewDone done;
    // `failed`: why the renewals did not reach the replicas (null: they did).
    void deliver(const StoreError* failed) {
      for (std::size_t k = 0; k < answers.size(); ++k) {
        const auto& [status, why] = answers[k];
        if (status == Renewed::kYes && failed != nullptr)
          done(k, Renewed::kTransient, failed);
        else
          done(k, status, why ? &*why : nullptr);
      }
    }
  };
  auto batch = std::make_shared<Batch>(Batch{{locks.size(), {Renewed::kTransient, {}}}, keepalive, std::move(done)});
  const std::size_t commands =
      renew_now(locks, std::move(keepalive), [batch](std::size_t k, Renewed status, const StoreError* why) {
        batch->answers[k] = {status, why ? std::optional(*why) : std::nullopt};
      });
  renew_->command({"ROLE"}, [this, batch](const redisReply* role, const StoreError* err) {
    // ["master", offset, [[host, port, offset], ...]]: the replicas it has.
    long long listed = replicas_.min;
    if (err == nullptr && role->type == REDIS_REPLY_ARRAY && role->elements >= 3 && is_string(role->element[0]) &&
        text_of(role->element[0]) == "master" && role->element[2]->type == REDIS_REPLY_ARRAY)
      listed = static_cast<long long>(role->element[2]->elements);
    const long long needed = std::min<long long>(replicas_.min, listed);
    // ROLE failed (the renewals are transient for it), or no replica to wait for.
    if (err != nullptr || needed == 0) {
      batch->deliver(err);
      return;
    }
    wait_replicas(*renew_, needed, "renewal", [batch](const StoreError* short_of) { batch->deliver(short_of); });
  });
  return commands + 1;
}

std::size_t RedisNodeStore::renew_now(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive,
                                      RenewDone done) {
  if (std::any_of(locks.begin(), locks.end(), [](const LockRef& l) { return !l.kind.exclusive_kind(); }))
    return renew_mixed(locks, std::move(keepalive), std::move(done));
  // Written straight from the leases into the request, no argument strings:
  // the locks, then each one's token (in the redisson layout, its owner
  // field) and ttl. `keepalive` holds the leases until the reply.
  const std::size_t n = locks.size();
  const bool redisson = layout_.redisson();
  std::size_t bytes = 0;
  for (const auto& l : locks) bytes += l.name.size() + l.token.size() + l.ttl_ms.size() + layout_.client_id.size() + 64;
  EvalRequest request(script(redisson ? ScriptId::kRedissonRenew : ScriptId::kRenew), n, 3 * n, bytes);
  for (const auto& l : locks) request.arg(l.name);
  for (const auto& l : locks) (redisson ? request.arg(layout_.field(l.token)) : request.arg(l.token)).arg(l.ttl_ms);
  with_asking(*renew_).eval(std::move(request), [this, n, keepalive = std::move(keepalive), done = std::move(done)](
                                                    const redisReply* r, const StoreError* err) {
    RenewReply reply(r, err, n, renew_->name());
    for (std::size_t k = 0; k < n; ++k) {
      const StoreError* why = nullptr;
      const Renewed status = reply.next(&why);
      done(k, status, why);
    }
  });
  return 1;
}

std::size_t RedisNodeStore::renew_mixed(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive,
                                        RenewDone done) {
  // The exclusive leases as always (one call); the others in one kRenewKind
  // call, their arguments copied (they are few). Each call keeps the
  // leases alive until its answer (the callback is told about them).
  std::vector<LockRef> exclusive;
  std::vector<std::size_t> exclusive_at, kinds_at;
  for (std::size_t i = 0; i < locks.size(); ++i) {
    if (locks[i].kind.exclusive_kind()) {
      exclusive.push_back(locks[i]);
      exclusive_at.push_back(i);
    } else {
      kinds_at.push_back(i);
    }
  }
  auto shared_done = std::make_shared<RenewDone>(std::move(done));
  std::size_t commands = 0;
  const bool asking = asking_;  // both calls go after an ASKING
  if (!exclusive.empty()) {
    commands += renew_now(exclusive, keepalive, [shared_done, at = std::move(exclusive_at)](
                                                    std::size_t k, Renewed status, const StoreError* why) {
      (*shared_done)(at[k], status, why);
    });
  }
  asking_ = asking;
  kinds_call<RenewReply>(
      with_asking(*renew_), ScriptId::kRenewKind, locks, std::move(kinds_at), {},
      [](const LockRef& l) { return l.ttl_ms; }, CallDone<RenewDone>(std::move(shared_done)), std::move(keepalive));
  return commands + 1;
}

void RedisNodeStore::raise_fence(std::string_view name, std::uint64_t fence, RaiseDone done) {
  raise_fence_or_error(name, fence, [done = std::move(done)](const StoreError* err) { done(err == nullptr); });
}

void RedisNodeStore::raise_fence_or_error(std::string_view name, std::uint64_t fence,
                                          std::function<void(const StoreError*)> done) {
  eval_tool(EvalRequest::of(script(ScriptId::kRaiseFence), 1, redis_keys::counter(key_prefix_, name),
                            std::to_string(fence)),
            [done = std::move(done)](auto r, auto err, auto at) { done(or_null(read_raise_fence(r, err, at))); });
}

void RedisNodeStore::reserve_tokens(const LockRef& lock, std::uint32_t n, ReserveDone done) {
  // With min_replicas, the raised counter must reach the replicas before
  // its tokens are handed out, as a lock write must (a failover must not
  // hand a later holder a token below them): on the acquisitions'
  // connection, then WAIT; short of it, no tokens.
  eval_tool(
      EvalRequest::of(script(ScriptId::kReserveTokens), 2, lock.name, redis_keys::counter(key_prefix_, lock.name),
                      lock.token, std::to_string(n)),
      [this, done = std::move(done)](auto r, auto err, auto at) mutable {
        std::optional<StoreError> failed;
        const auto last = read_reserve_tokens(r, err, at, failed);
        if (failed || last == 0 || replicas_.min <= 0) return done(last, or_null(failed));
        wait_replicas(for_acquire(), replicas_.min, "token reservation",
                      [last, done = std::move(done)](const StoreError* short_of) {
                        done(short_of == nullptr ? last : 0, short_of);
                      });
      },
      replicas_.min > 0 ? &for_acquire() : nullptr);
}

void RedisNodeStore::wait_replicas(RedisConnection& c, long long needed, std::string_view what,
                                   std::function<void(const StoreError*)> done) {
  c.command({"WAIT", std::to_string(needed), std::to_string(replicas_.ack_timeout.count())},
            [&c, needed, what, done = std::move(done)](const redisReply* w, const StoreError* werr) {
              const long long acks = (!werr && w->type == REDIS_REPLY_INTEGER) ? w->integer : 0;
              if (acks >= needed) return done(nullptr);
              const StoreError short_of =
                  werr ? *werr
                       : StoreError::unavailable(c.name(), fmt::format("the {} reached {} of the {} replicas required",
                                                                       what, acks, needed));
              done(&short_of);
            });
}

void RedisNodeStore::server_time(TimeDone done) {
  conn_->command({"TIME"}, [endpoint = conn_->name(), done = std::move(done)](const redisReply* r,
                                                                               const StoreError* err) {
    if (err) return done({}, err);
    // TIME: seconds, microseconds.
    if (is_array_of(r, 2)) return done(server_clock(number_of(r->element[0]), number_of(r->element[1])), nullptr);
    const StoreError unexpected = StoreError::refused(endpoint, "unexpected reply to TIME");
    done({}, &unexpected);
  });
}

void RedisNodeStore::claim_period(std::string_view name, std::string_view token, std::int64_t period,
                                  std::chrono::system_clock::time_point start,
                                  ClaimDone done) {
  auto start_ms = std::chrono::duration_cast<std::chrono::milliseconds>(start.time_since_epoch()).count();
  eval_tool(EvalRequest::of(script(ScriptId::kClaimPeriod), 2, name, redis_keys::period(name), token,
                            std::to_string(period), std::to_string(start_ms)),
            [done = std::move(done)](auto r, auto err, auto at) { done(read_claim_period(r, err, at)); });
}

void RedisNodeStore::inspect(std::string_view name, InspectDone done) {
  std::string lock(name);
  eval_tool(EvalRequest::of(script(ScriptId::kInspect), 2, lock, redis_keys::counter(key_prefix_, lock),
                            redis_keys::legacy_fence(lock)),
            [lock, done = std::move(done)](auto r, auto err, auto at) {
              LockInfo info;
              const auto failed = read_inspect(r, err, at, lock, info);
              done(info, or_null(failed));
            });
}

struct RedisNodeStore::Listing {
  std::string match;  // P{<prefix>*}: lock names only (the others do not end in '}')
  std::size_t limit = 0;
  std::string cursor = "0";
  std::vector<LockInfo> found;
  ListDone done;
};

void RedisNodeStore::list_locks(std::string_view prefix, std::size_t limit, ListDone done) {
  scan_page(std::make_shared<Listing>(
      Listing{glob_escaped(key_prefix_) + "{" + glob_escaped(prefix) + "*}", limit, "0", {}, std::move(done)}));
}

void RedisNodeStore::scan_page(std::shared_ptr<Listing> listing) {
  conn_->command({"SCAN", listing->cursor, "MATCH", listing->match, "COUNT", "1000"},
                 [this, listing](const redisReply* r, const StoreError* err) {
    if (err) return listing->done({}, err);
    if (!is_array_of(r, 2) || !is_string(r->element[0]) || r->element[1]->type != REDIS_REPLY_ARRAY) {
      const StoreError bad = StoreError::refused(conn_->name(), "unexpected reply to SCAN");
      return listing->done({}, &bad);
    }
    listing->cursor.assign(text_of(r->element[0]));
    struct Page {
      std::vector<std::string> names;
      std::vector<LockInfo> infos;
      std::size_t answered = 0;
      std::optional<StoreError> error;
    };
    auto page = std::make_shared<Page>();
    for (const redisReply* n : std::span(r->element[1]->element, r->element[1]->elements))
      if (is_string(n)) page->names.emplace_back(text_of(n));
    page->infos.resize(page->names.size());
    auto finish_page = [this, listing, page] {
      if (page->error) return listing->done({}, &*page->error);
      const std::size_t prefix = key_prefix_.size() + 1;  // P{
      for (std::size_t i = 0; i < page->names.size() && listing->found.size() < listing->limit; ++i) {
        if (!page->infos[i].held) continue;
        page->infos[i].key = page->names[i].substr(prefix, page->names[i].size() - prefix - 1);
        listing->found.push_back(std::move(page->infos[i]));
      }
      if (listing->cursor == "0" || listing->found.size() >= listing->limit)
        return listing->done(std::move(listing->found), nullptr);
      scan_page(listing);
    };
    if (page->names.empty()) return finish_page();
    for (std::size_t i = 0; i < page->names.size(); ++i)
      inspect(page->names[i], [page, i, finish_page](const LockInfo& info, const StoreError* e) {
        // A name that is no lock (a user's key without expiry) is left out.
        if (e && e->kind != StoreError::Kind::kRefused && !page->error) page->error = *e;
        page->infos[i] = info;
        if (++page->answered == page->names.size()) finish_page();
      });
  });
}

void RedisNodeStore::force_release(std::string_view name, ForceDone done) {
  eval_tool(EvalRequest::of(script(ScriptId::kForceRelease), 1, name, redis_keys::channel(name), notice()),
            [done = std::move(done)](auto r, auto err, auto at) {
              bool held = false;
              const auto failed = read_force_release(r, err, at, held);
              done(held, or_null(failed));
            });
}

RedisConnection& RedisNodeStore::with_asking(RedisConnection& c) {
  if (asking_) {
    c.ask_next();
    asking_ = false;
  }
  return c;
}

std::string RedisNodeStore::notice() const { return notices_ == Notices::kSharded ? "s" : "p"; }

void RedisNodeStore::subscribe(std::string_view name) { sub_->subscribe(channel_of(name)); }
void RedisNodeStore::unsubscribe(std::string_view name) {
  erase_listening(name);  // from now on a notice heard once is another's
  sub_->unsubscribe(channel_of(name));
}

std::string RedisNodeStore::channel_of(std::string_view name) const {
  return layout_.redisson() ? redisson_keys::channel(name) : redis_keys::channel(name);
}

std::string_view RedisNodeStore::lock_of(std::string_view channel) const {
  return layout_.redisson() ? redisson_keys::lock_of_channel(channel) : redis_keys::lock_of_channel(channel);
}

// A lone lock's release, as send_batch() writes a batch of one (with its
// notice).
EvalRequest RedisNodeStore::release_one(const LockRef& l) const {
  return release_call(std::span<const LockRef>(&l, 1), [](const LockRef&) { return true; });
}

// In the lockwatch layout: each lock's keys (itself, its slot's counter,
// its old counter), then each one's token and ttl ('w' first for a call
// that waits), then the owner's name.
template <class Locks>
EvalRequest RedisNodeStore::acquire_call(const Locks& locks) const {
  if (layout_.redisson()) {
    std::size_t bytes = 0;
    for (const auto& a : locks)
      bytes += 4 * a.name.size() + a.token.size() + layout_.client_id.size() + a.ttl_ms.size() + 128;
    EvalRequest request(script(ScriptId::kRedissonAcquire), 3 * locks.size(), 5 * locks.size(), bytes);
    for (const auto& a : locks)
      request.arg(a.name).arg(redisson_keys::token_counter(a.name)).arg(redisson_keys::latch(a.name, a.token));
    for (const auto& a : locks) request.arg(layout_.field(a.token)).arg(a.ttl_ms);
    return request;
  }
  std::size_t bytes = owner_.size();
  for (const auto& a : locks) bytes += 3 * a.name.size() + a.token.size() + a.ttl_ms.size() + 64;
  EvalRequest request(script(ScriptId::kAcquire), 3 * locks.size(), 5 * locks.size() + 1, bytes);
  for (const auto& a : locks) {
    request.arg(a.name);
    request.arg(key_prefix_, redis_keys::kCounterInfix, "{", slot_tag(key_slot(a.name)), "}");
    request.arg(a.name, redis_keys::kFenceSuffix);
  }
  for (const auto& a : locks) request.arg(a.token).arg(a.waits ? "w" : "", a.ttl_ms);
  request.arg(owner_);
  return request;
}

// In the lockwatch layout: each lock's channel where notify(lock) says its
// release is told, else ''.
template <class Locks, class Notify>
EvalRequest RedisNodeStore::release_call(const Locks& locks, Notify notify) const {
  std::size_t bytes = 0;
  if (layout_.redisson()) {
    for (const auto& r : locks) bytes += 3 * r.name.size() + r.token.size() + layout_.client_id.size() + 128;
    EvalRequest request(script(ScriptId::kRedissonRelease), 2 * locks.size(), 1 + 5 * locks.size(), bytes);
    for (const auto& r : locks) request.arg(r.name).arg(redisson_keys::latch(r.name, r.token));
    request.arg(notice());
    // The unlock latch's expiry: Redisson keeps its latch for its command
    // timeout times its retries; a retry of ours comes within two.
    const std::string keep = std::to_string(std::max<long long>(1000, 2 * command_timeout_.count()));
    // Every release is announced, even of a lock given back unused: a
    // Redisson waiter that found it busy meanwhile waits for the message (or
    // else for the whole lease), and no lockwatch bookkeeping says whether
    // one did.
    for (const auto& r : locks) request.arg(layout_.field(r.token)).arg(redisson_keys::channel(r.name)).arg(keep);
    return request;
  }
  for (const auto& r : locks) bytes += 2 * r.name.size() + r.token.size() + 48;
  EvalRequest request(script(ScriptId::kRelease), locks.size(), 1 + 3 * locks.size(), bytes);
  for (const auto& r : locks) request.arg(r.name);
  request.arg(notice());
  for (const auto& r : locks) {
    request.arg(r.token);
    if (notify(r))
      request.arg(r.name, redis_keys::kChannelSuffix);
    else
      request.arg(std::string_view());
  }
  return request;
}

void RedisNodeStore::erase_listening(std::string_view name) {
  if (auto it = listening_.find(name); it != listening_.end()) listening_.erase(it);
}

ReleaseReply RedisNodeStore::release_reply(const redisReply* r, const StoreError* err, std::size_t locks) {
  // A release whose notice the ACL refused deleted the lock, but is
  // unconfirmed: only a log line tells why.
  if (err != nullptr && redis_acl_refusal(*err) && events_.log)
    events_.log(true, err->describe() + ": the release is unconfirmed");
  return ReleaseReply(r, err, locks, conn_->name());
}

Released RedisNodeStore::heard_by(std::string_view name, ReleaseReply& reply, const StoreError** why) const {
  bool heard_once = false;
  const Released status = reply.next(why, &heard_once);
  // One listener on the node, and ours is confirmed there: it was ours.
  if (heard_once && listening_.find(name) != listening_.end()) return Released::kYesUnheard;
  return status;
}

void RedisNodeStore::close() {
  // What is queued goes to the connection, which fails it as it closes:
  // every callback runs.
  send_batches(true);
  batch_turn_.close();
  if (sentinel_) sentinel_->close();
  each_connection([](RedisConnection& c) { c.close(); });
}

}  // namespace lockwatch::detail
