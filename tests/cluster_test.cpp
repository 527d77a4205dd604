// A real Redis Cluster (3 masters, 3 replicas, on loopback) behind
// redis-cluster://: slot math against the server, routing over every
// master, exclusion and fencing across runtimes, batched renewals over all
// shards, sets of keys taken by one script call per slot (also after a
// MOVED), a graceful failover while leases are held, operators' tools and
// the store's other calls on a slot that moved or is moving (MOVED, ASK,
// TRYAGAIN), and bad seeds. The failures: a master killed with leases held,
// a lock write lost in that failover, resharding under load, SCRIPT FLUSH,
// a slot no master serves, and wrong credentials.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "core/loop.hpp"
#include "lockwatch/lockwatch.hpp"
#include "store/redis/cluster_slot.hpp"
#include "store_on_loop.hpp"
#include "support/redis_cluster.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = new RedisCluster(); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    ASSERT_EQ(cluster_->wait_healthy(kBound), "");
  }

  static Options options(std::size_t threads = 4) {
    Options o;
    o.redis_url = cluster_->url();
    o.runtime.threads = threads;
    return o;
  }

  // The index of the master holding lock `key` now (-1: none holds it).
  static int holder_of(const std::string& key) {
    for (int m : cluster_->masters())
      if (cluster_->node(m).command({"EXISTS", lock_key(key)}).integer == 1) return m;
    return -1;
  }

  // Whether node `n` (a replica too: no redirect) has lock `key` in its data.
  static bool has_locally(int n, const std::string& key) {
    auto keys = cluster_->node(n).command(
        {"CLUSTER", "GETKEYSINSLOT", std::to_string(detail::key_slot(lock_key(key))), "1000"});
    for (const auto& k : keys.elements)
      if (k.str == lock_key(key)) return true;
    return false;
  }

  // A master other than `m`.
  static int other_master(int m) {
    for (int o : cluster_->masters())
      if (o != m) return o;
    return -1;
  }

  // Subscribers of `key`'s release channel on node `m` (PUBSUB SHARDNUMSUB
  // counts sharded subscriptions, which a node holds only for its slots).
  static long long shard_subscribers(int m, const std::string& key) {
    auto r = cluster_->node(m).command({"PUBSUB", "SHARDNUMSUB", lock_key(key) + ":rel"});
    return r.elements.size() == 2 ? r.elements[1].integer : -1;
  }
  // Waits (bounded) until node `m` counts `n` subscribers of `key`'s channel.
  static bool shard_subscribers_become(int m, const std::string& key, long long n) {
    auto until = std::chrono::steady_clock::now() + kBound;
    while (shard_subscribers(m, key) != n && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(10ms);  // another client's subscription signals nothing to the test
    return shard_subscribers(m, key) == n;
  }

  static RedisCluster* cluster_;
};

RedisCluster* ClusterTest::cluster_ = nullptr;

// Brings back what a test crashed (SIGKILL) or stopped (SIGSTOP), also when
// the test fails half-way: the next test needs the whole cluster. A killed
// master comes back as a replica of the node that replaced it.
class Revive {
 public:
  explicit Revive(RedisCluster& cluster) : cluster_(cluster) {}
  Revive(const Revive&) = delete;
  Revive& operator=(const Revive&) = delete;
  ~Revive() {
    try {
      for (int n : paused_) cluster_.node(n).resume();
      for (int n : killed_) cluster_.node(n).start();
      std::string wrong = cluster_.wait_healthy(30s);
      EXPECT_EQ(wrong, "") << "the cluster did not recover";
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the cluster could not be revived: " << e.what();
    }
  }
  void kill(int n) {
    killed_.push_back(n);
    cluster_.node(n).kill();
  }
  void pause(int n) {
    paused_.push_back(n);
    cluster_.node(n).pause();
  }
  void resume(int n) {
    std::erase(paused_, n);
    cluster_.node(n).resume();
  }

 private:
  RedisCluster& cluster_;
  std::vector<int> killed_, paused_;
};

// Counts the renewals that failed (and were retried), per key.
class RenewalFailures : public Observer {
 public:
  void on_renewal_failed(std::string_view key, std::string_view) override {
    std::lock_guard<std::mutex> g(mu_);
    failed_[std::string(key)]++;
  }
  int of(const std::string& key) const {
    std::lock_guard<std::mutex> g(mu_);
    auto it = failed_.find(key);
    return it == failed_.end() ? 0 : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, int> failed_;
};

// Polls `done` until it holds or `bound` passed; returns whether it held.
template <class F>
bool within(std::chrono::steady_clock::duration bound, F done) {
  auto until = std::chrono::steady_clock::now() + bound;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(10ms);  // polling state nothing signals
  }
}

// prefix0, prefix1, ...: n keys.
std::vector<std::string> numbered(const std::string& prefix, int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(prefix + std::to_string(i));
  return keys;
}

// Takes and gives back keys on every master, so that `rt` has mapped the
// slots and connected to each: a lease's ttl counts from its request, and
// under the sanitizers a loaded machine took longer than a short ttl to do
// that first.
void connect_every_master(Runtime& rt) {
  for (auto& h : hold_all(rt, numbered("warm", 64), 5s)) {
    auto f = h.release();
    get_bounded(f);
  }
}

// Waits (bounded) until every lease in `held` was renewed `more` times
// since the call, or one was lost; returns whether all were, none lost.
bool all_renewed(const std::vector<LockHandle>& held, std::uint64_t more) {
  std::vector<std::uint64_t> target;
  for (const auto& h : held) target.push_back(h.lease().renewals() + more);
  auto until = std::chrono::steady_clock::now() + kBound;
  for (;;) {
    bool all = true;
    for (std::size_t i = 0; i < held.size(); ++i) {
      if (held[i].lease().lost()) return false;
      if (held[i].lease().renewals() < target[i]) all = false;
    }
    if (all) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(10ms);  // polling counters the watchdog moves
  }
}

LockHandle take(Runtime& rt, const std::string& key, std::chrono::milliseconds ttl, Retries retries = 0) {
  auto f = rt.acquire({.key = key, .ttl = ttl, .retries = retries});
  return get_bounded(f);
}

// Releases `held` and returns the lock `waiting` then gets, checking that
// it came within a quarter of `ttl`: woken by the release notice, not by
// the holder's ttl running out.
LockHandle woken_by_release(LockHandle& held, std::future<LockHandle>& waiting, std::chrono::milliseconds ttl) {
  auto t0 = std::chrono::steady_clock::now();
  auto released = held.release();
  get_bounded(released);
  LockHandle h = get_bounded(waiting);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, ttl / 4);
  return h;
}

TEST_F(ClusterTest, SlotMathMatchesClusterKeyslot) {
  std::vector<std::string> keys{"foo",           "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{user1000}.following",
                                "lockwatch:{a}", "{",          "}",             "{}",            "a{b"};
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string k;
    for (int n = static_cast<int>(rng() % 12); n >= 0; --n) k.push_back("ab{}xyz:01"[rng() % 10]);
    keys.push_back(k);
  }
  for (const auto& k : keys) {
    auto r = cluster_->node(0).command({"CLUSTER", "KEYSLOT", k});
    EXPECT_EQ(detail::key_slot(k), r.integer) << k;
  }
}

TEST_F(ClusterTest, LocksSpreadOverEveryMaster) {
  Runtime rt(options());
  std::vector<LockHandle> held;
  std::set<int> masters;
  for (int i = 0; i < 60; ++i) {
    std::string key = "spread" + std::to_string(i);
    held.push_back(take(rt, key, 5s));
    int m = holder_of(key);
    EXPECT_GE(m, 0) << key;
    EXPECT_EQ(m, cluster_->master_of_slot(detail::key_slot(lock_key(key)))) << key;
    masters.insert(m);
  }
  EXPECT_EQ(masters.size(), 3u);
  for (auto& h : held) {
    auto f = h.release();
    get_bounded(f);
  }
  for (int i = 0; i < 60; ++i) EXPECT_EQ(holder_of("spread" + std::to_string(i)), -1);
}

TEST_F(ClusterTest, OneHolderAtATimeAcrossRuntimesAndTokensRise) {
  Runtime a(options()), b(options());
  for (int i = 0; i < 12; ++i) {
    std::string key = "excl" + std::to_string(i);
    auto first = take(a, key, 5s);
    auto other = locked(key, 5s, 0).on(b)([] { return 1; });
    auto refused = other();
    EXPECT_TRUE(error_of<LockNotAcquired>(refused)) << key;
    std::uint64_t t1 = first.lease().fencing_token();
    auto f = first.release();
    get_bounded(f);
    auto second = take(b, key, 5s);
    EXPECT_GT(second.lease().fencing_token(), t1) << key;
  }
}

// One fencing counter per slot, each on the master of its slot: 20,000
// names of `sku:{0}` locked and released leave 11,090 keys over the
// masters (a counter per name left 20,000). A prefix of their own keeps
// other tests' keys out of the count.
TEST_F(ClusterTest, TwentyThousandNamesLeaveOneCounterPerSlotOnItsMaster) {
  constexpr int kNames = 20000;
  constexpr int kInFlight = 1000;
  Options o = options();
  o.runtime.key_prefix = "manynames:";
  Runtime rt(o);
  lock_names_twice(rt, kNames, kInFlight);
  if (::testing::Test::HasFatalFailure()) return;
  std::set<std::string> counters;  // of the slots the names use
  for (int i = 0; i < kNames; ++i)
    counters.insert("manynames:fence:{" +
                    std::string(detail::slot_tag(detail::key_slot("{sku:" + std::to_string(i) + "}"))) + "}");
  long long left = 0;
  for (int m : cluster_->masters()) {
    std::string cursor = "0";
    do {
      auto r = cluster_->node(m).command({"SCAN", cursor, "MATCH", "manynames:*", "COUNT", "1000"});
      ASSERT_EQ(r.elements.size(), 2u);
      cursor = r.elements[0].str;
      for (const auto& k : r.elements[1].elements) {
        ++left;
        EXPECT_EQ(counters.count(k.str), 1u) << k.str;
      }
    } while (cursor != "0");
  }
  EXPECT_EQ(left, 11090);
  EXPECT_EQ(counters.size(), 11090u);
}

