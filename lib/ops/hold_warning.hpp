// lib/ops/hold_warning.hpp: Options::observability.hold_warning. A lease held longer than
// the warning is told once: counted in lockwatch_holds_long_total, to the
// observers (Observer::on_held_long) and the log.
//
// The watchdog makes one for a lease when the option is on (kept in the
// lease's rarely used part: off, it costs a lease nothing), schedules it on
// the wheel at grant + hold_warning, and cancels it when the lease is over.
//
// Threading: loop thread (the wheel runs it).
#pragma once

#include <chrono>
#include <string>

#include "lockwatch/timer_wheel.hpp"
#include "ops/events.hpp"

namespace lockwatch::detail {

struct HoldWarning final : TimerTask {
  using Clock = std::chrono::steady_clock;
  HoldWarning(Events& events, std::string key, Clock::time_point granted_at)
      : events(events), key(std::move(key)), granted_at(granted_at) {}
  void run(Timeout) noexcept override { events.held_long(key, Clock::now() - granted_at); }

  Events& events;
  std::string key;
  Clock::time_point granted_at;
  Timeout timeout;
};

}  // namespace lockwatch::detail
