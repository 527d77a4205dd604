// The redisson layout (`?layout=redisson`, docs/redisson.md) against
// clients no one here wrote, on a real redis-server and a real Redis
// Cluster: a lockwatch runtime shares locks with
//  - node-redisson (the npm package, tests/redisson/peer.js, driven one
//    line at a time through stdin), and
//  - Redisson's protocol itself, as RedissonLock, RedissonBaseLock,
//    LockPubSub and RedissonFencedLock run it: their scripts' commands on
//    the lock's hash, its channel and its token counter, and a waiter that
//    subscribes (SSUBSCRIBE on a Cluster, as Redisson does where servers
//    have sharded pub/sub) and tries again on the unlock message.
// Each side excludes the other, wakes the other's waiter within 50 ms of
// its release, holds reentrantly, and loses a lease the other then takes.
//
// node-redisson speaks classic pub/sub even on a Cluster (Java's Redisson
// uses SSUBSCRIBE/SPUBLISH there, and lockwatch follows Java): on the
// Cluster the node-redisson cases check exclusion only, and the wake-ups
// are checked with the protocol side.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <chrono>
#include <deque>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/loop.hpp"
#include "lockwatch/lockwatch.hpp"
#include "store/redis/cluster_slot.hpp"
#include "store/redis/layout.hpp"
#include "store/redis/node_store.hpp"
#include "support/redis_cluster.hpp"
#include "test_util.hpp"

#ifndef LOCKWATCH_REDISSON_PEER
#error "LOCKWATCH_REDISSON_PEER: the path of tests/redisson/peer.js"
#endif

namespace lockwatch::testing {
namespace {

using Clock = std::chrono::steady_clock;

// How soon a waiter must hold the lock after the other side let it go.
constexpr auto kWakeBound = 50ms;

// Redisson's protocol, written from its source: each script runs the
// commands Redisson's own does, with its KEYS and ARGV.
// RedissonLock.tryLockInnerAsync: nil taken (or entered again), else PTTL.
constexpr const char* kTryLock = R"lua(
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])
)lua";
// RedissonFencedLock's: the same, taking a token from its counter (on
// every entry): {-1, token} taken, else {PTTL, -1}.
constexpr const char* kTryFencedLock = R"lua(
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
  local token = redis.call('incr', KEYS[2])
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {-1, token}
end
return {redis.call('pttl', KEYS[1]), -1}
)lua";
// RedissonBaseLock.renewExpirationAsync: 1 extended, 0 not ours.
constexpr const char* kRenew = R"lua(
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 1
end
return 0
)lua";
// RedissonLock.unlockInnerAsync. KEYS: lock, channel, latch. ARGV: unlock
// message, lease, field, publish command, latch ms. nil not ours, 0 still
// held (reentered), 1 released.
constexpr const char* kUnlock = R"lua(
local done = redis.call('get', KEYS[3])
if done ~= false then return tonumber(done) end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('set', KEYS[3], 0, 'px', ARGV[5])
  return 0
end
redis.call('del', KEYS[1])
redis.call(ARGV[4], KEYS[2], ARGV[1])
redis.call('set', KEYS[3], 1, 'px', ARGV[5])
return 1
)lua";
// RedissonLock.forceUnlockAsync.
constexpr const char* kForceUnlock = R"lua(
if redis.call('del', KEYS[1]) == 1 then
  redis.call(ARGV[2], KEYS[2], ARGV[1])
  return 1
end
return 0
)lua";

// RedissonObject.prefixName.
std::string prefixed(const std::string& prefix, const std::string& name) {
  return name.find('{') == std::string::npos ? prefix + ":{" + name + "}" : prefix + ":" + name;
}
std::string channel_of(const std::string& name) { return prefixed("redisson_lock__channel", name); }

enum class Where { kNode, kCluster };
std::string where_name(const ::testing::TestParamInfo<Where>& info) {
  return info.param == Where::kCluster ? "Cluster" : "Node";
}

