// What every lock store must do, run against each real server: one Redis
// node (redis-server), a Redis Cluster (six redis-servers), a SQL table
// (mariadbd), a PostgreSQL table (postgres), a ZooKeeper ensemble (three
// members) and an etcd cluster (three etcd members, authentication on),
// and against the in-process
// store (memory://). Exclusion, a holder that dies, fencing, waiting, renewal, and
// bad input; the kinds of lock (read-write locks, leased semaphores), where
// a store that cannot hold a kind must refuse it with Unsupported. Each
// store's servers are started once for the suite, and again for each test
// that crashes, stops or hangs them. Store-specific behaviour stays in the
// stores' own suites.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "lockwatch/lockwatch.hpp"
#include "backends.hpp"
#include "store_on_loop.hpp"
#include "test_util.hpp"
#include "transfers.hpp"

namespace lockwatch::testing {
namespace {

// Takes `key` outside LOCKED (bounded).
LockHandle take(Runtime& rt, const std::string& key, std::chrono::milliseconds ttl, Retries retries = forever) {
  auto f = rt.acquire({.key = key, .ttl = ttl, .retries = retries});
  return get_bounded(f);
}

class StoreContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  // One server (or cluster) per store for the suite, each test on keys of
  // its own; a test that crashes, stops or hangs its server gets its own.
  static void TearDownTestSuite() { shared().clear(); }
  static std::map<std::string, std::unique_ptr<Backend>>& shared() {
    static std::map<std::string, std::unique_ptr<Backend>> backends;
    return backends;
  }
  static bool harms_its_server() {
    static const std::set<std::string> harmful{"AServerGoneMidLeaseLosesTheLeaseByItsDeadline",
                                               "AHungServerCannotHangACall",
                                               "AnAcquireThatTimedOutLeavesNoGhostLock"};
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    return harmful.count(name.substr(0, name.find('/'))) != 0;
  }

  void TearDown() override {
    if (HasFailure() && backend_ != nullptr) backend_->report_failure();
  }

  void SetUp() override {
    if (harms_its_server()) {
      own_ = make_backend(GetParam());
      backend_ = own_.get();
      return;
    }
    auto& slot = shared()[GetParam()];
    if (!slot)
      slot = make_backend(GetParam());
    else
      slot->settle();
    backend_ = slot.get();
  }

  Options options(std::size_t threads = 4) const {
    Options o;
    o.redis_url = backend_->url();
    o.runtime.threads = threads;
    return o;
  }

  // Takes and gives back a lock on `rt` until one is had (bounded, each
  // try on a key of its own): the runtime is connected, and a store just
  // started (a test's own) is past its first requests, which it may answer
  // slower than a short command timeout (a ZooKeeper ensemble did, 300 ms).
  static bool warm_up(Runtime& rt) {
    for (int i = 0; i < 10; ++i) {
      auto f = rt.acquire("warm-up-" + std::to_string(i), 1s);
      if (f.wait_for(kBound) != std::future_status::ready) return false;
      try {
        LockHandle h = f.get();
        give_back(h);
        return true;
      } catch (const ConnectionError&) {
        // too slow: again
      }
    }
    return false;
  }

  // Calls `call` until it returns `expected` (true) or the bound passes;
  // a ConnectionError (no answer within a short command timeout) is tried
  // again, anything else fails the test.
  template <class Call>
  static bool answers(Call& call, int expected) {
    auto until = std::chrono::steady_clock::now() + kBound;
    while (std::chrono::steady_clock::now() < until) {
      auto f = call();
      if (f.wait_for(kBound) != std::future_status::ready) return false;
      try {
        return f.get() == expected;
      } catch (const ConnectionError&) {
        // too slow: again
      }
    }
    return false;
  }