TEST_F(ClusterTest, ContendedWorkNeverOverlaps) {
  std::vector<std::unique_ptr<Runtime>> runtimes;
  for (int i = 0; i < 2; ++i) runtimes.push_back(std::make_unique<Runtime>(options(2)));
  std::atomic<int> inside{0}, overlaps{0}, done{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, r] {
        auto inc = locked("contended", 2s, forever).on(*runtimes[r]).wait(30s)([&] {
          if (inside.fetch_add(1) != 0) overlaps++;
          std::this_thread::sleep_for(1ms);  // the critical section's work
          inside.fetch_sub(1);
          done++;
        });
        for (int i = 0; i < 10; ++i) {
          auto f = inc();
          if (!completes(f)) return;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(done.load(), 60);
  EXPECT_EQ(overlaps.load(), 0);
}

// Three processes (tests/file_counter) count in files, each file under the
// lock of its own key, with keys on every master: a lost increment would
// be two holders at once.
TEST_F(ClusterTest, SeveralProcessesCountExactlyOnKeysOfEveryShard) {
  const char* counter = std::getenv("LOCKWATCH_FILE_COUNTER");
  ASSERT_NE(counter, nullptr);
  constexpr int kKeys = 6, kProcs = 3, kIncrements = 60;
  std::set<int> shards;
  for (int k = 0; k < kKeys; ++k) {
    Runtime probe(options(1));
    auto h = take(probe, "fc:" + std::to_string(k), 2s);
    shards.insert(holder_of("fc:" + std::to_string(k)));
    auto f = h.release();
    get_bounded(f);
  }
  ASSERT_EQ(shards.size(), 3u) << "the keys must span every master";
  char tmpl[] = "/tmp/lockwatch-fc-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::vector<std::unique_ptr<ChildProcess>> procs;
  for (int p = 0; p < kProcs; ++p) {
    procs.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
        counter, cluster_->url(), dir, std::to_string(kKeys), std::to_string(kIncrements)}));
  }
  for (auto& p : procs) EXPECT_EQ(p->wait(60s), 0);
  for (int k = 0; k < kKeys; ++k) {
    std::ifstream in(dir + "/fc-" + std::to_string(k));
    long n = 0;
    in >> n;
    EXPECT_EQ(n, kProcs * kIncrements / kKeys) << "key fc:" << k;
  }
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

TEST_F(ClusterTest, RenewalsOfManyLeasesOverAllShardsLoseNone) {
  constexpr int kLeases = 200;
  // Each renewal sent 200 ms before the local deadline: the default 50 ms
  // was missed by a loaded machine under the sanitizers, six servers and
  // the test sharing two cores.
  Options o = options();
  o.watchdog.min_renewal_window = 200ms;
  Runtime rt(o);
  connect_every_master(rt);
  auto held = hold_all(rt, numbered("renew", kLeases), 600ms);
  auto before = rt.stats();
  auto after = after_renewals(rt, before, 3 * kLeases);
  const auto renewals = after.renewals_sent - before.renewals_sent;
  const auto commands = after.renew_commands - before.renew_commands;
  EXPECT_GE(renewals, 3u * kLeases);
  // One script call per slot group: at least one per node and tick, at
  // most one per lease.
  EXPECT_GT(commands, 0u);
  EXPECT_LE(commands, renewals);
  EXPECT_EQ(after.leases_lost, before.leases_lost);
  for (auto& h : held) EXPECT_FALSE(h.lease().lost());
  EXPECT_TRUE(all_renewed(held, 1));
}

TEST_F(ClusterTest, AGracefulFailoverLosesNoLeaseAndLockingGoesOn) {
  constexpr int kLeases = 1000;
  Runtime rt(options());
  connect_every_master(rt);
  auto held = hold_all(rt, numbered("fo", kLeases), 2s);
  const auto lost_before = rt.stats().leases_lost;

  auto replicas = cluster_->replicas();
  ASSERT_FALSE(replicas.empty());
  const int promoted = replicas.front();
  auto r = cluster_->node(promoted).command({"CLUSTER", "FAILOVER"});
  ASSERT_EQ(r.type, Reply::Type::kStatus) << r.str;
  auto until = std::chrono::steady_clock::now() + kBound;
  while (cluster_->node(promoted).command({"ROLE"}).elements.at(0).str != "master" &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(20ms);  // nothing signals the promotion to a client
  ASSERT_EQ(cluster_->node(promoted).command({"ROLE"}).elements.at(0).str, "master");
  ASSERT_EQ(cluster_->wait_healthy(kBound), "");

  // Every lease is renewed (on the new master for the moved shard) and none is lost.
  EXPECT_TRUE(all_renewed(held, 2));
  EXPECT_EQ(rt.stats().leases_lost, lost_before);
  // Locking goes on, on every shard, including the promoted node.
  std::set<int> masters;
  for (int i = 0; i < 40; ++i) {
    std::string key = "after-fo" + std::to_string(i);
    auto h = take(rt, key, 2s);
    masters.insert(holder_of(key));
    auto f = h.release();
    get_bounded(f);
  }
  EXPECT_EQ(masters.size(), 3u);
  EXPECT_TRUE(masters.count(promoted));
  for (auto& h : held) {
    auto f = h.release();
    get_bounded(f);
  }
}

// A master crashes (SIGKILL) with leases held on every shard. Those whose
// write reached the replica (min_replicas = 1: the acquisition waited for
// WAIT) live on: the watchdog retries each renewal until the lease's local
// deadline, and the promoted replica confirms it once the slot map names
// it. The failover takes about 2.2 s at node timeout 1 s; renewing every
// 1.5 s, a 5 s ttl leaves at least 3.5 s. Leases on the other masters are
// not touched.
TEST_F(ClusterTest, AKilledMastersReplicatedLeasesAreRenewedOnThePromotedReplica) {
  constexpr auto kTtl = 5s;
  Options o = options();
  add_url_param(o, "min_replicas=1&replica_ack_timeout=1000");
  o.watchdog.renew_weight = 0.3;
  Runtime rt(o);
  auto failures = std::make_shared<RenewalFailures>();
  rt.add_observer(failures);
  auto keys = numbered("crash", 60);
  auto held = hold_all(rt, keys, kTtl);
  const int victim = holder_of(keys.front());
  ASSERT_GE(victim, 0);
  const auto replicas = cluster_->replicas_of(victim);
  ASSERT_EQ(replicas.size(), 1u);
  const int promoted = replicas.front();
  std::vector<std::size_t> on_victim, elsewhere;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    // The replica has every lock its master confirmed.
    if (holder_of(keys[i]) == victim) {
      on_victim.push_back(i);
      EXPECT_TRUE(has_locally(promoted, keys[i])) << keys[i];
    } else {
      elsewhere.push_back(i);
    }
  }
  ASSERT_FALSE(on_victim.empty());
  ASSERT_FALSE(elsewhere.empty());
  const auto lost_before = rt.stats().leases_lost;

  Revive revive(*cluster_);
  const auto killed_at = std::chrono::steady_clock::now();
  revive.kill(victim);
  ASSERT_TRUE(within(kTtl + 5s, [&] { return cluster_->node(promoted).command({"ROLE"}).elements.at(0).str == "master"; }));
  const auto promoted_after = std::chrono::steady_clock::now() - killed_at;
  // Two confirmed renewals each after the kill: the second one came from
  // the promoted replica, since the first may have been due before the
  // crash. Within a ttl of the promotion plus a margin.
  std::vector<std::uint64_t> target;
  for (const auto& h : held) target.push_back(h.lease().renewals() + 2);
  EXPECT_TRUE(within(2 * kTtl + 2s, [&] {
    for (std::size_t i = 0; i < held.size(); ++i)
      if (held[i].lease().lost() || held[i].lease().renewals() < target[i]) return false;
    return true;
  }));
  for (std::size_t i : on_victim) {
    EXPECT_FALSE(held[i].lease().lost()) << keys[i];
    EXPECT_EQ(holder_of(keys[i]), promoted) << keys[i];
    // It was felt: renewals failed (the node was gone) and were retried.
    EXPECT_GT(failures->of(keys[i]), 0) << keys[i];
  }
  for (std::size_t i : elsewhere) EXPECT_FALSE(held[i].lease().lost()) << keys[i];
  EXPECT_EQ(rt.stats().leases_lost, lost_before);
  // A lease's key is still held: another runtime cannot take it.
  Runtime other(options());
  auto refused = other.acquire({.key = keys[on_victim.front()], .ttl = 1s, .retries = 0});
  EXPECT_TRUE(error_of<LockNotAcquired>(refused));
  std::cout << "[ INFO     ] replica promoted " << std::chrono::duration_cast<std::chrono::milliseconds>(promoted_after).count()
            << " ms after the kill\n";
  for (auto& h : held) {
    auto f = h.release();
    get_bounded(f);
  }
}