// node-redisson in a child process (tests/redisson/peer.js).
class NodePeer {
 public:
  NodePeer(Where where, const std::string& ports)
      : child_({"node", LOCKWATCH_REDISSON_PEER, where == Where::kCluster ? "cluster" : "single", ports, "3000"}, {},
               /*piped_stdin=*/true) {
    const auto first = child_.read_line(kBound);
    ready_ = first == std::optional<std::string>("ready");
    if (!ready_)
      ADD_FAILURE() << "node-redisson did not start (" << first.value_or("no output")
                    << "); scripts/setup installs it in tests/redisson";
  }
  ~NodePeer() {
    child_.close_stdin();
    try {
      child_.wait(kBound);
    } catch (const std::exception&) {
    }
  }
  bool ready() const { return ready_; }
  // Sends a command; its id.
  int send(const std::string& command, const std::string& name, const std::string& rest = "") {
    const int id = ++next_;
    child_.write_line(command + " " + std::to_string(id) + " " + name + (rest.empty() ? "" : " " + rest));
    return id;
  }
  // The next answer (bounded by `bound`), or empty.
  std::string answer(std::chrono::milliseconds bound = kBound) {
    if (early_.empty()) return next_answer(Clock::now() + bound);
    std::string line = std::move(early_.front());
    early_.pop_front();
    return line;
  }
  // Whether a waiter's listener for `channel` came to be in place within
  // kBound (peer.js's "listening" line): only then does it hear a release.
  bool listening(const std::string& channel) {
    const auto until = Clock::now() + kBound;
    while (listening_.count(channel) == 0 && Clock::now() < until) {
      std::string line = next_answer(until);
      if (!line.empty()) early_.push_back(std::move(line));
    }
    const auto it = listening_.find(channel);
    if (it == listening_.end()) return false;
    listening_.erase(it);
    return true;
  }
  std::string answer_of(int id, const std::string& what, std::chrono::milliseconds bound = kBound) {
    const std::string line = answer(bound);
    EXPECT_EQ(line.rfind(what + " " + std::to_string(id), 0), 0u) << "answer: '" << line << "'";
    return line;
  }
  // lock() and its answer.
  void lock(const std::string& name, int lease_ms = 0) {
    answer_of(send("lock", name, std::to_string(lease_ms)), "locked");
  }
  // tryLock(0 wait): whether it was taken.
  bool try_lock(const std::string& name, int lease_ms = 0) {
    const int id = send("try", name, "0 " + std::to_string(lease_ms));
    return answer_of(id, "try") == "try " + std::to_string(id) + " true";
  }
  // unlock(): "" when done, else node-redisson's error.
  std::string unlock(const std::string& name) {
    const int id = send("unlock", name);
    const std::string line = answer(kBound);
    if (line == "unlocked " + std::to_string(id)) return "";
    return line.empty() ? "no answer" : line;
  }

 private:
  // The next line but "listening" ones (noted in listening_), or empty at `until`.
  std::string next_answer(Clock::time_point until) {
    while (Clock::now() < until) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()) + 1ms;
      std::optional<std::string> line = child_.read_line(left);
      if (!line) return "";
      if (line->rfind("listening ", 0) != 0) return *line;
      listening_.insert(line->substr(10));
    }
    return "";
  }

  ChildProcess child_;
  bool ready_ = false;
  int next_ = 0;
  std::deque<std::string> early_;        // answers read while looking for a "listening" line
  std::multiset<std::string> listening_;  // channels with a listener in place, not yet asked for
};

// A waiter on one lock's release channel, as Redisson's LockPubSub
// subscribes: SUBSCRIBE on one node, SSUBSCRIBE on a Cluster's node that
// serves the channel's slot.
class ChannelWaiter {
 public:
  ChannelWaiter(int port, const std::string& channel, bool sharded) {
    timeval tv{static_cast<long>(std::chrono::seconds(kBound).count()), 0};
    c_ = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c_ == nullptr || c_->err != 0) return;
    redisSetTimeout(c_, tv);
    auto* r = static_cast<redisReply*>(redisCommand(c_, "%s %s", sharded ? "SSUBSCRIBE" : "SUBSCRIBE", channel.c_str()));
    subscribed_ = r != nullptr && r->type == REDIS_REPLY_ARRAY;
    if (r != nullptr) freeReplyObject(r);
  }
  ~ChannelWaiter() {
    if (c_ != nullptr) redisFree(c_);
  }
  bool subscribed() const { return subscribed_; }
  // The next message's payload (bounded), or nullopt.
  std::optional<std::string> message() {
    void* raw = nullptr;
    if (redisGetReply(c_, &raw) != REDIS_OK || raw == nullptr) return std::nullopt;
    auto* r = static_cast<redisReply*>(raw);
    std::optional<std::string> out;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 3) out = std::string(r->element[2]->str, r->element[2]->len);
    freeReplyObject(r);
    return out;
  }

 private:
  redisContext* c_ = nullptr;
  bool subscribed_ = false;
};

