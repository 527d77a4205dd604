// Runtime::inspect and Runtime::force_release against real redis-servers:
// one node, and Redlock over three.
#include <gtest/gtest.h>

#include <thread>

#include <stop_token>

#include "lockwatch/lockwatch.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

std::string test_key(const std::string& suffix = "") {
  return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + suffix;
}

// Waits (bounded) until `lease` is lost, without polling.
bool lost_within_bound(const Lease& lease) {
  std::promise<void> p;
  auto f = p.get_future();
  std::stop_callback cb(lease.stop_token(), [&p] { p.set_value(); });
  return f.wait_for(kBound) == std::future_status::ready;
}

class AdminTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new RedisServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { rt_ = std::make_unique<Runtime>(options_for(*server_)); }
  void TearDown() override { rt_.reset(); }

  LockState inspect(const std::string& key) {
    auto f = rt_->inspect(key);
    return get_bounded(f);
  }
  bool force_release(const std::string& key) {
    auto f = rt_->force_release(key);
    return get_bounded(f);
  }

  static RedisServer* server_;
  std::unique_ptr<Runtime> rt_;
};
RedisServer* AdminTest::server_ = nullptr;

TEST_F(AdminTest, AKeyNeverLockedIsFreeWithCounterZero) {
  LockState s = inspect(test_key());
  EXPECT_EQ(s.key, test_key());
  EXPECT_FALSE(s.held);
  EXPECT_EQ(s.ttl, 0ms);
  EXPECT_EQ(s.fencing_token, 0u);
}

TEST_F(AdminTest, AHeldLockShowsItsRemainingTtlAndFencingCounter) {
  auto acquired = rt_->acquire(test_key(), 5s);
  LockHandle h = get_bounded(acquired);
  LockState s = inspect(test_key());
  EXPECT_TRUE(s.held);
  EXPECT_GT(s.ttl, 0ms);
  EXPECT_LE(s.ttl, 5s);
  EXPECT_EQ(s.fencing_token, h.lease().fencing_token());
  auto released = h.release();
  get_bounded(released);
  LockState after = inspect(test_key());
  EXPECT_FALSE(after.held);
  EXPECT_EQ(after.ttl, 0ms);
  EXPECT_EQ(after.fencing_token, s.fencing_token) << "the counter outlives the lock";
}

TEST_F(AdminTest, ForceReleaseRemovesAnotherOwnersLockAndItsHolderLosesTheLease) {
  Runtime holder_rt(options_for(*server_));
  auto acquired = holder_rt.acquire(test_key(), 1s);
  LockHandle h = get_bounded(acquired);
  const auto token = h.lease().fencing_token();

  EXPECT_TRUE(force_release(test_key()));
  EXPECT_FALSE(exists(*server_, test_key()));
  LockState s = inspect(test_key());
  EXPECT_FALSE(s.held);
  EXPECT_EQ(s.fencing_token, token);

  // The holder finds its key gone at its next renewal, before its ttl
  // could have run out: removed, not expired.
  ASSERT_TRUE(lost_within_bound(h.lease()));
  EXPECT_EQ(h.lease().lost_reason(), LostReason::kRemoved);
  auto released = h.release();
  EXPECT_TRUE(error_of<LeaseLost>(released));

  // Tokens keep rising for the next holder.
  auto next = rt_->acquire(test_key(), 5s);
  LockHandle h2 = get_bounded(next);
  EXPECT_EQ(h2.lease().fencing_token(), token + 1);
}

TEST_F(AdminTest, ForceReleaseOfAFreeKeySaysNothingWasHeld) {
  EXPECT_FALSE(force_release(test_key()));
  EXPECT_EQ(inspect(test_key()).fencing_token, 0u);
}

TEST_F(AdminTest, ForceReleaseWakesAWaiterLongBeforeTheHoldersTtl) {
  Runtime holder_rt(options_for(*server_));
  auto acquired = holder_rt.acquire(test_key(), 60s);
  LockHandle holder = get_bounded(acquired);
  auto start = std::chrono::steady_clock::now();
  auto waiting = rt_->acquire({.key = test_key(), .ttl = 5s, .retries = forever, .wait = 30s});
  EXPECT_TRUE(force_release(test_key()));
  LockHandle h = get_bounded(waiting);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "woken by the release, not the ttl";
  EXPECT_EQ(h.lease().fencing_token(), holder.lease().fencing_token() + 1);
}

TEST_F(AdminTest, ALockKeyWithoutExpiryIsNotALockwatchLock) {
  server_->command({"SET", lock_key(test_key()), "by-hand"});
  auto f = rt_->inspect(test_key());
  auto err = error_of<StoreRefused>(f);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("without expiry"), std::string::npos) << err->what();
  EXPECT_TRUE(force_release(test_key()));  // an operator can still clear it
  EXPECT_FALSE(exists(*server_, test_key()));
}

