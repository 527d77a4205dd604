// lockwatch/asio.hpp against a real redis-server: hundreds of coroutines
// on one single-threaded io_context locking a few keys through LOCKED,
// each suspending while it holds: exact counts, no overlap, and 99% of
// the ticks of a 1 ms timer on the same context late by a few ms at most
// (nothing blocks the context); a lock deleted under a coroutine cancels
// it.
#include "asio_util.hpp"

#include <cstdio>

#include "support/redis_server.hpp"

namespace lockwatch::testing {
namespace {

class AsioRedisTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new RedisServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { rt_ = std::make_unique<Runtime>(options_for(*server_)); }
  void TearDown() override { rt_.reset(); }

  static RedisServer* server_;
  std::unique_ptr<Runtime> rt_;
};
RedisServer* AsioRedisTest::server_ = nullptr;

TEST_F(AsioRedisTest, HundredsOfCoroutinesOnFewKeysNeverOverlapAndNothingBlocksTheContext) {
  auto r = coroutine_stress(*rt_, 300, 4, {"co:a", "co:b", "co:c"});
  EXPECT_EQ(r.done, 300);
  EXPECT_EQ(r.errors, 0);
  EXPECT_EQ(r.overlaps, 0);
  for (int n : r.per_key) EXPECT_EQ(n, 400);
  EXPECT_GT(r.ticks, 100);
  // A few ms for 99% of the ticks: a blocked context would keep most of
  // them late by a lock round trip times the waiters. The worst one alone
  // is the machine's (another suite beside this one can hold the core for
  // tens of ms).
  EXPECT_LT(r.late_at(0.01), std::chrono::microseconds(20000))
      << "1% of the 1 ms timer's ticks ran late by " << r.late_at(0.01).count() << " us or more";
  std::printf("300 coroutines x 4 cycles: %d ticks, 1 ms timer lateness: 99%% within %lld us, worst %lld us\n",
              r.ticks, static_cast<long long>(r.late_at(0.01).count()), static_cast<long long>(r.late_at(0).count()));
  EXPECT_EQ(rt_->held_leases(), 0u);
  for (auto k : {"co:a", "co:b", "co:c"}) EXPECT_FALSE(exists(*server_, k));
}

TEST_F(AsioRedisTest, ADeletedLockCancelsTheCoroutineWithLeaseLost) {
  asio::io_context ctx(1);
  bool aborted = false;
  auto work = locked("co:doomed", 300ms, forever).on(*rt_)([&]() -> asio::awaitable<void> {
    server_->command({"DEL", lock_key("co:doomed")});
    asio::steady_timer t(co_await asio::this_coro::executor, 10s);
    try {
      co_await t.async_wait(asio::use_awaitable);
    } catch (const std::system_error& e) {
      aborted = e.code() == asio::error::operation_aborted;
      throw;
    }
  });
  auto err = thrown<LeaseLost>([&] { run_to_end(ctx, work()); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->reason(), LostReason::kRemoved);
  EXPECT_TRUE(aborted);
}

TEST_F(AsioRedisTest, ACancelledWaitLeavesNoLockInRedis) {
  asio::io_context ctx(1);
  auto holder_f = rt_->acquire("co:wait", 5s);
  auto holder = get_bounded(holder_f);
  using namespace asio::experimental::awaitable_operators;
  auto index = run_to_end(ctx, [&]() -> asio::awaitable<std::size_t> {
    asio::steady_timer timer(co_await asio::this_coro::executor, 30ms);
    const LockRequest request{.key = "co:wait", .ttl = 1s, .wait = 10s};
    auto r = co_await (async_lock(*rt_, request, asio::use_awaitable) ||
                       timer.async_wait(asio::use_awaitable));
    co_return r.index();
  }());
  EXPECT_EQ(index, 1u);
  auto released = holder.release();
  get_bounded(released);
  // Nobody took it after the release: the cancelled waiter left the queue.
  EXPECT_FALSE(exists(*server_, "co:wait"));
  auto again = rt_->acquire("co:wait", 1s);
  auto h = get_bounded(again);
  EXPECT_TRUE(h);
}

}  // namespace
}  // namespace lockwatch::testing