class RedissonTest : public ::testing::TestWithParam<Where> {
 protected:
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (cluster()) {
      if (cluster_ == nullptr) cluster_ = new RedisCluster();
      ASSERT_EQ(cluster_->wait_healthy(kBound), "");
    } else if (server_ == nullptr) {
      server_ = new RedisServer();
    }
    field_ = "5a2d7bd1-62d3-4c2c-8a4e-3b0f0e2a9c11:" + std::to_string(1 + ++thread_);
  }

  bool cluster() const { return GetParam() == Where::kCluster; }
  std::string key() const {
    return std::string("acct:") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  Options options() const {
    Options o;
    o.redis_url = (cluster() ? cluster_->url() : server_->url()) + "?layout=redisson";
    o.runtime.threads = 2;
    return o;
  }
  std::string peer_ports() const {
    if (!cluster()) return std::to_string(server_->port());
    return std::to_string(cluster_->node(0).port()) + "," + std::to_string(cluster_->node(1).port());
  }
  // On the master of `name`'s slot.
  Reply command(const std::string& name, const std::vector<std::string>& args) const {
    return cluster() ? cluster_->command_for(name, args) : server_->command(args);
  }
  int port_of(const std::string& name) const {
    return cluster() ? cluster_->node(cluster_->master_of_slot(detail::key_slot(name))).port() : server_->port();
  }
  std::string publish() const { return cluster() ? "spublish" : "publish"; }
  // Subscribers of `name`'s release channel on its node.
  long long listeners(const std::string& name) const {
    Reply r = command(name, {"PUBSUB", cluster() ? "SHARDNUMSUB" : "NUMSUB", channel_of(name)});
    return r.elements.size() == 2 ? r.elements[1].integer : -1;
  }
  // Waits (bounded) until `n` subscribers listen for `name`'s release.
  bool heard_by(const std::string& name, long long n) const {
    const auto until = Clock::now() + kBound;
    while (listeners(name) < n && Clock::now() < until) std::this_thread::sleep_for(2ms);  // polling the server
    return listeners(name) >= n;
  }

  // The protocol side: Redisson's own commands, owner field_.
  Reply try_lock(const std::string& name, long long lease_ms = 10000) const {
    return command(name, {"EVAL", kTryLock, "1", name, std::to_string(lease_ms), field_});
  }
  // The token RFencedLock got (0: busy).
  long long try_fenced_lock(const std::string& name, long long lease_ms = 10000) const {
    Reply r = command(name, {"EVAL", kTryFencedLock, "2", name, prefixed("redisson_lock_token", name),
                             std::to_string(lease_ms), field_});
    if (r.elements.size() != 2) {
      ADD_FAILURE() << "RFencedLock's script answered no pair";
      return 0;
    }
    return r.elements[0].integer == -1 ? r.elements[1].integer : 0;
  }
  Reply renew(const std::string& name, long long lease_ms = 10000) const {
    return command(name, {"EVAL", kRenew, "1", name, std::to_string(lease_ms), field_});
  }
  Reply unlock(const std::string& name) {
    const std::string latch = prefixed("redisson_unlock_latch", name) + ":request-" + std::to_string(++request_);
    return command(name, {"EVAL", kUnlock, "3", name, channel_of(name), latch, "0", "10000", field_, publish(), "1000"});
  }
  Reply force_unlock(const std::string& name) const {
    return command(name, {"EVAL", kForceUnlock, "2", name, channel_of(name), "0", publish()});
  }
  long long count_of(const std::string& name, const std::string& field) const {
    Reply r = command(name, {"HGET", name, field});
    return r.type == Reply::Type::kString ? std::stoll(r.str) : 0;
  }
  // The lock's hash: how many owner fields it holds.
  long long owners(const std::string& name) const { return command(name, {"HLEN", name}).integer; }

  static RedisServer* server_;
  static RedisCluster* cluster_;
  std::string field_;  // the protocol side's `<UUID>:<thread id>`
  static inline int thread_ = 0;
  int request_ = 0;
};

RedisServer* RedissonTest::server_ = nullptr;
RedisCluster* RedissonTest::cluster_ = nullptr;

// A lockwatch waiter for `name` (1 s ttl, renewed; 10 s wait).
std::future<LockHandle> waiting(Runtime& rt, const std::string& name) {
  return rt.acquire({.key = name, .ttl = 1s, .retries = forever, .wait = 10s});
}

bool ready_within(std::future<LockHandle>& f, std::chrono::milliseconds bound) {
  return f.wait_for(bound) == std::future_status::ready;
}

// When a lockwatch waiter's future became ready, seen by a thread of its
// own that waits from before the release: the time the releasing side
// takes to answer its own caller (a Node.js peer's reply on a loaded
// machine, the test's command) does not count against the waiter's wake.
class ReadyAt {
 public:
  explicit ReadyAt(std::future<LockHandle>& f)
      : at_(std::async(std::launch::async, [&f] {
          return ready_within(f, kBound) ? Clock::now() : Clock::time_point::max();
        })) {}
  // How long after `t0` it was ready (Clock::duration::max(): not within kBound).
  Clock::duration since(Clock::time_point t0) {
    const auto at = at_.get();
    return at == Clock::time_point::max() ? Clock::duration::max() : at - t0;
  }

 private:
  std::future<Clock::time_point> at_;
};

