// Taking and waiting for locks, on an in-memory store: FIFO, only the head
// asks, wake on release, retry when the holder's ttl ends.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "memory_runtime.hpp"
#include "store/redis/redis_error.hpp"

namespace lockwatch::testing {
namespace {

using detail::Acquired;

class WaitQueueTest : public ::testing::Test {
 protected:
  void SetUp() override { rt_ = memory_runtime(backend_, script_); }
  void TearDown() override { rt_.reset(); }
  // Another process holds `key` for `ttl`.
  void held_elsewhere(const std::string& key, std::chrono::milliseconds ttl) {
    backend_->set_owner(memory_name(key), "another-process", ttl);
  }
  std::size_t acquires_of(const std::string& key) const {
    std::size_t n = 0;
    for (const auto& c : script_->calls())
      if (c.op == Op::kAcquire && c.name == memory_name(key)) n++;
    return n;
  }

  std::shared_ptr<MemoryBackend> backend_ = std::make_shared<MemoryBackend>();
  std::shared_ptr<StoreScript> script_ = std::make_shared<StoreScript>();
  std::unique_ptr<Runtime> rt_;
};

TEST_F(WaitQueueTest, ABusyLockWithoutWaitFailsAtOnceAfterOneAttempt) {
  held_elsewhere("busy", 10s);
  auto f = rt_->acquire("busy", 1s);
  auto err = error_of<LockNotAcquired>(f);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->key(), "busy");
  EXPECT_LT(err->waited(), 1s);
  EXPECT_EQ(acquires_of("busy"), 1u);
  EXPECT_EQ(script_->count(Op::kSubscribe), 0u);  // nobody waits, nobody listens
}

TEST_F(WaitQueueTest, AFreeLockIsTakenWithOneRequest) {
  auto f = rt_->acquire({.key = "free", .ttl = 1s, .retries = forever, .wait = 5s});
  auto h = get_bounded(f);
  EXPECT_EQ(acquires_of("free"), 1u);
  EXPECT_EQ(script_->count(Op::kSubscribe), 0u);
  EXPECT_TRUE(backend_->owner(memory_name("free")));
  h.release().get();
}

TEST_F(WaitQueueTest, AReleaseNoticeWakesTheHeadLongBeforeTheHoldersTtl) {
  held_elsewhere("notice", 10s);
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt_->acquire({.key = "notice", .ttl = 1s, .retries = forever, .wait = 15s});
  ASSERT_TRUE(script_->wait_for(Op::kSubscribe, 1));
  backend_->release_as_other(memory_name("notice"));
  auto h = get_bounded(f);
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 5s);
  h.release().get();
}

TEST_F(WaitQueueTest, TheHeadTriesAgainOnceItsSubscriptionIsConfirmed) {
  // A release between the busy answer and the subscription would go
  // unheard: so the confirmed subscription itself triggers an attempt.
  // Here the first attempt answers busy for a holder that is already gone,
  // and nobody ever publishes a notice.
  auto answered = std::make_shared<std::atomic<int>>(0);
  script_->script_acquire([answered](const std::string&) -> std::optional<Acquired> {
    if (answered->fetch_add(1) > 0) return std::nullopt;  // the real store from now on
    Acquired a;
    a.status = Acquired::Status::kBusy;
    a.busy_for = 10s;
    return a;
  });
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt_->acquire({.key = "confirmed", .ttl = 1s, .retries = forever, .wait = 5s});
  auto h = get_bounded(f);
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 2s);  // not the 10 s the busy answer named
  EXPECT_EQ(acquires_of("confirmed"), 2u);
  EXPECT_EQ(script_->count(Op::kSubscribe), 1u);
  h.release().get();
}

TEST_F(WaitQueueTest, AHolderThatDiesIsWaitedOutByItsTtl) {
  held_elsewhere("dead-holder", 400ms);  // never releases, never publishes
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt_->acquire({.key = "dead-holder", .ttl = 1s, .retries = forever, .wait = 10s});
  auto h = get_bounded(f);
  auto waited = ms_between(t0, std::chrono::steady_clock::now());
  EXPECT_GE(waited, 350ms);
  EXPECT_LT(waited, 2s);
  // Not polled meanwhile: the first attempt, the one after subscribing,
  // the one when the ttl ended.
  EXPECT_LE(acquires_of("dead-holder"), 4u);
  h.release().get();
}

