// lockwatch/asio.hpp on an in-memory store, on one single-threaded
// io_context: async_lock with use_awaitable, use_future and callbacks, its
// handler on its executor, per-operation cancellation (slots and
// awaitable_operators timeouts) before and at the grant, async_release,
// async_lost, and LOCKED on coroutines: lambdas and member functions, the
// lease renewed across suspensions, a lost lease cancelling the coroutine,
// errors as typed exceptions.
#include "asio_util.hpp"

#include <atomic>
#include <future>
#include <string>
#include <thread>

#include "memory_runtime.hpp"

namespace lockwatch::testing {
namespace {

using namespace asio::experimental::awaitable_operators;

class AsioTest : public ::testing::Test {
 protected:
  void SetUp() override { rt_ = memory_runtime(backend_, script_, memory_options()); }
  void TearDown() override { rt_.reset(); }

  // Waits (bounded) until nothing holds `key` and no lease is held.
  bool nothing_held(const std::string& key) {
    auto until = std::chrono::steady_clock::now() + kBound;
    while (std::chrono::steady_clock::now() < until) {
      if (!backend_->owner(memory_name(key)) && rt_->held_leases() == 0) return true;
      std::this_thread::sleep_for(1ms);  // polling the store, which has no event for this
    }
    return false;
  }
  bool held(const std::string& key) const { return backend_->owner(memory_name(key)).has_value(); }

  std::shared_ptr<MemoryBackend> backend_ = std::make_shared<MemoryBackend>();
  std::shared_ptr<StoreScript> script_ = std::make_shared<StoreScript>();
  std::unique_ptr<Runtime> rt_;
  asio::io_context ctx_{1};
};

TEST_F(AsioTest, AsyncLockWithUseAwaitableResumesOnTheCoroutinesThread) {
  auto me = std::this_thread::get_id();
  run_to_end(ctx_, [&]() -> asio::awaitable<void> {
    LockHandle h = co_await async_lock(*rt_, "aw", 1s, asio::use_awaitable);  // the shorthand
    EXPECT_EQ(std::this_thread::get_id(), me);
    EXPECT_TRUE(h);
    EXPECT_TRUE(held("aw"));
    co_await h.async_release(asio::use_awaitable);
    EXPECT_EQ(std::this_thread::get_id(), me);
    EXPECT_FALSE(h);
  }());
  EXPECT_FALSE(held("aw"));
}

TEST_F(AsioTest, AsyncLockWithUseFuture) {
  std::future<LockHandle> f = async_lock(*rt_, {.key = "fut", .ttl = 1s, .retries = forever, .wait = 0ms}, asio::use_future);
  LockHandle h = get_bounded(f);
  EXPECT_TRUE(held("fut"));
  std::future<void> released = h.async_release(asio::use_future);
  get_bounded(released);
  EXPECT_FALSE(held("fut"));
  // Errors are the future's exception.
  auto busy_holder = async_lock(*rt_, {.key = "fut", .ttl = 5s, .retries = forever, .wait = 0ms}, asio::use_future);
  auto holder = get_bounded(busy_holder);
  auto busy = async_lock(*rt_, {.key = "fut", .ttl = 1s}, asio::use_future);
  auto error = error_of<std::system_error>(busy);  // the error code, as use_future gives it
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), errc::busy);
}

