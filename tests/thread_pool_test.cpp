#include "lockwatch/thread_pool.hpp"

#include <gtest/gtest.h>

#include <pthread.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <mutex>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "lockwatch/errors.hpp"
#include "lockwatch/options.hpp"

namespace lockwatch {
namespace {

using namespace std::chrono_literals;

// Every wait is bounded so that a bug fails the test instead of hanging it.
constexpr auto kWaitLimit = 10s;

std::string this_thread_name() {
  char name[16] = {};
  ::pthread_getname_np(::pthread_self(), name, sizeof name);
  return name;
}

template <class T>
::testing::AssertionResult ready(std::future<T>& f) {
  if (f.wait_for(kWaitLimit) == std::future_status::ready) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "future not ready within the wait limit";
}

TEST(UniqueFunctionTest, EmptyFunctionThrowsBadFunctionCall) {
  UniqueFunction f;
  EXPECT_FALSE(f);
  EXPECT_THROW(f(), std::bad_function_call);
  void (*null_fn)() = nullptr;
  EXPECT_FALSE(UniqueFunction(null_fn));
}

TEST(UniqueFunctionTest, SmallAndLargeCallablesSurviveMoves) {
  int small_calls = 0;
  UniqueFunction small([&small_calls] { ++small_calls; });
  std::array<char, 4 * UniqueFunction::kInlineSize> big_payload{};
  big_payload[0] = 'x';
  std::string seen;
  UniqueFunction big([big_payload, &seen] { seen.push_back(big_payload[0]); });

  UniqueFunction moved_small(std::move(small));
  UniqueFunction moved_big;
  moved_big = std::move(big);
  EXPECT_FALSE(small);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_FALSE(big);    // NOLINT(bugprone-use-after-move)
  moved_small();
  moved_big();
  EXPECT_EQ(small_calls, 1);
  EXPECT_EQ(seen, "x");
}

TEST(UniqueFunctionTest, DestroysCapturesExactlyOnce) {
  auto counter = std::make_shared<int>(0);
  {
    UniqueFunction f([counter] {});
    UniqueFunction g(std::move(f));
    UniqueFunction h;
    h = std::move(g);
    EXPECT_EQ(counter.use_count(), 2);
  }
  EXPECT_EQ(counter.use_count(), 1);
}

TEST(ThreadPoolTest, ZeroThreadsMeansHardwareConcurrency) {
  ThreadPool pool(0);
  EXPECT_GE(pool.size(), 1u);
  ThreadPool three(3);
  EXPECT_EQ(three.size(), 3u);
}

TEST(ThreadPoolTest, SubmitReturnsResultThroughFuture) {
  ThreadPool pool(2);
  auto answer = pool.submit([] { return 6 * 7; });
  ASSERT_TRUE(ready(answer));
  EXPECT_EQ(answer.get(), 42);

  auto nothing = pool.submit([] {});
  ASSERT_TRUE(ready(nothing));
  nothing.get();
}

TEST(ThreadPoolTest, SubmitCarriesExceptionInFuture) {
  ThreadPool pool(1);
  auto failing = pool.submit([]() -> int { throw std::runtime_error("boom"); });
  // Waiting for a later task on the single worker means the worker has let go
  // of the first task before the exception is examined. Otherwise the worker
  // may free the exception last, and TSan, which cannot see the reference
  // count inside the uninstrumented libstdc++, reports a false race.
  auto later = pool.submit([] {});
  ASSERT_TRUE(ready(later));
  ASSERT_TRUE(ready(failing));
  EXPECT_THROW(
      {
        try {
          failing.get();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "boom");
          throw;
        }
      },
      std::runtime_error);
}

TEST(ThreadPoolTest, PostedTaskThatThrowsDoesNotStopThePool) {
  ThreadPool pool(1);
  pool.post([] { throw std::runtime_error("dropped"); });
  auto after = pool.submit([] { return 1; });
  ASSERT_TRUE(ready(after));
  EXPECT_EQ(after.get(), 1);
}

TEST(ThreadPoolTest, SingleThreadRunsTasksInFifoOrder) {
  ThreadPool pool(1);
  std::vector<int> order;  // touched only by the single worker until `done` is ready
  constexpr int kTasks = 1000;
  for (int i = 0; i < kTasks; ++i) pool.post([&order, i] { order.push_back(i); });
  auto done = pool.submit([] {});
  ASSERT_TRUE(ready(done));
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kTasks));
  for (int i = 0; i < kTasks; ++i) ASSERT_EQ(order[i], i);
}

