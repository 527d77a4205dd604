// The LOCKED decorator end to end against a real redis-server.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "lockwatch/lockwatch.hpp"
#include "store/redis/scripts.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

// Every case runs in plaintext and over TLS (LOCKED without .on() uses the
// process-wide runtime, which is the plaintext server's either way).
class LockedTest : public ::testing::TestWithParam<Transport> {
 protected:
  static void SetUpTestSuite() {
    plain_ = &lasting_server();
    tls_ = new RedisServer(over(Transport::kTls));
    ::setenv("LOCKWATCH_REDIS_URL", plain_->url().c_str(), 1);
  }
  static void TearDownTestSuite() {
    delete tls_;
    plain_ = tls_ = nullptr;
  }
  // The plaintext server lives until the process exits: made before the
  // process-wide runtime, it stops after that runtime, which never sees it go.
  static RedisServer& lasting_server() {
    static RedisServer s;
    return s;
  }
  static RedisServer& server() { return GetParam() == Transport::kTls ? *tls_ : *plain_; }
  void SetUp() override { rt_ = std::make_unique<Runtime>(options_for(server())); }
  void TearDown() override { rt_.reset(); }

  // A key unique to the running test.
  std::string key(const std::string& suffix = "") const {
    auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return std::string(info->name()) + suffix;
  }

  static RedisServer* plain_;
  static RedisServer* tls_;
  std::unique_ptr<Runtime> rt_;
};
RedisServer* LockedTest::plain_ = nullptr;
RedisServer* LockedTest::tls_ = nullptr;

int free_function(int a, int b) { return a * b; }

struct Multiplier {
  int factor;
  int operator()(int x) const { return x * factor; }
};

class Account {
 public:
  long withdraw(int id, long amount) {
    last_key = this_lease().key();
    balance -= amount;
    (void)id;
    return balance;
  }
  long balance = 1000;
  std::string last_key;
};

TEST_P(LockedTest, RunsTheCallableAndReturnsItsResult) {
  std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  auto f = locked("sku:{0}", 5s, 3).on(*rt_)([&](int sku, int qty) {
    ran_on = std::this_thread::get_id();
    return sku * 10 + qty;
  });
  auto fut = f(42, 1);
  EXPECT_EQ(get_bounded(fut), 421);
  EXPECT_NE(ran_on, caller);
}

TEST_P(LockedTest, MacroDecoratesALambdaWithTheDefaultSyntax) {
  auto f = LOCKED("sku:{0}:{1}", 5s, 3)[&](int, const std::string& who) { return this_lease().key() + "/" + who; };
  // Bind to this test's runtime through the builder form too.
  auto g = locked("sku:{0}:{1}", 5s, 3).on(*rt_)([&](int sku, const std::string& who) {
    return this_lease().key() + "/" + who + std::to_string(sku);
  });
  auto fut = g(42, std::string("ann"));
  EXPECT_EQ(get_bounded(fut), "sku:42:ann/ann42");
  EXPECT_EQ(f.key_for(7, std::string("bob")), "sku:7:bob");
  auto fut2 = f(7, std::string("bob"));
  EXPECT_EQ(get_bounded(fut2), "sku:7:bob/bob");
}

TEST_P(LockedTest, ReleasesTheLockBeforeTheFutureIsReady) {
  std::string k = key();
  auto f = locked([&] { return k; }, 5s, 3).on(*rt_)([&] {
    EXPECT_TRUE(exists(server(), k));
    return 1;
  });
  for (int i = 0; i < 20; ++i) {
    auto fut = f();
    ASSERT_EQ(get_bounded(fut), 1);
    ASSERT_FALSE(exists(server(), k)) << "iteration " << i;
  }
}

TEST_P(LockedTest, ExceptionsPropagateAndTheLockIsStillReleased) {
  std::string k = key();
  auto f = locked([&] { return k; }, 5s, 3).on(*rt_)([]() -> int { throw std::logic_error("boom"); });
  auto fut = f();
  auto err = error_of<std::logic_error>(fut);
  ASSERT_TRUE(err);
  EXPECT_STREQ(err->what(), "boom");
  EXPECT_FALSE(exists(server(), k));
}