// The write the research saw lost: the replica stalls (SIGSTOP), a filler
// fills the replication link's socket buffers, so that a lock written next
// stays in the master's memory; then the master crashes and the replica,
// resumed, is promoted without it. With min_replicas = 1 the acquisition
// is refused up front (WAIT gets no ack) and the lock given back. Without,
// the lease is taken, and its first renewal at the promoted replica finds
// the key gone: the lease is reported lost (expired), never kept while
// someone else can take the lock.
TEST_F(ClusterTest, ALockWriteLostInAFailoverIsReportedLostOrRefusedWithMinReplicas) {
  constexpr auto kTtl = 5s;
  const std::string key = "lost-write";
  const int slot = detail::key_slot(lock_key(key));
  const int victim = cluster_->master_of_slot(slot);
  ASSERT_GE(victim, 0);
  const auto replicas = cluster_->replicas_of(victim);
  ASSERT_EQ(replicas.size(), 1u);
  const int replica = replicas.front();
  // Another key on the same master, for the refused acquisition.
  std::string safe_key;
  for (int i = 0; safe_key.empty() && i < 10000; ++i) {
    std::string k = "lost-write-safe" + std::to_string(i);
    if (cluster_->master_of_slot(detail::key_slot(lock_key(k))) == victim) safe_key = k;
  }
  ASSERT_FALSE(safe_key.empty());

  Options safe_options = options();
  add_url_param(safe_options, "min_replicas=1&replica_ack_timeout=200");
  Runtime safe(safe_options);
  Options o = options();
  o.watchdog.renew_weight = 0.3;
  Runtime rt(o);
  // Each runtime has its slot map before the replica stalls.
  auto warm = safe.inspect(key);
  get_bounded(warm);
  auto warm2 = rt.inspect(key);
  get_bounded(warm2);

  Revive revive(*cluster_);
  revive.pause(replica);
  for (int i = 0; i < 3; ++i) {
    auto r = cluster_->node(victim).command(
        {"SET", lock_key(key) + ":filler" + std::to_string(i), std::string(std::size_t{8} << 20, 'f')});
    ASSERT_EQ(r.type, Reply::Type::kStatus) << r.str;
  }

  // Refused: no replica acknowledged the write, and the lock was given back.
  auto refused = safe.acquire({.key = safe_key, .ttl = kTtl, .retries = forever});
  auto err = error_of<ConnectionError>(refused);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("replicas required"), std::string::npos) << err->what();
  EXPECT_EQ(cluster_->node(victim).command({"EXISTS", lock_key(safe_key)}).integer, 0);

  // Taken on the master alone.
  auto lease_holder = take(rt, key, kTtl, forever);
  ASSERT_EQ(cluster_->node(victim).command({"EXISTS", lock_key(key)}).integer, 1);
  const auto lost_before = rt.stats().leases_lost;
  revive.kill(victim);
  revive.resume(replica);
  const auto killed_at = std::chrono::steady_clock::now();

  ASSERT_TRUE(within(kTtl + 5s, [&] { return cluster_->node(replica).command({"ROLE"}).elements.at(0).str == "master"; }));
  EXPECT_FALSE(has_locally(replica, key));
  // Reported lost within the lease's ttl (plus a margin), as the key gone:
  // the renewal reached the new master and found no key, removed by the
  // failover when answered within the ttl, expired when answered after.
  ASSERT_TRUE(within(kTtl + 2s, [&] { return lease_holder.lease().lost(); }));
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, kTtl + 2s);
  const auto reason = lease_holder.lease().lost_reason();
  EXPECT_TRUE(reason == LostReason::kRemoved || reason == LostReason::kExpired) << to_string(*reason);
  EXPECT_EQ(rt.stats().leases_lost, lost_before + 1);
  // Which was the truth: someone else takes the lock now.
  Runtime other(options());
  auto h = take(other, key, 2s);
  EXPECT_GE(h.lease().fencing_token(), 1u);
  auto f = h.release();
  get_bounded(f);
}

// The slots master `m` serves now (per its own CLUSTER SLOTS), ascending.
std::vector<int> slots_of(const RedisCluster& cluster, int m) {
  std::vector<int> out;
  auto ranges = cluster.node(m).command({"CLUSTER", "SLOTS"});
  for (const auto& r : ranges.elements) {
    if (r.elements.size() < 3 || r.elements[2].elements.at(1).integer != cluster.node(m).port()) continue;
    for (long long s = r.elements[0].integer; s <= r.elements[1].integer; ++s) out.push_back(static_cast<int>(s));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// `redis-cli --cluster reshard`: `n` slots from master `from` to master
// `to`. It refuses to start while the nodes disagree about the
// configuration (gossip lags after a move), so it is run again until it
// succeeds or `bound` passed. Returns its output when it failed, else empty.
std::string reshard(const RedisCluster& cluster, int from, int to, int n, std::chrono::steady_clock::duration bound) {
  const auto until = std::chrono::steady_clock::now() + bound;
  std::string output;
  for (;;) {
    ChildProcess cli({"redis-cli", "--cluster", "reshard",
                      cluster.node(from).host() + ":" + std::to_string(cluster.node(from).port()), "--cluster-from",
                      cluster.id_of(from), "--cluster-to", cluster.id_of(to), "--cluster-slots", std::to_string(n),
                      "--cluster-yes"});
    output.clear();
    while (auto line = cli.read_line(30s)) output += *line + "\n";
    if (cli.wait(30s) == 0) return {};
    if (std::chrono::steady_clock::now() >= until) return output;
    std::this_thread::sleep_for(100ms);  // gossip has no event a client can await
  }
}

// Locks taken and released over and over on keys of many slots, by four
// threads of two runtimes, while 1000 slots move to another master and back
// (redis-cli --cluster reshard) and, in between, one slot stays half
// migrated for more than a ttl with a lease on it (its key on the target,
// its fencing counter on the source: renewals get ASK, acquisitions
// TRYAGAIN). No lease is lost, no key is ever held twice, and every call
// ends in success or a typed error (retried) within the bound.
TEST_F(ClusterTest, ReshardingUnderLoadLosesNoLeaseAndKeepsExclusion) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  const auto masters = cluster_->masters();
  ASSERT_EQ(masters.size(), 3u);
  const int from = masters[0], to = masters[1];
  const auto from_slots = slots_of(*cluster_, from);
  ASSERT_GT(from_slots.size(), 1000u);
  const std::set<int> moving(from_slots.begin(), from_slots.begin() + 1000);
  // Half the keys in the slots that move, half elsewhere.
  std::vector<std::string> keys, held_keys;
  for (int i = 0; keys.size() < 48 || held_keys.size() < 48; ++i) {
    std::string k = "reshard" + std::to_string(i);
    const bool moves = moving.count(detail::key_slot(lock_key(k))) > 0;
    auto& into = i % 2 == 0 ? keys : held_keys;
    const auto& mine = i % 2 == 0 ? keys : held_keys;
    const auto in_moving = std::count_if(mine.begin(), mine.end(), [&](const std::string& m) {
      return moving.count(detail::key_slot(lock_key(m))) > 0;
    });
    if (into.size() >= 48) continue;
    if (moves ? in_moving < 24 : static_cast<long>(into.size()) - in_moving < 24) into.push_back(k);
  }

  Runtime holder(options(2));
  std::vector<std::unique_ptr<Runtime>> runtimes;
  for (int r = 0; r < 2; ++r) runtimes.push_back(std::make_unique<Runtime>(options(2)));
  auto held = hold_all(holder, held_keys, 1s);

  std::vector<std::atomic<int>> in_use(keys.size());
  std::atomic<bool> stop{false};
  std::atomic<int> taken{0}, busy{0}, retried{0}, overlaps{0}, untyped{0}, hung{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      Runtime& rt = *runtimes[static_cast<std::size_t>(w % 2)];
      std::mt19937 rng(static_cast<unsigned>(w) + 1);
      const auto until = Clock::now() + 60s;
      while (!stop.load() && Clock::now() < until) {
        const std::size_t i = rng() % keys.size();
        auto f = rt.acquire({.key = keys[i], .ttl = 1s, .retries = forever});
        if (f.wait_for(10s) != std::future_status::ready) {
          hung++;
          return;
        }
        try {
          LockHandle h = f.get();
          if (in_use[i].exchange(1) != 0) overlaps++;
          std::this_thread::sleep_for(1ms);  // the critical section's work
          in_use[i].store(0);
          taken++;
          auto r = h.release();
          if (r.wait_for(10s) != std::future_status::ready) {
            hung++;
            return;
          }
          r.get();
        } catch (const LockNotAcquired&) {
          busy++;
        } catch (const ConnectionError&) {
          retried++;
        } catch (const StoreRefused&) {
          retried++;
        } catch (const std::exception& e) {
          untyped++;
          ADD_FAILURE() << keys[i] << ": " << e.what();
        }
      }
    });
  }
  struct Joiner {
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~Joiner() {
      stop.store(true);
      for (auto& t : threads) t.join();
    }
  } joiner{stop, workers};

  // 1000 slots to another master, with the load on.
  const auto to_slots = slots_of(*cluster_, to).size();
  EXPECT_EQ(reshard(*cluster_, from, to, 1000, 10s), "");
  EXPECT_EQ(slots_of(*cluster_, to).size(), to_slots + 1000);

  // One slot half migrated, with a lease on it, for more than its ttl.
  const std::string mid = "reshard-mid";
  const int mid_slot = detail::key_slot(lock_key(mid));
  auto mid_lease = take(holder, mid, 1s, forever);
  const int mid_to = other_master(cluster_->master_of_slot(mid_slot));
  const int mid_from = cluster_->begin_migration(mid_slot, mid_to);
  cluster_->migrate(mid_from, mid_to, {lock_key(mid)});
  // Renewed twice (ASK to the target) while the slot stays split.
  EXPECT_TRUE(renewed_again(mid_lease.lease(), 2));
  // Nobody else takes it meanwhile: TRYAGAIN (or busy), a typed error.
  auto intruder = runtimes[0]->acquire({.key = mid, .ttl = 1s, .retries = 0});
  try {
    get_bounded(intruder);
    ADD_FAILURE() << "a lock on a half-migrated slot was taken twice";
  } catch (const StoreRefused& e) {
    EXPECT_EQ(e.server_message().rfind("TRYAGAIN", 0), 0u) << e.server_message();
    EXPECT_EQ(e.backend_code().message(), "TRYAGAIN");
  } catch (const LockNotAcquired&) {
  }
  cluster_->finish_migration(mid_slot, mid_from, mid_to);
  EXPECT_TRUE(renewed_again(mid_lease.lease(), 1));
  cluster_->move_slot(mid_slot, mid_from);
  EXPECT_TRUE(renewed_again(mid_lease.lease(), 1));

  // And the 1000 slots back.
  EXPECT_EQ(reshard(*cluster_, to, from, 1000, 10s), "");
  EXPECT_EQ(slots_of(*cluster_, to).size(), to_slots);
  EXPECT_TRUE(all_renewed(held, 1));
  stop.store(true);
  for (auto& t : workers) t.join();
  workers.clear();

  EXPECT_EQ(hung.load(), 0);
  EXPECT_EQ(untyped.load(), 0);
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_GT(taken.load(), 100);
  EXPECT_FALSE(mid_lease.lease().lost());
  for (const auto& h : held) EXPECT_FALSE(h.lease().lost());
  EXPECT_EQ(holder.stats().leases_lost, 0u);
  for (auto& rt : runtimes) EXPECT_EQ(rt->stats().leases_lost, 0u);
  const auto took = Clock::now() - started;
  EXPECT_LT(took, 30s);
  std::cout << "[ INFO     ] " << taken << " locks taken, " << busy << " busy, " << retried << " typed errors retried, in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms\n";
  auto f = mid_lease.release();
  get_bounded(f);
  for (auto& h : held) {
    auto r = h.release();
    get_bounded(r);
  }
}