TEST_P(RedissonTest, ALockwatchLockIsRedissonsHashAndExcludesBothKindsOfPeer) {
  Runtime rt(options());
  const std::string k = key();
  auto held = rt.acquire(k, 5s);
  LockHandle h = get_bounded(held);
  // The layout: a hash under the key itself, one field `<uuid>:<thread
  // id>` entered once, with the lease as its expiry; RFencedLock's token.
  EXPECT_EQ(command(k, {"TYPE", k}).str, "hash");
  Reply fields = command(k, {"HGETALL", k});
  ASSERT_EQ(fields.elements.size(), 2u);
  const std::string field = fields.elements[0].str;
  EXPECT_EQ(field.size(), 37u + std::to_string(std::stoull(field.substr(37))).size());
  EXPECT_EQ(field[8], '-');
  EXPECT_EQ(field[14], '4') << "a version-4 UUID, as Java's UUID.randomUUID()";
  EXPECT_EQ(field[36], ':');
  EXPECT_EQ(fields.elements[1].str, "1");
  const long long pttl = command(k, {"PTTL", k}).integer;
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 5000);
  EXPECT_EQ(command(k, {"GET", prefixed("redisson_lock_token", k)}).str, std::to_string(h.lease().fencing_token()));
  EXPECT_EQ(command(k, {"EXISTS", "lockwatch:{" + k + "}"}).integer, 0) << "no prefix, no lockwatch key";

  // Redisson's own acquire finds it busy, with the lease left.
  Reply busy = try_lock(k);
  ASSERT_EQ(busy.type, Reply::Type::kInteger);
  EXPECT_GT(busy.integer, 0);
  EXPECT_EQ(owners(k), 1);
  // Nor can it unlock or renew what is not its own.
  EXPECT_EQ(unlock(k).type, Reply::Type::kNil);
  EXPECT_EQ(renew(k).integer, 0);
  {
    NodePeer peer(GetParam(), peer_ports());
    ASSERT_TRUE(peer.ready());
    EXPECT_FALSE(peer.try_lock(k));
  }
  auto released = h.release();
  get_bounded(released);
  EXPECT_EQ(command(k, {"EXISTS", k}).integer, 0);
  // Free now: Redisson takes it.
  EXPECT_EQ(try_lock(k).type, Reply::Type::kNil);
  EXPECT_EQ(unlock(k).integer, 1);
}