TEST_P(LockedTest, MemberFunctionKeyUsesTheFirstDeclaredParameter) {
  Account account;
  auto withdraw = locked("acct:{0}", 2s, forever).on(*rt_)(&Account::withdraw);
  auto fut = withdraw(account, 7, 100);
  EXPECT_EQ(get_bounded(fut), 900);
  EXPECT_EQ(account.balance, 900);  // the object was used by reference
  EXPECT_EQ(account.last_key, "acct:7");
  auto by_pointer = withdraw(&account, 8, 50);
  EXPECT_EQ(get_bounded(by_pointer), 850);
  EXPECT_EQ(account.last_key, "acct:8");
}

TEST_P(LockedTest, MemberFunctionsTakeSmartPointersAndReferenceWrappers) {
  auto withdraw = locked("acct:{0}", 2s, forever).on(*rt_)(&Account::withdraw);
  auto shared = std::make_shared<Account>();
  auto f1 = withdraw(shared, 1, 10);  // an lvalue shared_ptr: used by reference
  EXPECT_EQ(get_bounded(f1), 990);
  auto f2 = withdraw(std::make_shared<Account>(), 2, 10);  // an rvalue: kept alive by the call
  EXPECT_EQ(get_bounded(f2), 990);
  auto unique = std::make_unique<Account>();
  auto f3 = withdraw(unique, 3, 20);
  EXPECT_EQ(get_bounded(f3), 980);
  EXPECT_EQ(unique->balance, 980);
  Account plain;
  auto f4 = withdraw(std::ref(plain), 4, 30);
  EXPECT_EQ(get_bounded(f4), 970);
  EXPECT_EQ(plain.balance, 970);
  EXPECT_EQ(plain.last_key, "acct:4");
}

TEST_P(LockedTest, FunctionPointersAndFunctionObjectsWork) {
  auto mul = locked("mul:{0}", 2s, 1).on(*rt_)(&free_function);
  auto fut = mul(6, 7);
  EXPECT_EQ(get_bounded(fut), 42);
  auto times3 = locked("times:{0}", 2s, 1).on(*rt_)(Multiplier{3});
  auto fut2 = times3(5);
  EXPECT_EQ(get_bounded(fut2), 15);
}

TEST_P(LockedTest, KeyCanBeAFunctionOrAConstant) {
  auto by_fn = locked([](int a, int b) { return "sum:" + std::to_string(a + b); }, 2s, 1).on(*rt_)([](int, int) {
    return this_lease().key();
  });
  auto fut = by_fn(2, 3);
  EXPECT_EQ(get_bounded(fut), "sum:5");
  auto constant = locked("nightly-job", 2s, 1).on(*rt_)([] { return this_lease().key(); });
  auto fut2 = constant();
  EXPECT_EQ(get_bounded(fut2), "nightly-job");
}

TEST_P(LockedTest, BusyLockFailsAtOnceWithLockNotAcquired) {
  std::string k = key();
  Gate gate, started;
  auto hold = locked([&] { return k; }, 5s, forever).on(*rt_)([&] {
    started.open();
    gate.wait();
  });
  auto held = hold();
  ASSERT_TRUE(started.wait());
  auto other = locked([&] { return k; }, 5s, forever).on(*rt_)([] { return 1; });
  auto fut = other();
  auto err = error_of<LockNotAcquired>(fut);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->key(), k);
  EXPECT_LT(err->waited(), 1s);  // no wait: one attempt's round trip
  gate.open();
  get_bounded(held);
}

