// lib/core/backoff.hpp: the doubling back-off every part that tries again
// uses (reconnects, give-backs, polls): the first delay, then twice the
// last, up to a most.
#pragma once

#include <algorithm>
#include <chrono>

namespace lockwatch::detail {

class Backoff {
 public:
  Backoff(std::chrono::milliseconds first, std::chrono::milliseconds most) noexcept : first_(first), most_(most) {}

  // The delay before the next try.
  std::chrono::milliseconds next() noexcept {
    delay_ = delay_.count() == 0 ? first_ : std::min(delay_ * 2, most_);
    return delay_;
  }
  // A try succeeded: the next failure starts from the first delay again.
  void reset() noexcept { delay_ = std::chrono::milliseconds(0); }
  // The delay next() gave last (0: none since the last reset).
  std::chrono::milliseconds last() const noexcept { return delay_; }

 private:
  std::chrono::milliseconds first_;
  std::chrono::milliseconds most_;
  std::chrono::milliseconds delay_{0};
};

}  // namespace lockwatch::detail