// Every master forgets its scripts (SCRIPT FLUSH) three times while leases
// are renewed and new locks taken: NOSCRIPT is answered by loading the
// script again, so no lease is lost and every acquisition succeeds.
// How many NOSCRIPT errors the masters answered (INFO errorstats).
long long noscript_errors(const RedisCluster& cluster) {
  long long n = 0;
  for (int m : cluster.masters()) {
    auto info = cluster.node(m).command({"INFO", "errorstats"}).str;
    auto at = info.find("errorstat_NOSCRIPT:count=");
    if (at != std::string::npos) n += std::stoll(info.substr(at + std::strlen("errorstat_NOSCRIPT:count=")));
  }
  return n;
}

TEST_F(ClusterTest, AScriptFlushOnEveryMasterLosesNoLeaseAndLockingGoesOn) {
  const long long noscript_before = noscript_errors(*cluster_);
  // Renewals at half the ttl: a renewal that meets NOSCRIPT takes a second
  // round trip, and at the default weight (0.9) a 1 s lease leaves it 88 ms,
  // which a loaded machine most likely missed once (the leases of one master
  // were lost at their local deadline; not reproduced). What is tested is
  // that NOSCRIPT costs no lease.
  Options o = options();
  o.watchdog.renew_weight = 0.5;
  Runtime rt(o);
  auto held = hold_all(rt, numbered("flush", 100), 1s);
  std::atomic<bool> stop{false};
  std::atomic<int> taken{0}, failed{0};
  std::thread worker([&] {
    const auto until = std::chrono::steady_clock::now() + 60s;
    for (int i = 0; !stop.load() && std::chrono::steady_clock::now() < until; ++i) {
      auto f = rt.acquire({.key = "flush-new" + std::to_string(i % 50), .ttl = 1s, .retries = forever});
      try {
        auto h = get_bounded(f);
        auto r = h.release();
        get_bounded(r);
        taken++;
      } catch (const std::exception& e) {
        failed++;
        ADD_FAILURE() << e.what();
        return;
      }
    }
  });
  for (int round = 0; round < 3; ++round) {
    for (int m : cluster_->masters()) EXPECT_EQ(cluster_->node(m).command({"SCRIPT", "FLUSH"}).str, "OK");
    const int before = taken.load();
    // Every lease renewed since (each through a NOSCRIPT on its master),
    // and new locks taken.
    EXPECT_TRUE(all_renewed(held, 1)) << "round " << round;
    EXPECT_TRUE(within(5s, [&] { return taken.load() > before + 10 || failed.load() > 0; })) << "round " << round;
  }
  stop.store(true);
  worker.join();
  // The flushes were felt: the masters answered NOSCRIPT.
  EXPECT_GT(noscript_errors(*cluster_), noscript_before);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(rt.stats().leases_lost, 0u);
  for (const auto& h : held) EXPECT_FALSE(h.lease().lost());
  for (auto& h : held) {
    auto f = h.release();
    get_bounded(f);
  }
}

// A slot no master serves (CLUSTER DELSLOTS on every node; the cluster
// is told not to require full coverage, so the other slots stay served):
// an acquisition on it fails at once with a typed error, whether the
// runtime's map is stale (the old owner answers CLUSTERDOWN) or fresh (no
// owner); locks on every other slot, on the same master too, still work.
TEST_F(ClusterTest, ASlotNotServedFailsFastWithATypedErrorAndOtherSlotsWork) {
  const std::string key = "unserved";
  const int slot = detail::key_slot(lock_key(key));
  const int owner = cluster_->master_of_slot(slot);
  ASSERT_GE(owner, 0);
  auto set_everywhere = [&](const std::vector<std::string>& args) {
    for (int n = 0; n < RedisCluster::kNodes; ++n)
      if (cluster_->node(n).running()) cluster_->node(n).command(args);
  };
  Options o = options();
  o.connection.connect_timeout = 1s;
  Runtime stale(o);
  auto warm = stale.inspect(key);
  ASSERT_FALSE(get_bounded(warm).held);

  set_everywhere({"CONFIG", "SET", "cluster-require-full-coverage", "no"});
  struct Reassign {
    std::function<void()> fn;
    ~Reassign() { fn(); }
  } reassign{[&] {
    try {
      cluster_->node(owner).command({"CLUSTER", "ADDSLOTS", std::to_string(slot)});
      // Every master learns it (by gossip) before full coverage is required again.
      EXPECT_TRUE(within(10s, [&] {
        for (int m : cluster_->masters())
          if (cluster_->node(m).command({"GET", lock_key(key)}).str.rfind("CLUSTERDOWN", 0) == 0) return false;
        return true;
      }));
      set_everywhere({"CONFIG", "SET", "cluster-require-full-coverage", "yes"});
      EXPECT_EQ(cluster_->wait_healthy(kBound), "");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the slot could not be given back: " << e.what();
    }
  }};
  // A node that has not yet run DELSLOTS can gossip the old owner back to one that has (an
  // unassigned slot takes any claim), so it is sent again, to every node, until no master serves it.
  ASSERT_TRUE(within(10s, [&] {
    set_everywhere({"CLUSTER", "DELSLOTS", std::to_string(slot)});
    for (int m : cluster_->masters())
      if (cluster_->node(m).command({"GET", lock_key(key)}).str.rfind("CLUSTERDOWN", 0) != 0) return false;
    return true;
  }));

  auto typed_and_fast = [&](Runtime& rt, const char* which) {
    auto t0 = std::chrono::steady_clock::now();
    auto f = rt.acquire({.key = key, .ttl = 2s, .retries = forever});
    if (f.wait_for(kBound) != std::future_status::ready) {
      ADD_FAILURE() << which << ": no answer";
      return;
    }
    try {
      f.get();
      ADD_FAILURE() << which << ": a lock on a slot nobody serves";
    } catch (const StoreRefused& e) {
      std::cout << "[ INFO     ] " << which << ": StoreRefused " << e.server_message() << "\n";
      EXPECT_EQ(e.server_message().rfind("CLUSTERDOWN", 0), 0u) << which << ": " << e.server_message();
    } catch (const ConnectionError& e) {
      std::cout << "[ INFO     ] " << which << ": ConnectionError " << e.what() << "\n";
      EXPECT_NE(std::string(e.what()).find("no master serves slot " + std::to_string(slot)), std::string::npos)
          << which << ": " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << which << ": untyped " << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, o.connection.connect_timeout) << which;
  };
  typed_and_fast(stale, "map read before");
  Runtime fresh(o);
  typed_and_fast(fresh, "map read after");
  typed_and_fast(stale, "map refreshed");

  std::set<int> masters;
  for (int i = 0; i < 40; ++i) {
    std::string k = "served" + std::to_string(i);
    auto h = take(fresh, k, 2s);
    masters.insert(holder_of(k));
    auto f = h.release();
    get_bounded(f);
  }
  EXPECT_EQ(masters.size(), 3u);
  EXPECT_TRUE(masters.count(owner));
}

// The value of lockwatch_cluster_redirects_total{kind="<kind>"} in `rt`'s
// metrics (-1: not there).
long long redirects(const Runtime& rt, const std::string& kind) {
  const std::string text = rt.metrics_text();
  const std::string name = "lockwatch_cluster_redirects_total{kind=\"" + kind + "\"} ";
  auto at = text.find(name);
  return at == std::string::npos ? -1 : std::stoll(text.substr(at + name.size()));
}