TEST_F(WaitQueueTest, WaitersAreServedInArrivalOrder) {
  held_elsewhere("fifo", 10s);
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::future<void>> calls;
  for (int i = 0; i < 6; ++i) {
    auto f = locked("fifo", 2s, forever).on(*rt_).wait(15s)([&, i] {
      std::lock_guard lk(mu);
      order.push_back(i);
    });
    calls.push_back(f());  // calls from one thread reach the loop in call order
  }
  ASSERT_TRUE(script_->wait_for(Op::kSubscribe, 1));
  backend_->release_as_other(memory_name("fifo"));
  for (auto& c : calls) EXPECT_TRUE(completes(c));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST_F(WaitQueueTest, OnlyTheHeadAsksTheStore) {
  held_elsewhere("head-only", 10s);
  std::vector<std::future<LockHandle>> waiting;
  for (int i = 0; i < 20; ++i) waiting.push_back(rt_->acquire({.key = "head-only", .ttl = 1s, .retries = forever, .wait = 15s}));
  ASSERT_TRUE(script_->wait_for(Op::kSubscribe, 1));
  ASSERT_TRUE(script_->wait_for(Op::kAcquire, 2));
  std::this_thread::sleep_for(100ms);  // a window in which twenty callers could have polled
  EXPECT_LE(acquires_of("head-only"), 2u);
  EXPECT_EQ(script_->count(Op::kSubscribe), 1u);
  backend_->release_as_other(memory_name("head-only"));
  for (auto& w : waiting) {
    auto h = get_bounded(w);
    h.release().get();
  }
}

TEST_F(WaitQueueTest, OurOwnReleaseHandsTheLockToOurNextWaiter) {
  script_->set_release_events(false);  // no notices: the hand-off must not need one
  rt_.reset();
  rt_ = memory_runtime(backend_, script_);  // the store reads it when it is made
  auto first = rt_->acquire("hand-off", 10s);
  auto h = get_bounded(first);
  auto next = rt_->acquire({.key = "hand-off", .ttl = 10s, .retries = forever, .wait = 15s});
  ASSERT_TRUE(script_->wait_for(Op::kAcquire, 2));
  auto t0 = std::chrono::steady_clock::now();
  h.release().get();
  auto h2 = get_bounded(next);
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 1s);  // not the 10 s ttl
  h2.release().get();
}

TEST_F(WaitQueueTest, AWaitThatRunsOutIsLockNotAcquired) {
  held_elsewhere("runs-out", 10s);
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt_->acquire({.key = "runs-out", .ttl = 1s, .retries = forever, .wait = 300ms});
  auto err = error_of<LockNotAcquired>(f);
  ASSERT_TRUE(err);
  EXPECT_GE(err->waited(), 290ms);
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 2s);
  EXPECT_TRUE(script_->wait_for(Op::kUnsubscribe, 1));  // the queue is gone, and so is its subscription
}

TEST_F(WaitQueueTest, AWaiterWhoseWaitRanOutLeavesItsPlaceToTheNext) {
  held_elsewhere("leaves", 10s);
  auto impatient = rt_->acquire({.key = "leaves", .ttl = 1s, .retries = forever, .wait = 200ms});
  auto patient = rt_->acquire({.key = "leaves", .ttl = 1s, .retries = forever, .wait = 15s});
  EXPECT_TRUE(error_of<LockNotAcquired>(impatient));
  backend_->release_as_other(memory_name("leaves"));
  auto h = get_bounded(patient);
  h.release().get();
}

TEST_F(WaitQueueTest, AConnectionBlipKeepsTheWaitersPlace) {
  held_elsewhere("blip", 300ms);
  script_->set_down(true);
  auto f = rt_->acquire({.key = "blip", .ttl = 1s, .retries = forever, .wait = 10s});
  ASSERT_TRUE(script_->wait_for(Op::kAcquire, 3));  // retried while down
  script_->set_down(false);
  auto h = get_bounded(f);
  h.release().get();
}

TEST_F(WaitQueueTest, AWaitSpentOnConnectionErrorsReportsThem) {
  script_->set_down(true);
  auto f = rt_->acquire({.key = "down", .ttl = 1s, .retries = forever, .wait = 300ms});
  auto err = error_of<ConnectionError>(f);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->endpoint(), "memory");
}

