// Redlock's quorum over in-memory stores: majority, give-back, the fence
// raise, renewal and release votes.
#include <gtest/gtest.h>

#include <future>
#include <optional>

#include "core/loop.hpp"
#include "runtime/store_errors.hpp"
#include "store/redis/redis_error.hpp"
#include "store/quorum_store.hpp"
#include "support/memory_store.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

using detail::Acquired;
using detail::LockInfo;
using detail::LockRef;
using detail::QuorumStore;
using detail::Released;
using detail::Renewed;
using Status = Acquired::Status;

// A lock as the tests ask for it; the views point into it.
struct TestLock {
  std::string name, token, ttl_ms;
  std::chrono::milliseconds ttl;
  TestLock(std::string n, std::string t, std::chrono::milliseconds l = 2s)
      : name(std::move(n)), token(std::move(t)), ttl_ms(std::to_string(l.count())), ttl(l) {}
  LockRef ref() const { return LockRef{name, token, ttl_ms, ttl}; }
};

class QuorumStoreTest : public ::testing::Test {
 protected:
  void make(std::size_t n, Options o = {}) {
    std::vector<std::unique_ptr<detail::LockStore>> stores;
    std::vector<std::string> names;
    for (std::size_t i = 0; i < n; ++i) {
      backends_.push_back(std::make_shared<MemoryBackend>());
      scripts_.push_back(std::make_shared<StoreScript>());
      stores.push_back(std::make_unique<MemoryStore>(loop_, backends_.back(), scripts_.back(), ""));
      names.push_back("node" + std::to_string(i));
    }
    q_ = std::make_unique<QuorumStore>(std::move(stores), std::move(names), o.watchdog);
    on_loop([this] { q_->start({}); });
  }
  void TearDown() override {
    if (q_) loop_.shutdown([this] { q_->close(); });
  }
  template <class F>
  void on_loop(F f) {
    std::promise<void> done;
    loop_.post([&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }
  // One call with one lock; waits (bounded) for its answer.
  Acquired acquire(const TestLock& l) {
    std::promise<Acquired> p;
    auto f = p.get_future();
    on_loop([&] {
      LockRef r = l.ref();
      q_->acquire(std::span<const LockRef>(&r, 1), [&p](std::size_t, const Acquired& a) { p.set_value(a); });
    });
    EXPECT_EQ(f.wait_for(kBound), std::future_status::ready);
    return f.get();
  }
  std::pair<Renewed, std::string> renew(const TestLock& l) {
    std::promise<std::pair<Renewed, std::string>> p;
    auto f = p.get_future();
    on_loop([&] {
      LockRef r = l.ref();
      q_->renew(std::span<const LockRef>(&r, 1), nullptr,
                [&p](std::size_t, Renewed v, const detail::StoreError* why) {
                  p.set_value({v, why != nullptr ? why->describe() : std::string()});
                });
    });
    EXPECT_EQ(f.wait_for(kBound), std::future_status::ready);
    return f.get();
  }
  Released release(const TestLock& l) {
    std::promise<Released> p;
    auto f = p.get_future();
    on_loop([&] {
      LockRef r = l.ref();
      q_->release(std::span<const LockRef>(&r, 1), true,
                  [&p](std::size_t, Released v, const lockwatch::detail::StoreError*) { p.set_value(v); });
    });
    EXPECT_EQ(f.wait_for(kBound), std::future_status::ready);
    return f.get();
  }
  std::size_t holders(const TestLock& l) const {
    std::size_t n = 0;
    for (const auto& b : backends_)
      if (b->owner(l.name) == l.token) n++;
    return n;
  }

  detail::Loop loop_;
  std::vector<std::shared_ptr<MemoryBackend>> backends_;
  std::vector<std::shared_ptr<StoreScript>> scripts_;
  std::unique_ptr<QuorumStore> q_;
};

TEST_F(QuorumStoreTest, TheQuorumIsAMajority) {
  make(5);
  EXPECT_EQ(q_->quorum(), 3u);
}

TEST_F(QuorumStoreTest, EveryNodeTakesTheLockWithTheSameToken) {
  make(3);
  TestLock l("k", "t1");
  auto a = acquire(l);
  EXPECT_EQ(a.status, Status::kTaken);
  EXPECT_EQ(a.fence, 1u);
  EXPECT_EQ(holders(l), 3u);
}

TEST_F(QuorumStoreTest, AMinorityDownStillTakesTheLock) {
  make(3);
  scripts_[2]->set_down(true);
  TestLock l("k", "t1");
  EXPECT_EQ(acquire(l).status, Status::kTaken);
  EXPECT_EQ(holders(l), 2u);
}

TEST_F(QuorumStoreTest, AMajorityDownFailsAndGivesBackWhatItTook) {
  make(3);
  scripts_[1]->set_down(true);
  scripts_[2]->set_down(true);
  TestLock l("k", "t1");
  auto a = acquire(l);
  ASSERT_EQ(a.status, Status::kFailed);
  try {
    std::rethrow_exception(lockwatch::detail::to_exception(a.error));
  } catch (const ConnectionError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("no majority"), std::string::npos) << what;
    EXPECT_NE(e.endpoint().find("node1"), std::string::npos) << e.endpoint();
  }
  EXPECT_EQ(holders(l), 0u);  // node0 took it and gave it back
  EXPECT_EQ(scripts_[0]->count(Op::kRelease), 1u);
}

TEST_F(QuorumStoreTest, BusyOnAMajorityIsBusyWithTheShortestTtl) {
  make(3);
  backends_[0]->set_owner("k", "other", 5s);
  backends_[1]->set_owner("k", "other", 800ms);
  TestLock l("k", "t1");
  auto a = acquire(l);
  EXPECT_EQ(a.status, Status::kBusy);
  EXPECT_LE(a.busy_for, 800ms);
  EXPECT_GT(a.busy_for, 500ms);
  EXPECT_EQ(holders(l), 0u);  // node2 took it and gave it back
}

TEST_F(QuorumStoreTest, ASplitVoteGivesBackEverywhere) {
  make(3);
  backends_[0]->set_owner("k", "other", 5s);
  scripts_[1]->set_down(true);
  TestLock l("k", "t1");
  auto a = acquire(l);
  EXPECT_NE(a.status, Status::kTaken);
  EXPECT_EQ(holders(l), 0u);
  EXPECT_EQ(backends_[0]->owner("k"), "other");  // someone else's lock is left alone
}

TEST_F(QuorumStoreTest, AnErrorThatIsNotAConnectionErrorIsReportedAsItself) {
  make(3);
  for (int i = 1; i < 3; ++i) {
    scripts_[i]->script_acquire([](const std::string&) -> std::optional<Acquired> {
      Acquired a;
      a.error = detail::redis_reply_error("node", "WRONGTYPE Operation against a key holding the wrong kind of value");
      return a;
    });
  }
  TestLock l("k", "t1");
  auto a = acquire(l);
  ASSERT_EQ(a.status, Status::kFailed);
  EXPECT_THROW(std::rethrow_exception(lockwatch::detail::to_exception(a.error)), StoreRefused);
}

// The quorum reports the failure that says most: refused credentials on
// one node over another node that could not be reached (which answers
// first here), whatever the order of the answers.
TEST_F(QuorumStoreTest, TheMostTellingFailureIsReported) {
  make(3);
  scripts_[0]->set_down(true);
  scripts_[1]->script_acquire([](const std::string&) -> std::optional<Acquired> {
    Acquired a;
    a.error = detail::redis_reply_error("node1", "WRONGPASS invalid username-password pair or user is disabled.");
    return a;
  });
  TestLock l("k", "t1");
  auto a = acquire(l);
  ASSERT_EQ(a.status, Status::kFailed);
  EXPECT_EQ(a.error.kind, detail::StoreError::Kind::kAuth) << a.error.describe();
  EXPECT_THROW(std::rethrow_exception(lockwatch::detail::to_exception(a.error)), AuthError);
  EXPECT_EQ(holders(l), 0u);  // node2 took it and gave it back
}

TEST_F(QuorumStoreTest, TheFenceIsTheMaximumOfTheMajorityAndTheMajorityIsRaisedToIt) {
  make(3);
  backends_[0]->raise("k", 10);
  backends_[1]->raise("k", 4);
  TestLock l("k", "t1");
  auto a = acquire(l);
  ASSERT_EQ(a.status, Status::kTaken);
  EXPECT_EQ(a.fence, 11u);
  for (const auto& b : backends_) EXPECT_GE(b->fence("k"), 11u);
}

TEST_F(QuorumStoreTest, TokensRiseWhenTheMajorityChanges) {
  // The case a plain maximum gets wrong: each majority shares one node with
  // the one before, but node2 missed the first increment.
  make(3);
  std::uint64_t last = 0;
  for (std::size_t down : {2, 1, 0}) {
    for (std::size_t i = 0; i < 3; ++i) scripts_[i]->set_down(i == down);
    TestLock l("k", "t" + std::to_string(down));
    auto a = acquire(l);
    ASSERT_EQ(a.status, Status::kTaken);
    EXPECT_GT(a.fence, last) << "with node" << down << " down";
    last = a.fence;
    EXPECT_EQ(release(l), Released::kYes);
  }
}

TEST_F(QuorumStoreTest, WithoutEnoughRaisesTheLockIsGivenBack) {
  make(3);
  scripts_[1]->lose_replies(Op::kRaise, 1);
  scripts_[2]->lose_replies(Op::kRaise, 1);
  TestLock l("k", "t1");
  auto a = acquire(l);
  ASSERT_EQ(a.status, Status::kFailed);
  EXPECT_THROW(std::rethrow_exception(lockwatch::detail::to_exception(a.error)), ConnectionError);
  EXPECT_EQ(holders(l), 0u);
}

TEST_F(QuorumStoreTest, ALateTakerIsRaisedAndCounted) {
  make(3);
  scripts_[0]->set_delay(Op::kAcquire, 100ms);  // answers after the majority decided
  scripts_[1]->lose_replies(Op::kRaise, 1);    // one raise fails: the late one is needed
  TestLock l("k", "t1");
  auto a = acquire(l);
  ASSERT_EQ(a.status, Status::kTaken);
  EXPECT_EQ(scripts_[0]->count(Op::kRaise), 1u);
}

TEST_F(QuorumStoreTest, AMajorityReachedAfterTheValidityTimeIsGivenBack) {
  make(3);
  for (auto& s : scripts_) s->set_delay(Op::kAcquire, 250ms);
  TestLock l("k", "t1", 200ms);  // validity: 200 - 4 ms
  auto a = acquire(l);
  ASSERT_EQ(a.status, Status::kFailed);
  try {
    std::rethrow_exception(lockwatch::detail::to_exception(a.error));
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("validity"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(scripts_[2]->wait_for(Op::kRelease, 1));
}

TEST_F(QuorumStoreTest, ARaiseConfirmedAfterTheValidityTimeGivesTheLockBack) {
  make(3);
  for (auto& s : scripts_) s->set_delay(Op::kRaise, 250ms);
  TestLock l("k", "t1", 200ms);  // taken in time, raised too late
  auto a = acquire(l);
  ASSERT_EQ(a.status, Status::kFailed);
  try {
    std::rethrow_exception(lockwatch::detail::to_exception(a.error));
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("raised its fencing counters only after the validity time"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(holders(l), 0u);
}

TEST_F(QuorumStoreTest, ARenewalNeedsAMajorityOfYes) {
  make(3);
  TestLock l("k", "t1");
  ASSERT_EQ(acquire(l).status, Status::kTaken);
  scripts_[2]->set_down(true);
  EXPECT_EQ(renew(l).first, Renewed::kYes);
  scripts_[1]->set_down(true);
  auto [v, why] = renew(l);
  EXPECT_EQ(v, Renewed::kTransient);
  EXPECT_NE(why.find("down"), std::string::npos) << why;
}

TEST_F(QuorumStoreTest, ARenewalIsLostOnceMoreThanNMinusQSayNotYours) {
  make(3);
  TestLock l("k", "t1");
  ASSERT_EQ(acquire(l).status, Status::kTaken);
  backends_[0]->set_owner("k", "thief", 5s);
  EXPECT_EQ(renew(l).first, Renewed::kYes);  // one "not yours" of three is outvoted
  backends_[1]->erase("k");
  EXPECT_EQ(renew(l).first, Renewed::kTakenByOther);
}

TEST_F(QuorumStoreTest, ARenewalFoundGoneOnAMajorityIsGone) {
  make(3);
  TestLock l("k", "t1");
  ASSERT_EQ(acquire(l).status, Status::kTaken);
  backends_[0]->erase("k");
  backends_[1]->erase("k");
  EXPECT_EQ(renew(l).first, Renewed::kGone);
}

TEST_F(QuorumStoreTest, ARenewalIsDecidedWithoutWaitingForASlowNode) {
  make(3);
  TestLock l("k", "t1");
  ASSERT_EQ(acquire(l).status, Status::kTaken);
  scripts_[2]->set_delay(Op::kRenew, 2s);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(renew(l).first, Renewed::kYes);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

TEST_F(QuorumStoreTest, EveryLockOfABatchIsAnsweredExactlyOnce) {
  make(3);
  std::vector<TestLock> locks;
  for (int i = 0; i < 8; ++i) locks.emplace_back("k" + std::to_string(i), "t");
  for (auto& l : locks) ASSERT_EQ(acquire(l).status, Status::kTaken);
  backends_[0]->erase("k3");
  backends_[1]->erase("k3");
  std::vector<int> answers(locks.size(), 0);
  std::vector<Renewed> result(locks.size());
  std::promise<void> all;
  std::size_t left = locks.size();
  on_loop([&] {
    std::vector<LockRef> refs;
    for (auto& l : locks) refs.push_back(l.ref());
    q_->renew(refs, nullptr, [&](std::size_t k, Renewed v, const lockwatch::detail::StoreError*) {
      answers[k]++;
      result[k] = v;
      if (--left == 0) all.set_value();
    });
  });
  ASSERT_EQ(all.get_future().wait_for(kBound), std::future_status::ready);
  on_loop([] {});  // late votes from the third node have been delivered and ignored
  for (std::size_t k = 0; k < locks.size(); ++k) {
    EXPECT_EQ(answers[k], 1) << k;
    EXPECT_EQ(result[k], k == 3 ? Renewed::kGone : Renewed::kYes) << k;
  }
}

TEST_F(QuorumStoreTest, ACallbackNeverRunsInsideTheCall) {
  make(3);
  TestLock l("k", "t1");
  bool inside = false, ran_inside = false;
  std::promise<void> done;
  on_loop([&] {
    inside = true;
    LockRef r = l.ref();
    q_->acquire(std::span<const LockRef>(&r, 1), [&](std::size_t, const Acquired&) {
      ran_inside = inside;
      done.set_value();
    });
    inside = false;
  });
  ASSERT_EQ(done.get_future().wait_for(kBound), std::future_status::ready);
  EXPECT_FALSE(ran_inside);
}

TEST_F(QuorumStoreTest, AReleaseIsConfirmedByAMajorityAndAnsweredAfterEveryNode) {
  make(3);
  TestLock l("k", "t1");
  ASSERT_EQ(acquire(l).status, Status::kTaken);
  scripts_[2]->set_delay(Op::kRelease, 200ms);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(release(l), Released::kYes);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 190ms);  // waited for the slow node
  EXPECT_EQ(holders(l), 0u);  // no reachable node keeps it
}

TEST_F(QuorumStoreTest, AReleaseWithoutAMajorityIsUnconfirmed) {
  make(3);
  TestLock l("k", "t1");
  ASSERT_EQ(acquire(l).status, Status::kTaken);
  scripts_[0]->set_down(true);
  scripts_[1]->set_down(true);
  EXPECT_EQ(release(l), Released::kUnconfirmed);
}

TEST_F(QuorumStoreTest, AReleaseThatFindsAnotherOwnerSaysSo) {
  make(3);
  TestLock l("k", "t1");
  ASSERT_EQ(acquire(l).status, Status::kTaken);
  for (auto& b : backends_) b->set_owner("k", "other", 5s);
  EXPECT_EQ(release(l), Released::kTakenByOther);
  for (auto& b : backends_) EXPECT_EQ(b->owner("k"), "other");
}

TEST_F(QuorumStoreTest, InspectSeesAHolderOnlyWithAMajority) {
  make(3);
  TestLock l("k", "t1");
  ASSERT_EQ(acquire(l).status, Status::kTaken);
  auto inspect = [&] {
    std::promise<std::pair<LockInfo, std::optional<detail::StoreError>>> p;
    auto f = p.get_future();
    on_loop([&] {
      q_->inspect("k", [&p](const LockInfo& i, const detail::StoreError* e) {
        p.set_value({i, e ? std::optional<detail::StoreError>(*e) : std::nullopt});
      });
    });
    EXPECT_EQ(f.wait_for(kBound), std::future_status::ready);
    return f.get();
  };
  auto [info, err] = inspect();
  EXPECT_FALSE(err);
  EXPECT_TRUE(info.held);
  EXPECT_EQ(info.owner, "t1");
  EXPECT_EQ(info.fencing_token, 1u);
  backends_[0]->set_owner("k", "x", 5s);
  backends_[1]->set_owner("k", "y", 5s);
  EXPECT_FALSE(inspect().first.held);  // three owners, no majority
  scripts_[0]->set_down(true);
  scripts_[1]->set_down(true);
  auto unknown = inspect().second;  // too few answers to say
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->kind, detail::StoreError::Kind::kUnavailable);
  EXPECT_NE(unknown->describe().find("cannot tell"), std::string::npos) << unknown->describe();
}

TEST_F(QuorumStoreTest, ForceReleaseRemovesTheLockFromEveryNode) {
  make(3);
  TestLock l("k", "t1");
  ASSERT_EQ(acquire(l).status, Status::kTaken);
  std::promise<bool> p;
  auto f = p.get_future();
  on_loop([&] { q_->force_release("k", [&p](bool held, const detail::StoreError*) { p.set_value(held); }); });
  ASSERT_EQ(f.wait_for(kBound), std::future_status::ready);
  EXPECT_TRUE(f.get());
  EXPECT_EQ(holders(l), 0u);
  for (const auto& b : backends_) EXPECT_EQ(b->fence("k"), 1u);  // the counters stay
}

}  // namespace
}  // namespace lockwatch::testing