// The redirects a runtime followed are counted: MOVED for a call sent by a
// stale map after the slot moved, ASK for a renewal while the slot
// migrates with the lease's key on the target already.
TEST_F(ClusterTest, MovedAndAskRedirectsAreCountedInTheMetrics) {
  const std::string key = "redirect-metrics";
  const int slot = detail::key_slot(lock_key(key));
  Runtime rt(options());
  auto h = take(rt, key, 1s, forever);
  EXPECT_EQ(redirects(rt, "moved"), 0);
  EXPECT_EQ(redirects(rt, "ask"), 0);
  const int home = holder_of(key);
  ASSERT_GE(home, 0);

  // Moved away and inspected at once: the runtime's map is stale (it is
  // read every 5 s, so a try or two more cover a refresh in between).
  int owner = home;
  for (int tries = 0; tries < 3 && redirects(rt, "moved") < 1; ++tries) {
    owner = other_master(owner);
    cluster_->move_slot(slot, owner);
    auto state = rt.inspect(key);
    EXPECT_TRUE(get_bounded(state).held);
  }
  EXPECT_GE(redirects(rt, "moved"), 1);
  EXPECT_EQ(redirects(rt, "ask"), 0);

  // Migrating back, the lease's key moved first: its renewal gets ASK.
  ASSERT_TRUE(renewed_again(h.lease(), 1));  // the map names `owner` now
  const int from = cluster_->begin_migration(slot, home);
  cluster_->migrate(from, home, {lock_key(key)});
  EXPECT_TRUE(renewed_again(h.lease(), 1));
  EXPECT_GE(redirects(rt, "ask"), 1);
  cluster_->finish_migration(slot, from, home);
  EXPECT_TRUE(renewed_again(h.lease(), 1));
  EXPECT_FALSE(h.lease().lost());
  auto f = h.release();
  get_bounded(f);
}

// `n` keys whose locks share one slot (so their renewals are one script
// call, a slot group), the first of them `prefix`0.
std::vector<std::string> same_slot(const std::string& prefix, int n) {
  std::vector<std::string> keys{prefix + "0"};
  const int slot = detail::key_slot(lock_key(keys.front()));
  for (int i = 1; static_cast<int>(keys.size()) < n; ++i) {
    std::string k = prefix + std::to_string(i);
    if (detail::key_slot(lock_key(k)) == slot) keys.push_back(k);
  }
  return keys;
}

// A slot group of leases whose slot moves while the runtime's map still
// names the old master: the renewal answered MOVED is sent on to the new
// master at once, as one group, and confirmed there: no renewal of the
// group ever fails (before, each was reported failed and retried a tick
// later, on the stale map until a refresh came: with a loaded machine,
// past the lease's deadline). Then the slot migrates back with the keys
// moved first: the group's renewal answered ASK goes on at once as well.
TEST_F(ClusterTest, ARenewalGroupAnsweredMovedOrAskIsSentOnAtOnceAndNeverFails) {
  const auto keys = same_slot("moved-group", 4);
  const int slot = detail::key_slot(lock_key(keys.front()));
  // Connected first, each renewal sent 200 ms before the local deadline
  // (as in RenewalsOfManyLeasesOverAllShardsLoseNone): the 1 s leases
  // must outlast a loaded machine's slow setup and late ticks.
  Options o = options();
  o.watchdog.min_renewal_window = 200ms;
  Runtime rt(o);
  connect_every_master(rt);
  auto failures = std::make_shared<RenewalFailures>();
  rt.add_observer(failures);
  auto held = hold_all(rt, keys, 1s);
  ASSERT_TRUE(all_renewed(held, 1));
  const int home = holder_of(keys.front());
  ASSERT_GE(home, 0);

  // Moved while the renewals run on the map read before. A periodic
  // refresh (every 5 s) between the move and the next renewal would spare
  // the renewal its MOVED: then it is moved again.
  int owner = home;
  for (int tries = 0; tries < 3 && redirects(rt, "moved") < 1; ++tries) {
    owner = other_master(owner);
    cluster_->move_slot(slot, owner);
    EXPECT_TRUE(all_renewed(held, 2));
  }
  // One MOVED per lease when the four renew in one command; fewer when a
  // slow build granted them in different ticks: the first MOVED teaches the
  // store the slot's owner, and the later ticks' renewals go there directly.
  EXPECT_GE(redirects(rt, "moved"), 1);
  for (const auto& k : keys) EXPECT_EQ(failures->of(k), 0) << k << ": a renewal answered MOVED was reported failed";

  // Migrating back home with the keys moved first: ASK, at once too.
  const int from = cluster_->begin_migration(slot, home);
  std::vector<std::string> lock_keys;
  for (const auto& k : keys) lock_keys.push_back(lock_key(k));
  cluster_->migrate(from, home, lock_keys);
  EXPECT_TRUE(all_renewed(held, 2));
  EXPECT_GE(redirects(rt, "ask"), static_cast<long long>(keys.size()));
  cluster_->finish_migration(slot, from, home);
  EXPECT_TRUE(all_renewed(held, 1));
  for (const auto& k : keys) EXPECT_EQ(failures->of(k), 0) << k << ": a renewal answered ASK was reported failed";
  EXPECT_EQ(rt.stats().leases_lost, 0u);
  for (auto& h : held) {
    auto r = h.release();
    get_bounded(r);
  }
}

// Script calls (EVALSHA and EVAL) node `m` has run.
long long script_calls(RedisCluster& cluster, int m) {
  const std::string info = cluster.node(m).command({"INFO", "commandstats"}).str;
  long long calls = 0;
  for (const std::string name : {"cmdstat_evalsha:calls=", "cmdstat_eval:calls="}) {
    auto at = info.find(name);
    if (at != std::string::npos) calls += std::atoll(info.c_str() + at + name.size());
  }
  return calls;
}

// Takes and gives back a lock on every master, so that each has the
// scripts cached (one EVALSHA a call) and `rt` has read the slot map.
void warm_every_master(RedisCluster& cluster, Runtime& rt) {
  std::set<int> warm;
  for (int i = 0; warm.size() < cluster.masters().size() && i < 1000; ++i) {
    const std::string key = "warm-" + std::to_string(i);
    const int m = cluster.master_of_slot(detail::key_slot(lock_key(key)));
    if (warm.count(m) > 0) continue;
    LockHandle h = take(rt, key, 5s);
    give_back(h);
    warm.insert(m);
  }
  EXPECT_EQ(warm.size(), cluster.masters().size());
}

// Keys whose locks share a slot, asked for as a set, are taken by one
// script call on the slot's master, which Redis runs atomically, and given
// back by one: the node store batches them by slot, not one call a key.
TEST_F(ClusterTest, ASetOfOneSlotIsTakenAndGivenBackByOneScriptCall) {
  const auto keys = same_slot("acct:", 4);
  const int m = cluster_->master_of_slot(detail::key_slot(lock_key(keys.front())));
  ASSERT_GE(m, 0);
  Runtime rt(options());
  warm_every_master(*cluster_, rt);
  const long long before = script_calls(*cluster_, m);
  auto f = rt.acquire({.key = lockwatch::all_of(keys[3], keys[1], keys[0], keys[2]), .ttl = 30s});
  LockHandle set = get_bounded(f);
  EXPECT_EQ(script_calls(*cluster_, m) - before, 1);
  EXPECT_EQ(set.lease().keys().size(), 4u);
  for (const auto& k : keys) {
    EXPECT_EQ(holder_of(k), m) << k;
    EXPECT_GT(set.lease().fencing_token(k), 0u) << k;
  }
  give_back(set);
  EXPECT_EQ(script_calls(*cluster_, m) - before, 2);
  for (const auto& k : keys) EXPECT_EQ(holder_of(k), -1) << k;
}

// A set over three slots on three masters: one script call per slot, all
// sent at once; taken whole when free, and none of it kept while one key
// is busy elsewhere.
TEST_F(ClusterTest, ASetAcrossSlotsIsTakenWholeOrNotAtAll) {
  auto keys = same_slot("xslot:", 2);  // two keys of one slot...
  std::map<int, std::string> by_master;  // ...and one key on each other master
  const int pair_master = cluster_->master_of_slot(detail::key_slot(lock_key(keys.front())));
  ASSERT_GE(pair_master, 0);
  for (int i = 0; by_master.size() + 1 < cluster_->masters().size() && i < 1000; ++i) {
    const std::string k = "xslot-other:" + std::to_string(i);
    const int m = cluster_->master_of_slot(detail::key_slot(lock_key(k)));
    if (m != pair_master && by_master.count(m) == 0) by_master.emplace(m, k);
  }
  ASSERT_EQ(by_master.size() + 1, cluster_->masters().size());
  for (const auto& [m, k] : by_master) keys.push_back(k);
  const std::string busy_key = by_master.begin()->second;

  Runtime a(options()), b(options());
  warm_every_master(*cluster_, b);
  std::map<int, long long> before;
  for (int m : cluster_->masters()) before[m] = script_calls(*cluster_, m);
  auto whole = b.acquire({.key = lockwatch::all_of(keys[3], keys[2], keys[1], keys[0]), .ttl = 30s});
  LockHandle set = get_bounded(whole);
  for (int m : cluster_->masters()) EXPECT_EQ(script_calls(*cluster_, m) - before[m], 1) << "master " << m;
  for (const auto& k : keys) EXPECT_GE(holder_of(k), 0) << k;
  give_back(set);
  for (const auto& k : keys) EXPECT_EQ(holder_of(k), -1) << k;

  // One key busy: the set fails and keeps nothing. `a` gets each other key
  // as soon as `b` gave it back, long before b's ttl of 30 s would free it.
  LockHandle mid = take(a, busy_key, 30s);
  auto refused = b.acquire({.key = lockwatch::all_of(keys[0], keys[1], keys[2], keys[3]), .ttl = 30s, .wait = 0ms});
  auto err = error_of<LockNotAcquired>(refused);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find(busy_key), std::string::npos) << err->what();
  for (const auto& k : keys) {
    if (k == busy_key) continue;
    auto f = a.acquire({.key = k, .ttl = 5s, .wait = 5s});
    LockHandle h = get_bounded(f);
    give_back(h);
  }
  give_back(mid);
  auto again = b.acquire({.key = lockwatch::all_of(keys[0], keys[1], keys[2], keys[3]), .ttl = 30s, .wait = 5s});
  LockHandle set2 = get_bounded(again);
  for (const auto& k : keys) EXPECT_GE(holder_of(k), 0) << k;
  give_back(set2);
  for (const auto& k : keys) EXPECT_EQ(holder_of(k), -1) << k;
}