TEST(ThreadPoolTest, ManyTasksFromSeveralThreadsRunExactlyOnce) {
  constexpr int kProducers = 4;
  constexpr int kPerProducer = 2000;
  std::vector<std::atomic<int>> runs(kProducers * kPerProducer);
  {
    ThreadPool pool(4);
    std::vector<std::thread> producers;
    for (int p = 0; p < kProducers; ++p) {
      producers.emplace_back([&pool, &runs, p] {
        for (int i = 0; i < kPerProducer; ++i) {
          pool.post([&runs, slot = p * kPerProducer + i] {
            runs[slot].fetch_add(1, std::memory_order_relaxed);
          });
        }
      });
    }
    for (std::thread& t : producers) t.join();
    // The destructor runs everything queued before joining.
  }
  for (std::size_t i = 0; i < runs.size(); ++i) ASSERT_EQ(runs[i].load(), 1) << "task " << i;
}

TEST(ThreadPoolTest, ShutdownFinishesQueuedWorkThenRefusesNewWork) {
  ThreadPool pool(1);
  std::promise<void> gate;
  std::shared_future<void> gate_open = gate.get_future().share();
  // Keeps the only worker busy so that the next tasks are still queued when
  // shutdown() begins.
  pool.post([gate_open] { (void)gate_open.wait_for(kWaitLimit); });
  std::atomic<int> ran{0};
  constexpr int kQueued = 100;
  for (int i = 0; i < kQueued; ++i) pool.post([&ran] { ran.fetch_add(1); });

  gate.set_value();
  pool.shutdown();
  EXPECT_EQ(ran.load(), kQueued);
  EXPECT_THROW(pool.post([] {}), RuntimeStopped);
  EXPECT_THROW((void)pool.submit([] { return 1; }), RuntimeStopped);
  pool.shutdown();  // idempotent
}

TEST(ThreadPoolTest, ShutdownFromOwnTaskRefusesNewWorkWithoutDeadlock) {
  std::atomic<int> ran{0};
  std::promise<bool> refused;
  auto refused_result = refused.get_future();
  {
    ThreadPool pool(2);
    pool.post([&pool, &ran, &refused] {
      pool.shutdown();  // must return: a worker cannot wait for itself
      try {
        pool.post([] {});
        refused.set_value(false);
      } catch (const RuntimeStopped&) {
        refused.set_value(true);
      }
      ran.fetch_add(1);
    });
    ASSERT_TRUE(ready(refused_result));
    EXPECT_TRUE(refused_result.get());
    EXPECT_THROW(pool.post([] {}), RuntimeStopped);
  }
  EXPECT_EQ(ran.load(), 1);
}

TEST(ThreadPoolTest, ConcurrentShutdownsAllReturnAfterTheJoin) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  for (int i = 0; i < 200; ++i) pool.post([&ran] { ran.fetch_add(1); });
  std::vector<std::thread> stoppers;
  std::vector<int> seen(3, -1);
  for (int i = 0; i < 3; ++i) {
    stoppers.emplace_back([&pool, &ran, &seen, i] {
      pool.shutdown();
      seen[i] = ran.load();
    });
  }
  for (std::thread& t : stoppers) t.join();
  for (int s : seen) EXPECT_EQ(s, 200);
}

