// The I/O thread's task queue.
#include <gtest/gtest.h>

#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/loop.hpp"

namespace lockwatch::detail {
namespace {

using namespace std::chrono_literals;

TEST(LoopTest, TasksRunOnTheLoopThreadInPostingOrder) {
  Loop loop;
  std::vector<int> order;
  std::promise<std::thread::id> ran_on;
  for (int i = 0; i < 100; ++i) loop.post([&order, i] { order.push_back(i); });
  loop.post([&] { ran_on.set_value(std::this_thread::get_id()); });
  auto f = ran_on.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_NE(f.get(), std::this_thread::get_id());
  EXPECT_EQ(loop.shutdown([] {}), 0);
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST(LoopTest, ATaskThatThrowsDoesNotStopTheLoop) {
  Loop loop;
  std::promise<void> after;
  loop.post([] { throw std::runtime_error("a bug in a task"); });
  loop.post([] { throw 42; });
  loop.post([&] { after.set_value(); });
  EXPECT_EQ(after.get_future().wait_for(10s), std::future_status::ready);
  EXPECT_EQ(loop.shutdown([] {}), 0);
}

TEST(LoopTest, PostIsRefusedOnceShutdownHasBegunAndQueuedTasksStillRun) {
  Loop loop;
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) loop.post([&] { ran++; });
  EXPECT_EQ(loop.shutdown([] {}), 0);
  EXPECT_EQ(ran.load(), 10);
  EXPECT_FALSE(loop.post([&] { ran++; }));
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace lockwatch::detail
