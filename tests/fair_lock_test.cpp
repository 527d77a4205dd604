// Fair locks (LockKind::fair(), .fair()): granted in the order the waiters
// arrived across runtimes; a waiter that gives up or dies leaves the queue
// and never blocks it; tokens rise; a lost lease stops its holder; one
// family per key; stores that keep no queue refuse them with Unsupported.
// Run on memory://, one Redis node, a Redis Cluster, MariaDB, and
// PostgreSQL and a ZooKeeper ensemble (when built with them), each started
// once for the suite.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends.hpp"
#include "lockwatch/lockwatch.hpp"
#include "store/memory/memory_space.hpp"
#if LOCKWATCH_WITH_SQL
#include "support/mariadb_server.hpp"
#endif
#if LOCKWATCH_WITH_POSTGRESQL
#include "support/postgres_server.hpp"
#endif
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

using namespace std::chrono_literals;

// One store of the suite: its URL, and how many fair waiters a key's queue
// holds (what the tests wait on before the next waiter arrives).
class FairStore {
 public:
  virtual ~FairStore() = default;
  virtual std::string url() const = 0;
  virtual long long queued(const std::string& key) const = 0;
  virtual bool has_server() const { return true; }
  // The shortest ttl whose renewals hold on a loaded machine (Backend's).
  virtual std::chrono::milliseconds steady_ttl() const { return std::chrono::milliseconds(600); }
};

class MemoryFairStore final : public FairStore {
 public:
  std::string url() const override { return "memory://fair-suite"; }
  long long queued(const std::string& key) const override {
    return static_cast<long long>(space_->fair_waiters("lockwatch:" + key));
  }
  bool has_server() const override { return false; }

 private:
  // Kept open for the suite, so every runtime of a test shares it.
  std::shared_ptr<detail::MemorySpace> space_ = detail::MemorySpace::open("fair-suite");
};

class RedisFairStore final : public FairStore {
 public:
  std::string url() const override { return server_.url(); }
  long long queued(const std::string& key) const override {
    return server_.command({"ZCARD", "lockwatch:{" + key + "}:queue"}).integer;
  }

 private:
  RedisServer server_;
};

class ClusterFairStore final : public FairStore {
 public:
  std::string url() const override { return cluster_.url(); }
  long long queued(const std::string& key) const override {
    const std::string lock = "lockwatch:{" + key + "}";
    return cluster_.command_for(lock, {"ZCARD", lock + ":queue"}).integer;
  }
  const RedisCluster& cluster() const { return cluster_; }

 private:
  RedisCluster cluster_;
};

#if LOCKWATCH_WITH_ZOOKEEPER
class ZooKeeperFairStore final : public FairStore {
 public:
  std::string url() const override { return backend_.url(); }
  // The nodes of the lock's directory: the lowest holds (or is about to),
  // the others wait, in the order they came.
  long long queued(const std::string& key) const override {
    long long nodes = 0;
    for (const auto& c : ZooKeeperBackend::client().children(ZooKeeperBackend::dir_of("lockwatch:" + key)))
      if (c.rfind("lock-", 0) == 0) ++nodes;
    return std::max(0LL, nodes - 1);
  }
  std::chrono::milliseconds steady_ttl() const override { return backend_.steady_ttl(); }

 private:
  ZooKeeperBackend backend_;
};
#endif

#if LOCKWATCH_WITH_POSTGRESQL
class PostgresFairStore final : public FairStore {
 public:
  std::string url() const override { return server_.url(); }
  long long queued(const std::string& key) const override {
    return std::stoll(server_.query("SELECT count(*) FROM lockwatch_locks_holders WHERE role = 'q' AND "
                                    "expires_at > clock_timestamp() AND lock_name = convert_to('lockwatch:" +
                                    key + "', 'UTF8')")
                          .at(0)
                          .at(0));
  }

 private:
  PostgresServer server_;
};
#endif

