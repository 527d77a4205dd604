// The I/O thread's task queue.
#include <gtest/gtest.h>
#include <pthread.h>

#include <future>
#include <memory>
#include <stdexcept>
#include <string>
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

TEST(LoopTest, TheLoopThreadIsNamedLwLoop) {
  Loop loop;
  std::promise<std::string> name;
  loop.post([&] {
    char buf[16] = {};
    ::pthread_getname_np(::pthread_self(), buf, sizeof buf);
    name.set_value(buf);
  });
  auto f = name.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(f.get(), "lw-loop");
  EXPECT_EQ(loop.shutdown([] {}), 0);
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

// Options::busy_poll: after a drain the loop polls for the window, so a
// task posted from a task finds it awake; once the window has passed with
// nothing posted, it sleeps again. A loop without the option never polls.
TEST(LoopTest, ABusyPollingLoopStaysAwakeForItsWindowThenSleeps) {
  Loop loop(10ms);
  // A task posted by a task runs within the window unless this thread or
  // the loop lost its core for 10 ms; a few tries make that no failure.
  auto polling_seen_by_next_task = [&loop] {
    for (int attempt = 0; attempt < 20; ++attempt) {
      auto seen = std::make_shared<std::promise<bool>>();
      auto f = seen->get_future();
      loop.post([&loop, seen] { loop.post([&loop, seen] { seen->set_value(loop.polling()); }); });
      EXPECT_EQ(f.wait_for(10s), std::future_status::ready);
      if (f.get()) return true;
    }
    return false;
  };
  EXPECT_TRUE(polling_seen_by_next_task());
  // A probe sees what the previous drain left; probes far apart see the
  // window ended. Bounded: 100 probes 30 ms apart.
  bool slept = false;
  for (int probe = 0; probe < 100 && !slept; ++probe) {
    std::this_thread::sleep_for(30ms);  // lets the window pass: time is what is tested
    std::promise<bool> seen;
    loop.post([&] { seen.set_value(loop.polling()); });
    auto f = seen.get_future();
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
    slept = !f.get();
  }
  EXPECT_TRUE(slept);
  EXPECT_TRUE(polling_seen_by_next_task());
  EXPECT_EQ(loop.shutdown([] {}), 0);  // closes the polling handle too, while it is active
}

TEST(LoopTest, WithoutBusyPollTheLoopNeverPolls) {
  Loop loop;
  std::promise<bool> seen;
  loop.post([&] { loop.post([&] { seen.set_value(loop.polling()); }); });
  auto f = seen.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_FALSE(f.get());
  EXPECT_EQ(loop.shutdown([] {}), 0);
}

}  // namespace
}  // namespace lockwatch::detail