// A set of one slot sent by a stale map after the slot moved: the group's
// script call is answered MOVED, and its locks go on to the new master
// together, as one script call there, within the hop budget.
TEST_F(ClusterTest, ASetOfOneSlotAnsweredMovedGoesOnAsOneScriptCall) {
  const auto keys = same_slot("moved-set:", 3);
  const int slot = detail::key_slot(lock_key(keys.front()));
  Runtime rt(options());
  warm_every_master(*cluster_, rt);
  int owner = cluster_->master_of_slot(slot);
  ASSERT_GE(owner, 0);
  // The runtime reads the map every 5 s: a try or two more cover a refresh
  // between the move and the acquisition.
  for (int tries = 0; tries < 3 && redirects(rt, "moved") < 1; ++tries) {
    owner = other_master(owner);
    cluster_->move_slot(slot, owner);
    const long long before = script_calls(*cluster_, owner);
    auto f = rt.acquire({.key = lockwatch::all_of(keys[2], keys[0], keys[1]), .ttl = 30s});
    LockHandle set = get_bounded(f);
    EXPECT_EQ(script_calls(*cluster_, owner) - before, 1);
    for (const auto& k : keys) EXPECT_EQ(holder_of(k), owner) << k;
    give_back(set);
    for (const auto& k : keys) EXPECT_EQ(holder_of(k), -1) << k;
  }
  EXPECT_GE(redirects(rt, "moved"), 1);
}

// The admin runtime reads the slot map when first used and then only
// every 5 s, or when a reply asks for it: right after a move, its map is
// stale, and only following the redirect reaches the lock.
// A lock held by one runtime, seen held by another (whose slot map is now
// read), for the operators' tools to follow as the slot moves.
struct HeldForAdmin {
  HeldForAdmin(const Options& o, const std::string& key) : key(key), holder(o), admin(o) {
    held = take(holder, key, 20s);
    token = held.lease().fencing_token();
    auto first = admin.inspect(key);
    seen_held = get_bounded(first).held;
  }
  // Held, with the fencing counter at this holder's token.
  LockState expect_held() {
    auto f = admin.inspect(key);
    LockState state = get_bounded(f);
    EXPECT_TRUE(state.held);
    EXPECT_EQ(state.fencing_token, token);
    return state;
  }
  // After a forced release: free, and the fencing counter kept.
  void expect_released() {
    auto after = admin.inspect(key);
    LockState gone = get_bounded(after);
    EXPECT_FALSE(gone.held);
    EXPECT_EQ(gone.fencing_token, token);
  }
  std::string key;
  Runtime holder, admin;
  LockHandle held;
  std::uint64_t token = 0;
  bool seen_held = false;
};

TEST_F(ClusterTest, InspectAndForceReleaseFollowASlotThatMoved) {
  const std::string key = "admin-moved";
  const int slot = detail::key_slot(lock_key(key));
  HeldForAdmin h(options(), key);
  ASSERT_TRUE(h.seen_held);
  const int from = holder_of(key);
  const int to = other_master(from);
  ASSERT_GE(from, 0);
  ASSERT_GE(to, 0);

  cluster_->move_slot(slot, to);
  ASSERT_EQ(holder_of(key), to);
  EXPECT_GT(h.expect_held().ttl, 10s);

  cluster_->move_slot(slot, from);  // and back: the map is stale again
  auto forced = h.admin.force_release(key);
  EXPECT_TRUE(get_bounded(forced));
  EXPECT_EQ(holder_of(key), -1);
  h.expect_released();
}

TEST_F(ClusterTest, InspectAndForceReleaseFollowAskWhileTheSlotMigrates) {
  const std::string key = "admin-ask";
  const int slot = detail::key_slot(lock_key(key));
  HeldForAdmin h(options(), key);
  ASSERT_TRUE(h.seen_held);
  const int to = other_master(holder_of(key));
  ASSERT_GE(to, 0);

  // The lock and its counter are on the target, the slot still on the
  // source: the source answers ASK, and only with ASKING does the target
  // serve the slot.
  const int from = cluster_->begin_migration(slot, to);
  cluster_->migrate(from, to, {lock_key(key), fence_key(key)});
  // A target without the scripts: the EVAL sent after NOSCRIPT needs its
  // own ASKING, or it is sent back with MOVED.
  ASSERT_EQ(cluster_->node(to).command({"SCRIPT", "FLUSH"}).str, "OK");
  h.expect_held();
  auto forced = h.admin.force_release(key);
  EXPECT_TRUE(get_bounded(forced));
  // Without ASKING the target refuses the slot (MOVED to the source).
  EXPECT_EQ(cluster_->node(to).command({"EXISTS", lock_key(key)}).type, Reply::Type::kError);

  cluster_->finish_migration(slot, from, to);
  EXPECT_EQ(cluster_->node(to).command({"EXISTS", lock_key(key)}).integer, 0);
  h.expect_released();
  cluster_->move_slot(slot, from);
}

TEST_F(ClusterTest, ASplitSlotIsRetriedWithinTheHopBudgetThenReported) {
  const std::string key = "admin-split";
  const int slot = detail::key_slot(lock_key(key));
  Runtime holder(options()), admin(options());
  auto held = take(holder, key, 20s);
  const std::uint64_t token = held.lease().fencing_token();
  const int to = other_master(holder_of(key));
  ASSERT_GE(to, 0);

  // The lock moved, its counter did not: inspect (both keys) gets TRYAGAIN
  // wherever it goes until the migration ends.
  const int from = cluster_->begin_migration(slot, to);
  cluster_->migrate(from, to, {lock_key(key)});
  auto t0 = std::chrono::steady_clock::now();
  auto split = admin.inspect(key);
  auto err = error_of<StoreRefused>(split);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->server_message().rfind("TRYAGAIN", 0), 0u) << err->server_message();
  // kRedirectBudget (5) retries, each after a throttled map refresh.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);

  cluster_->finish_migration(slot, from, to);
  auto whole = admin.inspect(key);
  LockState state = get_bounded(whole);
  EXPECT_TRUE(state.held);
  EXPECT_EQ(state.fencing_token, token);
  cluster_->move_slot(slot, from);
}

// Release notices are sharded: the waiter subscribes (SSUBSCRIBE) on the
// master of its lock's slot, the release SPUBLISHes there, and the waiter
// wakes long before the holder's ttl would have let it in.
TEST_F(ClusterTest, AWaiterOnEveryMasterWakesPromptlyWhenTheHolderReleases) {
  constexpr auto kTtl = 8s;
  Runtime holder(options(2)), waiter(options(2));
  std::map<int, std::string> key_on;  // master -> a key of its slots
  for (int i = 0; key_on.size() < 3 && i < 300; ++i) {
    std::string key = "wake" + std::to_string(i);
    key_on.emplace(cluster_->master_of_slot(detail::key_slot(lock_key(key))), key);
  }
  ASSERT_EQ(key_on.size(), 3u);
  for (const auto& [m, key] : key_on) {
    auto held = take(holder, key, kTtl, forever);
    const std::uint64_t held_token = held.lease().fencing_token();
    auto waiting = waiter.acquire({.key = key, .ttl = kTtl, .retries = 0, .wait = 20s});
    ASSERT_TRUE(shard_subscribers_become(m, key, 1)) << key;
    EXPECT_EQ(waiting.wait_for(0ms), std::future_status::timeout) << key;
    SCOPED_TRACE(key);
    auto h = woken_by_release(held, waiting, kTtl);
    EXPECT_GT(h.lease().fencing_token(), held_token) << key;
    EXPECT_EQ(holder_of(key), m) << key;
    auto f = h.release();
    get_bounded(f);
    // The waiter is gone: so is its subscription.
    EXPECT_TRUE(shard_subscribers_become(m, key, 0)) << key;
  }
  EXPECT_EQ(holder.stats().leases_lost, 0u);
  EXPECT_EQ(waiter.stats().leases_lost, 0u);
}