TEST_P(LockedTest, WaitingWakesOnReleaseNotOnTtl) {
  std::string k = key();
  Gate gate, started;
  // Two runtimes: the waiter learns of the release through Redis pub/sub,
  // not through an in-process hand-off.
  Runtime other(options_for(server()));
  auto hold = locked([&] { return k; }, 10s, forever).on(*rt_)([&] {
    started.open();
    gate.wait();
  });
  auto held = hold();
  ASSERT_TRUE(started.wait());
  auto waiter = locked([&] { return k; }, 10s, forever).on(other).wait(15s)([] { return this_lease().fencing_token(); });
  auto waited = waiter();
  EXPECT_EQ(waited.wait_for(100ms), std::future_status::timeout);  // really waiting
  auto released_at = std::chrono::steady_clock::now();
  gate.open();
  get_bounded(held);
  auto token = get_bounded(waited);
  auto wake = std::chrono::steady_clock::now() - released_at;
  EXPECT_GT(token, 0u);
  // The holder's ttl was 10 s: a wake-up within 2 s came from the release.
  EXPECT_LT(wake, 2s);
}

TEST_P(LockedTest, WaitRunsOutWithLockNotAcquired) {
  std::string k = key();
  Gate gate, started;
  auto hold = locked([&] { return k; }, 5s, forever).on(*rt_)([&] {
    started.open();
    gate.wait();
  });
  auto held = hold();
  ASSERT_TRUE(started.wait());
  auto waiter = locked([&] { return k; }, 5s, forever).on(*rt_).wait(200ms)([] { return 1; });
  auto t0 = std::chrono::steady_clock::now();
  auto fut = waiter();
  auto err = error_of<LockNotAcquired>(fut);
  ASSERT_TRUE(err);
  EXPECT_GE(err->waited(), 200ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  gate.open();
  get_bounded(held);
}

TEST_P(LockedTest, ExactCountUnderContentionFromThreadsAndRuntimes) {
  std::string k = key();
  constexpr int kRuntimes = 3, kThreads = 3, kCalls = 15;
  std::vector<std::unique_ptr<Runtime>> runtimes;
  for (int i = 0; i < kRuntimes; ++i) runtimes.push_back(std::make_unique<Runtime>(options_for(server(), 2)));
  std::atomic<int> inside{0}, overlaps{0}, done{0};
  std::atomic<std::uint64_t> last_token{0};
  std::atomic<int> token_regressions{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRuntimes; ++r) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, r] {
        auto inc = locked([&] { return k; }, 2s, forever).on(*runtimes[r]).wait(30s)([&] {
          if (inside.fetch_add(1) != 0) overlaps++;
          auto token = this_lease().fencing_token();
          if (token <= last_token.load()) token_regressions++;
          last_token = token;
          std::this_thread::sleep_for(1ms);  // the critical section's work
          inside.fetch_sub(1);
          done++;
        });
        for (int i = 0; i < kCalls; ++i) {
          auto f = inc();
          if (!completes(f)) return;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(done.load(), kRuntimes * kThreads * kCalls);
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(token_regressions.load(), 0);
}

TEST_P(LockedTest, FencingTokensIncreaseAcrossRuntimes) {
  std::string k = key();
  Runtime other(options_for(server()));
  auto a = locked([&] { return k; }, 2s, 0).on(*rt_)([] { return this_lease().fencing_token(); });
  auto b = locked([&] { return k; }, 2s, 0).on(other)([] { return this_lease().fencing_token(); });
  std::uint64_t last = 0;
  for (int i = 0; i < 10; ++i) {
    auto f = i % 2 ? a() : b();
    auto t = get_bounded(f);
    EXPECT_GT(t, last);
    last = t;
  }
}

TEST_P(LockedTest, OnlyTheOwnerCanReleaseOrRenew) {
  std::string k = key();
  Gate gate, started;
  auto hold = locked([&] { return k; }, 5s, forever).on(*rt_)([&] {
    started.open();
    gate.wait();
  });
  auto held = hold();
  ASSERT_TRUE(started.wait());
  std::string lk = lock_key(k);
  const std::string release_source(detail::script(detail::ScriptId::kRelease).source);
  auto rel = server().command({"EVAL", release_source, "1", lk, "p", "not-the-owner", lk + ":rel"});
  EXPECT_EQ(rel.str, "x");  // someone else's: left alone
  auto ren = server().command(
      {"EVAL", std::string(detail::script(detail::ScriptId::kRenew).source), "1", lk, "not-the-owner", "100"});
  EXPECT_EQ(ren.str, "x");  // someone else's: nothing changed
  EXPECT_TRUE(exists(server(), k));
  EXPECT_GT(server().command({"PTTL", lk}).integer, 1000);  // the wrong owner's 100 ms did not apply
  gate.open();
  get_bounded(held);
  EXPECT_FALSE(exists(server(), k));
}

TEST_P(LockedTest, WorkLastingFiveTtlsKeepsItsLock) {
  std::string k = key();
  auto f = locked([&] { return k; }, 300ms, forever).on(*rt_)([&] {
    auto until = std::chrono::steady_clock::now() + 1500ms;
    std::int64_t min_pttl = 1 << 30;
    while (std::chrono::steady_clock::now() < until) {
      min_pttl = std::min<std::int64_t>(min_pttl, server().command({"PTTL", lock_key(k)}).integer);
      std::this_thread::sleep_for(20ms);  // sampling period
    }
    EXPECT_FALSE(this_lease().lost());
    return std::make_pair(min_pttl, this_lease().renewals());
  });
  auto fut = f();
  auto [min_pttl, renewals] = get_bounded(fut);
  EXPECT_GT(min_pttl, 0);  // never expired
  EXPECT_GE(renewals, 4u);
}

TEST_P(LockedTest, SpentRetriesTriggerTheStopTokenAndLeaseLost) {
  std::string k = key();
  std::atomic<bool> saw_stop{false};
  auto t0 = std::chrono::steady_clock::now();
  auto f = locked([&] { return k; }, 300ms, 1).on(*rt_)([&] {
    auto stop = this_lease().stop_token();
    auto until = std::chrono::steady_clock::now() + 5s;
    while (!stop.stop_requested() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
    saw_stop = stop.stop_requested();
    return 7;  // returned after the loss: must not reach the caller
  });
  auto fut = f();
  auto err = error_of<LeaseLost>(fut);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->reason(), LostReason::kRenewalsExhausted);
  EXPECT_TRUE(saw_stop);
  // One renewal at 245 ms extends to ~545 ms minus drift.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

TEST_P(LockedTest, NoRenewalIsSentAfterTheWorkEnds) {
  std::string k = key();
  // Renewals every half ttl (300 ms), each with 300 ms to be confirmed: a
  // loaded machine does not lose the lease before the work ends.
  Options o = options_for(server());
  o.watchdog.min_renewal_window = 300ms;
  Runtime rt(o);
  auto f = locked([&] { return k; }, 600ms, forever).on(rt)([] {
    std::this_thread::sleep_for(700ms);
    return this_lease().renewals();
  });
  auto fut = f();
  EXPECT_GE(get_bounded(fut), 2u);  // the watchdog was at work until the end
  EXPECT_EQ(rt.held_leases(), 0u);
  auto calls = [&] {
    auto info = server().command({"INFO", "commandstats"}).str;
    auto pos = info.find("cmdstat_evalsha:calls=");
    return pos == std::string::npos ? 0L : std::atol(info.c_str() + pos + 22);
  };
  long before = calls();
  std::this_thread::sleep_for(700ms);  // two renewal periods of observation
  EXPECT_EQ(calls(), before);
}

// A free set (lockwatch::all_of) on one Redis node is taken by one script
// call, which Redis runs atomically, and given back by one.
TEST_P(LockedTest, AFreeSetIsTakenByOneScriptCall) {
  auto calls = [&] {
    auto info = server().command({"INFO", "commandstats"}).str;
    auto pos = info.find("cmdstat_evalsha:calls=");
    return pos == std::string::npos ? 0L : std::atol(info.c_str() + pos + 22);
  };
  auto warm = rt_->acquire(key("-warm"), 30s);
  LockHandle w = get_bounded(warm);
  auto back = w.release();
  get_bounded(back);
  const std::string k = key();
  long before = calls();
  auto f = rt_->acquire({.key = all_of(k + ":d", k + ":c", k + ":b", k + ":a"), .ttl = 30s});
  LockHandle h = get_bounded(f);
  EXPECT_EQ(calls() - before, 1);
  EXPECT_TRUE(exists(server(), k + ":a") && exists(server(), k + ":d"));
  auto released = h.release();
  get_bounded(released);
  EXPECT_EQ(calls() - before, 2);
  EXPECT_FALSE(exists(server(), k + ":b"));
}

// A set taken the ordered way has its keys granted at different times; it
// renews them together from then on, so they expire together and a
// renewal round is one script call.
TEST_P(LockedTest, ASetTakenKeyByKeyIsRenewedTogether) {
  const std::string k = key();
  Runtime other(options_for(server()));
  auto held = other.acquire(k + ":b", 30s);
  LockHandle b = get_bounded(held);
  auto f = rt_->acquire({.key = lockwatch::all_of(k + ":a", k + ":b", k + ":c"), .ttl = 600ms, .wait = 10s});
  // The whole-set try takes a and c and gives them back (b is busy); the
  // ordered way then takes a again (a third lease) and waits for b.
  const auto taken_before = rt_->stats().acquired;
  auto ordered = [&] { return rt_->stats().acquired >= taken_before + 3 && exists(server(), k + ":a"); };
  for (int i = 0; i < 5000 && !ordered(); ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(ordered()) << rt_->stats().acquired - taken_before;  // the ordered way holds a, and waits for b
  std::this_thread::sleep_for(200ms);        // a's grant well before b's and c's
  auto back = b.release();
  get_bounded(back);
  LockHandle h = get_bounded(f);
  for (int i = 0; i < 5000 && h.lease().renewals() < 1; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_GE(h.lease().renewals(), 1u);  // every key renewed at least once since the grant
  std::vector<long long> pttl;
  for (const char* part : {":a", ":b", ":c"}) pttl.push_back(server().command({"PTTL", lock_key(k + part)}).integer);
  const auto [lo, hi] = std::minmax_element(pttl.begin(), pttl.end());
  EXPECT_GT(*lo, 0);
  EXPECT_LT(*hi - *lo, 100) << pttl[0] << " " << pttl[1] << " " << pttl[2];  // 200 ms apart if renewed apart
  auto released = h.release();
  get_bounded(released);
}

TEST_P(LockedTest, ReentrantCallRunsInlineWithoutTouchingRedis) {
  Options o = options_for(server(), 1);  // one pool thread: nesting must not need a second
  Runtime rt(o);
  std::string k = key();
  auto inner = locked([&] { return k; }, 2s, forever).on(rt)([] {
    return std::make_pair(std::this_thread::get_id(), this_lease().fencing_token());
  });
  auto other_key = locked([&] { return k + "-other"; }, 2s, forever).on(rt)([] {
    return std::make_pair(std::this_thread::get_id(), this_lease().fencing_token());
  });
  auto outer = locked([&] { return k; }, 2s, forever).on(rt)([&] {
    auto same = inner();
    EXPECT_EQ(same.wait_for(0s), std::future_status::ready);
    auto [tid, token] = get_bounded(same);
    EXPECT_EQ(tid, std::this_thread::get_id());
    EXPECT_EQ(token, this_lease().fencing_token());
    auto nested = other_key();
    EXPECT_EQ(nested.wait_for(0s), std::future_status::ready);
    auto [tid2, token2] = get_bounded(nested);
    EXPECT_EQ(tid2, std::this_thread::get_id());
    EXPECT_GT(token2, 0u);
    EXPECT_EQ(this_lease().key(), k);  // back to the outer lease
    return true;
  });
  auto fut = outer();
  EXPECT_TRUE(get_bounded(fut));
  EXPECT_FALSE(exists(server(), k + "-other"));
}

TEST_P(LockedTest, TheRenewalComesAtTheWeightedShareOfTheTtl) {
  // Weight 1/2 on a 1 s ttl: the first renewal is due 500 ms after the lock
  // was taken (a tick early at most), not at once and not at 9/10.
  auto f = locked("weighted", 1s, forever).renew_weight(0.5).on(*rt_)([] {
    const Lease& lease = this_lease();
    auto started = std::chrono::steady_clock::now();
    bool renewed = renewed_again(lease, 1);
    return std::make_pair(renewed, std::chrono::steady_clock::now() - started);
  });
  auto fut = f();
  auto [renewed, took] = get_bounded(fut);
  EXPECT_TRUE(renewed);
  EXPECT_GT(took, 300ms);
  EXPECT_LT(took, 700ms);
}

TEST_P(LockedTest, ThisLeaseOutsideALockedCallThrows) {
  EXPECT_THROW(this_lease(), NoActiveLease);
  EXPECT_EQ(current_lease(), nullptr);
}

TEST_P(LockedTest, RemainingShrinksAndIsRefreshedByRenewal) {
  auto f = locked("remaining", 300ms, forever).on(*rt_)([] {
    const Lease& lease = this_lease();
    auto first = lease.remaining();
    // Shrinks with time until the first renewal (at 245 ms) is confirmed.
    auto until = std::chrono::steady_clock::now() + kBound;
    while (lease.remaining() >= 100ms && lease.renewals() == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(2ms);  // polling the clock-driven value
    bool shrank = lease.renewals() == 0 && lease.remaining() < 100ms;
    bool renewed = renewed_again(lease, 1);
    return std::make_tuple(first, shrank, renewed, lease.remaining());
  });
  auto fut = f();
  auto [first, shrank, renewed, after] = get_bounded(fut);
  EXPECT_GT(first, 200ms);
  EXPECT_LE(first, 300ms);
  EXPECT_TRUE(shrank);
  EXPECT_TRUE(renewed);
  EXPECT_GT(after, 150ms);  // without the renewal it would be under 30 ms
}

TEST_P(LockedTest, RuntimeDestructionStopsCleanly) {
  std::string k = key();
  auto rt = std::make_unique<Runtime>(options_for(server()));
  Gate started;
  std::atomic<bool> stop_seen{false};
  auto hold = locked([&] { return k; }, 5s, forever).on(*rt)([&] {
    started.open();
    auto stop = this_lease().stop_token();
    auto until = std::chrono::steady_clock::now() + kBound;
    while (!stop.stop_requested() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(2ms);
    stop_seen = stop.stop_requested();
    return 5;
  });
  auto held = hold();
  ASSERT_TRUE(started.wait());
  auto waiter = locked([&] { return k; }, 5s, forever).on(*rt).wait(30s)([] { return 1; });
  auto waiting = waiter();
  EXPECT_EQ(waiting.wait_for(50ms), std::future_status::timeout);
  rt.reset();  // must return: running work is asked to stop
  EXPECT_TRUE(stop_seen);
  EXPECT_EQ(get_bounded(held), 5);
  EXPECT_TRUE(error_of<RuntimeStopped>(waiting));
  EXPECT_FALSE(exists(server(), k));
}


TEST_P(LockedTest, LockHandleHoldsUntilReleased) {
  std::string k = key();
  auto acquiring = rt_->acquire(k, 2s);
  LockHandle h = get_bounded(acquiring);
  ASSERT_TRUE(h);
  EXPECT_EQ(h.lease().key(), k);
  EXPECT_GT(h.lease().fencing_token(), 0u);
  EXPECT_TRUE(exists(server(), k));
  auto second = rt_->acquire(k, 2s);
  EXPECT_TRUE(error_of<LockNotAcquired>(second));
  auto released = h.release();
  get_bounded(released);
  EXPECT_FALSE(h);
  EXPECT_FALSE(exists(server(), k));
  EXPECT_THROW(h.release(), InvalidArgument);
}

TEST_P(LockedTest, LockHandleIsRenewedAndItsDestructorReleases) {
  std::string k = key();
  {
    auto acquiring = rt_->acquire(k, 300ms);
    LockHandle h = get_bounded(acquiring);
    EXPECT_TRUE(renewed_again(h.lease(), 2));
  }
  // The destructor released it (it does not wait for Redis): taken again
  // within 150 ms, before the 300 ms just renewed could run out.
  auto again = rt_->acquire({.key = k, .ttl = 300ms, .retries = forever, .wait = 150ms});
  EXPECT_NO_THROW(get_bounded(again));  // LockNotAcquired if it was still held
}

TEST_P(LockedTest, DestroyingTheRuntimeReleasesHandlesStillHeld) {
  std::string k = key();
  auto rt = std::make_unique<Runtime>(options_for(server()));
  auto acquiring = rt->acquire(k, 5s);
  LockHandle h = get_bounded(acquiring);
  rt.reset();
  EXPECT_TRUE(h.lease().stop_token().stop_requested());
  EXPECT_FALSE(exists(server(), k));
  auto released = h.release();  // the runtime is gone: already released
  EXPECT_EQ(released.wait_for(0s), std::future_status::ready);
}

// Runtime::lock() and LockHandle::unlock(): on the plaintext server the
// caller writes and reads its own requests (a connection of its own); over
// TLS they go the loop's way. Either way they do what acquire().get() and
// release().get() do.
TEST_P(LockedTest, LockAndUnlockHoldAndGiveBackAsAcquireAndReleaseDo) {
  const std::string k = key();
  const auto acquired_before = rt_->stats().acquired;
  LockHandle h = rt_->lock({.key = k, .ttl = 2s});
  ASSERT_TRUE(h);
  EXPECT_EQ(h.lease().key(), k);
  EXPECT_GT(h.lease().fencing_token(), 0u);
  EXPECT_GT(h.lease().remaining(), 1s);
  EXPECT_TRUE(exists(server(), k));
  EXPECT_EQ(rt_->held_leases(), 1u);
  EXPECT_EQ(rt_->stats().acquired, acquired_before + 1);
  auto busy = thrown<LockNotAcquired>([&] { (void)rt_->lock({.key = k, .ttl = 2s}); });
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->code(), errc::busy);
  const std::uint64_t first = h.lease().fencing_token();
  h.unlock();
  EXPECT_FALSE(h);
  EXPECT_FALSE(exists(server(), k));
  EXPECT_THROW(h.unlock(), InvalidArgument);
  LockHandle again = rt_->lock({.key = k, .ttl = 2s});
  EXPECT_GT(again.lease().fencing_token(), first);
  again.unlock();
  // The loop counts the releases when it next looks.
  const auto until = std::chrono::steady_clock::now() + kBound;
  while (rt_->held_leases() != 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(rt_->held_leases(), 0u);
  EXPECT_THROW((void)rt_->lock({.key = "", .ttl = 2s}), InvalidArgument);
}

TEST_P(LockedTest, ALockedHandleHeldPastItsTtlIsRenewedThenUnlocked) {
  const std::string k = key();
  LockHandle h = rt_->lock({.key = k, .ttl = 300ms});
  EXPECT_TRUE(renewed_again(h.lease(), 2));  // the watchdog took it in
  EXPECT_FALSE(h.lease().lost());
  h.unlock();
  EXPECT_FALSE(exists(server(), k));
}

TEST_P(LockedTest, ALockedHandleDroppedUnreleasedIsGivenBack) {
  const std::string k = key();
  { LockHandle h = rt_->lock({.key = k, .ttl = 300ms}); }
  // Taken again within 150 ms, before its 300 ms could run out.
  auto again = rt_->acquire({.key = k, .ttl = 300ms, .retries = forever, .wait = 150ms});
  EXPECT_NO_THROW(get_bounded(again));
}

TEST_P(LockedTest, DestroyingTheRuntimeReleasesLockedHandles) {
  const std::string k = key();
  auto rt = std::make_unique<Runtime>(options_for(server()));
  LockHandle h = rt->lock({.key = k, .ttl = 5s});
  rt.reset();
  EXPECT_TRUE(h.lease().stop_token().stop_requested());
  EXPECT_FALSE(exists(server(), k));
  try {
    h.unlock();  // released already
  } catch (const LeaseLost&) {
  }
  EXPECT_FALSE(h);
}

// The server closes every client's connection: lock() goes on (the
// caller's own connection is found closed before a request is written on
// it, and made again), within the reconnect.
TEST_P(LockedTest, LockGoesOnAfterTheServerClosedEveryConnection) {
  const std::string k = key();
  rt_->lock({.key = k, .ttl = 2s}).unlock();
  ASSERT_NE(server().command({"CLIENT", "KILL", "TYPE", "normal"}).type, Reply::Type::kError);
  const auto until = std::chrono::steady_clock::now() + kBound;
  int taken = 0;
  while (taken < 20 && std::chrono::steady_clock::now() < until) {
    try {
      rt_->lock({.key = k, .ttl = 2s}).unlock();
      ++taken;
    } catch (const ConnectionError&) {  // a call caught by the kill itself
    }
  }
  EXPECT_EQ(taken, 20);
  EXPECT_FALSE(exists(server(), k));
}

// Threads locking one key with lock() (no wait: busy is thrown) are never
// inside together, and leave nothing held.
TEST_P(LockedTest, ThreadsLockingOneKeyAreNeverInsideTogether) {
  const std::string k = key();
  std::atomic<int> inside{0}, most{0}, taken{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        try {
          LockHandle h = rt_->lock({.key = k, .ttl = 2s});
          const int now = ++inside;
          most = std::max(most.load(), now);
          ++taken;
          --inside;
          h.unlock();
        } catch (const LockNotAcquired&) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(most.load(), 1);
  EXPECT_GT(taken.load(), 0);
  EXPECT_FALSE(exists(server(), k));
}

TEST_P(LockedTest, OneBrokenKeyDoesNotCostTheOtherLeasesInItsBatch) {
  auto a = rt_->acquire(key("a"), 300ms);
  auto b = rt_->acquire(key("b"), 300ms);
  LockHandle ha = get_bounded(a), hb = get_bounded(b);
  // Someone replaces a's lock with a hash: its renewals fail, b's go on.
  server().command({"DEL", lock_key(key("a"))});
  server().command({"HSET", lock_key(key("a")), "f", "v"});
  auto stop = ha.lease().stop_token();
  auto until = std::chrono::steady_clock::now() + kBound;
  while (!stop.stop_requested() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(ha.lease().lost());
  EXPECT_EQ(ha.lease().lost_reason(), LostReason::kStoreUnreachable);
  EXPECT_TRUE(renewed_again(hb.lease(), 2));
  auto ra = ha.release();
  EXPECT_TRUE(error_of<LeaseLost>(ra));
  server().command({"DEL", lock_key(key("a"))});
}

TEST_P(LockedTest, AnIdleWatchdogSleepsUntilTheNextRenewal) {
  std::vector<std::future<LockHandle>> acquiring;
  for (int i = 0; i < 100; ++i) acquiring.push_back(rt_->acquire(key(std::to_string(i)), 30s));
  std::vector<LockHandle> held;
  for (auto& f : acquiring) held.push_back(get_bounded(f));
  auto before = rt_->stats().timer_wakeups;
  std::this_thread::sleep_for(500ms);  // an observation window: nothing is due for 27 s
  auto wakeups = rt_->stats().timer_wakeups - before;
  // Ticking would be 100 wake-ups (5 ms tick); sleeping until the next
  // occupied tick is a handful.
  EXPECT_LE(wakeups, 10u);
}

INSTANTIATE_TEST_SUITE_P(Transports, LockedTest, ::testing::Values(Transport::kPlain, Transport::kTls), transport_name);

}  // namespace
}  // namespace lockwatch::testing