#if LOCKWATCH_WITH_SQL
class MySqlFairStore final : public FairStore {
 public:
  std::string url() const override { return server_.url(); }
  long long queued(const std::string& key) const override {
    auto rows = server_.query(std::string("SELECT COUNT(*) FROM ") + MariaDbServer::kDatabase +
                              ".lockwatch_locks_holders WHERE lock_name = 'lockwatch:" + key +
                              "' AND role = 'q' AND expires_at > NOW(6)");
    return rows.empty() || rows[0].empty() ? 0 : std::stoll(rows[0][0]);
  }

 private:
  MariaDbServer server_;
};
#endif

class FairLockTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void TearDownTestSuite() { stores().clear(); }

  static std::map<std::string, std::unique_ptr<FairStore>>& stores() {
    static std::map<std::string, std::unique_ptr<FairStore>> s;
    return s;
  }

  FairStore& store() {
    auto& slot = stores()[GetParam()];
    if (!slot) {
      if (GetParam() == "memory") slot = std::make_unique<MemoryFairStore>();
      if (GetParam() == "redis") slot = std::make_unique<RedisFairStore>();
      if (GetParam() == "redis-cluster") slot = std::make_unique<ClusterFairStore>();
#if LOCKWATCH_WITH_ZOOKEEPER
      if (GetParam() == "zookeeper") slot = std::make_unique<ZooKeeperFairStore>();
#endif
#if LOCKWATCH_WITH_POSTGRESQL
      if (GetParam() == "postgresql") slot = std::make_unique<PostgresFairStore>();
#endif
#if LOCKWATCH_WITH_SQL
      if (GetParam() == "mysql") slot = std::make_unique<MySqlFairStore>();
#endif
    }
    return *slot;
  }

  Options options() {
    Options o;
    o.redis_url = store().url();
    o.runtime.threads = 2;
    // A test's ZooKeeper ensemble on a loaded machine has left a request
    // unanswered for the whole command timeout (2 s) now and then: a call
    // that waits rides such a stall out for the connect timeout, which
    // the default (2 s) would end at that first timeout.
    if (GetParam() == "zookeeper") o.connection.connect_timeout = 10s;
    return o;
  }

  // Waits (bounded) until `key`'s queue holds `n` waiters.
  bool queued_within_bound(const std::string& key, long long n) {
    const auto until = std::chrono::steady_clock::now() + kBound;
    while (std::chrono::steady_clock::now() < until) {
      if (store().queued(key) == n) return true;
      std::this_thread::sleep_for(2ms);  // polling the store's state, bounded
    }
    return false;
  }
};

TEST_P(FairLockTest, GrantsFollowTheOrderOfArrivalAcrossRuntimes) {
  constexpr int kWaiters = 4;
  Runtime holder_rt(options());
  std::vector<std::unique_ptr<Runtime>> rts;
  for (int i = 0; i < kWaiters; ++i) rts.push_back(std::make_unique<Runtime>(options()));
  auto first = holder_rt.acquire({.key = "order", .ttl = 5s, .kind = LockKind::fair()});
  LockHandle holder = get_bounded(first);
  const std::uint64_t holder_token = holder.lease().fencing_token();

  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> order;
  std::vector<std::uint64_t> tokens;
  for (int i = 0; i < kWaiters; ++i) {
    rts[i]->async_acquire({.key = "order", .ttl = 5s, .retries = forever, .wait = kBound, .kind = LockKind::fair()}, [&, i](std::error_code e, LockHandle h) {
      std::lock_guard lk(mu);
      order.push_back(e ? -1 : i);
      tokens.push_back(e ? 0 : h.lease().fencing_token());
      cv.notify_all();
      // The handle, dropped here, releases the lock: the next one goes.
    });
    ASSERT_TRUE(queued_within_bound("order", i + 1)) << "waiter " << i << " never reached the store's queue";
  }
  give_back(holder);
  std::unique_lock lk(mu);
  ASSERT_TRUE(cv.wait_for(lk, kBound, [&] { return order.size() == kWaiters; }));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  std::uint64_t last = holder_token;
  for (std::uint64_t t : tokens) {
    EXPECT_GT(t, last);
    last = t;
  }
}

