// The I/O thread's task queue, and the reconnects and command timeouts
// every store connection runs on it.
#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
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

// Loop::at_turn_end: on the loop, a task runs once the turn's events are
// handled, the turn's tasks newest first, and before the loop sleeps
// (also when asked for from a timer); elsewhere, and in the shutdown's
// last turn, at once.
TEST(LoopTest, TurnEndTasksRunAfterTheTurnNewestFirst) {
  Loop loop;
  std::vector<std::string> order;  // the loop thread's until `done`
  std::promise<void> done;
  loop.post([&] {
    for (int i = 0; i < 3; ++i) Loop::at_turn_end([&order, i] { order.push_back("end" + std::to_string(i)); });
    order.push_back("task");
  });
  loop.post([&] { order.push_back("next task"); });
  loop.post([&] { Loop::at_turn_end([&] { done.set_value(); }); });
  ASSERT_EQ(done.get_future().wait_for(10s), std::future_status::ready);
  std::promise<void> next_turn;  // the turn's end has run whole by then
  loop.post([&] { next_turn.set_value(); });
  ASSERT_EQ(next_turn.get_future().wait_for(10s), std::future_status::ready);
  // The posts may come in one turn or several: the turn's tasks follow it.
  ASSERT_GE(order.size(), 5u);
  EXPECT_EQ(order[0], "task");
  auto end2 = std::find(order.begin(), order.end(), "end2");
  ASSERT_NE(end2, order.end());
  ASSERT_LE(end2 + 3, order.end());
  EXPECT_EQ(*(end2 + 1), "end1");
  EXPECT_EQ(*(end2 + 2), "end0");

  // From a timer: run before the loop sleeps again (the next timer is far).
  std::promise<void> from_timer;
  uv_timer_t timer{}, far{};
  loop.post([&] {
    uv_timer_init(loop.uv(), &timer);
    uv_timer_init(loop.uv(), &far);
    timer.data = &from_timer;
    uv_timer_start(&far, [](uv_timer_t*) {}, 60'000, 0);
    uv_timer_start(&timer, [](uv_timer_t* t) {
      Loop::at_turn_end([p = static_cast<std::promise<void>*>(t->data)] { p->set_value(); });
    }, 1, 0);
  });
  EXPECT_EQ(from_timer.get_future().wait_for(10s), std::future_status::ready);

  // Off the loop: at once.
  bool ran = false;
  Loop::at_turn_end([&] { ran = true; });
  EXPECT_TRUE(ran);

  // Asked for as the loop shuts down: still run, before shutdown() returns.
  int at_close = 0;
  EXPECT_EQ(loop.shutdown([&] {
    uv_close(reinterpret_cast<uv_handle_t*>(&timer), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&far), nullptr);
    Loop::at_turn_end([&] { ++at_close; });
  }), 0);
  EXPECT_EQ(at_close, 1);
}

// A slow turn-end task delays the loop's timers by no more than it took:
// libuv times its next poll from a clock reading taken before the task
// ran, so without a fresh reading a 500 ms timer due while a 550 ms task
// runs would fire 500 ms after the task (at about 1,050 ms), not at once
// (at about 550 ms).
TEST(LoopTest, ASlowTurnEndTaskLeavesTheTimersOnTime) {
  Loop loop;
  using Clock = std::chrono::steady_clock;
  uv_timer_t timer{};
  std::promise<Clock::duration> fired;
  Clock::time_point armed;
  loop.post([&] {
    uv_timer_init(loop.uv(), &timer);
    timer.data = &fired;
    armed = Clock::now();
    uv_timer_start(&timer, [](uv_timer_t* t) {
      auto* p = static_cast<std::promise<Clock::duration>*>(t->data);
      p->set_value(Clock::now().time_since_epoch());
    }, 500, 0);
    // The slow work under test (a stand-in for a task that takes long).
    Loop::at_turn_end([] { std::this_thread::sleep_for(550ms); });
  });
  auto f = fired.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  const auto after = Clock::time_point(f.get()) - armed;
  EXPECT_GE(after, 500ms);
  EXPECT_LT(after, 900ms) << "fired " << std::chrono::duration_cast<std::chrono::milliseconds>(after).count()
                          << " ms after it was armed";
  EXPECT_EQ(loop.shutdown([&] { uv_close(reinterpret_cast<uv_handle_t*>(&timer), nullptr); }), 0);
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
