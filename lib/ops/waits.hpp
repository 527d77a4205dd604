// lib/ops/waits.hpp: the calls waiting for a busy lock right now, for the
// metrics (lockwatch_waiting, lockwatch_waits_long,
// lockwatch_oldest_wait_seconds) while the waits last; the acquisition
// histogram sees a wait only once it ends.
//
// Only calls that may wait (LockSpec::wait > 0) are counted: a call that
// tries once is never waiting. A WaitMark is the call's place here: made
// when it starts to wait, ended when it leaves the wait queue (granted,
// busy past its wait, failed or cancelled), or when it is destroyed.
//
// Threading: marks begin and end on the loop thread; snapshot() from any
// thread (a scrape). The set is under a mutex that only a scrape contends.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <optional>
#include <set>

namespace lockwatch::detail {

class Waits {
 public:
  using Clock = std::chrono::steady_clock;

  struct Snapshot {
    std::size_t waiting = 0;           // calls waiting now
    std::size_t long_waits = 0;        // of which waiting longer than the warning
    Clock::duration oldest{0};         // the longest wait going on (0: none)
  };

  // Options::observability.wait_warning.
  void set_warning(Clock::duration warning) noexcept {
    warning_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(warning).count(), std::memory_order_relaxed);
  }
  Snapshot snapshot(Clock::time_point now = Clock::now()) const;

 private:
  friend class WaitMark;
  using Set = std::multiset<Clock::time_point>;
  Set::iterator add(Clock::time_point started);
  void remove(Set::iterator it) noexcept;

  mutable std::mutex mu_;
  Set started_;  // guarded by mu_
  std::atomic<std::int64_t> warning_ns_{0};
};

// One waiting call's place in Waits (movable, ends once).
class WaitMark {
 public:
  WaitMark() = default;
  ~WaitMark() { end(); }
  WaitMark(const WaitMark&) = delete;
  WaitMark& operator=(const WaitMark&) = delete;

  void begin(Waits& waits, Waits::Clock::time_point started) {
    end();
    it_ = waits.add(started);
    waits_ = &waits;
  }
  void end() noexcept {
    if (waits_ == nullptr) return;
    waits_->remove(it_);
    waits_ = nullptr;
  }

 private:
  Waits* waits_ = nullptr;
  Waits::Set::iterator it_{};
};

inline Waits::Set::iterator Waits::add(Clock::time_point started) {
  std::lock_guard lk(mu_);
  return started_.insert(started);
}

inline void Waits::remove(Set::iterator it) noexcept {
  std::lock_guard lk(mu_);
  started_.erase(it);
}

inline Waits::Snapshot Waits::snapshot(Clock::time_point now) const {
  const auto warning = std::chrono::nanoseconds(warning_ns_.load(std::memory_order_relaxed));
  Snapshot s;
  std::lock_guard lk(mu_);
  s.waiting = started_.size();
  if (started_.empty()) return s;
  s.oldest = std::max(Clock::duration(0), now - *started_.begin());
  // Sorted by start: the long waits are a prefix.
  for (auto t : started_) {
    if (now - t <= warning) break;
    ++s.long_waits;
  }
  return s;
}

}  // namespace lockwatch::detail