TEST_P(FairLockTest, GrantsFollowTheOrderOfArrivalAcrossThreeProcesses) {
  if (!store().has_server()) GTEST_SKIP() << "a memory space is per process: a child process cannot wait on it";
  const char* holder_exe = std::getenv("LOCKWATCH_LOCK_HOLDER");
  ASSERT_NE(holder_exe, nullptr);
  Runtime rt(options());
  auto first = rt.acquire({.key = "processes", .ttl = 5s, .kind = LockKind::fair()});
  LockHandle holder = get_bounded(first);
  std::uint64_t last = holder.lease().fencing_token();
  std::vector<std::unique_ptr<ChildProcess>> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{holder_exe, store().url(), "processes", "5000", "fair"}));
    ASSERT_TRUE(queued_within_bound("processes", i + 1)) << "process " << i << " never reached the store's queue";
  }
  give_back(holder);
  for (int i = 0; i < 3; ++i) {
    // Process i holds while those after it are still queued behind it.
    auto line = waiters[i]->read_line(kBound);
    ASSERT_TRUE(line.has_value()) << "process " << i << " was never granted";
    ASSERT_EQ(line->rfind("held ", 0), 0u) << *line;
    EXPECT_TRUE(queued_within_bound("processes", 2 - i)) << "process " << i << " was granted out of order";
    const std::uint64_t token = std::stoull(line->substr(5));
    EXPECT_GT(token, last);
    last = token;
    waiters[i]->kill(SIGTERM);  // gives the lock back: the next one goes
  }
}

TEST_P(FairLockTest, AWaiterThatGivesUpLeavesTheQueueAndTheNextIsGranted) {
  Runtime a(options()), b(options()), c(options());
  auto first = a.acquire({.key = "give-up", .ttl = 5s, .kind = LockKind::fair()});
  LockHandle holder = get_bounded(first);
  const std::uint64_t holder_token = holder.lease().fencing_token();
  // Its wait covers b's and c's first connections (a PostgreSQL login on a
  // loaded machine can take most of a second) and both reaching the queue.
  auto quitter = b.acquire({.key = "give-up", .ttl = 5s, .retries = forever, .wait = 2s, .kind = LockKind::fair()});
  ASSERT_TRUE(queued_within_bound("give-up", 1));
  auto patient = c.acquire({.key = "give-up", .ttl = 5s, .retries = forever, .wait = kBound, .kind = LockKind::fair()});
  ASSERT_TRUE(queued_within_bound("give-up", 2));
  EXPECT_THROW(get_bounded(quitter), LockNotAcquired);
  EXPECT_TRUE(queued_within_bound("give-up", 1)) << "the waiter that gave up kept its place";
  const auto released_at = std::chrono::steady_clock::now();
  give_back(holder);
  LockHandle next = get_bounded(patient);
  // MySQL sends no release notice: its waiters ask again at least once a
  // second (the runtime's back-off bound), so a release is seen within that
  // and a round trip. The others wake the next waiter by the notice.
  const auto prompt = GetParam() == "mysql" ? 1500ms : 1000ms;
  EXPECT_LT(std::chrono::steady_clock::now() - released_at, prompt) << "the next waiter was not woken by the release";
  EXPECT_GT(next.lease().fencing_token(), holder_token);
  give_back(next);
}