// A request's context reaches the observer's span events through
// async_lock; a bad one is errc::invalid_argument, and nothing starts.
TEST_F(AsioTest, AsyncLockCarriesTheRequestsContextToItsSpans) {
  struct Contexts : Observer {
    void on_span(const SpanEvent& e) override {
      if (e.kind == SpanKind::kHeld) held.set_value(std::string(e.context));
    }
    std::promise<std::string> held;
  };
  auto spans = std::make_shared<Contexts>();
  auto told = spans->held.get_future();
  rt_->add_observer(spans);
  run_to_end(ctx_, [&]() -> asio::awaitable<void> {
    const LockRequest bad{.key = "ctx-aw", .ttl = 1s, .context = "line\nbreak"};
    auto [ec, none] = co_await async_lock(*rt_, bad, asio::experimental::as_tuple(asio::use_awaitable));
    EXPECT_EQ(ec, errc::invalid_argument);
    EXPECT_FALSE(none);
    const LockRequest traced{.key = "ctx-aw", .ttl = 1s, .context = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"};
    LockHandle h = co_await async_lock(*rt_, traced, asio::use_awaitable);
    EXPECT_TRUE(h);
    co_await h.async_release(asio::use_awaitable);
  }());
  ASSERT_EQ(told.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(told.get(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
}

// Errors are error codes, as in any Asio library: plain use_awaitable
// throws std::system_error carrying the code, redirect_error and as_tuple
// give it as a value (so a coroutine gives a first lock back when the
// second is busy, without a catch), and a bad request is a code too.
TEST_F(AsioTest, ErrorsAreErrorCodesForEveryCompletionToken) {
  auto holder_f = rt_->acquire("acct:2", 5s);
  auto holder = get_bounded(holder_f);
  run_to_end(ctx_, [&]() -> asio::awaitable<void> {
    try {
      const LockRequest busy{.key = "acct:2", .ttl = 1s};  // named: see asio.hpp on GCC 12
      (void)co_await async_lock(*rt_, busy, asio::use_awaitable);
      ADD_FAILURE() << "a busy lock was granted";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), errc::busy);
    }
    LockHandle first = co_await async_lock(*rt_, "acct:1", 1s, asio::use_awaitable);
    std::error_code ec;
    const LockRequest second_account{.key = "acct:2", .ttl = 1s};
    LockHandle second = co_await async_lock(*rt_, second_account, asio::redirect_error(asio::use_awaitable, ec));
    EXPECT_EQ(ec, errc::busy);
    EXPECT_FALSE(second);
    co_await first.async_release(asio::use_awaitable);  // given back with no catch block
    auto [bad, none] = co_await async_lock(*rt_, "", 1s, asio::experimental::as_tuple(asio::use_awaitable));
    EXPECT_EQ(bad, errc::invalid_argument);
    EXPECT_FALSE(none);
    const LockRequest negative_wait{.key = "k", .ttl = 1s, .wait = -1s};
    auto [swapped, also_none] =
        co_await async_lock(*rt_, negative_wait, asio::experimental::as_tuple(asio::use_awaitable));
    EXPECT_EQ(swapped, errc::invalid_argument);
  }());
  EXPECT_FALSE(held("acct:1"));
}

TEST(AsioKindsTest, AsyncLockTakesAKind) {
  Options o;
  o.redis_url = "memory://asio-kinds";  // a store that keeps every kind
  o.runtime.threads = 2;
  Runtime rt(o);
  auto a = async_lock(rt, {.key = "doc", .ttl = 1s, .kind = LockKind::shared()}, asio::use_future);
  auto b = async_lock(rt, {.key = "doc", .ttl = 1s, .kind = LockKind::shared()}, asio::use_future);
  LockHandle ha = get_bounded(a), hb = get_bounded(b);
  auto writer = async_lock(rt, {.key = "doc", .ttl = 1s, .kind = LockKind::exclusive()}, asio::use_future);
  auto busy = error_of<std::system_error>(writer);
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->code(), errc::busy);
}

TEST_F(AsioTest, AsyncLockWithDeferredStartsOnlyWhenLaunched) {
  auto op = async_lock(*rt_, {.key = "deferred", .ttl = 1s, .retries = forever, .wait = 0ms}, asio::experimental::deferred);
  EXPECT_EQ(script_->count(Op::kAcquire), 0u);  // nothing asked yet
  run_to_end(ctx_, [&]() -> asio::awaitable<void> {
    LockHandle h = co_await std::move(op)(asio::use_awaitable);
    EXPECT_TRUE(held("deferred"));
    co_await h.async_release(asio::experimental::deferred)(asio::use_awaitable);
  }());
  EXPECT_FALSE(held("deferred"));
}

TEST_F(AsioTest, CallbackRunsOnItsAssociatedExecutorNeverInsideTheCall) {
  std::thread::id ran_on;
  bool inside_call = true;
  bool called = false;
  auto me = std::this_thread::get_id();
  async_lock(*rt_, {.key = "cb", .ttl = 1s, .retries = forever, .wait = 0ms}, asio::bind_executor(ctx_.get_executor(), [&](std::error_code e, LockHandle h) {
               called = true;
               ran_on = std::this_thread::get_id();
               EXPECT_FALSE(inside_call);
               EXPECT_FALSE(e);
               EXPECT_TRUE(h);
             }));
  inside_call = false;
  EXPECT_FALSE(called);
  // Work is tracked: run() returns only once the handler ran.
  ctx_.run_for(kBound);
  EXPECT_TRUE(called);
  EXPECT_EQ(ran_on, me);
  EXPECT_TRUE(nothing_held("cb"));  // the handle was dropped by the handler
}

TEST_F(AsioTest, CancellationSlotEndsAPendingWaitWithCancelled) {
  auto holder_f = rt_->acquire("slot", 5s);
  auto holder = get_bounded(holder_f);
  asio::cancellation_signal signal;
  std::error_code error;
  bool called = false;
  async_lock(*rt_, {.key = "slot", .ttl = 1s, .retries = forever, .wait = 10s}, asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(ctx_, [&](std::error_code e, LockHandle h) {
                                            called = true;
                                            error = e;
                                            EXPECT_FALSE(h);
                                          })));
  ASSERT_TRUE(script_->wait_for(Op::kAcquire, 2));
  asio::post(ctx_, [&] { signal.emit(asio::cancellation_type::terminal); });
  auto t0 = std::chrono::steady_clock::now();
  ctx_.run_for(kBound);
  ASSERT_TRUE(called);
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 2s);
  EXPECT_EQ(error, errc::cancelled);
  auto released = holder.release();
  get_bounded(released);
  EXPECT_TRUE(nothing_held("slot"));
}

