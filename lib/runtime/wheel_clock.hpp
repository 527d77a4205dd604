// lib/runtime/wheel_clock.hpp: the runtime's timer: a TimerWheel driven by
// one uv timer on the loop.
//
// The uv timer sleeps until the next occupied tick instead of ticking while
// idle (folly's HHWheelTimer does the same). After each advance it runs the
// hook that flushes what the expired timeouts queued (the renewal batch).
//
// Threading: loop thread only, after start(); the wheel is bound to it.
#pragma once

#include <uv.h>

#include <chrono>
#include <cstdint>
#include <functional>

#include "lockwatch/options.hpp"
#include "lockwatch/timer_wheel.hpp"
#include "ops/stats.hpp"

namespace lockwatch::detail {

class Loop;

class WheelClock {
 public:
  using Clock = std::chrono::steady_clock;

  WheelClock(Loop& loop, const Options& options, StatsCounters& stats);
  void start();
  // Runs after every advance of the wheel.
  void after_advance(std::function<void()> hook) { after_advance_ = std::move(hook); }
  // Told how late each wake-up came after it was due (the loop's lag).
  void on_lag(std::function<void(Clock::duration)> hook) { on_lag_ = std::move(hook); }

  // A timeout for `task` at `at`, with the loop woken on its tick.
  Timeout at(TimerTask& task, Clock::time_point at);
  // `task`'s own timeout at `at` (moved there if pending), with the loop
  // woken on its tick; cancel() cancels it.
  void at(LinkedTimerTask& task, Clock::time_point at);
  bool cancel(LinkedTimerTask& task) noexcept { return wheel_.cancel(task); }
  Clock::duration tick() const noexcept { return wheel_.tick(); }
  // How many times the wheel advanced: one "tick" of the runtime's own.
  std::uint64_t advances() const noexcept { return advances_; }
  void close();

 private:
  void arm(Clock::time_point at);
  void on_timer();

  Loop& loop_;
  StatsCounters& stats_;
  TimerWheel wheel_;
  uv_timer_t timer_{};
  Clock::time_point due_ = Clock::time_point::max();  // when timer_ fires
  std::uint64_t advances_ = 0;
  std::function<void()> after_advance_;
  std::function<void(Clock::duration)> on_lag_;
};

}  // namespace lockwatch::detail