TEST(ThreadPoolTest, DestroyedFromOwnTaskDoesNotDeadlock) {
  auto pool = std::make_unique<ThreadPool>(2);
  std::promise<void> posted;
  std::shared_future<void> post_returned = posted.get_future().share();
  std::promise<void> destroyed;
  auto destroyed_result = destroyed.get_future();
  pool->post([&pool, post_returned, &destroyed] {
    // post() must have returned before the pool goes away under it.
    (void)post_returned.wait_for(kWaitLimit);
    pool.reset();  // the destructor runs on this worker, which it detaches
    destroyed.set_value();
  });
  posted.set_value();
  ASSERT_TRUE(ready(destroyed_result));
  EXPECT_EQ(pool, nullptr);
}

TEST(ThreadPoolTest, OnPoolThreadIsTrueOnlyOnWorkers) {
  EXPECT_FALSE(ThreadPool::on_pool_thread());
  ThreadPool pool(2);
  auto inside = pool.submit([] { return ThreadPool::on_pool_thread(); });
  ASSERT_TRUE(ready(inside));
  EXPECT_TRUE(inside.get());
  EXPECT_FALSE(ThreadPool::on_pool_thread());

  auto other_thread = std::async(std::launch::async, [] { return ThreadPool::on_pool_thread(); });
  ASSERT_TRUE(ready(other_thread));
  EXPECT_FALSE(other_thread.get());
}

TEST(ThreadPoolTest, MoveOnlyCapturesWork) {
  ThreadPool pool(2);
  auto value = pool.submit([p = std::make_unique<int>(7)] { return *p; });
  ASSERT_TRUE(ready(value));
  EXPECT_EQ(value.get(), 7);

  std::promise<int> posted;
  auto posted_result = posted.get_future();
  pool.post([p = std::make_unique<int>(9), promise = std::move(posted)]() mutable {
    promise.set_value(*p);
  });
  ASSERT_TRUE(ready(posted_result));
  EXPECT_EQ(posted_result.get(), 9);

  auto moved_result = pool.submit([p = std::make_unique<std::string>("moved")]() mutable {
    return std::move(*p);
  });
  ASSERT_TRUE(ready(moved_result));
  EXPECT_EQ(moved_result.get(), "moved");
}

TEST(ThreadPoolTest, EmptyTaskIsRejected) {
  ThreadPool pool(1);
  EXPECT_THROW(pool.post(UniqueFunction{}), InvalidArgument);
}

// post_all: the tasks queue in their order, each runs once on the workers
// (the sleeping ones woken once they are all queued); all or none: an
// empty task, or a pool shut down, queues none of them.
TEST(ThreadPoolTest, PostAllQueuesEveryTaskInOrderOrNone) {
  for (auto busy_poll : {std::chrono::microseconds(0), kBusyPollAdaptive}) {
    ThreadPool pool(1, busy_poll);
    std::vector<int> order;  // touched only by the single worker until `done` is ready
    std::vector<UniqueFunction> tasks;
    for (int i = 0; i < 100; ++i) tasks.emplace_back([&order, i] { order.push_back(i); });
    pool.post_all(tasks);
    auto all_ran = pool.submit([] {});
    ASSERT_TRUE(ready(all_ran));
    ASSERT_EQ(order.size(), 100u);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i);

    std::atomic<int> ran{0};
    std::vector<UniqueFunction> with_empty;
    with_empty.emplace_back([&ran] { ran++; });
    with_empty.emplace_back();
    EXPECT_THROW(pool.post_all(with_empty), InvalidArgument);
    auto none_ran = pool.submit([] {});
    ASSERT_TRUE(ready(none_ran));
    EXPECT_EQ(ran.load(), 0);
    EXPECT_TRUE(static_cast<bool>(with_empty[0]));  // not moved from

    std::vector<UniqueFunction> several;
    for (int i = 0; i < 8; ++i) several.emplace_back([&ran] { ran++; });
    ThreadPool wide(4, busy_poll);
    wide.post_all(several);
    wide.shutdown();  // runs what was queued
    EXPECT_EQ(ran.load(), 8);
    std::vector<UniqueFunction> late;
    late.emplace_back([&ran] { ran++; });
    EXPECT_THROW(wide.post_all(late), RuntimeStopped);
    EXPECT_EQ(ran.load(), 8);
  }
}