TEST_F(AsioTest, TimeoutWithAwaitableOperatorsCancelsTheWait) {
  auto holder_f = rt_->acquire("timeout", 5s);
  auto holder = get_bounded(holder_f);
  auto result = run_to_end(ctx_, [&]() -> asio::awaitable<std::size_t> {
    asio::steady_timer timer(co_await asio::this_coro::executor, 50ms);
    const LockRequest request{.key = "timeout", .ttl = 1s, .wait = 10s};
    auto r = co_await (async_lock(*rt_, request, asio::use_awaitable) ||
                       timer.async_wait(asio::use_awaitable));
    co_return r.index();
  }());
  EXPECT_EQ(result, 1u);  // the timer won
  auto attempts = script_->count(Op::kAcquire);
  auto released = holder.release();
  get_bounded(released);
  EXPECT_TRUE(nothing_held("timeout"));
  EXPECT_EQ(script_->count(Op::kAcquire), attempts);  // the cancelled waiter left the queue
}

TEST_F(AsioTest, CancelledExactlyAtTheGrantLeavesNoLockHeld) {
  // The store takes the lock at once but answers 40 ms later; the timeout
  // fires at 20 ms, while the grant is on its way.
  // Each wait on a key of its own: the first's late grant, given back,
  // must not pass to the second (an in-process hand-off) in its 20 ms.
  script_->set_delay(Op::kAcquire, 40ms);
  for (auto wait : {0ms, 5000ms}) {
    const std::string key = "grant-" + std::to_string(wait.count());
    auto result = run_to_end(ctx_, [&]() -> asio::awaitable<std::size_t> {
      asio::steady_timer timer(co_await asio::this_coro::executor, 20ms);
      const LockRequest request{.key = key, .ttl = 1s, .wait = wait};
      auto r = co_await (async_lock(*rt_, request, asio::use_awaitable) ||
                         timer.async_wait(asio::use_awaitable));
      co_return r.index();
    }());
    EXPECT_EQ(result, 1u) << "wait " << wait.count();
    EXPECT_GE(script_->count(Op::kAcquire), 1u);
    EXPECT_TRUE(nothing_held(key)) << "wait " << wait.count();
  }
}