TEST_F(WaitQueueTest, AClusterFailingOverKeepsTheWaitersPlace) {
  // CLUSTERDOWN (a failover under way) and TRYAGAIN (a slot migrating) are
  // "not now": a waiter rides them out within its wait, a caller without a
  // wait gets them at once.
  auto answered = std::make_shared<std::atomic<int>>(0);
  script_->script_acquire([answered](const std::string&) -> std::optional<Acquired> {
    const int n = answered->fetch_add(1);
    if (n >= 3) return std::nullopt;  // the real store from now on
    Acquired a;
    a.error = detail::redis_reply_error("memory", n % 2 == 0 ? "CLUSTERDOWN The cluster is down"
                                                             : "TRYAGAIN Multiple keys request");
    return a;
  });
  auto first = rt_->acquire({.key = "failing-over", .ttl = 1s, .retries = forever});  // no wait: at once
  auto err = error_of<StoreRefused>(first);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->server_message().rfind("CLUSTERDOWN", 0), 0u) << err->server_message();
  auto f = rt_->acquire({.key = "failing-over", .ttl = 1s, .retries = forever, .wait = 10s});
  auto h = get_bounded(f);
  EXPECT_EQ(acquires_of("failing-over"), 4u);  // TRYAGAIN, CLUSTERDOWN, then taken
  auto released = h.release();
  get_bounded(released);
}

TEST_F(WaitQueueTest, AWaitOnAStoreThatIsDownFailsAfterTheConnectTimeoutNotTheWait) {
  // A wait is for a busy lock: a store down for longer than the connect
  // timeout fails every waiter of the key with the connection error.
  rt_.reset();
  Options o = memory_options();
  o.connection.connect_timeout = 300ms;
  rt_ = memory_runtime(backend_, script_, o);
  script_->set_down(true);
  auto t0 = std::chrono::steady_clock::now();
  auto first = rt_->acquire({.key = "down-long", .ttl = 1s, .retries = forever, .wait = 8s});
  auto second = rt_->acquire({.key = "down-long", .ttl = 1s, .retries = forever, .wait = 8s});
  auto err = error_of<ConnectionError>(first);
  ASSERT_TRUE(err);
  EXPECT_TRUE(error_of<ConnectionError>(second));
  auto took = ms_between(t0, std::chrono::steady_clock::now());
  EXPECT_GE(took, 300ms);  // a blip shorter than the connect timeout is ridden out
  EXPECT_LT(took, 3s);     // not the 8 s wait
}