  std::unique_ptr<Backend> own_;
  Backend* backend_ = nullptr;
};

TEST_P(StoreContractTest, OneHolderAtATimeAcrossThreadsAndRuntimes) {
  constexpr int kRuntimes = 3, kThreads = 3, kCalls = 10;
  std::vector<std::unique_ptr<Runtime>> runtimes;
  for (int i = 0; i < kRuntimes; ++i) runtimes.push_back(std::make_unique<Runtime>(options(2)));
  std::atomic<int> inside{0}, overlaps{0}, done{0}, token_regressions{0};
  std::atomic<std::uint64_t> last_token{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRuntimes; ++r) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, r] {
        auto inc = locked("contended", 2s, forever).on(*runtimes[r]).wait(30s)([&] {
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

TEST_P(StoreContractTest, ABusyLockFailsAtOnceAndOnlyTheOwnerReleases) {
  Runtime a(options()), b(options());
  auto held = take(a, "owned", 5s);
  auto other = locked("owned", 5s, 0).on(b)([] { return 1; });
  auto fut = other();
  auto err = error_of<LockNotAcquired>(fut);
  ASSERT_TRUE(err);
  EXPECT_LT(err->waited(), 1s);
  give_back(held);
  auto again = other();
  EXPECT_EQ(get_bounded(again), 1);
}

TEST_P(StoreContractTest, FencingTokensRiseAcrossRuntimesReleasesAndExpiry) {
  Runtime a(options()), b(options());
  // Ttls of seconds: on ZooKeeper a lock's ttl is its session's timeout,
  // and a session of one second counts its connection lost after 667 ms
  // without an answer, which a loaded machine can take.
  auto token_on = [](Runtime& rt) {
    auto f = locked("fenced", 3s, 0).on(rt)([] { return this_lease().fencing_token(); });
    auto fut = f();
    return get_bounded(fut);
  };
  std::uint64_t t1 = token_on(a);
  std::uint64_t t2 = token_on(b);
  std::uint64_t t3 = token_on(a);
  EXPECT_GE(t1, 1u);
  EXPECT_GT(t2, t1);
  EXPECT_GT(t3, t2);
  // A lease left to expire (no renewals): the next holder's token is
  // higher still.
  auto handle = take(b, "fenced", 1s, 0);
  std::uint64_t t4 = handle.lease().fencing_token();
  EXPECT_GT(t4, t3);
  auto late = locked("fenced", 3s, 0).on(a).wait(5s)([] { return this_lease().fencing_token(); });
  auto fut = late();
  EXPECT_GT(get_bounded(fut), t4);
}

TEST_P(StoreContractTest, AHolderKilledBlocksOthersOnlyUntilItsTtlEnds) {
  if (!backend_->has_server()) GTEST_SKIP() << "a memory space is per process: a child process cannot hold its lock";
  const char* holder = std::getenv("LOCKWATCH_LOCK_HOLDER");
  ASSERT_NE(holder, nullptr);
  ChildProcess child({holder, backend_->url(), "killed-holder", "1000"});
  auto line = child.read_line(kBound);
  ASSERT_TRUE(line.has_value());
  ASSERT_EQ(line->rfind("held ", 0), 0u) << *line;
  child.kill(SIGKILL);
  auto killed_at = std::chrono::steady_clock::now();
  Runtime rt(options());
  auto f = locked("killed-holder", 1s, 0).on(rt).wait(10s)([] { return this_lease().fencing_token(); });
  auto fut = f();
  auto token = get_bounded(fut);
  auto blocked = std::chrono::steady_clock::now() - killed_at;
  EXPECT_GT(token, std::stoull(line->substr(5)));
  EXPECT_LT(blocked, 1600ms);  // at most the holder's ttl (1 s), plus slack
}

TEST_P(StoreContractTest, AWaiterGetsTheLockSoonAfterTheRelease) {
  Runtime a(options()), b(options());
  Gate gate, started;
  auto hold = locked("waited", 10s, forever).on(a)([&] {
    started.open();
    gate.wait();
  });
  auto held = hold();
  ASSERT_TRUE(started.wait());
  auto waiter = locked("waited", 10s, forever).on(b).wait(15s)([] { return this_lease().fencing_token(); });
  auto waited = waiter();
  EXPECT_EQ(waited.wait_for(300ms), std::future_status::timeout);  // really waiting
  auto released_at = std::chrono::steady_clock::now();
  gate.open();
  get_bounded(held);
  EXPECT_GT(get_bounded(waited), 0u);
  // The holder's ttl was 10 s: the waiter came in well before it.
  EXPECT_LT(std::chrono::steady_clock::now() - released_at, 2s);
}

TEST_P(StoreContractTest, AWaitRunsOutWithLockNotAcquired) {
  Runtime rt(options()), holder(options());
  auto held = take(holder, "wait-out", 5s);  // another process's (a handle of this thread would be reentrant)
  auto waiter = locked("wait-out", 5s, 0).on(rt).wait(300ms)([] { return 1; });
  auto t0 = std::chrono::steady_clock::now();
  auto fut = waiter();
  auto err = error_of<LockNotAcquired>(fut);
  ASSERT_TRUE(err);
  EXPECT_GE(err->waited(), 300ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST_P(StoreContractTest, WorkLastingFiveTtlsKeepsItsLease) {
  // The store's shortest ttl that a loaded machine renews without a miss
  // (400 ms; ZooKeeper's and etcd's are longer), each renewal sent 150 ms
  // before the local deadline: the default 50 ms left a renewal answered
  // late on a loaded machine (MariaDB, Redis) past it now and then.
  Options o = options();
  o.watchdog.min_renewal_window = 150ms;
  Runtime rt(o), other(options());
  // Connected first: a lease's ttl counts from its request, and a loaded
  // machine under the sanitizers took 0.5-0.8 s to set up a SQL server's
  // connections, longer than the ttl.
  ASSERT_TRUE(warm_up(rt));
  ASSERT_TRUE(warm_up(other));
  const auto ttl = backend_->steady_ttl();
  auto f = locked("long-work", ttl, forever).on(rt)([&] {
    // Five ttls at least, and until ten probes and four renewals were seen
    // (a loaded machine probes slower), within 15 s (get_bounded's 20 s).
    const auto start = std::chrono::steady_clock::now();
    const auto most = std::min<std::chrono::milliseconds>(25 * ttl, 15s);
    int probes = 0, refused = 0;
    auto more = [&] {
      auto elapsed = std::chrono::steady_clock::now() - start;
      if (elapsed >= most) return false;
      return elapsed < 5 * ttl || probes < 10 || this_lease().renewals() < 4;
    };
    while (more()) {
      auto probe = locked("long-work", ttl, 0).on(other)([] { return 1; });
      auto p = probe();
      ++probes;
      try {
        get_bounded(p);
      } catch (const LockNotAcquired&) {
        ++refused;
      }
      std::this_thread::sleep_for(100ms);  // probing at a pace, not waiting for an event
    }
    return std::tuple(probes, refused, this_lease().renewals());
  });
  auto fut = f();
  auto [probes, refused, renewals] = get_bounded(fut);
  EXPECT_GE(probes, 10);
  EXPECT_EQ(refused, probes);  // every probe was refused...
  EXPECT_GE(renewals, 4u);     // ...because the lease was renewed
}

TEST_P(StoreContractTest, RenewalsDueInOneTickShareACommand) {
  constexpr int kLeases = 200;
  // What is asserted is how renewals are grouped, not how fast a store
  // answers them: leases of 1 s at least, connected first, renewed at half
  // their ttl, so each renewal has half the ttl to be answered. (With 400 ms
  // leases renewed 150 ms before the local deadline, MariaDB under the
  // sanitizers on a loaded machine answered a tick's renewals past it.)
  const auto ttl = std::max<std::chrono::milliseconds>(1s, backend_->steady_ttl());
  Options o = options();
  o.watchdog.min_renewal_window = ttl / 2;
  Runtime rt(o);
  ASSERT_TRUE(warm_up(rt));
  auto held = hold_all(rt, backend_->batchable_keys(kLeases), ttl);
  auto before = rt.stats();
  auto after = after_renewals(rt, before, 2 * kLeases);
  auto renewals = after.renewals_sent - before.renewals_sent;
  auto commands = after.renew_commands - before.renew_commands;
  EXPECT_GE(renewals, 2u * kLeases);
  EXPECT_LE(commands * 10, renewals) << renewals << " renewals in " << commands << " commands";
  EXPECT_EQ(after.leases_lost, before.leases_lost);
  for (auto& h : held) EXPECT_FALSE(h.lease().lost());
}

TEST_P(StoreContractTest, TheLongestKeyWorksAndOneByteMoreIsInvalid) {
  Options o = options();
  Runtime rt(o);
  std::string longest(backend_->longest_key(o), 'k');
  auto ok = take(rt, longest, 1s, 0);
  EXPECT_GE(ok.lease().fencing_token(), 1u);
  give_back(ok);
  EXPECT_THROW(rt.acquire({.key = longest + "k", .ttl = 1s, .retries = 0}), InvalidArgument);
  EXPECT_THROW(rt.acquire({.key = "", .ttl = 1s, .retries = 0}), InvalidArgument);
}

TEST_P(StoreContractTest, KeysOfAnyBytesAreDistinctLocks) {
  Runtime rt(options());
  std::string binary("a\0b\xff'\"; DROP", 13);
  auto a = take(rt, binary, 2s, 0);
  auto b = take(rt, "A", 2s, 0);
  auto c = take(rt, "a", 2s, 0);  // case matters
  EXPECT_GE(a.lease().fencing_token(), 1u);
  EXPECT_GE(b.lease().fencing_token(), 1u);
  EXPECT_GE(c.lease().fencing_token(), 1u);
}

TEST_P(StoreContractTest, AWrongPasswordIsAnAuthError) {
  if (!backend_->has_server()) GTEST_SKIP() << "a memory space has no credentials to refuse";
  Options o = options();
  o.redis_url = backend_->url_with_wrong_password();
  o.connection.connect_timeout = 1s;
  Runtime rt(o);
  auto f = locked("k", 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  EXPECT_TRUE(error_of<AuthError>(fut));
}

TEST_P(StoreContractTest, AServerDownFailsWithinTheConnectTimeout) {
  if (!backend_->has_server()) GTEST_SKIP() << "a memory space has no address where nothing listens";
  Options o = options();
  o.redis_url = backend_->unreachable_url();
  o.connection.connect_timeout = 500ms;
  Runtime rt(o);
  auto f = locked("k", 1s, 0).on(rt)([] { return 1; });
  auto t0 = std::chrono::steady_clock::now();
  auto fut = f();
  auto err = error_of<ConnectionError>(fut);
  ASSERT_TRUE(err);
  EXPECT_NE(err->endpoint().find("127.0.0.1:"), std::string::npos) << err->endpoint();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST_P(StoreContractTest, AServerGoneMidLeaseLosesTheLeaseByItsDeadline) {
  Options o = options();
  // The first connection is made under this bound (a PostgreSQL login on a
  // loaded machine took over 300 ms); once the server is gone, a connect
  // is refused at once on loopback.
  o.connection.connect_timeout = 2s;
  o.connection.command_timeout = 300ms;
  Runtime rt(o);
  ASSERT_TRUE(warm_up(rt));
  Gate started;
  std::atomic<std::chrono::steady_clock::rep> stopped_at{0};
  auto f = locked("gone", 1s, forever).on(rt)([&] {
    started.open();
    bool stopped = stopped_within_bound(this_lease().stop_token());
    stopped_at = std::chrono::steady_clock::now().time_since_epoch().count();
    return stopped;
  });
  auto fut = f();
  ASSERT_TRUE(started.wait_or_ended(fut));
  auto killed_at = std::chrono::steady_clock::now();
  backend_->kill("gone");
  auto err = error_of<LeaseLost>(fut);
  ASSERT_TRUE(err);
  // Lost by the lease's own deadline (the ttl), not kept on hope: the work
  // was stopped by then, and the call ended once its release was settled.
  auto stopped = std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(stopped_at.load()));
  EXPECT_LT(stopped - killed_at, 2s);
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 2s + backend_->unconfirmed_release_wait(1s));
  backend_->start();
}

TEST_P(StoreContractTest, AHungServerCannotHangACall) {
  Options o = options();
  o.connection.command_timeout = 500ms;
  Runtime rt(o);
  ASSERT_TRUE(warm_up(rt));
  auto warm = locked("hung", 1s, 0).on(rt)([] { return 1; });
  ASSERT_TRUE(answers(warm, 1));
  backend_->pause("hung");
  auto t0 = std::chrono::steady_clock::now();
  auto fut = warm();
  auto err = error_of<ConnectionError>(fut);
  backend_->resume();
  ASSERT_TRUE(err);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  // And it recovers once the server answers again (a server just let go
  // may still answer its first requests later than the short timeout).
  auto after = locked("hung-after", 1s, 0).on(rt).wait(10s)([] { return 2; });
  EXPECT_TRUE(answers(after, 2));
}

// The command timeout is the server's delay, not the client's: a loop
// kept busy past it (heavy work on it, a starved process) takes in the
// answer that came meanwhile before it blames the server, and keeps the
// connection.
TEST_P(StoreContractTest, ALoopBusyPastTheCommandTimeoutTakesInTheAnswerThatCame) {
  Options o = options();
  o.connection.connect_timeout = 2s;
  o.connection.command_timeout = 300ms;
  StoreOnLoop store(o);
  const std::string first = store.encode("busy-loop"), second = store.encode("busy-loop-2");
  const detail::Acquired warm = store.acquire(first, "warm-up", 5s);
  ASSERT_EQ(warm.status, detail::Acquired::Status::kTaken) << warm.error.describe();
  auto answer = store.acquire_async(second, "after", 5s);
  store.stall(900ms);
  const detail::Acquired got = get_bounded(answer);
  EXPECT_EQ(got.status, detail::Acquired::Status::kTaken) << got.error.describe();
  EXPECT_EQ(store.downs(), 0) << "the connection was dropped";
  EXPECT_TRUE(detail::was_ours(store.release(first, "warm-up")));
  EXPECT_TRUE(detail::was_ours(store.release(second, "after")));
}

// An acquire whose answer never came (the server hung past the command
// timeout) may still be run by the server once it goes on: the runtime
// gives that token back as soon as the server answers again, so no lock
// is left that nobody owns for its ttl (30 s here).
TEST_P(StoreContractTest, AnAcquireThatTimedOutLeavesNoGhostLock) {
  Options o = options();
  o.connection.command_timeout = 300ms;
  Runtime rt(o);
  ASSERT_TRUE(warm_up(rt));  // connected before the pause
  backend_->pause("ghost");
  auto f = rt.acquire("ghost", 30s);
  auto err = error_of<ConnectionError>(f);
  backend_->resume();
  ASSERT_TRUE(err);
  // Free again within the bound, long before the ttl.
  bool held = true;
  auto until = std::chrono::steady_clock::now() + kBound;
  while (held && std::chrono::steady_clock::now() < until) {
    auto state = rt.inspect("ghost");
    try {
      held = get_bounded(state).held;
    } catch (const ConnectionError&) {
      // reconnecting
    }
    if (held) std::this_thread::sleep_for(20ms);  // polling the store's state
  }
  EXPECT_FALSE(held);
  Runtime other(options());
  auto next = other.acquire("ghost", 1s);
  auto h = get_bounded(next);
  give_back(h);
}

// Safe to retry after a lost reply: acquiring again with the same owner
// token is the same acquisition (the same fencing token, the ttl set anew),
// and a release of a lock already gone says so (kGone), which a retry
// counts as released. Another token still finds the lock busy, and the
// next holder's fencing token is higher.
TEST_P(StoreContractTest, AcquireAndReleaseAreSafeToRepeatWithTheSameToken) {
  StoreOnLoop store(options());
  const std::string name = store.encode("repeated");
  // A store whose ttl is fixed when the lock is taken repeats with the same.
  auto first = store.acquire(name, "token-one", backend_->repeat_lengthens_ttl() ? 2s : 10s);
  ASSERT_EQ(first.status, detail::Acquired::Status::kTaken);
  auto again = store.acquire(name, "token-one", 10s);
  ASSERT_EQ(again.status, detail::Acquired::Status::kTaken);
  EXPECT_EQ(again.fence, first.fence);
  auto other = store.acquire(name, "token-two", 2s);
  ASSERT_EQ(other.status, detail::Acquired::Status::kBusy);
  EXPECT_GT(other.busy_for, 5s);  // the repeat gave it its own, longer ttl
  EXPECT_TRUE(detail::was_ours(store.release(name, "token-one")));
  EXPECT_EQ(store.release(name, "token-one"), detail::Released::kGone);
  auto next = store.acquire(name, "token-two", 2s);
  ASSERT_EQ(next.status, detail::Acquired::Status::kTaken);
  EXPECT_GT(next.fence, first.fence);
  EXPECT_TRUE(detail::was_ours(store.release(name, "token-two")));
}

// The stores that reserve tokens for in-process hand-offs (TokenBlocks):
// only for the lock's holder, each block above every token before it and
// below every one after.
TEST_P(StoreContractTest, TokensAreReservedForTheHolderOnlyAndStayInOrder) {
  StoreOnLoop store(options());
  const std::string name = store.encode("reserved");
  auto first = store.acquire(name, "holder", 10s);
  ASSERT_EQ(first.status, detail::Acquired::Status::kTaken) << first.error.describe();
  auto last = store.reserve_tokens(name, "holder", 8);
  const bool reserves = GetParam() == "redis" || GetParam() == "redis-cluster" || GetParam() == "memory";
  ASSERT_EQ(last.has_value(), reserves) << GetParam();
  if (!last) GTEST_SKIP() << GetParam() << " reserves no tokens: no in-process hand-offs";
  EXPECT_GE(*last, first.fence + 8);
  auto more = store.reserve_tokens(name, "holder", 3);
  EXPECT_GE(more.value_or(0), *last + 3);
  EXPECT_EQ(store.reserve_tokens(name, "somebody-else", 8), std::optional<std::uint64_t>(0));
  EXPECT_TRUE(detail::was_ours(store.release(name, "holder")));
  EXPECT_EQ(store.reserve_tokens(name, "holder", 8), std::optional<std::uint64_t>(0));
  auto next = store.acquire(name, "next", 10s);
  ASSERT_EQ(next.status, detail::Acquired::Status::kTaken);
  EXPECT_GT(next.fence, more.value_or(0));
  EXPECT_TRUE(detail::was_ours(store.release(name, "next")));
}

// ------------------------------------------------------------ kinds of lock

// The stores that keep shared and permit locks; the others must refuse
// them with Unsupported (at the call, before anything starts).
bool keeps_kinds(const std::string& store) { return store != "etcd"; }

// True (the test then skips) for a store that refuses shared and permit
// locks, after checking that it does so with Unsupported, naming the kind.
bool refuses_kinds(Runtime& rt, const std::string& store) {
  if (keeps_kinds(store)) return false;
  for (LockKind kind : {LockKind::shared(), LockKind::permits(2)}) {
    try {
      (void)rt.acquire({.key = "kinds", .ttl = 1s, .kind = kind});
      ADD_FAILURE() << store << " took a " << kind.describe() << " lock";
    } catch (const Unsupported& e) {
      EXPECT_NE(std::string(e.what()).find(kind.describe()), std::string::npos) << e.what();
    }
  }
  return true;
}

TEST_P(StoreContractTest, ReadersOverlapAndNeverHoldWithAWriter) {
  Runtime a(options()), b(options());
  if (refuses_kinds(a, GetParam())) GTEST_SKIP() << GetParam() << " holds exclusive locks only (Unsupported)";
  // Two readers, one per runtime, inside together.
  Rendezvous together(2);
  auto meet = [&](Runtime& rt) {
    return locked("rw", 5s, forever).on(rt).shared().wait(kBound)([&] { return together.arrive(); });
  };
  auto meet_a = meet(a);
  auto meet_b = meet(b);
  auto ra = meet_a(), rb = meet_b();
  EXPECT_TRUE(get_bounded(ra) && get_bounded(rb)) << "the readers were never inside together";
  // Readers and writers of both runtimes at once: a writer alone.
  std::atomic<int> readers{0}, writers{0}, violations{0}, done{0};
  auto read = [&](Runtime& rt) {
    return locked("rw", 5s, forever).on(rt).shared().wait(30s)([&] {
      readers.fetch_add(1);
      if (writers.load() != 0) violations++;
      std::this_thread::sleep_for(2ms);  // the section's work
      if (writers.load() != 0) violations++;
      readers.fetch_sub(1);
      done++;
    });
  };
  auto write = [&](Runtime& rt) {
    return locked("rw", 5s, forever).on(rt).wait(30s)([&] {
      if (writers.fetch_add(1) != 0 || readers.load() != 0) violations++;
      std::this_thread::sleep_for(2ms);
      if (readers.load() != 0) violations++;
      writers.fetch_sub(1);
      done++;
    });
  };
  constexpr int kRounds = 6;
  auto read_a = read(a), read_b = read(b);
  auto write_a = write(a), write_b = write(b);
  std::vector<std::future<void>> calls;
  for (int i = 0; i < kRounds; ++i) {
    calls.push_back(read_a());
    calls.push_back(read_b());
    calls.push_back(write_a());
    calls.push_back(read_b());
    calls.push_back(read_a());
    calls.push_back(write_b());
  }
  for (auto& f : calls) get_bounded(f);
  EXPECT_EQ(done.load(), kRounds * 6);
  EXPECT_EQ(violations.load(), 0);
}

TEST_P(StoreContractTest, AWriterIsNotStarvedByAStreamOfReaders) {
  Runtime readers_rt(options()), writer_rt(options());
  if (refuses_kinds(readers_rt, GetParam())) GTEST_SKIP() << GetParam() << " holds exclusive locks only (Unsupported)";
  // Readers that overlap one another without a gap: each one's section
  // lasts until the next reader is inside (200 ms at most). Without a
  // writer's preference the key would never be free.
  std::atomic<bool> stop{false};
  std::atomic<int> inside{0}, reads{0};
  auto reader = [&] {
    auto read = locked("stream", 5s, forever).on(readers_rt).shared().wait(kBound)([&] {
      inside.fetch_add(1);
      const int me = ++reads;
      auto until = std::chrono::steady_clock::now() + 200ms;
      while (reads.load() == me && std::chrono::steady_clock::now() < until && !stop.load())
        std::this_thread::sleep_for(1ms);  // the section's work, until the next reader is in
      inside.fetch_sub(1);
    });
    while (!stop.load()) {
      auto f = read();
      if (!completes(f)) return;
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) threads.emplace_back(reader);
  // Wait (bounded) until the stream flows.
  auto until = std::chrono::steady_clock::now() + kBound;
  while (reads.load() < 6 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  ASSERT_GE(reads.load(), 6);
  auto t0 = std::chrono::steady_clock::now();
  auto write = locked("stream", 5s, forever).on(writer_rt).wait(kBound)([&] { return inside.load(); });
  auto w = write();
  const int readers_beside = get_bounded(w);
  auto waited = std::chrono::steady_clock::now() - t0;
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(readers_beside, 0);
  // The writer waits for the readers inside (200 ms at most), not for the
  // stream to end.
  EXPECT_LT(waited, 3s);
}

TEST_P(StoreContractTest, AWriterThatStopsWaitingHoldsReadersBackBriefly) {
  Runtime readers(options()), writer_rt(options());
  if (refuses_kinds(readers, GetParam())) GTEST_SKIP() << GetParam() << " holds exclusive locks only (Unsupported)";
  auto first = readers.acquire({.key = "gave-up", .ttl = 30s, .kind = LockKind::shared()});
  LockHandle reader = get_bounded(first);
  // A writer with a long ttl waits a little for the reader, and gives up.
  auto writer = writer_rt.acquire({.key = "gave-up", .ttl = 30s, .retries = forever, .wait = 200ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(writer));
  // Its mark outlives it by 2 s at most, not by its ttl.
  auto t0 = std::chrono::steady_clock::now();
  auto next = readers.acquire({.key = "gave-up", .ttl = 30s, .retries = forever, .wait = 10s, .kind = LockKind::shared()});
  LockHandle r = get_bounded(next);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2500ms);
  give_back(r);
  give_back(reader);
}

TEST_P(StoreContractTest, AKilledReaderFreesItsShareAfterItsTtl) {
  Runtime rt(options());
  if (refuses_kinds(rt, GetParam())) GTEST_SKIP() << GetParam() << " holds exclusive locks only (Unsupported)";
  if (!backend_->has_server()) GTEST_SKIP() << "a memory space is per process: a child process cannot hold its lock";
  const char* holder = std::getenv("LOCKWATCH_LOCK_HOLDER");
  ASSERT_NE(holder, nullptr);
  ChildProcess child({holder, backend_->url(), "killed-reader", "1000", "shared"});
  auto line = child.read_line(kBound);
  ASSERT_TRUE(line.has_value());
  ASSERT_EQ(line->rfind("held ", 0), 0u) << *line;
  child.kill(SIGKILL);
  auto killed_at = std::chrono::steady_clock::now();
  auto f = locked("killed-reader", 1s, 0).on(rt).wait(10s)([] { return this_lease().fencing_token(); });
  auto fut = f();
  auto token = get_bounded(fut);
  EXPECT_GT(token, std::stoull(line->substr(5)));  // a writer's grant raises the token readers saw
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 1600ms);  // the reader's ttl (1 s), plus slack
}

TEST_P(StoreContractTest, PermitsNeverAdmitMoreThanN) {
  constexpr int kRuntimes = 3, kThreads = 2, kCalls = 5;
  constexpr std::uint32_t kPermits = 2;
  std::vector<std::unique_ptr<Runtime>> runtimes;
  for (int i = 0; i < kRuntimes; ++i) runtimes.push_back(std::make_unique<Runtime>(options(2)));
  if (refuses_kinds(*runtimes[0], GetParam())) GTEST_SKIP() << GetParam() << " holds exclusive locks only (Unsupported)";
  std::atomic<int> inside{0}, most{0}, done{0};
  std::atomic<std::uint64_t> tokens_seen{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRuntimes; ++r) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, r] {
        auto use = locked("pool", 2s, forever).on(*runtimes[r]).permits(kPermits).wait(30s)([&] {
          int now = inside.fetch_add(1) + 1;
          int seen = most.load();
          while (now > seen && !most.compare_exchange_weak(seen, now)) {
          }
          std::this_thread::sleep_for(3ms);  // the section's work
          inside.fetch_sub(1);
          done++;
        });
        for (int i = 0; i < kCalls; ++i) {
          auto f = use();
          if (!completes(f)) return;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(done.load(), kRuntimes * kThreads * kCalls);
  EXPECT_LE(most.load(), static_cast<int>(kPermits));
  EXPECT_GE(most.load(), 1);
}

TEST_P(StoreContractTest, AKilledHoldersPermitComesBackAfterItsTtl) {
  Runtime rt(options());
  if (refuses_kinds(rt, GetParam())) GTEST_SKIP() << GetParam() << " holds exclusive locks only (Unsupported)";
  if (!backend_->has_server()) GTEST_SKIP() << "a memory space is per process: a child process cannot hold its lock";
  const char* holder = std::getenv("LOCKWATCH_LOCK_HOLDER");
  ASSERT_NE(holder, nullptr);
  ChildProcess child({holder, backend_->url(), "killed-permit", "1000", "permits:2"});
  auto line = child.read_line(kBound);
  ASSERT_TRUE(line.has_value());
  ASSERT_EQ(line->rfind("held ", 0), 0u) << *line;
  child.kill(SIGKILL);
  auto killed_at = std::chrono::steady_clock::now();
  // One permit is free at once; the dead holder's comes back after its ttl.
  auto first = rt.acquire({.key = "killed-permit", .ttl = 1s, .retries = forever, .wait = 0ms, .kind = LockKind::permits(2)});
  LockHandle one = get_bounded(first);
  auto second = rt.acquire({.key = "killed-permit", .ttl = 1s, .retries = forever, .wait = 10s, .kind = LockKind::permits(2)});
  LockHandle two = get_bounded(second);
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 1600ms);
  EXPECT_GT(two.lease().fencing_token(), one.lease().fencing_token());
  give_back(two);
  give_back(one);
}

TEST_P(StoreContractTest, CallersThatDisagreeOnNOrKindGetInvalidArgument) {
  Runtime a(options()), b(options());
  if (refuses_kinds(a, GetParam())) GTEST_SKIP() << GetParam() << " holds exclusive locks only (Unsupported)";
  auto f = a.acquire({.key = "agreed", .ttl = 5s, .kind = LockKind::permits(2)});
  LockHandle held = get_bounded(f);
  auto more = b.acquire({.key = "agreed", .ttl = 5s, .retries = forever, .wait = 0ms, .kind = LockKind::permits(3)});
  auto e = error_of<InvalidArgument>(more);
  ASSERT_TRUE(e);
  EXPECT_NE(std::string(e->what()).find("2 permit"), std::string::npos) << e->what();
  auto exclusive = b.acquire({.key = "agreed", .ttl = 5s, .retries = forever, .wait = 0ms});
  EXPECT_TRUE(error_of<InvalidArgument>(exclusive));
  auto shared = b.acquire({.key = "agreed", .ttl = 5s, .retries = forever, .wait = 0ms, .kind = LockKind::shared()});
  EXPECT_TRUE(error_of<InvalidArgument>(shared));
  // The holder keeps its permit; once it is back, any kind may take the key.
  EXPECT_FALSE(held.lease().lost());
  give_back(held);
  auto after = b.acquire({.key = "agreed", .ttl = 5s, .retries = forever, .wait = 0ms, .kind = LockKind::permits(3)});
  LockHandle h = get_bounded(after);
  give_back(h);
}

// Sets of keys (lockwatch::all_of): busy past the wait, a set gives back
// what it took and names the busy key; held, it holds every key, each with
// its own token.
TEST_P(StoreContractTest, ASetIsTakenAllOrNone) {
  Runtime a(options(2)), b(options(2));
  LockHandle mid = take(a, "set-b", 5s);
  auto busy = b.acquire({.key = all_of("set-c", "set-b", "set-a"), .ttl = 5s, .wait = 0ms});
  auto err = error_of<LockNotAcquired>(busy);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("set-b"), std::string::npos) << err->what();
  auto first = b.acquire({.key = "set-a", .ttl = 5s, .wait = 5s});  // given back (a round trip away)
  LockHandle ha = get_bounded(first);
  give_back(ha);
  give_back(mid);
  auto whole = b.acquire({.key = all_of("set-c", "set-b", "set-a"), .ttl = 5s, .wait = 5s});
  LockHandle set = get_bounded(whole);
  EXPECT_EQ(set.lease().keys().size(), 3u);
  EXPECT_GT(set.lease().fencing_token("set-a"), 0u);
  EXPECT_GT(set.lease().fencing_token("set-c"), 0u);
  auto other = a.acquire({.key = "set-c", .ttl = 5s, .wait = 0ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(other));
  give_back(set);
  auto again = a.acquire({.key = all_of("set-a", "set-b", "set-c"), .ttl = 5s, .wait = 5s});
  LockHandle set2 = get_bounded(again);
  EXPECT_GT(set2.lease().fencing_token("set-b"), 0u);
  give_back(set2);
}

// A set-waiter is granted within its wait while single-key callers of
// another runtime keep taking its keys through the store.
TEST_P(StoreContractTest, ASetWaiterIsNotStarvedBySingleKeyCallers) {
  Runtime churner(options(4)), rt(options(2));
  std::atomic<bool> stop{false};
  std::atomic<int> singles{0};
  std::vector<std::thread> churn;
  for (int t = 0; t < 4; ++t) {
    churn.emplace_back([&, t] {
      auto one = LOCKED("starve:{0}", 2s, forever, .on(churner).wait(10s))[&](int) {
        singles++;
        std::this_thread::sleep_for(2ms);
      };
      while (!stop.load()) {
        auto f = one(t % 2);
        if (!completes(f)) return;
      }
    });
  }
  for (int i = 0; i < 20000 && singles.load() < 20; ++i) std::this_thread::sleep_for(1ms);
  const int before = singles.load();
  auto set = rt.acquire({.key = all_of("starve:0", "starve:1"), .ttl = 2s, .wait = 5s});
  auto status = set.wait_for(kBound);
  std::size_t keys = 0;
  if (status == std::future_status::ready) {
    try {
      LockHandle h = set.get();
      keys = h.lease().keys().size();
      give_back(h);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the set-waiter was not granted: " << e.what();
    }
  }
  stop = true;
  for (auto& t : churn) t.join();
  EXPECT_GE(before, 20);  // the keys were being taken when the set asked
  ASSERT_EQ(status, std::future_status::ready);
  EXPECT_EQ(keys, 2u);
}

// Transfers between random pairs of accounts from three runtimes, each
// thread naming the pair in its own order: no call fails (no deadlock),
// no two transfers on one account overlap, balances stay exact, and each
// account's fencing token rises.
TEST_P(StoreContractTest, OppositeOrderTransfersKeepBalancesExact) {
  constexpr int kRuntimes = 3, kThreads = 8;
  std::vector<std::unique_ptr<Runtime>> runtimes;
  for (int i = 0; i < kRuntimes; ++i) runtimes.push_back(std::make_unique<Runtime>(options(kThreads)));
  Ledger<4> ledger;
  run_transfers(ledger, kRuntimes * kThreads, 4, 1, [&](int t) {
    return LOCKED(all_of("acct:{0}", "acct:{1}"), 3s, forever, .on(*runtimes[t % kRuntimes]).wait(60s))[&](
               int from, int to, long cents) { ledger.move(from, to, cents); };
  });
  EXPECT_EQ(ledger.failures.load(), 0);
  EXPECT_EQ(ledger.overlaps.load(), 0);
  EXPECT_EQ(ledger.token_regressions.load(), 0);
  EXPECT_EQ(ledger.total(), 4000);
}

// The same from three processes of eight threads (tests/file_counter in
// its transfer mode), the balances in files: a transfer overlapping
// another on an account would change the total.
TEST_P(StoreContractTest, OppositeOrderTransfersAcrossProcessesKeepTheTotal) {
  if (!backend_->has_server()) GTEST_SKIP() << "a memory space is per process";
  const char* counter = std::getenv("LOCKWATCH_FILE_COUNTER");
  ASSERT_NE(counter, nullptr);
  constexpr int kProcs = 3, kThreads = 8, kTransfers = 4, kAccounts = 4;
  const std::string dir = make_temp_dir("transfers");
  std::vector<std::unique_ptr<ChildProcess>> procs;
  for (int p = 0; p < kProcs; ++p) {
    procs.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
        counter, backend_->url(), dir, std::to_string(kAccounts), std::to_string(kTransfers), "transfer",
        std::to_string(kThreads), std::to_string(p + 1)}));
  }
  for (auto& p : procs) EXPECT_EQ(p->wait(120s), 0);
  long total = 0;
  int touched = 0;
  for (int a = 0; a < kAccounts; ++a) {
    std::ifstream in(dir + "/acct-" + std::to_string(a));
    long n = 1000;
    if (in) {
      in >> n;
      touched++;
    }
    total += n;
  }
  EXPECT_GT(touched, 1);
  EXPECT_EQ(total, 1000L * kAccounts);
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

// Who holds a lock, since when. Each holder's owner name and
// grant time are in the store: another runtime (another owner) reads them.
TEST_P(StoreContractTest, InspectNamesEachHolderAndItsGrantTime) {
  Options oa = options(), ob = options();
  oa.runtime.owner_name = "alpha host:1:prog";
  ob.runtime.owner_name = "beta";
  Runtime a(oa), b(ob);
  const auto before = std::chrono::system_clock::now();
  auto held = take(a, "who-holds", 5s);
  const auto after = std::chrono::system_clock::now();
  auto f = b.inspect("who-holds");
  const LockState s = get_bounded(f);
  ASSERT_TRUE(s.held);
  EXPECT_EQ(s.kind, LockKind::exclusive());
  EXPECT_EQ(s.owner, "alpha host:1:prog");
  ASSERT_EQ(s.holders.size(), 1u);
  EXPECT_EQ(s.holders[0].owner, "alpha host:1:prog");
  EXPECT_FALSE(s.holders[0].token.empty());
  // The store's clock is this host's (loopback): the grant lies between.
  EXPECT_GE(s.since, before - 1s);
  EXPECT_LE(s.since, after + 1s);
  EXPECT_GE(s.held_for.count(), 0);
  EXPECT_LT(s.held_for, 5s);
  give_back(held);
  auto gone = b.inspect("who-holds");
  const LockState g = get_bounded(gone);
  EXPECT_FALSE(g.held);
  EXPECT_TRUE(g.owner.empty());
  EXPECT_TRUE(g.holders.empty());

  if (!keeps_kinds(GetParam())) return;
  auto ra = a.acquire({.key = "who-reads", .ttl = 5s, .kind = LockKind::shared()});
  LockHandle r1 = get_bounded(ra);
  auto rb = b.acquire({.key = "who-reads", .ttl = 5s, .kind = LockKind::shared()});
  LockHandle r2 = get_bounded(rb);
  auto fr = a.inspect("who-reads");
  const LockState sr = get_bounded(fr);
  ASSERT_TRUE(sr.held);
  EXPECT_EQ(sr.kind, LockKind::shared());
  std::multiset<std::string> owners;
  for (const auto& h : sr.holders) owners.insert(h.owner);
  EXPECT_EQ(owners, (std::multiset<std::string>{"alpha host:1:prog", "beta"}));
  give_back(r1);
  auto fr2 = a.inspect("who-reads");
  const LockState sr2 = get_bounded(fr2);
  ASSERT_EQ(sr2.holders.size(), 1u);
  EXPECT_EQ(sr2.holders[0].owner, "beta");
  give_back(r2);
}

// `lockwatch ls`: the locks held under a prefix, bounded by the limit;
// released ones and those under other prefixes are not listed.
TEST_P(StoreContractTest, ListShowsTheLocksHeldUnderAPrefix) {
  Options oa = options();
  oa.runtime.owner_name = "lister";
  Runtime a(oa);
  auto h1 = take(a, "ls-a:1", 5s);
  auto h2 = take(a, "ls-a:2", 5s);
  auto h3 = take(a, "ls-b:1", 5s);
  auto h4 = take(a, "ls-a:3", 5s);
  give_back(h4);
  auto f = a.list("ls-a:", 100);
  std::vector<LockState> all = get_bounded(f);
  std::sort(all.begin(), all.end(), [](const LockState& x, const LockState& y) { return x.key < y.key; });
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].key, "ls-a:1");
  EXPECT_EQ(all[1].key, "ls-a:2");
  for (const auto& s : all) {
    EXPECT_TRUE(s.held);
    EXPECT_EQ(s.owner, "lister");
    EXPECT_GT(s.ttl.count(), 0);
  }
  auto one = a.list("ls-a:", 1);
  EXPECT_EQ(get_bounded(one).size(), 1u);
  EXPECT_THROW((void)a.list("ls-a:", 0), InvalidArgument);
  give_back(h1);
  give_back(h2);
  give_back(h3);
}

// No store can say who deleted a key; an operator's `lockwatch release
// --force` is found at the holder's next renewal, answered before the
// lease's ttl could have run out: reported as removed, not expired.
TEST_P(StoreContractTest, ForceReleaseIsReportedAsRemoved) {
  Runtime holder(options()), admin(options());
  auto h = take(holder, "forced", 2s);
  std::promise<std::optional<LostReason>> ended;
  auto reason = ended.get_future();
  auto watch = h.lease().on_lost([&ended](std::optional<LostReason> r) { ended.set_value(r); });
  auto forced = admin.force_release("forced");
  EXPECT_TRUE(get_bounded(forced));
  ASSERT_EQ(reason.wait_for(kBound), std::future_status::ready);
  const auto why = reason.get();
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why, LostReason::kRemoved) << to_string(*why);
  const std::string text = holder.metrics_text();
  EXPECT_NE(text.find("\nlockwatch_leases_lost_total{reason=\"removed\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nlockwatch_leases_lost_total{reason=\"expired\"} 0\n"), std::string::npos) << text;
  auto released = h.release();
  EXPECT_TRUE(error_of<LeaseLost>(released));
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreContractTest, ::testing::ValuesIn(backend_kinds()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string name = p.param;
                           std::replace(name.begin(), name.end(), '-', '_');  // a test name is an identifier
                           return name;
                         });

}  // namespace
}  // namespace lockwatch::testing