// Options::runtime.busy_poll: a polling worker takes tasks as a sleeping one does,
// each exactly once, in a ping-pong (every task posted after the previous
// one ran, which is the case polling serves) and from several producers;
// shutdown still joins within the window.
class BusyPollTest : public ::testing::TestWithParam<std::chrono::microseconds> {};

// A fixed window (500 us) and adaptive polling (negative).
TEST_P(BusyPollTest, BusyPollingWorkersRunEveryTaskOnceAndStillShutDown) {
  constexpr int kRounds = 2000;
  ThreadPool pool(2, GetParam());
  for (int i = 0; i < kRounds; ++i) {
    auto f = pool.submit([i] { return i * 2; });
    ASSERT_EQ(f.wait_for(kWaitLimit), std::future_status::ready);
    ASSERT_EQ(f.get(), i * 2);
  }
  constexpr int kProducers = 3;
  constexpr int kPerProducer = 2000;
  std::vector<std::atomic<int>> runs(kProducers * kPerProducer);
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&pool, &runs, p] {
      for (int i = 0; i < kPerProducer; ++i)
        pool.post([&runs, slot = p * kPerProducer + i] { runs[slot].fetch_add(1, std::memory_order_relaxed); });
    });
  }
  for (std::thread& t : producers) t.join();
  auto start = std::chrono::steady_clock::now();
  pool.shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - start, kWaitLimit);
  for (std::size_t i = 0; i < runs.size(); ++i) ASSERT_EQ(runs[i].load(), 1) << "task " << i;
}

INSTANTIATE_TEST_SUITE_P(FixedAndAdaptive, BusyPollTest,
                         ::testing::Values(std::chrono::microseconds(500), std::chrono::microseconds(-1)));

TEST(ThreadPoolTest, WorkersAreNamedLwPoolAndTheirIndex) {
  ThreadPool pool(3);
  // Each task holds its worker until all three run, so each worker runs one.
  std::mutex mu;
  std::condition_variable all_in;
  std::vector<std::string> names;
  std::vector<std::future<bool>> done;
  for (int i = 0; i < 3; ++i) {
    done.push_back(pool.submit([&] {
      std::unique_lock lk(mu);
      names.push_back(this_thread_name());
      all_in.notify_all();
      return all_in.wait_for(lk, kWaitLimit, [&] { return names.size() == 3; });
    }));
  }
  for (auto& f : done) {
    ASSERT_TRUE(ready(f));
    EXPECT_TRUE(f.get());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"lw-pool-0", "lw-pool-1", "lw-pool-2"}));
}

TEST(ThreadPoolTest, TheNamePatternNamesTheWorkersCutTo15Bytes) {
  ThreadPool numbered(1, {}, "job-{}-x");
  ThreadPool fixed(1, {}, "lw-events");
  ThreadPool long_name(1, {}, "a-very-long-thread-name-{}");
  auto a = numbered.submit(this_thread_name);
  auto b = fixed.submit(this_thread_name);
  auto c = long_name.submit(this_thread_name);
  ASSERT_TRUE(ready(a) && ready(b) && ready(c));
  EXPECT_EQ(a.get(), "job-0-x");
  EXPECT_EQ(b.get(), "lw-events");
  EXPECT_EQ(c.get(), "a-very-long-thr");
  EXPECT_EQ(this_thread_name().rfind("lw-", 0), std::string::npos) << "the caller's name is its own";
}

}  // namespace
}  // namespace lockwatch