// The slot moves while a waiter waits: the old owner drops the
// subscription (an unsolicited sunsubscribe), the waiter subscribes on the
// new owner, and the release there wakes it.
TEST_F(ClusterTest, AWaiterFollowsItsLockToAnotherMasterAndWakesThere) {
  constexpr auto kTtl = 6s;
  const std::string key = "wake-moved";
  const int slot = detail::key_slot(lock_key(key));
  Runtime holder(options(2)), waiter(options(2));
  auto held = take(holder, key, kTtl, forever);
  const std::uint64_t held_token = held.lease().fencing_token();
  const int from = holder_of(key);
  const int to = other_master(from);
  ASSERT_GE(from, 0);
  ASSERT_GE(to, 0);
  auto waiting = waiter.acquire({.key = key, .ttl = kTtl, .retries = 0, .wait = 30s});
  ASSERT_TRUE(shard_subscribers_become(from, key, 1));

  cluster_->move_slot(slot, to);
  const auto moved_at = std::chrono::steady_clock::now();
  ASSERT_EQ(holder_of(key), to);
  EXPECT_TRUE(shard_subscribers_become(to, key, 1));
  // Placed again on the old owner's sunsubscribe, not at the next periodic
  // map refresh (every 5 s).
  EXPECT_LT(std::chrono::steady_clock::now() - moved_at, 2s);
  EXPECT_EQ(shard_subscribers(from, key), 0);
  // Still held (renewed on the new owner): the waiter still waits.
  EXPECT_EQ(waiting.wait_for(0ms), std::future_status::timeout);
  EXPECT_FALSE(held.lease().lost());
  EXPECT_TRUE(renewed_again(held.lease(), 1));

  auto h = woken_by_release(held, waiting, kTtl);
  EXPECT_GT(h.lease().fencing_token(), held_token);
  EXPECT_EQ(holder_of(key), to);
  auto f = h.release();
  get_bounded(f);
  EXPECT_EQ(holder.stats().leases_lost, 0u);
  EXPECT_EQ(waiter.stats().leases_lost, 0u);
  cluster_->move_slot(slot, from);
}

// The node drops the waiter's pub/sub connection: it reconnects, subscribes
// again (SHARDNUMSUB was 0 once the kill returned, so 1 after it is a new
// subscription) and the release still wakes the waiter promptly.
TEST_F(ClusterTest, AWaiterWhosePubSubConnectionDropsSubscribesAgainAndWakes) {
  constexpr auto kTtl = 8s;
  const std::string key = "wake-reconnect";
  Runtime holder(options(2)), waiter(options(2));
  auto held = take(holder, key, kTtl, forever);
  const int m = holder_of(key);
  ASSERT_GE(m, 0);
  auto waiting = waiter.acquire({.key = key, .ttl = kTtl, .retries = 0, .wait = 30s});
  ASSERT_TRUE(shard_subscribers_become(m, key, 1));
  EXPECT_GE(cluster_->node(m).command({"CLIENT", "KILL", "TYPE", "pubsub"}).integer, 1);
  EXPECT_TRUE(shard_subscribers_become(m, key, 1));
  EXPECT_EQ(waiting.wait_for(0ms), std::future_status::timeout);
  auto h = woken_by_release(held, waiting, kTtl);
  auto f = h.release();
  get_bounded(f);
  EXPECT_EQ(waiter.stats().leases_lost, 0u);
}

// A waiter whose slot map predates a move: its SSUBSCRIBE may reach the old
// owner (answered MOVED) or follow a refreshed map; either way it ends up
// subscribed on the new owner only, and wakes on the release there.
TEST_F(ClusterTest, AWaiterWithAStaleMapSubscribesOnTheNewOwner) {
  constexpr auto kTtl = 6s;
  const std::string key = "wake-stale";
  const int slot = detail::key_slot(lock_key(key));
  Runtime holder(options(2)), waiter(options(2));
  auto held = take(holder, key, kTtl, forever);
  auto seen = waiter.inspect(key);  // the waiter's map, read now
  ASSERT_TRUE(get_bounded(seen).held);
  const int from = holder_of(key);
  const int to = other_master(from);
  ASSERT_GE(to, 0);
  cluster_->move_slot(slot, to);

  auto waiting = waiter.acquire({.key = key, .ttl = kTtl, .retries = 0, .wait = 30s});
  EXPECT_TRUE(shard_subscribers_become(to, key, 1));
  EXPECT_EQ(shard_subscribers(from, key), 0);
  EXPECT_EQ(waiting.wait_for(0ms), std::future_status::timeout);
  auto h = woken_by_release(held, waiting, kTtl);
  auto f = h.release();
  get_bounded(f);
  EXPECT_EQ(waiter.stats().leases_lost, 0u);
  cluster_->move_slot(slot, from);
}

// hiredis 0.14's async API aborted on the first `smessage`; our reader
// takes any amount of them. Junk notices on the waiters' own channels (a
// notice for a lock still held only makes a waiter look again), on many
// other shard channels and channels that are no lock's, some large, while
// the same runtime takes and releases other locks on every master: nothing
// aborts, no waiter takes a held lock, and each still wakes on the real
// release.
TEST_F(ClusterTest, ShardedMessagesNeverAbortOrConfuseTheConnection) {
  constexpr auto kTtl = 8s;
  Runtime holder(options(2)), waiter(options(2));
  const auto keys = numbered("noise", 6);
  auto held = hold_all(holder, keys, kTtl);
  std::vector<std::future<LockHandle>> waiting;
  for (const auto& key : keys) waiting.push_back(waiter.acquire({.key = key, .ttl = kTtl, .retries = 0, .wait = 30s}));
  for (const auto& key : keys) ASSERT_TRUE(shard_subscribers_become(holder_of(key), key, 1)) << key;

  std::vector<int> master_of;
  for (const auto& key : keys) master_of.push_back(holder_of(key));
  std::atomic<long long> delivered{0};
  std::thread noise([&] {
    const std::string big(200 * 1024, 'x');  // larger than one socket read
    for (int round = 0; round < 20; ++round) {
      for (std::size_t k = 0; k < keys.size(); ++k) {
        const std::string ch = lock_key(keys[k]) + ":rel";
        const int m = master_of[k];
        for (const std::string& payload : {std::string("1"), std::string(), std::string("\r\n*3\r\n$0\0", 9), big})
          delivered += cluster_->node(m).command({"SPUBLISH", ch, payload}).integer;
      }
      for (int i = 0; i < 15; ++i) {
        const std::string other = round % 2 ? "lockwatch:{noise-other" + std::to_string(i) + "}:rel"
                                            : "{noise-other" + std::to_string(i) + "}plain";
        cluster_->command_for(other, {"SPUBLISH", other, "junk"});
      }
    }
  });
  // The waiters' runtime keeps working meanwhile, on every master.
  std::set<int> masters;
  for (int i = 0; i < 30; ++i) {
    std::string key = "noise-work" + std::to_string(i);
    auto h = take(waiter, key, 2s);
    masters.insert(holder_of(key));
    auto f = h.release();
    get_bounded(f);
  }
  noise.join();
  EXPECT_EQ(masters.size(), 3u);
  EXPECT_EQ(delivered.load(), 20 * 6 * 4);  // every junk notice reached its one subscriber
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(waiting[i].wait_for(0ms), std::future_status::timeout) << keys[i];
    EXPECT_FALSE(held[i].lease().lost()) << keys[i];
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    SCOPED_TRACE(keys[i]);
    auto h = woken_by_release(held[i], waiting[i], kTtl);
    auto f = h.release();
    get_bounded(f);
  }
  EXPECT_EQ(holder.stats().leases_lost, 0u);
  EXPECT_EQ(waiter.stats().leases_lost, 0u);
}

// A reply lost after the script ran: the master is stopped with the
// acquisition in its socket, the command timeout resets the connection,
// the master runs it when it resumes and its reply goes nowhere. The store
// sends it again to the slot's owner, and the script, finding the lock
// holding our token, answers with the fencing token of the first run: the
// caller gets the lock, not a "busy" from its own lock. Then a release
// whose reply is lost the same way is sent again and counts as released.
TEST_F(ClusterTest, ACallWhoseReplyWasLostIsSentAgainAndKeepsItsFence) {
  const std::string key = "lost-reply";
  const std::string name = lock_key(key);
  const int m = cluster_->master_of_slot(detail::key_slot(name));
  ASSERT_GE(m, 0);
  Options o = options();
  o.connection.command_timeout = 300ms;
  StoreOnLoop store(o);
  // Warm up: the node has the scripts cached, so each call is one EVALSHA.
  ASSERT_EQ(store.acquire(name, "warm-up", 2s).status, detail::Acquired::Status::kTaken);
  ASSERT_EQ(store.release(name, "warm-up"), detail::Released::kYesUnheard);
  auto evalsha_calls = [&] {
    auto info = cluster_->node(m).command({"INFO", "commandstats"}).str;
    auto at = info.find("cmdstat_evalsha:calls=");
    return at == std::string::npos ? 0LL : std::atoll(info.c_str() + at + 22);
  };
  auto fence_now = [&] { return std::atoll(cluster_->node(m).command({"GET", fence_key(key)}).str.c_str()); };
  const long long calls_before = evalsha_calls();
  const long long fence_before = fence_now();

  const int downs = store.downs();
  cluster_->node(m).pause();
  auto acquiring = store.acquire_async(name, "our-token", 10s);
  auto until = std::chrono::steady_clock::now() + kBound;
  while (store.downs() == downs && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);  // polling the store's own count of lost connections
  cluster_->node(m).resume();
  ASSERT_GT(store.downs(), downs);
  auto taken = get_bounded(acquiring);
  ASSERT_EQ(taken.status, detail::Acquired::Status::kTaken);
  // Run twice (the lost one and the resend), the counter raised once.
  EXPECT_EQ(evalsha_calls() - calls_before, 2);
  EXPECT_EQ(fence_now(), fence_before + 1);
  EXPECT_EQ(taken.fence, static_cast<std::uint64_t>(fence_before + 1));
  const std::string value = cluster_->node(m).command({"GET", name}).str;
  EXPECT_EQ(value.substr(0, value.find(' ')), "our-token") << value;

  const int downs2 = store.downs();
  const long long calls_mid = evalsha_calls();
  cluster_->node(m).pause();
  std::promise<detail::Released> released;
  std::thread releasing([&] { released.set_value(store.release(name, "our-token")); });
  until = std::chrono::steady_clock::now() + kBound;
  while (store.downs() == downs2 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);  // as above
  cluster_->node(m).resume();
  releasing.join();
  // The first run released it; the resend found it gone: released (who
  // heard the first run's notice is not known).
  EXPECT_EQ(released.get_future().get(), detail::Released::kYes);
  EXPECT_EQ(evalsha_calls() - calls_mid, 2);
  EXPECT_EQ(cluster_->node(m).command({"EXISTS", name}).integer, 0);
  ASSERT_EQ(cluster_->wait_healthy(kBound), "");
}