TEST_F(AdminTest, AnEmptyKeyIsRejectedBeforeAnythingStarts) {
  EXPECT_THROW((void)rt_->inspect(""), InvalidArgument);
  EXPECT_THROW((void)rt_->force_release(""), InvalidArgument);
}

TEST_F(AdminTest, AnUnreachableStoreFailsThroughTheFuture) {
  Options o;
  o.redis_url = "redis://127.0.0.1:" + std::to_string(free_loopback_port());
  o.runtime.threads = 1;
  Runtime rt(o);
  auto inspected = rt.inspect("k");
  EXPECT_TRUE(error_of<ConnectionError>(inspected));
  auto released = rt.force_release("k");
  EXPECT_TRUE(error_of<ConnectionError>(released));
}

// Redlock over three nodes.
class AdminRedlockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string url;
    for (auto& s : servers_) {
      s = std::make_unique<RedisServer>();
      url += (url.empty() ? "" : ",") + s->url();
    }
    Options o;
    o.redis_url = url;
    o.runtime.threads = 2;
    o.connection.connect_timeout = 500ms;
    o.connection.command_timeout = 500ms;
    rt_ = std::make_unique<Runtime>(o);
  }
  void TearDown() override { rt_.reset(); }

  std::array<std::unique_ptr<RedisServer>, 3> servers_;
  std::unique_ptr<Runtime> rt_;
};

TEST_F(AdminRedlockTest, HeldOnAMajorityIsHeldAndTheCounterIsTheLargest) {
  auto acquired = rt_->acquire("k", 10s);
  LockHandle h = get_bounded(acquired);
  // Granted on a majority: the third node's acquisition (which raises its
  // counter) may still be on its way; the counter is set after it.
  const auto until = std::chrono::steady_clock::now() + kBound;
  while (servers_[2]->command({"EXISTS", lock_key("k")}).integer == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);  // polling the server, which has no event for this
  ASSERT_EQ(servers_[2]->command({"EXISTS", lock_key("k")}).integer, 1);
  servers_[2]->command({"SET", fence_key("k"), "100"});
  auto f = rt_->inspect("k");
  LockState s = get_bounded(f);
  EXPECT_TRUE(s.held);
  EXPECT_GT(s.ttl, 0ms);
  EXPECT_LE(s.ttl, 10s);
  EXPECT_EQ(s.fencing_token, 100u);

  servers_[0]->kill();  // two of three still hold it
  auto again = rt_->inspect("k");
  EXPECT_TRUE(get_bounded(again).held);
}

TEST_F(AdminRedlockTest, HeldOnAMinorityIsFree) {
  servers_[0]->command({"SET", lock_key("k"), "someone", "PX", "60000"});
  auto f = rt_->inspect("k");
  LockState s = get_bounded(f);
  EXPECT_FALSE(s.held);
  EXPECT_EQ(s.ttl, 0ms);
}

TEST_F(AdminRedlockTest, CannotTellWhenTheSilentNodesCouldMakeAMajority) {
  servers_[0]->command({"SET", lock_key("k"), "someone", "PX", "60000"});
  servers_[1]->kill();  // with it, "someone" could hold two of three
  auto f = rt_->inspect("k");
  auto err = error_of<ConnectionError>(f);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("cannot tell"), std::string::npos) << err->what();
}

TEST_F(AdminRedlockTest, ForceReleaseRemovesTheLockEverywhereAndKeepsTheCounters) {
  auto acquired = rt_->acquire("k", 10s);
  LockHandle h = get_bounded(acquired);
  auto token = std::to_string(h.lease().fencing_token());
  auto f = rt_->force_release("k");
  EXPECT_TRUE(get_bounded(f));
  for (auto& s : servers_) {
    EXPECT_EQ(s->command({"EXISTS", lock_key("k")}).integer, 0);
    EXPECT_EQ(s->command({"GET", fence_key("k")}).str, token);
  }
}

TEST_F(AdminRedlockTest, ForceReleaseWithOneNodeDownStillFreesTheLock) {
  auto acquired = rt_->acquire("k", 2s);  // its release cannot be confirmed: short
  LockHandle h = get_bounded(acquired);
  servers_[2]->kill();
  auto f = rt_->force_release("k");
  EXPECT_TRUE(get_bounded(f));
  auto inspected = rt_->inspect("k");
  EXPECT_FALSE(get_bounded(inspected).held);

  servers_[1]->kill();  // no majority left to remove anything
  auto failed = rt_->force_release("k");
  EXPECT_TRUE(error_of<ConnectionError>(failed));
}

}  // namespace
}  // namespace lockwatch::testing
