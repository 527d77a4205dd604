// lib/core/adaptive_spin.hpp: how long a thread that ran out of work
// polls before it sleeps, when Options::runtime.busy_poll is left adaptive.
//
// Polling pays only when the next event comes before the poll would have
// cost as much as the wake-up it saves. This is the halt-polling rule of
// KVM's halt_poll_ns, bounded by the wake-up cost (the ski-rental bound: a
// thread that polls at most as long as a wake-up costs spends at most
// twice the CPU of one that never polls):
// - the window starts at 0 (no polling);
// - a sleep that ended sooner than a wake-up costs says a poll would have
//   caught it: the window grows (kStart, then doubling) up to limit();
// - a poll that ran its whole window for nothing halves the window, and
//   below kFloor it is 0 again;
// - limit() is the wake-up cost as measured (the time from waking a thread
//   to it running, averaged), clamped to kStart .. kCap.
// The owner decides when there is something worth polling for (replies or
// tasks outstanding); with nothing outstanding it never polls.
//
// Thread-safety: every member may be called from any thread; the values
// are relaxed atomics (a lost update only delays the adaptation).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace lockwatch::detail {

class AdaptiveSpin {
 public:
  using Nanos = std::int64_t;
  static constexpr Nanos kFloor = 2'000;         // a shorter window is no window
  static constexpr Nanos kStart = 10'000;        // the first window after a short sleep
  static constexpr Nanos kCap = 200'000;         // never longer, whatever a wake-up costs
  static constexpr Nanos kInitialWake = 30'000;  // until a wake-up was measured

  Nanos window() const noexcept { return window_.load(std::memory_order_relaxed); }
  Nanos limit() const noexcept { return std::clamp(wake_.load(std::memory_order_relaxed), kStart, kCap); }

  // A thread was woken (a post to a sleeping thread) and ran `latency` later.
  void woke(Nanos latency) noexcept {
    if (latency <= 0) return;
    Nanos w = wake_.load(std::memory_order_relaxed);
    wake_.store(w + (std::min(latency, 4 * kCap) - w) / 8, std::memory_order_relaxed);
  }
  // The thread slept `slept` with something outstanding before its next event.
  void slept(Nanos slept) noexcept {
    Nanos lim = limit();
    if (slept <= 0 || slept >= lim) return;
    Nanos w = window();
    window_.store(std::min(lim, std::max(kStart, 2 * w)), std::memory_order_relaxed);
  }
  // The thread polled its whole window and nothing came.
  void wasted() noexcept {
    Nanos w = window() / 2;
    window_.store(w < kFloor ? 0 : w, std::memory_order_relaxed);
  }

 private:
  std::atomic<Nanos> window_{0};
  std::atomic<Nanos> wake_{kInitialWake};
};

}  // namespace lockwatch::detail