TEST_F(AsioTest, AsyncLostCompletesWithTheReasonOrOnRelease) {
  run_to_end(ctx_, [&]() -> asio::awaitable<void> {
    LockHandle h = co_await async_lock(*rt_, "lost", 200ms, asio::use_awaitable);
    backend_->erase(memory_name("lost"));
    std::optional<LostReason> reason = co_await async_lost(h.lease(), asio::use_awaitable);
    EXPECT_EQ(reason, LostReason::kRemoved);
    try {
      co_await h.async_release(asio::use_awaitable);
      ADD_FAILURE() << "release of a lost lease succeeded";
    } catch (const std::system_error& e) {  // plain use_awaitable throws the code
      EXPECT_EQ(e.code(), errc::lease_lost);
    }

    LockHandle g = co_await async_lock(*rt_, "lost2", 1s, asio::use_awaitable);
    // Cancelled by a timeout: Cancelled; the lease is kept.
    asio::steady_timer timer(co_await asio::this_coro::executor, 30ms);
    auto r = co_await (async_lost(g.lease(), asio::use_awaitable) || timer.async_wait(asio::use_awaitable));
    EXPECT_EQ(r.index(), 1u);
    EXPECT_FALSE(g.lease().lost());
    // Released: std::nullopt.
    asio::cancellation_signal never;
    std::optional<LostReason> end = LostReason::kExpired;
    bool told = false;
    async_lost(g.lease(), asio::bind_executor(ctx_, [&](std::error_code e, std::optional<LostReason> why) {
                 EXPECT_FALSE(e);
                 end = why;
                 told = true;
               }));
    co_await g.async_release(asio::use_awaitable);
    asio::steady_timer wait(co_await asio::this_coro::executor);
    for (int i = 0; i < 1000 && !told; ++i) {
      wait.expires_after(1ms);
      co_await wait.async_wait(asio::use_awaitable);
    }
    EXPECT_TRUE(told);
    EXPECT_EQ(end, std::nullopt);
  }());
}

TEST_F(AsioTest, LockedCoroutineHoldsAcrossSuspensionsAndReleasesAfter) {
  auto renewals_seen = std::make_shared<std::uint64_t>(0);
  auto work = locked("job:{0}", 100ms, forever).on(*rt_)([&](int id) -> asio::awaitable<int> {
    EXPECT_TRUE(held("job:7"));
    asio::steady_timer t(co_await asio::this_coro::executor);
    for (int i = 0; i < 5; ++i) {  // 300 ms: three ttls, renewed meanwhile
      t.expires_after(60ms);
      co_await t.async_wait(asio::use_awaitable);
      EXPECT_TRUE(held("job:7"));
    }
    co_return id * 2;
  });
  auto before = rt_->stats().renewals_sent;
  int v = run_to_end(ctx_, work(7));
  EXPECT_EQ(v, 14);
  EXPECT_GE(rt_->stats().renewals_sent - before, 2u);
  EXPECT_FALSE(held("job:7"));  // released before the caller went on
  EXPECT_EQ(rt_->held_leases(), 0u);
}

// A LOCKED coroutine reaches its lease through a `const Lease&` first
// parameter (this_lease() cannot follow a coroutine across threads): its
// key, fencing token and time left, the call's own arguments after it.
TEST_F(AsioTest, ALockedCoroutineTakingALeaseParameterReachesItsLease) {
  auto work = locked("pay:{0}", 1s, forever).on(*rt_)([&](const Lease& lease, int order) -> asio::awaitable<std::uint64_t> {
    EXPECT_EQ(lease.key(), "pay:" + std::to_string(order));
    asio::steady_timer t(co_await asio::this_coro::executor, 5ms);
    co_await t.async_wait(asio::use_awaitable);
    EXPECT_GT(lease.remaining(), 0ms);  // across a suspension
    EXPECT_FALSE(lease.stop_token().stop_requested());
    co_return lease.fencing_token();
  });
  EXPECT_EQ(work.key_for(42), "pay:42");  // the lease is no key argument
  std::uint64_t first = run_to_end(ctx_, work(42));
  std::uint64_t second = run_to_end(ctx_, work(42));
  EXPECT_GT(first, 0u);
  EXPECT_GT(second, first);  // each holding its own token
  EXPECT_FALSE(held("pay:42"));
}