TEST_P(FairLockTest, AFirstWaiterThatGivesUpWhileTheLockIsFreeWakesTheNext) {
  // A call without a wait takes its place and leaves it at once.
  Runtime a(options()), b(options());
  auto first = a.acquire({.key = "no-wait", .ttl = 5s, .kind = LockKind::fair()});
  LockHandle holder = get_bounded(first);
  auto once = b.acquire({.key = "no-wait", .ttl = 5s, .retries = forever, .wait = 0ms, .kind = LockKind::fair()});
  EXPECT_THROW(get_bounded(once), LockNotAcquired);
  EXPECT_TRUE(queued_within_bound("no-wait", 0));
  give_back(holder);
  auto again = b.acquire({.key = "no-wait", .ttl = 5s, .retries = forever, .wait = 0ms, .kind = LockKind::fair()});
  LockHandle h = get_bounded(again);
  give_back(h);
}

TEST_P(FairLockTest, AKilledWaiterIsDroppedWithinItsTtlAndNeverBlocksTheQueue) {
  if (!store().has_server()) GTEST_SKIP() << "a memory space is per process: a child process cannot wait on it";
  const char* holder_exe = std::getenv("LOCKWATCH_LOCK_HOLDER");
  ASSERT_NE(holder_exe, nullptr);
  Runtime a(options()), b(options());
  auto first = a.acquire({.key = "killed-waiter", .ttl = 5s, .kind = LockKind::fair()});
  LockHandle holder = get_bounded(first);
  const std::uint64_t holder_token = holder.lease().fencing_token();
  ChildProcess child({holder_exe, store().url(), "killed-waiter", "1000", "fair"});
  ASSERT_TRUE(queued_within_bound("killed-waiter", 1)) << "the child never queued";
  auto next = b.acquire({.key = "killed-waiter", .ttl = 5s, .retries = forever, .wait = kBound, .kind = LockKind::fair()});
  ASSERT_TRUE(queued_within_bound("killed-waiter", 2));
  child.kill(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  give_back(holder);
  // The dead waiter is first: it never takes the lock, and its place runs
  // out a ttl (1 s) after its last attempt at most.
  LockHandle h = get_bounded(next);
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 2000ms);
  EXPECT_GT(h.lease().fencing_token(), holder_token);
  give_back(h);
}

TEST_P(FairLockTest, AFairLeaseIsRenewedAndALostOneStopsItsHolder) {
  Runtime rt(options());
  auto f = rt.acquire({.key = "lost-fair", .ttl = store().steady_ttl(), .kind = LockKind::fair()});
  LockHandle h = get_bounded(f);
  EXPECT_TRUE(renewed_again(h.lease(), 2)) << "the watchdog did not renew the fair lease";
  auto forced = rt.force_release("lost-fair");
  EXPECT_TRUE(get_bounded(forced));
  EXPECT_TRUE(stopped_within_bound(h.lease().stop_token()));
  EXPECT_TRUE(h.lease().lost());
}

TEST_P(FairLockTest, AKeyHeldFairIsRefusedAsAnotherKindAndTheOtherWayRound) {
  Runtime a(options()), b(options());
  auto f = a.acquire({.key = "family", .ttl = 5s, .kind = LockKind::fair()});
  LockHandle h = get_bounded(f);
  for (LockKind other : {LockKind::shared(), LockKind::permits(2), LockKind::exclusive()}) {
    auto g = b.acquire({.key = "family", .ttl = 5s, .retries = forever, .wait = 0ms, .kind = other});
    EXPECT_THROW(get_bounded(g), InvalidArgument) << other.describe();
  }
  give_back(h);
  auto s = a.acquire({.key = "family-shared", .ttl = 5s, .kind = LockKind::shared()});
  LockHandle reader = get_bounded(s);
  auto g = b.acquire({.key = "family-shared", .ttl = 5s, .retries = forever, .wait = 0ms, .kind = LockKind::fair()});
  EXPECT_THROW(get_bounded(g), InvalidArgument);
  give_back(reader);
}

