// lib/runtime/admission.hpp: the calls a runtime has let in and not yet
// ended, and whether it still lets any in.
//
// A call is let in (begin()) by admission on the caller's thread and ends
// (end()) where its outcome is known: on the loop when its acquisition
// fails or its lease finishes, or on the caller's thread when the loop
// took nothing. Stopping refuses new calls and waits for the ones in.
//
// Threading: any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>

#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

class Admission {
 public:
  // A call is in; RuntimeStopped once the runtime stops.
  void begin() {
    std::lock_guard lk(mu_);
    if (stopping_.load()) throw RuntimeStopped("lockwatch runtime is stopping");
    ++active_;
  }
  // A call that began has ended.
  void end() noexcept {
    std::lock_guard lk(mu_);
    if (--active_ == 0) cv_.notify_all();
  }
  // The runtime stops: no call begins from now on.
  bool stopping() const noexcept { return stopping_.load(); }
  // RuntimeStopped when stopping.
  void check() const {
    if (stopping()) throw RuntimeStopped("lockwatch runtime is stopping");
  }
  // Refuses new calls from now on.
  void close() {
    std::lock_guard lk(mu_);
    stopping_.store(true);
  }
  // Waits until every call that began has ended (after close()).
  void wait_idle() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [this] { return active_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t active_ = 0;  // guarded by mu_
  std::atomic<bool> stopping_{false};
};

}  // namespace lockwatch::detail
