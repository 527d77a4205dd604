// Local hand-off (Options::handoff.enabled, on by default): a lease passes to
// the next caller waiting in the same runtime without a release and a new
// acquisition, with a fencing token the store reserved for it. Logic on
// the in-memory store; exclusion, fencing across runtimes (whatever their
// setting) and the streak bound against a real redis-server.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "memory_runtime.hpp"

namespace lockwatch::testing {
namespace {

constexpr auto kLongWait = std::chrono::milliseconds(kBound);

// Waits (bounded) for a release's outcome; rethrows its error.
void settle(std::future<void> f) { get_bounded(f); }

Options handoff_options(Options o) {
  o.handoff.enabled = true;
  return o;
}

// ------------------------------------------------------------ memory store

class HandoffTest : public ::testing::Test {
 protected:
  // A streak bounded by count only: a loaded machine's scheduling must not
  // end one (the time bound has a test of its own, on Redis).
  static Options streak_options() {
    auto o = handoff_options(memory_options());
    o.handoff.max_time = 60s;
    return o;
  }
  void SetUp() override { rt_ = memory_runtime(backend_, script_, streak_options()); }
  void TearDown() override { rt_.reset(); }
  void restart(Options o) {
    rt_.reset();
    rt_ = memory_runtime(backend_, script_, std::move(o));
  }
  // Through the wait queue (a wait), so that the lock counts as held here.
  LockHandle hold(const std::string& key, std::chrono::milliseconds ttl = 2s) {
    auto f = rt_->acquire({.key = key, .ttl = ttl, .retries = forever, .wait = kLongWait});
    return get_bounded(f);
  }
  std::size_t store_calls(Op op, const std::string& key) const {
    std::size_t n = 0;
    for (const auto& c : script_->calls())
      if (c.op == op && c.name == memory_name(key)) ++n;
    return n;
  }
  // Waits (bounded) until the store holds no lock on `key`.
  bool freed(const std::string& key) const {
    auto until = std::chrono::steady_clock::now() + kBound;
    while (backend_->owner(memory_name(key)) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(5ms);  // polling the store, as an operator would
    return !backend_->owner(memory_name(key));
  }

  std::shared_ptr<MemoryBackend> backend_ = std::make_shared<MemoryBackend>();
  std::shared_ptr<StoreScript> script_ = std::make_shared<StoreScript>();
  std::unique_ptr<Runtime> rt_;
};

TEST_F(HandoffTest, AWaiterTakesTheLockWithoutTheStoreAndTheNextReservedToken) {
  auto first = hold("k");
  auto store_fence = backend_->fence(memory_name("k"));
  EXPECT_EQ(first.lease().fencing_token(), store_fence);
  auto second_f = rt_->acquire({.key = "k", .ttl = 2s, .retries = forever, .wait = kLongWait});
  auto third_f = rt_->acquire({.key = "k", .ttl = 2s, .retries = forever, .wait = kLongWait});
  auto released = first.release();
  auto second = get_bounded(second_f);
  EXPECT_NO_THROW(get_bounded(released));
  // The first hand-off reserved a block of tokens above the first holder's
  // (the store's counter moved past them); each holder takes the next.
  EXPECT_EQ(second.lease().fencing_token(), store_fence + 1);
  second.release().wait_for(kBound);
  auto third = get_bounded(third_f);
  EXPECT_EQ(third.lease().fencing_token(), store_fence + 2);
  EXPECT_EQ(backend_->fence(memory_name("k")), store_fence + detail::LockTable::kTokenBlock);
  EXPECT_EQ(store_calls(Op::kReserve, "k"), 1u);
  // No release in the store since, and no token but the reserved: the key stayed ours.
  EXPECT_EQ(store_calls(Op::kRelease, "k"), 0u);
  EXPECT_EQ(rt_->stats().local_handoffs, 2u);
  EXPECT_TRUE(backend_->owner(memory_name("k")).has_value());
  EXPECT_NO_THROW(settle(third.release()));
  EXPECT_TRUE(freed("k"));
  EXPECT_EQ(rt_->held_leases(), 0u);
}

TEST_F(HandoffTest, TurnedOffEveryHolderGoesThroughTheStore) {
  auto o = memory_options();
  o.handoff.enabled = false;
  restart(o);
  auto first = hold("k");
  auto redis_fence = backend_->fence(memory_name("k"));
  EXPECT_EQ(first.lease().fencing_token(), redis_fence);
  auto second_f = rt_->acquire({.key = "k", .ttl = 2s, .retries = forever, .wait = kLongWait});
  first.release().wait_for(kBound);
  auto second = get_bounded(second_f);
  EXPECT_EQ(second.lease().fencing_token(), redis_fence + 1);
  EXPECT_EQ(backend_->fence(memory_name("k")), redis_fence + 1);
  EXPECT_EQ(store_calls(Op::kRelease, "k"), 1u);
  EXPECT_EQ(store_calls(Op::kReserve, "k"), 0u);
  EXPECT_EQ(rt_->stats().local_handoffs, 0u);
}

TEST_F(HandoffTest, OnByDefault) { EXPECT_TRUE(Options{}.handoff.enabled); }

// The first hand-off of a streak waits for its block: meanwhile the key
// stays held in the store (and renewed), so nobody slips in between.
TEST_F(HandoffTest, AHandOffWaitingForItsTokensKeepsTheKey) {
  restart(streak_options());  // the wait below is longer than the default streak
  script_->set_delay(Op::kReserve, 150ms);
  auto first = hold("k");
  const auto first_token = first.lease().fencing_token();
  auto owner = backend_->owner(memory_name("k"));
  ASSERT_TRUE(owner.has_value());
  auto second_f = rt_->acquire({.key = "k", .ttl = 2s, .retries = forever, .wait = kLongWait});
  auto released = first.release();
  ASSERT_TRUE(script_->wait_for(Op::kReserve, 1));
  EXPECT_EQ(second_f.wait_for(50ms), std::future_status::timeout);
  EXPECT_EQ(backend_->owner(memory_name("k")), owner);
  auto second = get_bounded(second_f);
  EXPECT_NO_THROW(get_bounded(released));
  EXPECT_EQ(second.lease().fencing_token(), first_token + 1);
  EXPECT_EQ(store_calls(Op::kRelease, "k"), 0u);
  EXPECT_NO_THROW(settle(second.release()));
  EXPECT_TRUE(freed("k"));
}

// A reservation without an answer hands nothing on: the key goes back to
// the store, and the waiter takes it there with a token above any the
// reservation may have made.
TEST_F(HandoffTest, AReservationWithoutAnAnswerSendsTheKeyBackToTheStore) {
  script_->lose_replies(Op::kReserve, 1);
  auto first = hold("k");
  const auto first_token = first.lease().fencing_token();
  auto second_f = rt_->acquire({.key = "k", .ttl = 2s, .retries = forever, .wait = kLongWait});
  EXPECT_NO_THROW(settle(first.release()));
  auto second = get_bounded(second_f);
  EXPECT_EQ(store_calls(Op::kRelease, "k"), 1u);
  EXPECT_EQ(rt_->stats().local_handoffs, 0u);
  EXPECT_EQ(second.lease().fencing_token(), backend_->fence(memory_name("k")));
  EXPECT_GT(second.lease().fencing_token(), first_token + detail::LockTable::kTokenBlock);
}

TEST_F(HandoffTest, TheNewHolderHasALeaseOfItsOwn) {
  auto o = handoff_options(memory_options());
  o.handoff.max_time = 60s;  // the first holder keeps it past a renewal
  restart(o);
  auto first = hold("k", 1s);
  ASSERT_TRUE(renewed_again(first.lease(), 1));
  auto first_token = first.lease().stop_token();
  auto second_f = rt_->acquire({.key = "k", .ttl = 1s, .retries = forever, .wait = kLongWait});
  first.release().wait_for(kBound);
  auto second = get_bounded(second_f);
  const Lease& lease = second.lease();
  EXPECT_EQ(lease.renewals(), 0u);  // counts from its own start
  EXPECT_FALSE(lease.stop_token().stop_requested());
  EXPECT_FALSE(first_token.stop_requested());
  EXPECT_GT(lease.remaining(), 0ms);
  // The watchdog keeps the store's key alive for it.
  EXPECT_TRUE(renewed_again(lease, 2));
  EXPECT_FALSE(lease.lost());
  EXPECT_EQ(lease.fencing_token(), 2u);
  EXPECT_EQ(backend_->fence(memory_name("k")), 1u + detail::LockTable::kTokenBlock);
}

TEST_F(HandoffTest, ARenewalInFlightAtTheHandOffCountsForTheNewHolder) {
  auto o = handoff_options(memory_options());
  o.handoff.max_time = 60s;
  restart(o);
  script_->set_delay(Op::kRenew, 100ms);  // each renewal is answered that much later
  auto first = hold("k", 2s);
  ASSERT_TRUE(script_->wait_for(Op::kRenew, 1));
  auto second_f = rt_->acquire({.key = "k", .ttl = 2s, .retries = forever, .wait = kLongWait});
  first.release().wait_for(kBound);
  auto second = get_bounded(second_f);
  ASSERT_EQ(rt_->stats().local_handoffs, 1u);
  // The answer to the renewal sent for the first holder moves the second's
  // deadline; without it the second would be lost at the old deadline.
  EXPECT_TRUE(renewed_again(second.lease(), 1));
  EXPECT_FALSE(second.lease().lost());
}

TEST_F(HandoffTest, AWaiterWithAnotherTtlOrNoRetriesTakesTheLockFromTheStore) {
  auto first = hold("k", 2s);
  auto other_ttl_f = rt_->acquire({.key = "k", .ttl = 3s, .retries = forever, .wait = kLongWait});
  first.release().wait_for(kBound);
  auto other_ttl = get_bounded(other_ttl_f);
  EXPECT_EQ(other_ttl.lease().fencing_token(), 2u);
  auto no_retries_f = rt_->acquire({.key = "k", .ttl = 3s, .retries = Retries(0), .wait = kLongWait});
  other_ttl.release().wait_for(kBound);
  auto no_retries = get_bounded(no_retries_f);
  EXPECT_EQ(no_retries.lease().fencing_token(), 3u);
  EXPECT_EQ(backend_->fence(memory_name("k")), 3u);
  EXPECT_EQ(store_calls(Op::kReserve, "k"), 0u);
  EXPECT_EQ(rt_->stats().local_handoffs, 0u);
}

TEST_F(HandoffTest, TheStreakCountBoundSendsTheKeyBackToTheStore) {
  auto o = streak_options();
  o.handoff.max_streak = 2;
  o.handoff.max_time = 60s;
  restart(o);
  auto first = hold("k");
  std::vector<std::future<LockHandle>> waiting;
  for (int i = 0; i < 4; ++i) waiting.push_back(rt_->acquire({.key = "k", .ttl = 2s, .retries = forever, .wait = kLongWait}));
  std::vector<std::uint64_t> tokens{first.lease().fencing_token()};
  first.release().wait_for(kBound);
  for (auto& f : waiting) {
    auto h = get_bounded(f);
    tokens.push_back(h.lease().fencing_token());
    h.release().wait_for(kBound);
  }
  // Two hand-offs (a block of two tokens: no more than the streak may use),
  // then the store again, then a hand-off from a block of its own.
  EXPECT_EQ(tokens, (std::vector<std::uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(rt_->stats().local_handoffs, 3u);
  EXPECT_EQ(backend_->fence(memory_name("k")), 6u);
  EXPECT_EQ(store_calls(Op::kRelease, "k"), 2u);
}

TEST_F(HandoffTest, ALostLeaseIsTheCurrentHoldersAndEndsTheStreak) {
  auto first = hold("k", 1s);
  auto second_f = rt_->acquire({.key = "k", .ttl = 1s, .retries = forever, .wait = kLongWait});
  auto third_f = rt_->acquire({.key = "k", .ttl = 1s, .retries = forever, .wait = kLongWait});
  auto first_stop = first.lease().stop_token();
  EXPECT_NO_THROW(settle(first.release()));
  auto second = get_bounded(second_f);
  ASSERT_EQ(rt_->stats().local_handoffs, 1u);
  // Another owner takes the key: the next renewal finds it.
  backend_->set_owner(memory_name("k"), "thief", 10s);
  EXPECT_TRUE(stopped_within_bound(second.lease().stop_token()));
  EXPECT_EQ(second.lease().lost_reason(), LostReason::kTakenByOther);
  EXPECT_FALSE(first_stop.stop_requested());
  auto second_token = second.lease().fencing_token();
  auto released = second.release();
  EXPECT_THROW(get_bounded(released), LeaseLost);
  // No hand-off after the loss: the third waits for the thief.
  EXPECT_EQ(third_f.wait_for(100ms), std::future_status::timeout);
  backend_->release_as_other(memory_name("k"));
  auto third = get_bounded(third_f);
  EXPECT_EQ(rt_->stats().local_handoffs, 1u);
  EXPECT_EQ(third.lease().fencing_token(), backend_->fence(memory_name("k")));
  EXPECT_GT(third.lease().fencing_token(), second_token);
}

TEST_F(HandoffTest, AWaiterWhoseWaitRanOutGetsNothingAndTheLockIsReleased) {
  auto first = hold("k");
  auto gone_f = rt_->acquire({.key = "k", .ttl = 2s, .retries = forever, .wait = 30ms});
  EXPECT_NE(error_in<LockNotAcquired>(gone_f), nullptr);
  EXPECT_NO_THROW(settle(first.release()));
  EXPECT_TRUE(freed("k"));
  EXPECT_EQ(rt_->held_leases(), 0u);
}

TEST_F(HandoffTest, AHandedOffLockWhoseFutureWasDroppedIsReleased) {
  auto first = hold("k");
  { auto dropped = rt_->acquire({.key = "k", .ttl = 2s, .retries = forever, .wait = kLongWait}); }
  EXPECT_NO_THROW(settle(first.release()));
  EXPECT_TRUE(freed("k"));
  // It was handed off (from a reserved block), then given back.
  EXPECT_EQ(rt_->stats().local_handoffs, 1u);
  EXPECT_EQ(store_calls(Op::kRelease, "k"), 1u);
}

TEST_F(HandoffTest, TheRuntimeStopsWithLocalHoldersAndWaiters) {
  auto first = hold("k");
  auto second_f = rt_->acquire({.key = "k", .ttl = 2s, .retries = forever, .wait = kLongWait});
  auto third_f = rt_->acquire({.key = "k", .ttl = 2s, .retries = forever, .wait = kLongWait});
  first.release().wait_for(kBound);
  auto second = get_bounded(second_f);
  rt_.reset();
  EXPECT_NE(error_in<RuntimeStopped>(third_f), nullptr);
  EXPECT_TRUE(freed("k"));
}

TEST(HandoffOptionsTest, StreakBoundsOutsideTheirRangeAreRejected) {
  Options o;
  o.handoff.max_streak = 0;
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.handoff.max_streak = 1u << 20;
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.handoff.max_streak = (1u << 20) - 1;
  EXPECT_NO_THROW(o.validate());
  o.handoff.max_time = 0ms;
  EXPECT_THROW(o.validate(), InvalidArgument);
}

// ---------------------------------------------------------- redis-server

class HandoffRedisTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new RedisServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static Options options(std::size_t threads = 4) { return handoff_options(options_for(*server_, threads)); }
  static RedisServer* server_;
};
RedisServer* HandoffRedisTest::server_ = nullptr;

// 16 threads x 200 calls on one key through `o`: the exact count, no
// overlap, and the lock released at the end. Returns how many holders had
// the lock handed on.
std::uint64_t sixteen_threads_on_one_key(const Options& o, RedisServer& server) {
  Runtime rt(o);
  constexpr int kThreads = 16;
  constexpr int kCalls = 200;
  long counter = 0;  // deliberately not atomic: the lock is what protects it
  std::atomic<bool> in_use{false};
  std::atomic<int> overlaps{0};
  auto fn = locked("excl", 5s, forever).on(rt).wait(kLongWait)([&] {
    if (in_use.exchange(true)) overlaps.fetch_add(1);
    long seen = counter;
    std::this_thread::yield();
    counter = seen + 1;
    in_use.store(false);
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) {
        auto f = fn();
        if (!completes(f)) return;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, long{kThreads} * kCalls);
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_FALSE(exists(server, lock_key("excl")));
  return rt.stats().local_handoffs;
}

TEST_F(HandoffRedisTest, SixteenThreadsOnOneKeyNeverOverlap) {
  EXPECT_GT(sixteen_threads_on_one_key(options(8), *server_), 0u);  // the hand-off path was taken
}

// Options::runtime.busy_poll: the I/O thread and a pool worker poll instead of
// sleeping; nothing about the lock changes, with hand-offs or without.
TEST_F(HandoffRedisTest, BusyPollingChangesNothingButTheWakeUps) {
  Options o = options(8);
  o.runtime.busy_poll = std::chrono::microseconds(200);
  EXPECT_GT(sixteen_threads_on_one_key(o, *server_), 0u);
  o.handoff.enabled = false;
  EXPECT_EQ(sixteen_threads_on_one_key(o, *server_), 0u);
}

// A streak's end: the key goes back to the store, and this runtime's
// waiters sit out one tick only if its release notice reached another
// runtime (a waiter elsewhere). A tick of 1 s makes a sit-out plain; one
// hand-off per streak makes every second release a streak's end.
Options one_handoff_streaks(Options o) {
  o.watchdog.tick = 1s;  // leases of 60 s (a tick of 1 s needs one of 23 s at least)
  o.handoff.max_streak = 1;
  o.handoff.max_time = 60s;
  return o;
}

TEST_F(HandoffRedisTest, AStreakEndNobodyElseHeardGoesStraightToTheNextWaiterHere) {
  Runtime rt(one_handoff_streaks(options()));
  auto first_f = rt.acquire({.key = "alone", .ttl = 60s, .retries = forever, .wait = kLongWait});
  auto first = get_bounded(first_f);
  auto second_f = rt.acquire({.key = "alone", .ttl = 60s, .retries = forever, .wait = kLongWait});
  auto third_f = rt.acquire({.key = "alone", .ttl = 60s, .retries = forever, .wait = kLongWait});
  settle(first.release());
  auto second = get_bounded(second_f);  // handed on: the streak's one hand-off
  ASSERT_EQ(rt.stats().local_handoffs, 1u);
  const auto second_token = second.lease().fencing_token();
  const auto released = std::chrono::steady_clock::now();
  auto released_f = second.release();  // the streak's end: back to the store
  auto third = get_bounded(third_f);
  const auto took = std::chrono::steady_clock::now() - released;
  EXPECT_NO_THROW(settle(std::move(released_f)));
  // Taken from the store (a token of its own, the store's counter), in
  // round trips, not after a 1 s tick's sit-out.
  EXPECT_EQ(rt.stats().local_handoffs, 1u);
  EXPECT_GT(third.lease().fencing_token(), second_token);
  EXPECT_LT(took, 500ms);
  settle(third.release());
}

TEST_F(HandoffRedisTest, AStreakEndAnotherRuntimeHeardIsItsTurnFirst) {
  const std::string key = "two-runtimes";
  Runtime rt(one_handoff_streaks(options()));
  Runtime other(options());
  auto first_f = rt.acquire({.key = key, .ttl = 60s, .retries = forever, .wait = kLongWait});
  auto first = get_bounded(first_f);
  auto second_f = rt.acquire({.key = key, .ttl = 60s, .retries = forever, .wait = kLongWait});
  auto third_f = rt.acquire({.key = key, .ttl = 60s, .retries = forever, .wait = kLongWait});
  // The other runtime waits, subscribed to the key's release notices.
  auto theirs_f = other.acquire({.key = key, .ttl = 60s, .retries = forever, .wait = kLongWait});
  auto until = std::chrono::steady_clock::now() + kBound;
  auto listeners = [&] {
    auto r = server_->command({"PUBSUB", "NUMSUB", lock_key(key) + ":rel"});
    return r.elements.size() == 2 ? r.elements[1].integer : -1;
  };
  while (listeners() < 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);  // polling the server, as an operator would
  ASSERT_GE(listeners(), 1);
  settle(first.release());
  auto second = get_bounded(second_f);  // handed on: the other is not asked
  EXPECT_EQ(theirs_f.wait_for(0s), std::future_status::timeout);
  const auto second_token = second.lease().fencing_token();
  settle(second.release());  // the streak's end, heard by the other runtime
  auto theirs = get_bounded(theirs_f);
  EXPECT_GT(theirs.lease().fencing_token(), second_token);
  // Ours sat out, then found the key held: it waits for the other's release.
  EXPECT_EQ(third_f.wait_for(0s), std::future_status::timeout);
  const auto theirs_token = theirs.lease().fencing_token();
  settle(theirs.release());
  auto third = get_bounded(third_f);
  EXPECT_GT(third.lease().fencing_token(), theirs_token);
  settle(third.release());
}

// Whatever the other runtime's setting: tokens come from the store.
class HandoffAcrossRuntimesTest : public HandoffRedisTest, public ::testing::WithParamInterface<bool> {};

TEST_P(HandoffAcrossRuntimesTest, TokensIncreaseAcrossHandOffsAndAcrossRuntimes) {
  std::vector<std::uint64_t> tokens;  // appended under the lock, in holding order
  std::uint64_t handed = 0;
  const std::string key = GetParam() ? "fence-on" : "fence-off";
  {
    Runtime rt(options(8));
    auto fn = locked(key, 5s, forever).on(rt).wait(kLongWait)([&] {
      tokens.push_back(this_lease().fencing_token());
    });
    std::vector<std::future<void>> calls;
    for (int i = 0; i < 200; ++i) calls.push_back(fn());
    for (auto& f : calls) ASSERT_TRUE(completes(f));
    handed = rt.stats().local_handoffs;
  }
  ASSERT_EQ(tokens.size(), 200u);
  for (std::size_t i = 1; i < tokens.size(); ++i) EXPECT_GT(tokens[i], tokens[i - 1]) << "at " << i;
  EXPECT_GT(handed, 0u);
  // Another runtime (as another process would), with hand-offs on or off,
  // takes the key from Redis: its token is above every one handed out
  // before, and it is the store's counter, as operators see it.
  auto o = options();
  o.handoff.enabled = GetParam();
  Runtime other(o);
  auto f = other.acquire({.key = key, .ttl = 5s, .retries = forever, .wait = kLongWait});
  auto h = get_bounded(f);
  EXPECT_GT(h.lease().fencing_token(), tokens.back());
  auto state = other.inspect(key);
  EXPECT_EQ(get_bounded(state).fencing_token, h.lease().fencing_token());
}

INSTANTIATE_TEST_SUITE_P(OtherRuntime, HandoffAcrossRuntimesTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "handoff_on" : "handoff_off"; });

TEST_F(HandoffRedisTest, TheStreakBoundLetsAnotherRuntimeIn) {
  auto o = options(8);
  o.handoff.max_time = 50ms;
  Runtime hammering(o);
  std::atomic<bool> stop{false};
  std::atomic<long> calls{0};
  auto fn = locked("turns", 5s, forever).on(hammering).wait(kLongWait)([&] { calls.fetch_add(1); });
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      while (!stop.load()) {
        auto f = fn();
        if (!completes(f)) return;
      }
    });
  // Wait (bounded) until the hammering runtime is in a streak.
  auto until = std::chrono::steady_clock::now() + kBound;
  while (calls.load() < 100 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_GE(calls.load(), 100);
  Runtime other(options());
  auto started = std::chrono::steady_clock::now();
  auto f = other.acquire({.key = "turns", .ttl = 5s, .retries = forever, .wait = 5s});
  auto h = get_bounded(f);
  auto took = std::chrono::steady_clock::now() - started;
  EXPECT_LT(took, 2s);
  EXPECT_GT(h.lease().fencing_token(), 0u);
  auto during = calls.load();
  EXPECT_NO_THROW(settle(h.release()));
  stop.store(true);
  for (auto& t : threads) t.join();
  EXPECT_GT(calls.load(), during);  // the hammering runtime went on after
}

}  // namespace
}  // namespace lockwatch::testing
