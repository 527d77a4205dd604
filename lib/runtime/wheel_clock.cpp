#include "runtime/wheel_clock.hpp"

#include "core/loop.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

WheelClock::WheelClock(Loop& loop, const Options& options, StatsCounters& stats)
    : loop_(loop),
      stats_(stats),
      wheel_(TimerWheelOptions{std::chrono::duration_cast<std::chrono::nanoseconds>(options.watchdog.tick),
                               options.watchdog.wheel_size, 0}) {}

void WheelClock::start() {
  wheel_.bind_to_current_thread();
  uv_timer_init(loop_.uv(), &timer_);
  timer_.data = this;
}

Timeout WheelClock::at(TimerTask& task, Clock::time_point at) {
  Timeout t = wheel_.new_timeout_at(task, at);
  arm(wheel_.tick_time(at));
  return t;
}

void WheelClock::at(LinkedTimerTask& task, Clock::time_point at) {
  wheel_.schedule(task, at);
  arm(wheel_.tick_time(at));
}

// `at` is a tick of the wheel (tick_time): waking before it would find
// nothing due.
void WheelClock::arm(Clock::time_point at) {
  if (at >= due_) return;
  auto now = Clock::now();
  // libuv counts whole milliseconds: round up, and never 0 (a timeout due
  // now runs at the next advance anyway).
  auto delay = std::max<std::int64_t>(1, std::chrono::ceil<milliseconds>(at - now).count());
  due_ = now + milliseconds(delay);
  uv_timer_start(
      &timer_, [](uv_timer_t* t) { static_cast<WheelClock*>(t->data)->on_timer(); }, static_cast<uint64_t>(delay),
      0);
}

void WheelClock::on_timer() {
  if (on_lag_) on_lag_(std::max(Clock::duration::zero(), Clock::now() - due_));
  due_ = Clock::time_point::max();
  advances_++;
  stats_.timer_wakeups.fetch_add(1, std::memory_order_relaxed);
  wheel_.advance();
  if (after_advance_) after_advance_();
  // Sleep until the next occupied tick; nothing pending: until a schedule.
  if (auto next = wheel_.next_expiry_in()) arm(Clock::now() + *next);
}

void WheelClock::close() {
  wheel_.stop();
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
}

}  // namespace lockwatch::detail
