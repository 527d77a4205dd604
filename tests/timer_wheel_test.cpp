// Tests of lockwatch::TimerWheel. Most drive a fake clock, so that every
// expectation about when a task runs is exact; one checks the real clock.
#include "lockwatch/timer_wheel.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

namespace lockwatch {
namespace {

using namespace std::chrono_literals;
using Clock = TimerWheel::Clock;

// The fake clock: nanoseconds since the steady clock's epoch. Atomic because
// producer threads read it while the owner moves it.
std::atomic<std::int64_t> g_fake_ns{0};

Clock::time_point fake_now() noexcept {
  return Clock::time_point(std::chrono::nanoseconds(g_fake_ns.load(std::memory_order_relaxed)));
}

// Records every run: how often and at what fake time.
class RecordingTask final : public TimerTask {
 public:
  void run(Timeout timeout) noexcept override {
    runs.fetch_add(1, std::memory_order_relaxed);
    last_run_ns = g_fake_ns.load(std::memory_order_relaxed);
    last_timeout = timeout;
  }
  std::atomic<int> runs{0};
  std::int64_t last_run_ns = -1;
  Timeout last_timeout;
};

class TimerWheelTest : public ::testing::Test {
 protected:
  static constexpr std::int64_t kStart = 1'000'000'000;

  void SetUp() override { g_fake_ns.store(kStart); }

  static TimerWheelOptions options(std::chrono::nanoseconds tick = 1ms, std::size_t size = 512) {
    TimerWheelOptions o;
    o.tick = tick;
    o.wheel_size = size;
    return o;
  }

  // Moves the fake clock to kStart + t and advances the wheel there.
  static std::size_t advance_to(TimerWheel& wheel, std::chrono::nanoseconds t) {
    g_fake_ns.store(kStart + t.count());
    return wheel.advance();
  }