TEST_P(RedissonTest, ARedissonHoldExcludesLockwatchUntilItsRelease) {
  Runtime rt(options());
  const std::string k = key();
  ASSERT_EQ(try_lock(k).type, Reply::Type::kNil);
  auto refused = rt.acquire({.key = k, .ttl = 5s, .retries = forever, .wait = 0ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(refused));
  EXPECT_EQ(count_of(k, field_), 1);
  ASSERT_EQ(unlock(k).integer, 1);
  auto taken = rt.acquire({.key = k, .ttl = 5s, .retries = forever, .wait = 0ms});
  EXPECT_TRUE(get_bounded(taken));

  NodePeer peer(GetParam(), peer_ports());
  ASSERT_TRUE(peer.ready());
  const std::string k2 = k + ":node";
  peer.lock(k2);
  auto refused2 = rt.acquire({.key = k2, .ttl = 5s, .retries = forever, .wait = 0ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(refused2));
  EXPECT_EQ(peer.unlock(k2), "");
  auto taken2 = rt.acquire({.key = k2, .ttl = 5s, .retries = forever, .wait = 0ms});
  EXPECT_TRUE(get_bounded(taken2));
}

TEST_P(RedissonTest, ALockwatchWaiterWakesWithinFiftyMsOfRedissonsRelease) {
  Runtime rt(options());
  const std::string k = key();
  // The protocol side (PUBLISH, or SPUBLISH on a Cluster).
  ASSERT_EQ(try_lock(k).type, Reply::Type::kNil);
  auto f = waiting(rt, k);
  ASSERT_TRUE(heard_by(k, 1));
  EXPECT_FALSE(ready_within(f, 0ms));
  ReadyAt ready(f);
  auto t0 = Clock::now();
  ASSERT_EQ(unlock(k).integer, 1);
  EXPECT_LE(ready.since(t0), kWakeBound);
  ASSERT_TRUE(ready_within(f, kBound));
  EXPECT_TRUE(f.get());
  if (cluster()) return;  // node-redisson PUBLISHes on a Cluster too: no sharded subscriber hears it

  NodePeer peer(GetParam(), peer_ports());
  ASSERT_TRUE(peer.ready());
  const std::string k2 = k + ":node";
  peer.lock(k2);
  auto f2 = waiting(rt, k2);
  ASSERT_TRUE(heard_by(k2, 1));
  ReadyAt ready2(f2);
  t0 = Clock::now();
  EXPECT_EQ(peer.unlock(k2), "");
  EXPECT_LE(ready2.since(t0), kWakeBound);
  ASSERT_TRUE(ready_within(f2, kBound));
}

TEST_P(RedissonTest, RedissonWaitersWakeWithinFiftyMsOfALockwatchRelease) {
  Runtime rt(options());
  const std::string k = key();
  auto held = rt.acquire(k, 5s);
  LockHandle h = get_bounded(held);
  // Redisson's waiter: subscribed, found the lock busy, waits for the
  // unlock message and tries again.
  ChannelWaiter waiter(port_of(k), channel_of(k), cluster());
  ASSERT_TRUE(waiter.subscribed());
  ASSERT_EQ(try_lock(k).type, Reply::Type::kInteger);
  auto t0 = Clock::now();
  auto released = h.release();
  EXPECT_EQ(waiter.message(), std::optional<std::string>("0")) << "Redisson's unlock message";
  EXPECT_EQ(try_lock(k).type, Reply::Type::kNil);
  EXPECT_LE(Clock::now() - t0, kWakeBound);
  get_bounded(released);
  EXPECT_EQ(unlock(k).integer, 1);
  if (cluster()) return;  // node-redisson SUBSCRIBEs on a Cluster: SPUBLISH does not reach it

  NodePeer peer(GetParam(), peer_ports());
  ASSERT_TRUE(peer.ready());
  const std::string k2 = k + ":node";
  auto held2 = rt.acquire(k2, 5s);
  LockHandle h2 = get_bounded(held2);
  const int id = peer.send("lock", k2, "0");
  ASSERT_TRUE(peer.listening(channel_of(k2)));
  t0 = Clock::now();
  auto released2 = h2.release();
  peer.answer_of(id, "locked");
  EXPECT_LE(Clock::now() - t0, kWakeBound);
  EXPECT_EQ(peer.unlock(k2), "");
}

TEST_P(RedissonTest, AReentrantRedissonHoldKeepsLockwatchOutUntilTheLastUnlock) {
  Runtime rt(options());
  const std::string k = key();
  ASSERT_EQ(try_lock(k).type, Reply::Type::kNil);
  ASSERT_EQ(try_lock(k).type, Reply::Type::kNil);  // entered again
  EXPECT_EQ(count_of(k, field_), 2);
  auto f = waiting(rt, k);
  ASSERT_TRUE(heard_by(k, 1));
  EXPECT_EQ(unlock(k).integer, 0) << "still held once";
  EXPECT_FALSE(ready_within(f, 100ms)) << "the first unlock neither frees nor announces it";
  ReadyAt ready(f);
  auto t0 = Clock::now();
  EXPECT_EQ(unlock(k).integer, 1);
  EXPECT_LE(ready.since(t0), kWakeBound);
  ASSERT_TRUE(ready_within(f, kBound));
  EXPECT_TRUE(f.get());

  if (cluster()) return;
  NodePeer peer(GetParam(), peer_ports());
  ASSERT_TRUE(peer.ready());
  const std::string k2 = k + ":node";
  peer.lock(k2);
  peer.lock(k2);  // the same lock object: reentrant
  EXPECT_EQ(owners(k2), 1);
  auto f2 = waiting(rt, k2);
  ASSERT_TRUE(heard_by(k2, 1));
  EXPECT_EQ(peer.unlock(k2), "");
  EXPECT_FALSE(ready_within(f2, 100ms));
  ReadyAt ready2(f2);
  t0 = Clock::now();
  EXPECT_EQ(peer.unlock(k2), "");
  EXPECT_LE(ready2.since(t0), kWakeBound);
  ASSERT_TRUE(ready_within(f2, kBound));
}

TEST_P(RedissonTest, AReentrantLockwatchHoldKeepsRedissonOutUntilTheOuterRelease) {
  Runtime rt(options());
  const std::string k = key();
  NodePeer peer(GetParam(), peer_ports());
  ASSERT_TRUE(peer.ready());
  auto held = rt.acquire(k, 5s);
  LockHandle h = get_bounded(held);
  auto inner = locked(k, 5s, 0).on(rt)([&] {
    // Inline under the handle's lease: the same one field, entered once.
    EXPECT_EQ(owners(k), 1);
    EXPECT_EQ(try_lock(k).type, Reply::Type::kInteger);
    EXPECT_FALSE(peer.try_lock(k));
    return this_lease().fencing_token();
  });
  std::future<std::uint64_t> inside;
  {
    LeaseScope in = h.enter();  // the handle's lease handed to this scope
    inside = inner();
  }
  ASSERT_EQ(inside.wait_for(0s), std::future_status::ready) << "reentrant: ran inline";
  EXPECT_EQ(inside.get(), h.lease().fencing_token());
  // The inner call's end leaves the hold as it was.
  EXPECT_EQ(owners(k), 1);
  EXPECT_EQ(try_lock(k).type, Reply::Type::kInteger);
  EXPECT_FALSE(peer.try_lock(k));
  auto released = h.release();
  get_bounded(released);
  EXPECT_TRUE(peer.try_lock(k));
  EXPECT_EQ(peer.unlock(k), "");
}

TEST_P(RedissonTest, ALockwatchLeaseTakenOverByRedissonIsLostAndNotRenewed) {
  Options o = options();
  Runtime rt(o);
  const std::string k = key();
  auto held = rt.acquire(k, 600ms);
  LockHandle h = get_bounded(held);
  // An operator's forceUnlock, and Redisson takes the lock.
  EXPECT_EQ(force_unlock(k).integer, 1);
  ASSERT_EQ(try_lock(k).type, Reply::Type::kNil);
  EXPECT_TRUE(stopped_within_bound(h.lease().stop_token()));
  EXPECT_EQ(h.lease().lost_reason(), std::optional<LostReason>(LostReason::kTakenByOther));
  // The renewal left Redisson's hold alone, and the release does too.
  auto released = h.release();
  EXPECT_THROW(get_bounded(released), LeaseLost);
  EXPECT_EQ(count_of(k, field_), 1);
  EXPECT_EQ(owners(k), 1);
  EXPECT_GT(command(k, {"PTTL", k}).integer, 600);
  EXPECT_EQ(unlock(k).integer, 1);
}

TEST_P(RedissonTest, ARedissonLeaseThatRanOutGoesToLockwatchAndItsUnlockFails) {
  Runtime rt(options());
  const std::string k = key();
  // A lease without a watchdog, as Redisson's lock(leaseTime) takes.
  ASSERT_EQ(try_lock(k, 300).type, Reply::Type::kNil);
  auto f = waiting(rt, k);
  ASSERT_TRUE(ready_within(f, kBound));
  LockHandle h = f.get();
  EXPECT_EQ(renew(k).integer, 0) << "Redisson's watchdog no longer extends it";
  EXPECT_EQ(unlock(k).type, Reply::Type::kNil) << "IllegalMonitorStateException in Java";
  EXPECT_TRUE(renewed_again(h.lease(), 1)) << "the lockwatch lease is untouched";

  if (!cluster()) {
    NodePeer peer(GetParam(), peer_ports());
    ASSERT_TRUE(peer.ready());
    const std::string k2 = k + ":node";
    ASSERT_TRUE(peer.try_lock(k2, 300));
    auto f2 = waiting(rt, k2);
    ASSERT_TRUE(ready_within(f2, kBound));
    LockHandle h2 = f2.get();
    EXPECT_NE(peer.unlock(k2), "") << "not locked by current client";
    EXPECT_TRUE(renewed_again(h2.lease(), 1));
  }
}

TEST_P(RedissonTest, FencingTokensComeFromRFencedLocksCounterOnBothSides) {
  Runtime rt(options());
  const std::string k = key();
  const long long first = try_fenced_lock(k);
  ASSERT_GT(first, 0);
  ASSERT_EQ(unlock(k).integer, 1);
  auto taken = rt.acquire({.key = k, .ttl = 5s, .retries = forever, .wait = 0ms});
  LockHandle h = get_bounded(taken);
  const std::uint64_t ours = h.lease().fencing_token();
  EXPECT_GT(ours, static_cast<std::uint64_t>(first));
  auto released = h.release();
  get_bounded(released);
  // Busy while lockwatch holds it: RFencedLock takes no token then.
  auto again = rt.acquire(k, 5s);
  LockHandle h2 = get_bounded(again);
  EXPECT_EQ(try_fenced_lock(k), 0);
  const std::uint64_t second = h2.lease().fencing_token();
  EXPECT_GT(second, ours);
  auto released2 = h2.release();
  get_bounded(released2);
  EXPECT_GT(try_fenced_lock(k), static_cast<long long>(second));
  EXPECT_EQ(unlock(k).integer, 1);
}

TEST_P(RedissonTest, OtherKindsAndTheCapabilitiesAreRefusedSayingWhy) {
  // On one node and on a Cluster alike: exclusive locks only, each other
  // kind refused naming what Redisson keeps it in, and none of the
  // capabilities that rest on lockwatch's own layout (here the operators'
  // inspect and force-release, and the listing).
  Runtime rt(options());
  const std::string k = key();
  const std::pair<LockKind, const char*> kinds[] = {
      {LockKind::shared(), "RReadWriteLock"}, {LockKind::permits(2), "semaphores"}, {LockKind::fair(), "RFairLock"}};
  for (const auto& [kind, names] : kinds) {
    auto refused = thrown<Unsupported>([&] { (void)rt.acquire({.key = k, .ttl = 5s, .kind = kind}); });
    ASSERT_TRUE(refused) << kind.describe();
    const std::string what = refused->what();
    EXPECT_NE(what.find("the redisson layout holds exclusive locks only"), std::string::npos) << what;
    EXPECT_NE(what.find(names), std::string::npos) << what;
  }
  EXPECT_TRUE(thrown<Unsupported>([&] {
    auto f = rt.inspect(k);
    get_bounded(f);
  }));
  EXPECT_TRUE(thrown<Unsupported>([&] {
    auto f = rt.force_release(k);
    get_bounded(f);
  }));
  EXPECT_TRUE(thrown<Unsupported>([&] {
    auto f = rt.list("");
    get_bounded(f);
  }));
  // Exclusive locks it holds.
  auto held = rt.acquire(k, 5s);
  LockHandle h = get_bounded(held);
  EXPECT_EQ(command(k, {"TYPE", k}).str, "hash");
}

TEST_P(RedissonTest, ARetriedReleaseAnswersAsTheFirst) {
  // Redisson's unlock latch: a lease's release leaves one behind (named by
  // its owner token), so the same call sent again, e.g. after a lost
  // reply, answers 'released' as the first did, even once Redisson holds
  // the lock again, and leaves that hold alone. The store of one node (on
  // a Cluster, of the master of the key's slot, as the Cluster's store
  // makes it).
  const std::string k = key();
  detail::Loop loop;
  Endpoint ep;
  ep.port = port_of(k);
  Options o;
  detail::RedisNodeStore store(
      loop, ep, detail::StoreSettings::of(o),
      cluster() ? detail::RedisNodeStore::Notices::kSharded : detail::RedisNodeStore::Notices::kClassic,
      detail::StoreLayout::make_redisson());
  if (cluster()) store.batch_by_slot();
  loop.post([&] { store.start(detail::StoreEvents{}); });
  const std::string token = "0123456789abcdef0123456789abcdef";
  auto on_loop = [&](auto call) {
    auto done = std::make_shared<std::promise<void>>();
    auto f = done->get_future();
    loop.post([&, call, done] { call(done); });
    EXPECT_EQ(f.wait_for(kBound), std::future_status::ready);
  };
  auto acquire = [&] {
    detail::Acquired out;
    on_loop([&](std::shared_ptr<std::promise<void>> done) {
      detail::LockRef ref{k, token, "5000", 5s};
      store.acquire(std::span<const detail::LockRef>(&ref, 1), [&, done](std::size_t, const detail::Acquired& r) {
        out = r;
        done->set_value();
      });
    });
    return out;
  };
  const detail::Acquired taken = acquire();
  ASSERT_EQ(taken.status, detail::Acquired::Status::kTaken) << taken.error.describe();
  EXPECT_EQ(owners(k), 1);
  auto release = [&] {
    detail::Released out = detail::Released::kUnconfirmed;
    on_loop([&](std::shared_ptr<std::promise<void>> done) {
      detail::LockRef ref{k, token, "5000", 5s};
      store.release(std::span<const detail::LockRef>(&ref, 1), true,
                    [&, done](std::size_t, detail::Released r, const detail::StoreError*) {
                      out = r;
                      done->set_value();
                    });
    });
    return out;
  };
  EXPECT_TRUE(detail::was_ours(release()));
  EXPECT_EQ(command(k, {"EXISTS", k}).integer, 0);
  ASSERT_EQ(try_lock(k).type, Reply::Type::kNil);  // Redisson's now
  EXPECT_TRUE(detail::was_ours(release())) << "answered from the latch";
  EXPECT_EQ(count_of(k, field_), 1) << "Redisson's hold is untouched";
  Reply latches = command(k, {"KEYS", prefixed("redisson_unlock_latch", k) + ":*"});
  ASSERT_EQ(latches.elements.size(), 1u);
  EXPECT_EQ(latches.elements[0].str, prefixed("redisson_unlock_latch", k) + ":" + token);
  EXPECT_GT(command(k, {"PTTL", latches.elements[0].str}).integer, 0) << "it expires";
  EXPECT_EQ(unlock(k).integer, 1);
  // An acquisition that tries again with its token (after giving the lock
  // back) gets a grant whose release is its own, not the latch's answer.
  ASSERT_EQ(acquire().status, detail::Acquired::Status::kTaken);
  EXPECT_EQ(command(k, {"EXISTS", latches.elements[0].str}).integer, 0) << "the take cleared the latch";
  EXPECT_TRUE(detail::was_ours(release()));
  EXPECT_EQ(command(k, {"EXISTS", k}).integer, 0) << "released for real";
  EXPECT_EQ(loop.shutdown([&] { store.close(); }), 0);
}

INSTANTIATE_TEST_SUITE_P(Where, RedissonTest, ::testing::Values(Where::kNode, Where::kCluster), where_name);

// What the setting refuses, before anything starts.
TEST(RedissonLayout, UnknownLayoutsAndKindsItCannotHoldAreRefused) {
  RedisServer server;
  Options o;
  o.runtime.threads = 1;
  o.redis_url = server.url() + "?layout=jedis";
  auto bad = thrown<InvalidArgument>([&] { Runtime rt(o); });
  ASSERT_TRUE(bad);
  EXPECT_NE(std::string(bad->what()).find("'lockwatch'"), std::string::npos) << bad->what();
  EXPECT_NE(std::string(bad->what()).find("'redisson'"), std::string::npos) << bad->what();
  o.redis_url = server.url() + "?flavour=redisson";
  EXPECT_TRUE(thrown<InvalidArgument>([&] { Runtime rt(o); }));
  o.redis_url = server.url() + "," + server.url() + "?layout=redisson";
  EXPECT_TRUE(thrown<Unsupported>([&] { Runtime rt(o); }));

  o.redis_url = server.url() + "?layout=redisson";
  Runtime rt(o);
  auto shared = thrown<Unsupported>([&] { (void)rt.acquire({.key = "k", .ttl = 5s, .kind = LockKind::shared()}); });
  ASSERT_TRUE(shared);
  EXPECT_NE(std::string(shared->what()).find("RReadWriteLock"), std::string::npos) << shared->what();
  EXPECT_TRUE(thrown<Unsupported>([&] { (void)rt.acquire({.key = "k", .ttl = 5s, .kind = LockKind::permits(2)}); }));
  EXPECT_TRUE(thrown<Unsupported>([&] { (void)rt.acquire({.key = "k", .ttl = 5s, .kind = LockKind::fair()}); }));
  EXPECT_TRUE(thrown<InvalidArgument>([&] { (void)rt.acquire("{k}", 5s); }));
  auto inspected = thrown<Unsupported>([&] {
    auto f = rt.inspect("k");
    get_bounded(f);
  });
  EXPECT_TRUE(inspected);
  // The default layout is untouched: the same URL without the parameter,
  // or with layout=lockwatch, keeps lockwatch's keys.
  o.redis_url = server.url() + "?layout=lockwatch";
  Runtime plain(o);
  auto held = plain.acquire("k", 5s);
  LockHandle h = get_bounded(held);
  EXPECT_EQ(server.command({"TYPE", "lockwatch:{k}"}).str, "string");
}

// The parameter on every Redis URL form: taken off the URL the topology
// is read from, with the layout it names.
TEST(RedissonLayout, TheParameterIsReadOnEveryRedisUrlForm) {
  using detail::RedisLayout;
  const std::pair<const char*, const char*> forms[] = {
      {"redis://127.0.0.1:6379?layout=redisson", "redis://127.0.0.1:6379"},
      {"rediss://u:p%3Fw@127.0.0.1:6380/2?layout=redisson", "rediss://u:p%3Fw@127.0.0.1:6380/2"},
      {"redis-sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/1?layout=redisson",
       "redis-sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/1"},
      {"rediss-cluster://127.0.0.1:7000,127.0.0.1:7001?layout=redisson", "rediss-cluster://127.0.0.1:7000,127.0.0.1:7001"},
  };
  for (const auto& [url, rest] : forms) {
    const detail::RedisUrl split = detail::split_redis_url(url);
    EXPECT_EQ(split.url, rest) << url;
    EXPECT_EQ(split.layout, RedisLayout::kRedisson) << url;
  }
  EXPECT_EQ(detail::split_redis_url("redis://127.0.0.1:6379").layout, RedisLayout::kLockwatch);
  EXPECT_EQ(detail::split_redis_url("redis://127.0.0.1:6379?layout=lockwatch").layout, RedisLayout::kLockwatch);
  EXPECT_TRUE(thrown<InvalidArgument>([] { detail::split_redis_url("redis://h:1?layout=redisson&layout=lockwatch"); }));
  EXPECT_TRUE(thrown<InvalidArgument>([] { detail::split_redis_url("redis://h:1?layout="); }));
  // The owner field: `<uuid>:<thread id>`, the same for a token every time.
  const detail::StoreLayout a = detail::StoreLayout::make_redisson(), b = detail::StoreLayout::make_redisson();
  EXPECT_NE(a.client_id, b.client_id);
  EXPECT_EQ(a.field("0000000000000ff00123456789abcdef"), a.client_id + ":255");
  EXPECT_EQ(a.field("fffffffffffffff00000000000000000"), a.client_id + ":" + std::to_string((1ull << 60) - 1));
}

// Over TLS (rediss://) the layout is the same: a Redisson client on the
// server's port sees lockwatch's hold and its release notice.
TEST(RedissonLayout, OverTlsTheLayoutAndTheNoticesAreTheSame) {
  RedisServer server(over(Transport::kTls));
  Options o = options_for(server, 1);
  o.redis_url += "?layout=redisson";
  ASSERT_EQ(o.redis_url.rfind("rediss://", 0), 0u);
  Runtime rt(o);
  auto held = rt.acquire("acct:tls", 5s);
  LockHandle h = get_bounded(held);
  EXPECT_EQ(server.command({"TYPE", "acct:tls"}).str, "hash");
  EXPECT_EQ(server.command({"HLEN", "acct:tls"}).integer, 1);
  ChannelWaiter waiter(server.command_port(), channel_of("acct:tls"), false);
  ASSERT_TRUE(waiter.subscribed());
  auto released = h.release();
  EXPECT_EQ(waiter.message(), std::optional<std::string>("0"));
  get_bounded(released);
  EXPECT_EQ(server.command({"EXISTS", "acct:tls"}).integer, 0);
}

}  // namespace
}  // namespace lockwatch::testing