TEST_F(WaitQueueTest, AnAcquireWhoseAnswerWasLostIsGivenBackOnceTheStoreAnswers) {
  // The acquire is applied but its answer lost (a command timeout while
  // the server hung): the lock is held by a token nobody renews. The
  // runtime gives it back, instead of leaving it for its whole ttl.
  script_->lose_replies(Op::kAcquire, 1);
  auto f = rt_->acquire("ghost", 30s);
  ASSERT_TRUE(error_of<ConnectionError>(f));
  auto until = std::chrono::steady_clock::now() + kBound;
  while (backend_->owner(memory_name("ghost")) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(2ms);  // the backend's state, moved by the runtime's release
  EXPECT_FALSE(backend_->owner(memory_name("ghost")));
  auto again = rt_->acquire("ghost", 1s);
  auto h = get_bounded(again);  // free at once, not in 30 s
  auto released = h.release();
  get_bounded(released);
}

TEST_F(WaitQueueTest, AGhostIsGivenBackWhenTheStoreComesBack) {
  // The store stays unreachable for a while after the lost answer: the
  // give-back is retried with a back-off until it is answered. (Its
  // releases go unanswered from the start: a store taken down only once
  // the caller saw the error could answer the first give-back first.)
  auto down = std::make_shared<std::atomic<bool>>(true);
  script_->script_release([down](const std::string&) -> std::optional<detail::Released> {
    if (down->load()) return detail::Released::kUnconfirmed;
    return std::nullopt;
  });
  script_->lose_replies(Op::kAcquire, 1);
  auto f = rt_->acquire("ghost-later", 30s);
  ASSERT_TRUE(error_of<ConnectionError>(f));
  ASSERT_TRUE(script_->wait_for(Op::kRelease, 3));  // tried, and tried again
  EXPECT_TRUE(backend_->owner(memory_name("ghost-later")));
  down->store(false);
  auto until = std::chrono::steady_clock::now() + kBound;
  while (backend_->owner(memory_name("ghost-later")) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(2ms);
  EXPECT_FALSE(backend_->owner(memory_name("ghost-later")));
}

TEST_F(WaitQueueTest, AWaiterGivenUpAfterAConnectionErrorGivesItsTokenBack) {
  // A waiter whose last attempt went unanswered and whose wait then runs
  // out: that attempt may have taken the lock.
  held_elsewhere("ghost-wait", 200ms);
  script_->set_delay(Op::kAcquire, 0ms);
  auto f = rt_->acquire({.key = "ghost-wait", .ttl = 30s, .retries = forever, .wait = 400ms});
  ASSERT_TRUE(script_->wait_for(Op::kAcquire, 1));
  script_->lose_replies(Op::kAcquire, 1000);  // from now on every attempt is applied, its answer lost
  auto err = error_of<ConnectionError>(f);
  ASSERT_TRUE(err);
  script_->lose_replies(Op::kAcquire, 0);
  auto until = std::chrono::steady_clock::now() + kBound;
  while (backend_->owner(memory_name("ghost-wait")) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(2ms);
  EXPECT_FALSE(backend_->owner(memory_name("ghost-wait")));
}

TEST_F(WaitQueueTest, AnErrorOtherThanAConnectionFailsTheWaiterAtOnce) {
  script_->script_acquire([](const std::string&) -> std::optional<Acquired> {
    Acquired a;
    a.error = detail::redis_reply_error("memory", "WRONGTYPE Operation against a key holding the wrong kind of value");
    return a;
  });
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt_->acquire({.key = "wrongtype", .ttl = 1s, .retries = forever, .wait = 10s});
  auto err = error_of<StoreRefused>(f);
  ASSERT_TRUE(err);
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 2s);
  EXPECT_EQ(acquires_of("wrongtype"), 1u);
}

TEST_F(WaitQueueTest, ALockTakenAfterTheWaitRanOutIsGivenBack) {
  script_->set_delay(Op::kAcquire, 400ms);
  auto f = rt_->acquire({.key = "late", .ttl = 1s, .retries = forever, .wait = 100ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(f));
  ASSERT_TRUE(script_->wait_for(Op::kRelease, 1));
  script_->set_delay(Op::kAcquire, 0ms);
  auto again = rt_->acquire("late", 1s);  // free again: nothing was left held
  auto h = get_bounded(again);
  h.release().get();
}

TEST_F(WaitQueueTest, WithoutReleaseNoticesTheHeadPollsWithABoundedBackOff) {
  script_->set_release_events(false);
  rt_.reset();
  rt_ = memory_runtime(backend_, script_);  // the store reads it when it is made
  held_elsewhere("polled", 10s);
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt_->acquire({.key = "polled", .ttl = 1s, .retries = forever, .wait = 15s});
  ASSERT_TRUE(script_->wait_for(Op::kAcquire, 3));
  backend_->erase(memory_name("polled"));  // released, and nobody is told
  auto h = get_bounded(f);
  auto waited = ms_between(t0, std::chrono::steady_clock::now());
  EXPECT_LT(waited, 3s);                             // found well before the 10 s ttl
  EXPECT_LT(acquires_of("polled"), 14u);             // 10 ms doubling: not a busy loop
  EXPECT_EQ(script_->count(Op::kSubscribe), 0u);
  h.release().get();
}

TEST_F(WaitQueueTest, LostSubscriptionsCostLatencyNotLiveness) {
  MemoryStore* store = nullptr;
  rt_.reset();
  rt_ = memory_runtime(backend_, script_, memory_options(), &store);
  held_elsewhere("lost-subs", 500ms);
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt_->acquire({.key = "lost-subs", .ttl = 1s, .retries = forever, .wait = 10s});
  ASSERT_TRUE(script_->wait_for(Op::kSubscribe, 1));
  ASSERT_TRUE(script_->wait_for(Op::kAcquire, 2));
  store->drop_subscriptions_soon();  // as if the pub/sub connection dropped
  ASSERT_TRUE(script_->wait_for(Op::kUnsubscribe, 1));
  // A release whose notice nobody hears, and the next holder at once.
  backend_->hand_over(memory_name("lost-subs"), "another-process", 300ms);
  auto h = get_bounded(f);
  // The holder's ttl still ended the wait.
  EXPECT_GE(ms_between(t0, std::chrono::steady_clock::now()), 250ms);
  h.release().get();
}

// Election::on_change reads who leads on each release notice: an observer
// of a key hears every release, and keeps its subscription while waiters
// of the same key come and go.
TEST_F(WaitQueueTest, AnObserverHearsEachReleaseAndKeepsItsSubscriptionPastTheWaiters) {
  struct Looks {
    std::mutex mu;
    std::condition_variable cv;
    int n = 0;
    bool reached(int want) {
      std::unique_lock lk(mu);
      return cv.wait_for(lk, kBound, [&] { return n >= want; });
    }
  };
  auto looks = std::make_shared<Looks>();  // a late call finds it still there
  auto& impl = detail::RuntimeAccess::impl(*rt_);
  const auto id = impl.observe_releases("observed", [looks] {
    std::lock_guard lk(looks->mu);
    ++looks->n;
    looks->cv.notify_all();
  });
  ASSERT_NE(id, 0u);
  ASSERT_TRUE(script_->wait_for(Op::kSubscribe, 1));
  ASSERT_TRUE(looks->reached(1));  // the subscription's confirmation: look now
  held_elsewhere("observed", 10s);
  backend_->release_as_other(memory_name("observed"));
  ASSERT_TRUE(looks->reached(2));
  // A waiter of the key, woken by the next release, takes it and gives it back.
  held_elsewhere("observed", 10s);
  auto f = rt_->acquire({.key = "observed", .ttl = 1s, .retries = forever, .wait = 15s});
  ASSERT_TRUE(script_->wait_for(Op::kAcquire, 1));
  backend_->release_as_other(memory_name("observed"));
  auto h = get_bounded(f);
  h.release().get();
  ASSERT_TRUE(looks->reached(3));
  EXPECT_EQ(script_->count(Op::kSubscribe), 1u);    // the observer's, shared by the waiter
  EXPECT_EQ(script_->count(Op::kUnsubscribe), 0u);  // kept past the waiter
  impl.unobserve_releases(id);
  ASSERT_TRUE(script_->wait_for(Op::kUnsubscribe, 1));
}

TEST_F(WaitQueueTest, StoppingTheRuntimeFailsWaitersWithRuntimeStopped) {
  held_elsewhere("stopping", 10s);
  auto f = rt_->acquire({.key = "stopping", .ttl = 1s, .retries = forever, .wait = 15s});
  ASSERT_TRUE(script_->wait_for(Op::kSubscribe, 1));
  rt_.reset();
  EXPECT_TRUE(error_of<RuntimeStopped>(f));
}

TEST_F(WaitQueueTest, TwoProcessesTakeTurnsThroughNotices) {
  auto other_script = std::make_shared<StoreScript>();
  auto other = memory_runtime(backend_, other_script);
  auto mine = rt_->acquire("turns", 10s);
  auto h = get_bounded(mine);
  auto theirs = other->acquire({.key = "turns", .ttl = 10s, .retries = forever, .wait = 15s});
  ASSERT_TRUE(other_script->wait_for(Op::kSubscribe, 1));
  auto t0 = std::chrono::steady_clock::now();
  h.release().get();
  auto h2 = get_bounded(theirs);
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 2s);  // woken, not timed out
  EXPECT_GT(h2.lease().fencing_token(), 1u);
  h2.release().get();
}

TEST_F(WaitQueueTest, NestedCallsOnTheSameKeyAreReentrantAndNeverAskTheStore) {
  auto inner = locked("reentrant", 1s, forever).on(*rt_)([] { return this_lease().fencing_token(); });
  auto outer = locked("reentrant", 1s, forever).on(*rt_)([&] {
    auto f = inner();
    return std::make_pair(this_lease().fencing_token(), f.get());
  });
  auto f = outer();
  auto [a, b] = get_bounded(f);
  EXPECT_EQ(a, b);
  EXPECT_EQ(acquires_of("reentrant"), 1u);
}

TEST_F(WaitQueueTest, ANestedCallOnAnotherKeyRunsInlineAndReleasesBeforeReturning) {
  auto inner = locked("inner", 1s, forever).on(*rt_)([] { return std::this_thread::get_id(); });
  auto outer = locked("outer", 1s, forever).on(*rt_)([&] {
    auto f = inner();
    bool inner_released = !f.valid() || f.wait_for(0ms) == std::future_status::ready;
    return std::make_tuple(std::this_thread::get_id(), f.get(), inner_released);
  });
  auto f = outer();
  auto [outer_thread, inner_thread, ready] = get_bounded(f);
  EXPECT_EQ(outer_thread, inner_thread);
  EXPECT_TRUE(ready);
  EXPECT_FALSE(backend_->owner(memory_name("inner")));
}

TEST_F(WaitQueueTest, InspectAndForceReleaseReachTheStore) {
  auto f = rt_->acquire("inspected", 5s);
  auto h = get_bounded(f);
  auto s = rt_->inspect("inspected");
  auto state = get_bounded(s);
  EXPECT_TRUE(state.held);
  EXPECT_EQ(state.key, "inspected");
  EXPECT_GT(state.ttl, 4s);
  EXPECT_EQ(state.fencing_token, 1u);
  auto forced = rt_->force_release("inspected");
  EXPECT_TRUE(get_bounded(forced));
  auto s2 = rt_->inspect("inspected");
  EXPECT_FALSE(get_bounded(s2).held);
  EXPECT_THROW(h.release().get(), LeaseLost);
}

}  // namespace
}  // namespace lockwatch::testing