  static std::int64_t at(std::chrono::nanoseconds t) { return kStart + t.count(); }
};

TEST_F(TimerWheelTest, TasksRunInDeadlineOrderAtTheFirstTickAfterTheirDeadline) {
  TimerWheel wheel(options(1ms), fake_now);
  wheel.bind_to_current_thread();
  std::vector<int> order;
  std::vector<std::int64_t> when;
  for (int ms : {30, 10, 20, 1}) {
    wheel.new_timeout(
        [&order, &when, ms](Timeout) {
          order.push_back(ms);
          when.push_back(g_fake_ns.load());
        },
        std::chrono::milliseconds(ms));
  }
  for (int ms = 0; ms <= 40; ++ms) advance_to(wheel, std::chrono::milliseconds(ms));
  EXPECT_EQ(order, (std::vector<int>{1, 10, 20, 30}));
  EXPECT_EQ(when, (std::vector<std::int64_t>{at(1ms), at(10ms), at(20ms), at(30ms)}));
}

TEST_F(TimerWheelTest, NeverRunsBeforeTheDeadlineWithinATick) {
  TimerWheel wheel(options(5ms), fake_now);
  wheel.bind_to_current_thread();
  RecordingTask task;
  wheel.new_timeout(task, 7ms);
  EXPECT_EQ(advance_to(wheel, 5ms), 0u);
  EXPECT_EQ(advance_to(wheel, 9999us), 0u);  // past the deadline, before its tick boundary
  EXPECT_EQ(task.runs, 0);
  EXPECT_EQ(advance_to(wheel, 10ms), 1u);
  EXPECT_EQ(task.runs, 1);
  EXPECT_EQ(task.last_run_ns, at(10ms));
}

TEST_F(TimerWheelTest, TickTimeIsTheTickOnWhichADeadlineExpires) {
  TimerWheel wheel(options(5ms), fake_now);
  wheel.bind_to_current_thread();
  EXPECT_EQ(wheel.tick_time(Clock::time_point(std::chrono::nanoseconds(at(7ms)))),
            Clock::time_point(std::chrono::nanoseconds(at(10ms))));
  EXPECT_EQ(wheel.tick_time(Clock::time_point(std::chrono::nanoseconds(at(10ms)))),
            Clock::time_point(std::chrono::nanoseconds(at(10ms))));
  EXPECT_EQ(wheel.tick_time(Clock::time_point(std::chrono::nanoseconds(at(10ms) + 1))),
            Clock::time_point(std::chrono::nanoseconds(at(15ms))));
  EXPECT_EQ(wheel.tick_time(Clock::time_point(std::chrono::nanoseconds(kStart - 1000))),
            Clock::time_point(std::chrono::nanoseconds(kStart)));
  // And a timeout at that deadline does fire on that tick, not before.
  RecordingTask task;
  wheel.new_timeout_at(task, Clock::time_point(std::chrono::nanoseconds(at(7ms))));
  EXPECT_EQ(advance_to(wheel, 9999us), 0u);
  EXPECT_EQ(advance_to(wheel, 10ms), 1u);
}

TEST_F(TimerWheelTest, TimeoutsBeyondOneRevolutionWaitForTheirRound) {
  TimerWheel wheel(options(1ms, 8), fake_now);  // one revolution = 8 ms
  wheel.bind_to_current_thread();
  RecordingTask near, far, farther;
  wheel.new_timeout(near, 4ms);      // bucket 4, round 0
  wheel.new_timeout(far, 20ms);      // bucket 4, round 2
  wheel.new_timeout(farther, 100ms);  // bucket 4, round 12
  for (int ms = 1; ms <= 100; ++ms) {
    advance_to(wheel, std::chrono::milliseconds(ms));
    EXPECT_EQ(near.runs, ms >= 4 ? 1 : 0) << ms;
    EXPECT_EQ(far.runs, ms >= 20 ? 1 : 0) << ms;
    EXPECT_EQ(farther.runs, ms >= 100 ? 1 : 0) << ms;
  }
  EXPECT_EQ(far.last_run_ns, at(20ms));
  EXPECT_EQ(farther.last_run_ns, at(100ms));
}

TEST_F(TimerWheelTest, OneAdvanceOverManyRevolutionsRunsOnlyWhatIsDue) {
  TimerWheel wheel(options(1ms, 16), fake_now);
  wheel.bind_to_current_thread();
  std::vector<RecordingTask> tasks(200);
  for (int i = 0; i < 200; ++i) wheel.new_timeout(tasks[i], std::chrono::milliseconds(i + 1));
  EXPECT_EQ(advance_to(wheel, 150ms), 150u);  // about nine revolutions at once
  for (int i = 0; i < 200; ++i) EXPECT_EQ(tasks[i].runs, i < 150 ? 1 : 0) << i;
  EXPECT_EQ(wheel.pending(), 50u);
  EXPECT_EQ(advance_to(wheel, 200ms), 50u);
  EXPECT_EQ(wheel.pending(), 0u);
}

TEST_F(TimerWheelTest, CancelBeforeExpiryNeverRuns) {
  TimerWheel wheel(options(), fake_now);
  wheel.bind_to_current_thread();
  RecordingTask task;
  Timeout timeout = wheel.new_timeout(task, 10ms);
  EXPECT_TRUE(timeout.is_pending());
  EXPECT_EQ(wheel.pending(), 1u);
  EXPECT_TRUE(timeout.cancel());
  EXPECT_FALSE(timeout.cancel());
  EXPECT_TRUE(timeout.is_cancelled());
  EXPECT_FALSE(timeout.is_pending());
  EXPECT_FALSE(timeout.is_expired());
  EXPECT_EQ(wheel.pending(), 0u);
  EXPECT_EQ(advance_to(wheel, 1s), 0u);
  EXPECT_EQ(task.runs, 0);
  EXPECT_EQ(wheel.next_expiry_in(), std::nullopt);
}

TEST_F(TimerWheelTest, CancelAfterExpiryReturnsFalse) {
  TimerWheel wheel(options(), fake_now);
  wheel.bind_to_current_thread();
  RecordingTask task;
  Timeout timeout = wheel.new_timeout(task, 3ms);
  advance_to(wheel, 3ms);
  ASSERT_EQ(task.runs, 1);
  EXPECT_TRUE(timeout.is_expired());
  EXPECT_FALSE(timeout.cancel());
  EXPECT_TRUE(timeout.is_expired());
  EXPECT_FALSE(timeout.is_cancelled());
}

TEST_F(TimerWheelTest, CancelFromInsideItsOwnTaskReturnsFalse) {
  TimerWheel wheel(options(), fake_now);
  wheel.bind_to_current_thread();
  bool cancel_result = true;
  bool expired_inside = false;
  wheel.new_timeout(
      [&](Timeout self) {
        expired_inside = self.is_expired();
        cancel_result = self.cancel();
      },
      1ms);
  advance_to(wheel, 1ms);
  EXPECT_TRUE(expired_inside);
  EXPECT_FALSE(cancel_result);
}

TEST_F(TimerWheelTest, StaleHandleAfterRecyclingIsInert) {
  TimerWheel wheel(options(), fake_now);
  wheel.bind_to_current_thread();
  RecordingTask old_task;
  Timeout stale = wheel.new_timeout(old_task, 1ms);
  ASSERT_TRUE(stale.cancel());
  // The node is free again; schedule enough that it is certainly reused.
  std::vector<RecordingTask> tasks(64);
  std::vector<Timeout> fresh;
  for (auto& t : tasks) fresh.push_back(wheel.new_timeout(t, 5ms));
  EXPECT_FALSE(stale.cancel());
  EXPECT_FALSE(stale.is_pending());
  EXPECT_FALSE(stale.is_cancelled());  // reused: the handle no longer knows
  EXPECT_FALSE(stale.is_expired());
  EXPECT_TRUE(static_cast<bool>(stale));
  for (const Timeout& t : fresh) EXPECT_TRUE(t.is_pending());
  EXPECT_EQ(advance_to(wheel, 5ms), 64u);
  for (const auto& t : tasks) EXPECT_EQ(t.runs, 1);
  EXPECT_EQ(old_task.runs, 0);
}

TEST_F(TimerWheelTest, EmptyHandleDoesNothing) {
  Timeout empty;
  EXPECT_FALSE(static_cast<bool>(empty));
  EXPECT_FALSE(empty.cancel());
  EXPECT_FALSE(empty.is_pending());
  EXPECT_FALSE(empty.is_cancelled());
  EXPECT_FALSE(empty.is_expired());
  static_assert(sizeof(Timeout) == 16);
}

// Re-arms itself every period from inside run(), like a lease renewal.
class PeriodicTask final : public TimerTask {
 public:
  PeriodicTask(TimerWheel& wheel, std::chrono::nanoseconds period) : wheel_(wheel), period_(period) {}
  void run(Timeout) noexcept override {
    runs.push_back(g_fake_ns.load());
    next = wheel_.new_timeout(*this, period_);
  }
  std::vector<std::int64_t> runs;
  Timeout next;