TEST_P(FairLockTest, LockedTakesFairAsAModifier) {
  Runtime rt(options());
  auto run = LOCKED("fair-locked:{0}", 5s, forever, .fair().wait(kBound).on(rt))[](int) {
    return this_lease().fencing_token();
  };
  auto one = run(1);
  auto two = run(1);
  const auto t1 = get_bounded(one);
  const auto t2 = get_bounded(two);
  EXPECT_NE(t1, t2);
  EXPECT_GT(std::max(t1, t2), 0u);
}

TEST_P(FairLockTest, AClustersLockKeepsItsQueueInItsOwnSlot) {
  if (GetParam() != "redis-cluster") GTEST_SKIP() << "a Redis Cluster's slots";
  const auto& cluster = static_cast<ClusterFairStore&>(store()).cluster();
  Runtime a(options()), b(options());
  auto f = a.acquire({.key = "slot", .ttl = 5s, .kind = LockKind::fair()});
  LockHandle h = get_bounded(f);
  auto w = b.acquire({.key = "slot", .ttl = 5s, .retries = forever, .wait = kBound, .kind = LockKind::fair()});
  ASSERT_TRUE(queued_within_bound("slot", 1));  // asked of the node serving the lock's slot
  const std::string lock = "lockwatch:{slot}";
  const auto slot = cluster.command_for(lock, {"CLUSTER", "KEYSLOT", lock}).integer;
  for (const char* suffix : {":holders", ":queue", ":waiting", ":rel"})
    EXPECT_EQ(cluster.command_for(lock, {"CLUSTER", "KEYSLOT", lock + suffix}).integer, slot) << suffix;
  EXPECT_EQ(cluster.command_for(lock, {"EXISTS", lock + ":holders", lock + ":queue", lock + ":waiting"}).integer, 3);
  give_back(h);
  LockHandle next = get_bounded(w);
  give_back(next);
}

// Under TSan, which checks the runtime's side of a fair wait, on memory://
// and Redis only.
std::vector<std::string> fair_stores() {
  std::vector<std::string> stores{"memory", "redis", "redis-cluster"};
#if !defined(__SANITIZE_THREAD__)
#if LOCKWATCH_WITH_SQL
  stores.push_back("mysql");
#endif
#if LOCKWATCH_WITH_POSTGRESQL
  stores.push_back("postgresql");
#endif
#if LOCKWATCH_WITH_ZOOKEEPER
  stores.push_back("zookeeper");
#endif
#endif
  return stores;
}

INSTANTIATE_TEST_SUITE_P(Stores, FairLockTest, ::testing::ValuesIn(fair_stores()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string name = p.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Stores that keep no queue of waiters refuse fair locks at the call (no
// server is needed: the refusal comes before anything starts).
TEST(FairLockRefusalTest, StoresWithoutAQueueRefuseFairWithUnsupported) {
  const int port = free_loopback_port();
  const std::string at = "127.0.0.1:" + std::to_string(port);
  std::vector<std::string> urls{"redis://" + at + ",redis://127.0.0.1:" + std::to_string(free_loopback_port()) +
                                    ",redis://127.0.0.1:" + std::to_string(free_loopback_port())};
#if LOCKWATCH_WITH_ETCD && !defined(__SANITIZE_THREAD__)  // gRPC's own threads are not TSan's to check
  urls.push_back("etcd://" + at);
#endif
  for (const auto& url : urls) {
    Options o;
    o.redis_url = url;
    o.runtime.threads = 1;
    o.connection.connect_timeout = 500ms;
    Runtime rt(o);
    try {
      (void)rt.acquire({.key = "fair", .ttl = 5s, .kind = LockKind::fair()});
      ADD_FAILURE() << url << " took a fair lock";
    } catch (const Unsupported& e) {
      EXPECT_NE(std::string(e.what()).find("fair"), std::string::npos) << e.what();
    }
    // Through LOCKED: the future carries it.
    auto call = locked("fair", 5s, forever).on(rt).fair()([] {});
    auto f = call();
    EXPECT_THROW(get_bounded(f), Unsupported) << url;
  }
}

}  // namespace
}  // namespace lockwatch::testing