// A set (lockwatch::all_of) through async_lock and on a LOCKED coroutine:
// every key held while it runs, each with its token, all given back after.
TEST_F(AsioTest, ASetIsTakenByAsyncLockAndByALockedCoroutine) {
  run_to_end(ctx_, [&]() -> asio::awaitable<void> {
    const LockRequest r{.key = all_of("acct:2", "acct:1"), .ttl = 1s};
    LockHandle h = co_await async_lock(*rt_, r, asio::use_awaitable);
    EXPECT_TRUE(held("acct:1") && held("acct:2"));
    EXPECT_EQ(h.lease().keys().size(), 2u);
    co_await h.async_release(asio::use_awaitable);
  }());
  EXPECT_TRUE(nothing_held("acct:1") && nothing_held("acct:2"));
  auto transfer = locked(all_of("acct:{0}", "acct:{1}"), 1s, forever)
                      .on(*rt_)([&](const Lease& lease, int from, int to) -> asio::awaitable<bool> {
                        asio::steady_timer t(co_await asio::this_coro::executor, 2ms);
                        co_await t.async_wait(asio::use_awaitable);
                        co_return held("acct:" + std::to_string(from)) && held("acct:" + std::to_string(to)) &&
                            lease.fencing_token("acct:" + std::to_string(to)) > 0;
                      });
  EXPECT_TRUE(run_to_end(ctx_, transfer(2, 1)));
  EXPECT_TRUE(nothing_held("acct:1") && nothing_held("acct:2"));
}

class Inventory {
 public:
  asio::awaitable<int> take(int sku, int n) {
    asio::steady_timer t(co_await asio::this_coro::executor, 1ms);
    co_await t.async_wait(asio::use_awaitable);
    stock -= n;
    (void)sku;
    co_return stock;
  }
  int stock = 100;
};

TEST_F(AsioTest, LockedMemberCoroutineKeysOnTheFirstDeclaredParameter) {
  Inventory inv;
  auto take = locked("sku:{0}", 1s, 3).on(*rt_).wait(1s)(&Inventory::take);
  EXPECT_EQ(take.key_for(inv, 42, 1), "sku:42");
  int left = run_to_end(ctx_, [&]() -> asio::awaitable<int> {
    co_await take(inv, 42, 1);
    co_return co_await take(&inv, 42, 2);
  }());
  EXPECT_EQ(left, 97);
  EXPECT_EQ(inv.stock, 97);
}

TEST_F(AsioTest, ALostLeaseCancelsTheCoroutineAndTheCallerGetsLeaseLost) {
  bool aborted = false;
  auto work = locked("doomed", 200ms, forever).on(*rt_)([&]() -> asio::awaitable<int> {
    asio::steady_timer t(co_await asio::this_coro::executor, 10s);
    backend_->erase(memory_name("doomed"));  // the next renewal finds the key gone
    try {
      co_await t.async_wait(asio::use_awaitable);
    } catch (const std::system_error& e) {
      aborted = e.code() == asio::error::operation_aborted;
      throw;
    }
    co_return 1;
  });
  auto t0 = std::chrono::steady_clock::now();
  auto err = thrown<LeaseLost>([&] { run_to_end(ctx_, work()); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->reason(), LostReason::kRemoved);
  EXPECT_TRUE(aborted);
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 5s);  // not the 10 s timer
}

TEST_F(AsioTest, LockedCoroutineErrorsAreTypedAndTheLockIsReleased) {
  auto holder_f = rt_->acquire("busy", 5s);
  auto holder = get_bounded(holder_f);
  int ran = 0;
  auto work = locked("busy", 1s, 0).on(*rt_)([&]() -> asio::awaitable<void> {
    ++ran;
    co_return;
  });
  EXPECT_TRUE(thrown<LockNotAcquired>([&] { run_to_end(ctx_, work()); }));
  EXPECT_EQ(ran, 0);
  auto released = holder.release();
  get_bounded(released);

  auto failing = locked("fails", 1s, 0).on(*rt_)([&]() -> asio::awaitable<int> {
    co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
    throw std::logic_error("boom");
  });
  EXPECT_TRUE(thrown<std::logic_error>([&] { run_to_end(ctx_, failing()); }));
  EXPECT_TRUE(nothing_held("fails"));

  auto bad_key = locked("", 1s, 0).on(*rt_)([]() -> asio::awaitable<void> { co_return; });
  EXPECT_TRUE(thrown<InvalidArgument>([&] { run_to_end(ctx_, bad_key()); }));
}