TEST_F(ClusterTest, RaiseFenceAndClaimPeriodFollowASlotThatMoved) {
  const std::string key = "job:moved";
  const std::string name = lock_key(key);
  const int slot = detail::key_slot(name);
  StoreOnLoop store(options());
  auto taken = store.acquire(name, "our-token", 20s);
  ASSERT_EQ(taken.status, detail::Acquired::Status::kTaken);
  const int from = holder_of(key);
  const int to = other_master(from);
  ASSERT_GE(to, 0);

  cluster_->move_slot(slot, to);
  auto claim = store.claim(name, "our-token", 7);
  EXPECT_EQ(claim.status, detail::ClaimResult::Status::kClaimed);
  EXPECT_NE(claim.status, detail::ClaimResult::Status::kFailed) << claim.error.describe();
  EXPECT_EQ(cluster_->node(to).command({"GET", name + ":period"}).str, "7");

  cluster_->move_slot(slot, from);
  EXPECT_TRUE(store.raise_fence(name, taken.fence + 1000));
  EXPECT_EQ(cluster_->node(from).command({"GET", fence_key(key)}).str, std::to_string(taken.fence + 1000));
}

// rediss-cluster://: six nodes that speak TLS only to clients (and on
// their bus and replication links), two of them given as seeds.
class ClusterTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    RedisClusterOptions o;
    o.tls = true;
    cluster_ = new RedisCluster(o);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

  static RedisCluster* cluster_;
};

RedisCluster* ClusterTlsTest::cluster_ = nullptr;

TEST_F(ClusterTlsTest, LocksOnEveryMasterOverTls) {
  Options o;
  o.redis_url = cluster_->url();
  ASSERT_EQ(o.redis_url.rfind("rediss-cluster://", 0), 0u) << o.redis_url;
  o.tls.ca_file = test_certificates().ca_cert;
  o.runtime.threads = 2;
  Runtime rt(o);
  // Keys until every master holds one: at least one master was not a seed
  // and is reached at the TLS port the slot map gives.
  std::set<int> masters;
  for (int i = 0; i < 60 && masters.size() < 3; ++i) {
    std::string key = "tls" + std::to_string(i);
    auto h = take(rt, key, 5s);
    EXPECT_GE(h.lease().fencing_token(), 1u);
    auto state = rt.inspect(key);
    EXPECT_TRUE(get_bounded(state).held) << key;
    int holder = -1;
    for (int m : cluster_->masters())
      if (cluster_->node(m).command({"EXISTS", lock_key(key)}).integer == 1) holder = m;
    EXPECT_GE(holder, 0) << key;
    masters.insert(holder);
    auto f = h.release();
    get_bounded(f);
  }
  EXPECT_EQ(masters.size(), 3u);
}

TEST_F(ClusterTlsTest, AMovedSlotIsFollowedOverTls) {
  const std::string key = "tls-moved";
  const int slot = detail::key_slot(lock_key(key));
  Options o;
  o.redis_url = cluster_->url();
  o.tls.ca_file = test_certificates().ca_cert;
  o.runtime.threads = 2;
  Runtime rt(o);
  auto h = take(rt, key, 20s);
  const int from = cluster_->master_of_slot(slot);
  int to = -1;
  for (int m : cluster_->masters())
    if (m != from) to = m;
  ASSERT_GE(from, 0);
  ASSERT_GE(to, 0);
  cluster_->move_slot(slot, to);
  // MOVED names the new master's TLS port.
  auto state = rt.inspect(key);
  LockState s = get_bounded(state);
  EXPECT_TRUE(s.held);
  EXPECT_EQ(s.fencing_token, h.lease().fencing_token());
  auto f = h.release();
  get_bounded(f);
  EXPECT_EQ(cluster_->node(to).command({"EXISTS", lock_key(key)}).integer, 0);
  cluster_->move_slot(slot, from);
}

TEST_F(ClusterTlsTest, AnUntrustedServerCertificateIsAConnectionError) {
  Options o;
  o.redis_url = cluster_->url();  // no tls.ca_file: the test CA is not trusted
  o.connection.connect_timeout = 1s;
  Runtime rt(o);
  auto f = rt.acquire({.key = "k", .ttl = 1s, .retries = 0});
  auto err = error_of<ConnectionError>(f);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("certificate verify failed"), std::string::npos) << err->what();
}

// Wrong credentials for a cluster whose every node has requirepass: an
// AuthError, as from one node, within the connect timeout; the right ones
// lock on every master.
TEST(ClusterAuthTest, WrongOrMissingCredentialsAreAnAuthErrorWithinTheConnectTimeout) {
  RedisClusterOptions co;
  co.password = "right";
  RedisCluster cluster(co);
  const std::string seeds =
      "127.0.0.1:" + std::to_string(cluster.node(0).port()) + ",127.0.0.1:" + std::to_string(cluster.node(1).port());
  for (const std::string& url : {"redis-cluster://:wrong@" + seeds, "redis-cluster://" + seeds}) {
    Options o;
    o.redis_url = url;
    o.connection.connect_timeout = 1s;
    o.runtime.threads = 1;
    Runtime rt(o);
    auto t0 = std::chrono::steady_clock::now();
    auto f = rt.acquire({.key = "k", .ttl = 1s, .retries = 0});
    auto err = error_of<AuthError>(f);
    EXPECT_TRUE(err) << url;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, o.connection.connect_timeout) << url;
    if (err) {
      EXPECT_EQ(std::string(err->what()).find(":wrong@"), std::string::npos) << "no password in messages";
    }
  }
  Options o;
  o.redis_url = cluster.url();
  o.runtime.threads = 1;
  Runtime rt(o);
  std::set<int> masters;
  for (int i = 0; i < 30; ++i) {
    const std::string key = "auth" + std::to_string(i);
    auto h = take(rt, key, 2s);
    for (int m : cluster.masters())
      if (cluster.node(m).command({"EXISTS", lock_key(key)}).integer == 1) masters.insert(m);
    auto f = h.release();
    get_bounded(f);
  }
  EXPECT_EQ(masters.size(), 3u);
}

TEST(ClusterSeedTest, ANodeOutsideAClusterIsATypedError) {
  RedisServer plain;
  Options o;
  o.redis_url = "redis-cluster://127.0.0.1:" + std::to_string(plain.port());
  o.connection.connect_timeout = 1s;
  Runtime rt(o);
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt.acquire({.key = "k", .ttl = 1s, .retries = 0});
  auto err = error_of<ConnectionError>(f);
  ASSERT_TRUE(err);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_NE(err->endpoint().find(std::to_string(plain.port())), std::string::npos) << err->endpoint();
  EXPECT_NE(std::string(err->what()).find("not a Redis Cluster node"), std::string::npos) << err->what();
}

TEST(ClusterSeedTest, NoReachableSeedFailsWithinTheConnectTimeout) {
  const int p1 = free_loopback_port(), p2 = free_loopback_port();
  Options o;
  o.redis_url = "redis-cluster://127.0.0.1:" + std::to_string(p1) + ",127.0.0.1:" + std::to_string(p2);
  o.connection.connect_timeout = 500ms;
  Runtime rt(o);
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt.acquire({.key = "k", .ttl = 1s, .retries = 0});
  auto err = error_of<ConnectionError>(f);
  ASSERT_TRUE(err);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_NE(err->endpoint().find(std::to_string(p1)), std::string::npos) << err->endpoint();
  EXPECT_NE(err->endpoint().find(std::to_string(p2)), std::string::npos) << err->endpoint();
}

TEST(ClusterSeedTest, MalformedClusterUrlsAreInvalidArguments) {
  Options o;
  for (const char* bad : {"redis-cluster://127.0.0.1:7000/1", "redis-cluster://",
                          "redis-cluster://127.0.0.1:7000,,127.0.0.1:7001", "rediss-cluster://127.0.0.1:7000/0",
                          "rediss-cluster://127.0.0.1:notaport", "redis-clusters://127.0.0.1:7000"}) {
    o.redis_url = bad;
    EXPECT_THROW(o.validate(), InvalidArgument) << bad;
  }
  for (const char* good : {"redis-cluster://u:p@127.0.0.1:7000,127.0.0.1:7001",
                           "rediss-cluster://u:p@127.0.0.1:7000,127.0.0.1:7001"}) {
    o.redis_url = good;
    EXPECT_NO_THROW(o.validate()) << good;
  }
  // The TLS options are checked for rediss-cluster:// as for rediss://.
  o.tls.cert_file = test_certificates().client_cert;
  EXPECT_THROW(o.validate(), InvalidArgument);
}

}  // namespace
}  // namespace lockwatch::testing