 private:
  TimerWheel& wheel_;
  std::chrono::nanoseconds period_;
};

TEST_F(TimerWheelTest, TaskThatReArmsItselfKeepsItsPeriod) {
  TimerWheel wheel(options(1ms), fake_now);
  wheel.bind_to_current_thread();
  PeriodicTask task(wheel, 10ms);
  task.next = wheel.new_timeout(task, 10ms);
  for (int ms = 1; ms <= 100; ++ms) advance_to(wheel, std::chrono::milliseconds(ms));
  ASSERT_EQ(task.runs.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(task.runs[i], at(std::chrono::milliseconds(10 * (i + 1))));
  EXPECT_TRUE(task.next.is_pending());
  EXPECT_TRUE(task.next.cancel());
  EXPECT_EQ(wheel.pending(), 0u);
}

TEST_F(TimerWheelTest, TaskMayCancelAnotherDueInTheSameAdvance) {
  TimerWheel wheel(options(1ms), fake_now);
  wheel.bind_to_current_thread();
  Timeout first, second;
  int ran = 0;
  bool cancelled_other = false;
  // Whichever runs first cancels the other.
  first = wheel.new_timeout([&](Timeout) { ++ran, cancelled_other = second.cancel(); }, 2ms);
  second = wheel.new_timeout([&](Timeout) { ++ran, cancelled_other = first.cancel(); }, 2ms);
  EXPECT_EQ(advance_to(wheel, 2ms), 1u);
  EXPECT_EQ(ran, 1);
  EXPECT_TRUE(cancelled_other);
  EXPECT_EQ(wheel.pending(), 0u);
}

TEST_F(TimerWheelTest, ZeroDelayRunsAtTheNextAdvanceEvenWithoutTimePassing) {
  TimerWheel wheel(options(5ms), fake_now);
  wheel.bind_to_current_thread();
  advance_to(wheel, 2ms);  // mid-tick
  int outer = 0, inner = 0;
  wheel.new_timeout(
      [&](Timeout) {
        ++outer;
        // Scheduled from a task: waits for the next advance, so a task that
        // re-arms with zero delay cannot spin inside one advance().
        wheel.new_timeout([&](Timeout) { ++inner; }, 0ns);
      },
      0ns);
  EXPECT_EQ(wheel.next_expiry_in(), std::chrono::nanoseconds(0));
  EXPECT_EQ(wheel.advance(), 1u);
  EXPECT_EQ(outer, 1);
  EXPECT_EQ(inner, 0);
  EXPECT_EQ(wheel.advance(), 1u);
  EXPECT_EQ(inner, 1);
}

TEST_F(TimerWheelTest, PastDeadlineRunsAtTheNextAdvance) {
  TimerWheel wheel(options(5ms), fake_now);
  wheel.bind_to_current_thread();
  advance_to(wheel, 50ms);
  RecordingTask task;
  wheel.new_timeout_at(task, fake_now() - 20ms);
  EXPECT_EQ(wheel.advance(), 1u);
  EXPECT_EQ(task.runs, 1);
}

TEST_F(TimerWheelTest, HugeDelaysSaturateInsteadOfOverflowing) {
  TimerWheel wheel(options(1ms, 8), fake_now);
  wheel.bind_to_current_thread();
  RecordingTask never, at_max, now;
  Timeout a = wheel.new_timeout(never, std::chrono::nanoseconds::max());
  Timeout b = wheel.new_timeout_at(at_max, Clock::time_point::max());
  wheel.new_timeout(now, std::chrono::nanoseconds::min());  // runs at the next advance
  wheel.new_timeout_at(now, Clock::time_point::min());
  EXPECT_EQ(advance_to(wheel, 1h), 2u);
  EXPECT_EQ(now.runs, 2);
  EXPECT_EQ(never.runs, 0);
  EXPECT_EQ(at_max.runs, 0);
  // A lower bound: the far ring only knows the epoch modulo its size.
  auto next = wheel.next_expiry_in();
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(*next, 0ns);
  EXPECT_EQ(advance_to(wheel, 1h + *next), 0u);
  EXPECT_TRUE(a.cancel());
  EXPECT_TRUE(b.cancel());
  EXPECT_EQ(wheel.pending(), 0u);
}

TEST_F(TimerWheelTest, OwnerDelaysCountFromTheLastAdvance) {
  TimerWheel wheel(options(1ms), fake_now);
  wheel.bind_to_current_thread();
  advance_to(wheel, 10ms);
  g_fake_ns.store(at(13ms));  // the clock moved, the wheel has not been advanced
  RecordingTask task;
  wheel.new_timeout(task, 5ms);
  advance_to(wheel, 15ms);
  EXPECT_EQ(task.runs, 1);  // 10 + 5, not 13 + 5
}

TEST_F(TimerWheelTest, OtherThreadDelaysCountFromTheClock) {
  TimerWheel wheel(options(1ms), fake_now);
  wheel.bind_to_current_thread();
  advance_to(wheel, 10ms);
  g_fake_ns.store(at(13ms));
  RecordingTask task;
  std::thread([&] { wheel.new_timeout(task, 5ms); }).join();
  EXPECT_EQ(advance_to(wheel, 17ms), 0u);
  EXPECT_EQ(advance_to(wheel, 18ms), 1u);
  EXPECT_EQ(task.runs, 1);
}

TEST_F(TimerWheelTest, NextExpiryInPointsAtTheNearestOccupiedTick) {
  TimerWheel wheel(options(5ms), fake_now);
  wheel.bind_to_current_thread();
  EXPECT_EQ(wheel.next_expiry_in(), std::nullopt);
  RecordingTask task;
  Timeout far = wheel.new_timeout(task, 23ms);  // tick boundary at 25 ms
  EXPECT_EQ(wheel.next_expiry_in(), std::chrono::nanoseconds(25ms));
  g_fake_ns.store(at(7ms));
  EXPECT_EQ(wheel.next_expiry_in(), std::chrono::nanoseconds(18ms));
  ASSERT_TRUE(far.cancel());
  EXPECT_EQ(wheel.next_expiry_in(), std::nullopt);
  // Scheduled elsewhere: still a lower bound before the owner drained it.
  std::thread([&] { wheel.new_timeout(task, 40ms); }).join();
  auto next = wheel.next_expiry_in();
  ASSERT_TRUE(next.has_value());
  EXPECT_LE(*next, 40ms);
}

TEST_F(TimerWheelTest, FunctionOverloadDestroysItsFunctionOnceDone) {
  TimerWheel wheel(options(), fake_now);
  wheel.bind_to_current_thread();
  auto token = std::make_shared<int>(0);
  int ran = 0;
  wheel.new_timeout([token, &ran](Timeout) { ++ran; }, 1ms);
  Timeout cancelled = wheel.new_timeout([token, &ran](Timeout) { ++ran; }, 1ms);
  EXPECT_EQ(token.use_count(), 3);
  EXPECT_TRUE(cancelled.cancel());
  EXPECT_EQ(token.use_count(), 2);  // cancelled on the owner: destroyed at once
  advance_to(wheel, 1ms);
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(token.use_count(), 1);
  EXPECT_THROW(wheel.new_timeout(std::function<void(Timeout)>(), 1ms), std::invalid_argument);
}

// Random schedules, cancels and jumps of the clock, checked against a plain
// model of the contract: a timeout runs at the first advance() that reaches
// the tick boundary at or after its deadline, and next_expiry_in() is never
// later than that boundary. A small wheel makes both rings and rounds busy.
TEST_F(TimerWheelTest, RandomScheduleCancelAndAdvanceMatchAModel) {
  constexpr std::int64_t kTick = 1'000'000;
  TimerWheel wheel(options(std::chrono::nanoseconds(kTick), 8), fake_now);
  wheel.bind_to_current_thread();

  struct Entry final : TimerTask {
    void run(Timeout) noexcept override { ran_at = g_fake_ns.load() - kStart; }
    Timeout handle;
    std::int64_t due = 0;  // relative time of the advance that must run it
    std::int64_t ran_at = -1;
    bool cancelled = false;
    bool immediate = false;
  };
  std::vector<std::unique_ptr<Entry>> entries;
  std::mt19937_64 rng(7);
  std::int64_t now = 0;   // relative fake time of the last advance
  std::int64_t ticked = 0;  // last tick boundary reached by an advance
  int mismatches = 0, late_hints = 0;
  for (int op = 0; op < 30'000; ++op) {
    const unsigned what = rng() % 10;
    if (what < 5) {
      auto e = std::make_unique<Entry>();
      const std::int64_t delay = static_cast<std::int64_t>(rng() % 200'000'000) - 2'000'000;
      e->immediate = delay <= 0;
      const std::int64_t deadline = now + delay;
      e->due = (deadline + kTick - 1) / kTick * kTick;  // the boundary it waits for
      e->handle = wheel.new_timeout(*e, std::chrono::nanoseconds(delay));
      entries.push_back(std::move(e));
    } else if (what < 7 && !entries.empty()) {
      Entry& e = *entries[rng() % entries.size()];
      const bool expect = !e.cancelled && e.ran_at < 0;
      if (e.handle.cancel() != expect) ++mismatches;
      if (expect) e.cancelled = true;
    } else {
      // Mostly small steps, sometimes a jump over several revolutions.
      now += rng() % 10 == 0 ? static_cast<std::int64_t>(rng() % 100'000'000)
                              : static_cast<std::int64_t>(rng() % 3'000'000);
      g_fake_ns.store(kStart + now);
      const std::int64_t before = ticked;
      ticked = now / kTick * kTick;
      wheel.advance();
      for (auto& e : entries) {
        if (e->cancelled) {
          mismatches += e->ran_at >= 0;
          continue;
        }
        const bool should_have_run = e->immediate || e->due <= ticked;
        const bool ran = e->ran_at >= 0;
        if (ran != should_have_run) ++mismatches;
        if (ran && !e->immediate && e->due <= before) ++mismatches;  // should have run earlier
      }
      std::erase_if(entries, [](const auto& e) { return e->cancelled || e->ran_at >= 0; });
      for (auto& e : entries) e->immediate = false;  // the next advance is past them
      std::int64_t earliest = -1;
      for (auto& e : entries) earliest = earliest < 0 ? e->due : std::min(earliest, e->due);
      const auto hint = wheel.next_expiry_in();
      if (earliest < 0 ? hint.has_value() : !hint || hint->count() > std::max<std::int64_t>(0, earliest - now)) {
        ++late_hints;
      }
      if (wheel.pending() != entries.size()) ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(late_hints, 0);
}

// One task per timeout: counts its runs and checks it was not early against
// the time of the advance running it (a plain copy: this test has one thread,
// and it keeps the test quick under ThreadSanitizer).
std::int64_t g_advanced_to = 0;
class DeadlineTask final : public TimerTask {
 public:
  void run(Timeout) noexcept override {
    ++runs;
    early += g_advanced_to < deadline;
  }
  std::int64_t deadline = 0;
  int runs = 0;
  int early = 0;
};

TEST_F(TimerWheelTest, AMillionTimeoutsAllFireExactlyOnce) {
  constexpr int kCount = 1'000'000;
  // 4096 x 5 ms: a third of the timeouts pass through the far ring, the rest
  // are visited once, which keeps this quick under ThreadSanitizer.
  TimerWheel wheel(options(5ms, 4096), fake_now);
  wheel.bind_to_current_thread();
  std::vector<DeadlineTask> tasks(kCount);
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<std::int64_t> delay_ns(0, 30'000'000'000);
  for (auto& t : tasks) {
    const std::int64_t d = delay_ns(rng);
    t.deadline = kStart + d;
    wheel.new_timeout(t, std::chrono::nanoseconds(d));
  }
  EXPECT_EQ(wheel.pending(), static_cast<std::size_t>(kCount));
  std::size_t ran = 0;
  for (auto t = 0ms; t <= 30'100ms; t += 37ms) {  // not tick-aligned
    g_advanced_to = kStart + std::chrono::nanoseconds(t).count();
    ran += advance_to(wheel, t);
  }
  EXPECT_EQ(ran, static_cast<std::size_t>(kCount));
  EXPECT_EQ(wheel.pending(), 0u);
  int wrong = 0, early = 0;
  for (const auto& t : tasks) {
    wrong += t.runs != 1;
    early += t.early;
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(early, 0);
}

// Producers schedule and cancel from their own threads while the owner
// advances a fake clock; every timeout must run exactly when not cancelled.
TEST_F(TimerWheelTest, OtherThreadsScheduleAndCancelWhileTheOwnerAdvances) {
  constexpr int kProducers = 3;
  constexpr int kPerProducer = 20'000;
  constexpr int kOwnerTimeouts = 2'000;
  TimerWheel wheel(options(1ms, 64), fake_now);
  wheel.bind_to_current_thread();

  struct Slot {
    RecordingTask task;
    bool cancelled = false;  // cancel() returned true
  };
  std::vector<std::vector<Slot>> slots(kProducers);
  for (auto& s : slots) s = std::vector<Slot>(kPerProducer);

  // Owner-scheduled timeouts that a producer cancels from its thread; an hour
  // away, which the ticking below never reaches.
  std::vector<RecordingTask> owner_tasks(kOwnerTimeouts);
  std::vector<Timeout> owner_handles;
  for (auto& t : owner_tasks) owner_handles.push_back(wheel.new_timeout(t, 1h));
  std::vector<bool> owner_cancelled(kOwnerTimeouts, false);

  std::atomic<int> done{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      std::mt19937 rng(p);
      std::vector<Timeout> handles(kPerProducer);
      for (int i = 0; i < kPerProducer; ++i) {
        handles[i] = wheel.new_timeout(slots[p][i].task, std::chrono::microseconds(rng() % 20'000));
        // Cancel an earlier one: it may have run, be pending or be in the mailbox.
        if (i % 2 == 1) {
          const int victim = static_cast<int>(rng() % static_cast<unsigned>(i + 1));
          if (handles[victim].cancel()) slots[p][victim].cancelled = true;
        }
      }
      if (p == 0) {
        for (int i = 0; i < kOwnerTimeouts; i += 2) owner_cancelled[i] = owner_handles[i].cancel();
      }
      done.fetch_add(1);
    });
  }
  // The owner ticks until the producers are done and all their timeouts ran:
  // 100 ms of fake time after the end covers every delay (< 20 ms).
  std::int64_t t = 0;
  int after_done = 0;
  for (int step = 0; step < 10'000'000 && after_done < 1'000; ++step) {
    t += 100'000;  // 0.1 ms of fake time per step
    g_fake_ns.store(kStart + t);
    wheel.advance();
    if (done.load() == kProducers) ++after_done;
  }
  for (auto& th : producers) th.join();
  wheel.advance();
  EXPECT_EQ(done.load(), kProducers);
  EXPECT_EQ(wheel.pending(), static_cast<std::size_t>(kOwnerTimeouts / 2));
  EXPECT_EQ(advance_to(wheel, 2h), static_cast<std::size_t>(kOwnerTimeouts / 2));
  EXPECT_EQ(wheel.pending(), 0u);

  int wrong = 0, cancelled = 0;
  for (auto& per : slots) {
    for (auto& s : per) {
      cancelled += s.cancelled;
      wrong += s.task.runs.load() != (s.cancelled ? 0 : 1);
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(cancelled, 0);
  for (int i = 0; i < kOwnerTimeouts; ++i) {
    EXPECT_EQ(owner_tasks[i].runs.load(), owner_cancelled[i] ? 0 : 1) << i;
    EXPECT_EQ(owner_cancelled[i], i % 2 == 0) << i;
  }
}

TEST_F(TimerWheelTest, StopCountsTimeoutsThatNeverRanAndRefusesNewOnes) {
  TimerWheel wheel(options(), fake_now);
  wheel.bind_to_current_thread();
  std::vector<RecordingTask> tasks(5);
  std::vector<Timeout> handles;
  for (auto& t : tasks) handles.push_back(wheel.new_timeout(t, 10ms));
  RecordingTask fired;
  wheel.new_timeout(fired, 1ms);
  ASSERT_TRUE(handles[0].cancel());
  advance_to(wheel, 1ms);
  ASSERT_EQ(fired.runs, 1);
  auto token = std::make_shared<int>(0);
  wheel.new_timeout([token](Timeout) {}, 10ms);
  RecordingTask from_elsewhere;
  std::thread([&] { wheel.new_timeout(from_elsewhere, 10ms); }).join();  // still in the mailbox

  EXPECT_EQ(wheel.stop(), 6u);  // four tasks, the function, the mailbox one
  EXPECT_EQ(token.use_count(), 1);
  EXPECT_EQ(wheel.stop(), 0u);
  for (std::size_t i = 1; i < handles.size(); ++i) {
    EXPECT_TRUE(handles[i].is_cancelled());
    EXPECT_FALSE(handles[i].cancel());
  }
  EXPECT_THROW(wheel.new_timeout(tasks[0], 1ms), std::logic_error);
  bool threw = false;
  std::thread([&] {
    try {
      wheel.new_timeout(tasks[0], 1ms);
    } catch (const std::logic_error&) {
      threw = true;
    }
  }).join();
  EXPECT_TRUE(threw);
  EXPECT_EQ(advance_to(wheel, 1s), 0u);
  for (const auto& t : tasks) EXPECT_EQ(t.runs, 0);
  EXPECT_EQ(from_elsewhere.runs, 0);
  EXPECT_EQ(wheel.pending(), 0u);
  EXPECT_EQ(wheel.next_expiry_in(), std::nullopt);
}

TEST_F(TimerWheelTest, StopFromATaskEndsTheAdvance) {
  TimerWheel wheel(options(), fake_now);
  wheel.bind_to_current_thread();
  std::size_t stopped = 0;
  int ran = 0;
  for (int i = 0; i < 10; ++i) {
    wheel.new_timeout(
        [&](Timeout) {
          ++ran;
          stopped = wheel.stop();
        },
        1ms);
  }
  EXPECT_EQ(advance_to(wheel, 1ms), 1u);
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(stopped, 9u);
}

TEST_F(TimerWheelTest, DestructionRunsNoTaskAndFreesOwnedFunctions) {
  auto token = std::make_shared<int>(0);
  RecordingTask task;
  {
    TimerWheel wheel(options(), fake_now);
    wheel.bind_to_current_thread();
    wheel.new_timeout(task, 1ms);
    wheel.new_timeout([token](Timeout) {}, 1ms);
    g_fake_ns.store(at(1s));
  }
  EXPECT_EQ(task.runs, 0);
  EXPECT_EQ(token.use_count(), 1);
}

// A task that carries its own timeout; it re-arms itself `period` later
// while `rearm` is set.
class LinkedTask final : public LinkedTimerTask {
 public:
  void run(Timeout timeout) noexcept override {
    ran_at.push_back(g_fake_ns.load(std::memory_order_relaxed));
    empty_handle = empty_handle && !timeout;
    if (rearm && wheel != nullptr) wheel->schedule(*this, fake_now() + period);
  }
  std::vector<std::int64_t> ran_at;
  bool empty_handle = true;
  bool rearm = false;
  TimerWheel* wheel = nullptr;
  std::chrono::nanoseconds period{0};
};

TEST_F(TimerWheelTest, ALinkedTaskRunsOnItsTickAndMovesWhenScheduledAgain) {
  TimerWheel wheel(options(1ms, 8), fake_now);  // one epoch: 8 ms
  wheel.bind_to_current_thread();
  LinkedTask near, far, moved;
  wheel.schedule(near, fake_now() + 3ms);
  wheel.schedule(far, fake_now() + 50ms);  // several epochs away: the far ring
  wheel.schedule(moved, fake_now() + 5ms);
  wheel.schedule(moved, fake_now() + 20ms);  // moved: one timeout, not two
  EXPECT_TRUE(near.is_pending());
  EXPECT_EQ(wheel.pending(), 3u);
  for (int ms = 0; ms <= 60; ++ms) advance_to(wheel, std::chrono::milliseconds(ms));
  EXPECT_EQ(near.ran_at, (std::vector<std::int64_t>{at(3ms)}));
  EXPECT_EQ(moved.ran_at, (std::vector<std::int64_t>{at(20ms)}));
  EXPECT_EQ(far.ran_at, (std::vector<std::int64_t>{at(50ms)}));
  EXPECT_TRUE(near.empty_handle && far.empty_handle && moved.empty_handle);
  EXPECT_FALSE(near.is_pending());
  EXPECT_EQ(wheel.pending(), 0u);
}

TEST_F(TimerWheelTest, ALinkedTaskCancelledNeverRunsAndMayReArmItself) {
  TimerWheel wheel(options(1ms, 16), fake_now);
  wheel.bind_to_current_thread();
  LinkedTask cancelled, periodic;
  wheel.schedule(cancelled, fake_now() + 2ms);
  EXPECT_TRUE(wheel.cancel(cancelled));
  EXPECT_FALSE(wheel.cancel(cancelled));
  EXPECT_FALSE(cancelled.is_pending());
  periodic.rearm = true;
  periodic.wheel = &wheel;
  periodic.period = 7ms;
  wheel.schedule(periodic, fake_now() + 7ms);
  RecordingTask slab;  // a node of the wheel's beside them
  wheel.new_timeout(slab, 10ms);
  for (int ms = 0; ms <= 30; ++ms) advance_to(wheel, std::chrono::milliseconds(ms));
  EXPECT_TRUE(cancelled.ran_at.empty());
  EXPECT_EQ(periodic.ran_at, (std::vector<std::int64_t>{at(7ms), at(14ms), at(21ms), at(28ms)}));
  EXPECT_EQ(slab.runs.load(), 1);
  EXPECT_EQ(wheel.pending(), 1u);  // the periodic one, due at 35 ms
  periodic.rearm = false;
  EXPECT_TRUE(wheel.cancel(periodic));
  EXPECT_EQ(wheel.pending(), 0u);
  EXPECT_FALSE(wheel.next_expiry_in().has_value());
}

TEST_F(TimerWheelTest, StopEndsALinkedTaskAndOtherThreadsCannotScheduleOne) {
  TimerWheel wheel(options(1ms), fake_now);
  wheel.bind_to_current_thread();
  LinkedTask a, b;
  wheel.schedule(a, fake_now() + 5ms);
  bool refused = false;
  std::thread([&] {
    try {
      wheel.schedule(b, fake_now() + 5ms);
    } catch (const std::logic_error&) {
      refused = true;
    }
  }).join();
  EXPECT_TRUE(refused);
  EXPECT_FALSE(b.is_pending());
  EXPECT_EQ(wheel.stop(), 1u);
  EXPECT_FALSE(a.is_pending());
  EXPECT_FALSE(wheel.cancel(a));
  EXPECT_THROW(wheel.schedule(a, fake_now() + 5ms), std::logic_error);
  advance_to(wheel, 10ms);
  EXPECT_TRUE(a.ran_at.empty());
}

TEST_F(TimerWheelTest, BadOptionsThrow) {
  EXPECT_THROW(TimerWheel(options(999us)), std::invalid_argument);
  EXPECT_THROW(TimerWheel(options(0ns)), std::invalid_argument);
  EXPECT_THROW(TimerWheel(options(-1ms)), std::invalid_argument);
  EXPECT_THROW(TimerWheel(options(1ms, 0)), std::invalid_argument);
  EXPECT_THROW(TimerWheel(options(1ms, (std::size_t{1} << 20) + 1)), std::invalid_argument);
  EXPECT_THROW(TimerWheel(options(1ms, SIZE_MAX)), std::invalid_argument);
  EXPECT_NO_THROW(TimerWheel(options(1ms, std::size_t{1} << 20)));
  TimerWheel odd(options(1ms, 300), fake_now);  // rounded up to 512
  EXPECT_EQ(odd.tick(), 1ms);
}

TEST_F(TimerWheelTest, OddWheelSizeIsRoundedUpAndStillExact) {
  TimerWheel wheel(options(1ms, 3), fake_now);  // 4 buckets
  wheel.bind_to_current_thread();
  std::vector<RecordingTask> tasks(12);
  for (int i = 0; i < 12; ++i) wheel.new_timeout(tasks[i], std::chrono::milliseconds(i + 1));
  for (int ms = 1; ms <= 12; ++ms) EXPECT_EQ(advance_to(wheel, std::chrono::milliseconds(ms)), 1u) << ms;
}

TEST_F(TimerWheelTest, MaxPendingRefusesNewTimeoutsUntilOneFinishes) {
  TimerWheelOptions o = options();
  o.max_pending = 3;
  TimerWheel wheel(o, fake_now);
  wheel.bind_to_current_thread();
  RecordingTask task;
  Timeout a = wheel.new_timeout(task, 5ms);
  wheel.new_timeout(task, 5ms);
  wheel.new_timeout(task, 1ms);
  EXPECT_THROW(wheel.new_timeout(task, 5ms), std::length_error);
  bool threw = false;
  std::thread([&] {
    try {
      wheel.new_timeout(task, 5ms);
    } catch (const std::length_error&) {
      threw = true;
    }
  }).join();
  EXPECT_TRUE(threw);
  ASSERT_TRUE(a.cancel());
  EXPECT_NO_THROW(wheel.new_timeout(task, 5ms));
  advance_to(wheel, 1ms);
  EXPECT_NO_THROW(wheel.new_timeout(task, 5ms));
  EXPECT_EQ(wheel.pending(), 3u);
}

// The real clock: whatever the scheduling jitter, no task runs early.
TEST_F(TimerWheelTest, NeverEarlyWithTheRealClock) {
  TimerWheel wheel(options(1ms, 64));
  wheel.bind_to_current_thread();
  struct Task final : TimerTask {
    void run(Timeout) noexcept override {
      ran_at = Clock::now();
      ++runs;
    }
    Clock::time_point not_before;
    Clock::time_point ran_at;
    int runs = 0;
  };
  constexpr int kEach = 40;
  std::vector<Task> owner_tasks(kEach), other_tasks(kEach);
  const Clock::time_point t0 = Clock::now();
  wheel.advance(t0);
  for (int i = 0; i < kEach; ++i) {
    owner_tasks[i].not_before = t0 + std::chrono::microseconds(500 * i);  // counts from advance(t0)
    wheel.new_timeout(owner_tasks[i], std::chrono::microseconds(500 * i));
  }
  std::thread([&] {
    for (int i = 0; i < kEach; ++i) {
      other_tasks[i].not_before = Clock::now() + std::chrono::microseconds(300 * i);
      wheel.new_timeout(other_tasks[i], std::chrono::microseconds(300 * i));
    }
  }).join();
  const Clock::time_point give_up = t0 + 2s;
  while (wheel.pending() > 0 && Clock::now() < give_up) {
    auto next = wheel.next_expiry_in();
    if (next && *next > 0ns) std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(*next, 2ms));
    wheel.advance();
  }
  EXPECT_EQ(wheel.pending(), 0u);
  for (const auto* tasks : {&owner_tasks, &other_tasks}) {
    for (const Task& t : *tasks) {
      EXPECT_EQ(t.runs, 1);
      EXPECT_GE(t.ran_at, t.not_before);
    }
  }
}

}  // namespace
}  // namespace lockwatch