TEST_F(AsioTest, CancellingTheCallerCancelsTheRunningCoroutineAndReleases) {
  bool aborted = false;
  auto work = locked("slow", 1s, forever).on(*rt_)([&]() -> asio::awaitable<void> {
    asio::steady_timer t(co_await asio::this_coro::executor, 10s);
    try {
      co_await t.async_wait(asio::use_awaitable);
    } catch (const std::system_error& e) {
      aborted = e.code() == asio::error::operation_aborted;
      throw;
    }
  });
  auto index = run_to_end(ctx_, [&]() -> asio::awaitable<std::size_t> {
    asio::steady_timer timeout(co_await asio::this_coro::executor, 50ms);
    auto r = co_await (work() || timeout.async_wait(asio::use_awaitable));
    co_return r.index();
  }());
  EXPECT_EQ(index, 1u);
  EXPECT_TRUE(aborted);
  EXPECT_TRUE(nothing_held("slow"));
}

TEST_F(AsioTest, ManyCoroutinesOnFewKeysNeverOverlapAndNothingBlocksTheContext) {
  auto r = coroutine_stress(*rt_, 200, 3, {"s0", "s1", "s2", "s3"});
  EXPECT_EQ(r.done, 200);
  EXPECT_EQ(r.errors, 0);
  EXPECT_EQ(r.overlaps, 0);
  for (int n : r.per_key) EXPECT_EQ(n, 150);
  EXPECT_GT(r.ticks, 0);
  EXPECT_LT(r.late_at(0.01), std::chrono::microseconds(20000))  // as in asio_redis_test.cpp
      << "1% of the 1 ms timer's ticks ran late by " << r.late_at(0.01).count() << " us or more";
  EXPECT_EQ(rt_->held_leases(), 0u);
}

TEST(AsioElectionTest, AsyncCampaignLeadsAndACancelledOneGivesUp) {
  Options o;
  o.redis_url = "memory://asio-election";
  o.runtime.threads = 2;
  Runtime a(o), b(o);
  Election first(a, "asio-lead", 1s), second(b, "asio-lead", 1s);
  Leadership won = lockwatch::async_campaign(first, asio::use_future).get();
  EXPECT_GE(won.term(), 1u);
  // A second candidate waits; cancelling it gives the campaign up.
  asio::io_context io;
  asio::cancellation_signal cancel;
  std::error_code error;
  bool completed = false;
  lockwatch::async_campaign(second, asio::bind_cancellation_slot(
                                        cancel.slot(), asio::bind_executor(io, [&](std::error_code e, Leadership) {
                                          error = e;
                                          completed = true;
                                        })));
  asio::post(io, [&] { cancel.emit(asio::cancellation_type::terminal); });
  io.run_for(kBound);
  ASSERT_TRUE(completed);
  EXPECT_EQ(error, errc::cancelled);
  // Resigning hands over: the next campaign leads with a higher term.
  lockwatch::async_resign(first, asio::use_future).get();
  EXPECT_TRUE(won.stop_token().stop_requested());
  Leadership next = lockwatch::async_campaign(second, asio::use_future).get();
  EXPECT_GT(next.term(), won.term());
  lockwatch::async_resign(second, asio::use_future).get();
}

TEST(AsioLockedMacroTest, LockedOnACoroutineLambdaGivesAnAwaitableThatStartsOnlyWhenAwaited) {
  // LOCKED (the default runtime) on a coroutine: calling it makes an
  // awaitable and nothing else (no runtime is made, no lock asked for).
  auto f = LOCKED("k:{0}", 1s, 0)[](int x) -> asio::awaitable<int> { co_return x; };
  static_assert(std::is_same_v<decltype(f(1)), asio::awaitable<int>>);
  auto lazy = f(1);
  EXPECT_EQ(f.key_for(7), "k:7");
}

}  // namespace
}  // namespace lockwatch::testing
