// A real Redis Cluster (3 masters, 3 replicas, on loopback) behind
// redis-cluster://: slot math against the server, routing over every
// master, exclusion and fencing across runtimes, batched renewals over all
// shards, a graceful failover while leases are held, and bad seeds.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "lockwatch/lockwatch.hpp"
#include "store/redis/cluster_slot.hpp"
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
    o.threads = threads;
    return o;
  }

  // The index of the master holding lock `key` now (-1: none holds it).
  static int holder_of(const std::string& key) {
    for (int m : cluster_->masters())
      if (cluster_->node(m).command({"EXISTS", lock_key(key)}).integer == 1) return m;
    return -1;
  }

  static RedisCluster* cluster_;
};

RedisCluster* ClusterTest::cluster_ = nullptr;

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
  auto f = rt.acquire(key, ttl, retries);
  return get_bounded(f);
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

TEST_F(ClusterTest, RenewalsOfManyLeasesOverAllShardsLoseNone) {
  constexpr int kLeases = 200;
  Runtime rt(options());
  std::vector<std::future<LockHandle>> acquiring;
  for (int i = 0; i < kLeases; ++i) acquiring.push_back(rt.acquire("renew" + std::to_string(i), 600ms));
  std::vector<LockHandle> held;
  for (auto& f : acquiring) held.push_back(get_bounded(f));
  auto before = rt.stats();
  auto until = std::chrono::steady_clock::now() + kBound;
  while (rt.stats().renewals_sent - before.renewals_sent < 3 * kLeases && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);  // polling counters the watchdog moves
  auto after = rt.stats();
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
  constexpr int kLeases = 200;
  Runtime rt(options());
  std::vector<std::future<LockHandle>> acquiring;
  for (int i = 0; i < kLeases; ++i) acquiring.push_back(rt.acquire("fo" + std::to_string(i), 2s));
  std::vector<LockHandle> held;
  for (auto& f : acquiring) held.push_back(get_bounded(f));
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

TEST(ClusterSeedTest, ANodeOutsideAClusterIsATypedError) {
  RedisServer plain;
  Options o;
  o.redis_url = "redis-cluster://127.0.0.1:" + std::to_string(plain.port());
  o.connect_timeout = 1s;
  Runtime rt(o);
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt.acquire("k", 1s, 0);
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
  o.connect_timeout = 500ms;
  Runtime rt(o);
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt.acquire("k", 1s, 0);
  auto err = error_of<ConnectionError>(f);
  ASSERT_TRUE(err);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_NE(err->endpoint().find(std::to_string(p1)), std::string::npos) << err->endpoint();
  EXPECT_NE(err->endpoint().find(std::to_string(p2)), std::string::npos) << err->endpoint();
}

TEST(ClusterSeedTest, MalformedClusterUrlsAreInvalidArguments) {
  Options o;
  o.redis_url = "redis-cluster://127.0.0.1:7000/1";
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.redis_url = "redis-cluster://";
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.redis_url = "redis-cluster://127.0.0.1:7000,,127.0.0.1:7001";
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.redis_url = "redis-cluster://u:p@127.0.0.1:7000,127.0.0.1:7001";
  EXPECT_NO_THROW(o.validate());
}

}  // namespace
}  // namespace lockwatch::testing
