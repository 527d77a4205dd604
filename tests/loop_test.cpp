// The I/O thread's task queue, and the reconnects and command timeouts
// every store connection runs on it.
#include <gtest/gtest.h>
#include <pthread.h>

#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/loop.hpp"
#include "core/reconnector.hpp"

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

// Options::runtime.busy_poll: after a drain the loop polls for the window, so a
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

TEST(AdaptiveSpinTest, GrowsAfterShortSleepsUpToTheWakeCostAndHalvesToNoneWhenWasted) {
  AdaptiveSpin a;
  EXPECT_EQ(a.window(), 0) << "no polling before a short sleep was seen";
  a.slept(a.limit() * 2);  // a long sleep: polling would not have caught it
  EXPECT_EQ(a.window(), 0);
  a.slept(1'000);
  EXPECT_EQ(a.window(), AdaptiveSpin::kStart);
  for (int i = 0; i < 20; ++i) a.slept(1'000);
  EXPECT_EQ(a.window(), a.limit()) << "never longer than a wake-up costs";
  for (int i = 0; i < 200; ++i) a.woke(1'000'000'000);  // a very slow wake-up
  EXPECT_EQ(a.limit(), AdaptiveSpin::kCap);
  for (int i = 0; i < 200; ++i) a.woke(1);
  EXPECT_EQ(a.limit(), AdaptiveSpin::kStart);
  EXPECT_LE(a.window(), AdaptiveSpin::kCap);
  for (int i = 0; i < 20 && a.window() != 0; ++i) a.wasted();
  EXPECT_EQ(a.window(), 0) << "polls that catch nothing back off to none";
}

// Adaptive (busy_poll < 0): with nothing outstanding the loop sleeps after
// every task, however fast tasks come.
TEST(LoopTest, AnAdaptiveLoopWithNothingOutstandingNeverPolls) {
  Loop loop(std::chrono::microseconds(-1));
  for (int i = 0; i < 200; ++i) {
    std::promise<bool> seen;
    loop.post([&] { loop.post([&] { seen.set_value(loop.polling()); }); });
    auto f = seen.get_future();
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
    ASSERT_FALSE(f.get()) << "task " << i;
  }
  EXPECT_EQ(loop.shutdown([] {}), 0);
}

// With a reply outstanding that keeps coming at once, the loop learns to
// poll for it; once nothing is outstanding it stops.
TEST(LoopTest, AnAdaptiveLoopPollsWhileSomethingIsOutstandingThenStops) {
  Loop loop(std::chrono::microseconds(-1));
  std::size_t outstanding = 0;  // loop thread
  std::size_t id = 0;
  std::promise<void> added;
  loop.post([&] {
    id = loop.add_demand([&outstanding] { return outstanding; });
    added.set_value();
  });
  ASSERT_EQ(added.get_future().wait_for(10s), std::future_status::ready);
  // Each round: something becomes outstanding and its answer is posted at
  // once (by the loop itself, so that it comes sooner than any wake-up);
  // bounded by the rounds, not by time.
  bool polled = false;
  for (int round = 0; round < 2000 && !polled; ++round) {
    std::promise<bool> seen;
    loop.post([&] {
      outstanding = 1;
      loop.post([&] {
        outstanding = 0;
        seen.set_value(loop.polling());
      });
    });
    auto f = seen.get_future();
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
    polled = f.get();
  }
  EXPECT_TRUE(polled) << "never polled although the answer always came at once";
  // Nothing outstanding now: the window ends at the next iteration.
  bool stopped = false;
  for (int probe = 0; probe < 100 && !stopped; ++probe) {
    std::promise<bool> seen;
    loop.post([&] { loop.post([&] { seen.set_value(loop.polling()); }); });
    auto f = seen.get_future();
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
    stopped = !f.get();
  }
  EXPECT_TRUE(stopped);
  std::promise<void> removed;
  loop.post([&] {
    loop.remove_demand(id);
    removed.set_value();
  });
  ASSERT_EQ(removed.get_future().wait_for(10s), std::future_status::ready);
  EXPECT_EQ(loop.shutdown([] {}), 0);
}

// Runs `f` on the loop thread and waits for it (bounded).
template <class F>
void on_loop(Loop& loop, F f) {
  std::promise<void> done;
  ASSERT_TRUE(loop.post([&] {
    f();
    done.set_value();
  }));
  ASSERT_EQ(done.get_future().wait_for(10s), std::future_status::ready);
}

// Attempts that fail at once until `succeed_from`, then connect.
struct ScriptedAttempts : Reconnector::Attempts {
  Reconnector* rc = nullptr;
  int succeed_from = 0;
  std::vector<std::chrono::steady_clock::time_point> at;
  int timed_out = 0;
  std::promise<void> connected;
  bool hang = false;  // an attempt that never answers
  void attempt() override {
    at.push_back(std::chrono::steady_clock::now());
    if (hang) return;
    if (static_cast<int>(at.size()) < succeed_from) {
      rc->down("refused");
      return;
    }
    rc->connected();
    rc->usable();
    connected.set_value();
  }
  void attempt_timed_out() override {
    ++timed_out;
    rc->down("timed out");
    connected.set_value();
  }
};

TEST(ReconnectorTest, TellsEachTransitionOnceAndDoublesItsBackOff) {
  Loop loop;
  ScriptedAttempts attempts;
  attempts.succeed_from = 5;
  Reconnector rc(loop, Backoff(10ms, 40ms), 5s, attempts);
  attempts.rc = &rc;
  std::vector<std::pair<bool, std::string>> told;  // loop thread only
  rc.set_state_hook([&](bool up, const std::string& why) { told.emplace_back(up, why); });
  on_loop(loop, [&] { rc.start(); });
  ASSERT_EQ(attempts.connected.get_future().wait_for(10s), std::future_status::ready);
  on_loop(loop, [&] {
    ASSERT_EQ(attempts.at.size(), 5u);
    // Back-off 10, 20, 40 and 40 ms (the most) between the attempts.
    const std::chrono::milliseconds gaps[] = {10ms, 20ms, 40ms, 40ms};
    for (std::size_t i = 0; i < 4; ++i) EXPECT_GE(attempts.at[i + 1] - attempts.at[i], gaps[i] - 1ms) << i;
    // Four failures told as one "down", the success as one "up".
    ASSERT_EQ(told.size(), 2u);
    EXPECT_EQ(told[0], std::make_pair(false, std::string("refused")));
    EXPECT_EQ(told[1], std::make_pair(true, std::string()));
    EXPECT_EQ(rc.state(), Reconnector::State::kUp);
    rc.close();
  });
  EXPECT_EQ(loop.shutdown([] {}), 0);
}

TEST(ReconnectorTest, AnAttemptUnansweredPastTheConnectTimeoutIsGivenUp) {
  Loop loop;
  ScriptedAttempts attempts;
  attempts.hang = true;
  Reconnector rc(loop, Backoff(10s, 10s), 30ms, attempts);
  attempts.rc = &rc;
  const auto start = std::chrono::steady_clock::now();
  on_loop(loop, [&] { rc.start(); });
  ASSERT_EQ(attempts.connected.get_future().wait_for(10s), std::future_status::ready);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 29ms);
  on_loop(loop, [&] {
    EXPECT_EQ(attempts.timed_out, 1);
    EXPECT_EQ(rc.state(), Reconnector::State::kDown);
    EXPECT_TRUE(rc.scheduled());
    rc.close();
    EXPECT_TRUE(rc.closed());
  });
  EXPECT_EQ(loop.shutdown([] {}), 0);
}

struct ScriptedRequests : RequestTimer::Requests {
  RequestTimer::Clock::time_point since = RequestTimer::kNone;
  std::vector<RequestTimer::Clock::time_point> overdue_at;
  std::promise<void> fired;
  RequestTimer::Clock::time_point unanswered_since() const override { return since; }
  void overdue() override {
    overdue_at.push_back(RequestTimer::Clock::now());
    since = RequestTimer::kNone;  // the link dropped: nothing in flight
    fired.set_value();
  }
};

TEST(RequestTimerTest, TellsOnceWhenTheOldestRequestWasUnansweredForTheTimeout) {
  Loop loop;
  ScriptedRequests requests;
  RequestTimer timer(loop, 40ms, requests);
  RequestTimer::Clock::time_point written;
  on_loop(loop, [&] {
    timer.start();
    // Queued, not written yet (a busy loop): nothing is overdue.
    requests.since = RequestTimer::kUnwritten;
    timer.watch();
  });
  std::this_thread::sleep_for(60ms);  // longer than the timeout: what is unwritten is never overdue
  on_loop(loop, [&] {
    EXPECT_TRUE(requests.overdue_at.empty());
    written = RequestTimer::Clock::now();
    requests.since = written;
    timer.watch();
  });
  ASSERT_EQ(requests.fired.get_future().wait_for(10s), std::future_status::ready);
  on_loop(loop, [&] {
    ASSERT_EQ(requests.overdue_at.size(), 1u);
    EXPECT_GE(requests.overdue_at[0] - written, 40ms);
    timer.close();
  });
  EXPECT_EQ(loop.shutdown([] {}), 0);
}

}  // namespace
}  // namespace lockwatch::detail
