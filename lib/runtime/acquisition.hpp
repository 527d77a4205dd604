// lib/runtime/acquisition.hpp: a call on its way to a lease.
//
// Made on the caller's thread by admission (Runtime::Impl), then owned by
// the loop thread: the wait queue tries to take the lock for it, the
// watchdog turns it into a lease. Lives until granted or failed.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "lockwatch/lock_handle.hpp"
#include "lockwatch/runtime.hpp"
#include "lockwatch/timer_wheel.hpp"
#include "runtime/lease_record.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class WaitQueue;
class Watchdog;

// The call behind a LockHandle: no work, two outcomes (acquired, released).
class HandleCall final : public Call {
 public:
  void run() noexcept override {}
  void finish(std::exception_ptr error) noexcept override {
    try {
      if (!granted) {
        acquired.set_exception(error ? error : std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped")));
      } else if (error) {
        released.set_exception(error);
      } else {
        released.set_value();
      }
    } catch (...) {
    }
  }
  std::promise<LockHandle> acquired;
  std::promise<void> released;
  bool granted = false;  // loop thread
};

// What a LockHandle holds; the runtime only while it lives.
struct HandleState {
  std::weak_ptr<Runtime::Impl> runtime;
  std::shared_ptr<LeaseRecord> lease;
  std::shared_ptr<HandleCall> call;
};

struct Acquisition final : TimerTask {
  using Clock = std::chrono::steady_clock;

  // Set on the caller's thread, read-only after.
  LockSpec spec;
  std::shared_ptr<Call> call;
  std::string name;    // the store's name for spec.key
  std::string ttl_ms;  // spec.ttl as decimal text
  Clock::time_point started;
  bool inline_run = false;  // a nested call: the calling thread runs the work
  std::shared_ptr<HandleCall> handle;  // Runtime::acquire: granted makes a LockHandle
  std::promise<std::shared_ptr<LeaseRecord>> granted;  // inline only
  std::shared_ptr<std::promise<void>> finished;        // inline only

  // Loop thread.
  WaitQueue* queue = nullptr;  // the wait deadline goes there
  std::string token;
  Timeout wait_timeout;
  bool done = false;

  LockRef ref() const noexcept { return LockRef{name, token, ttl_ms, spec.ttl}; }
  void run(Timeout) noexcept override;  // the wait deadline
};

}  // namespace lockwatch::detail

namespace lockwatch {
struct HandleAccess {
  static LockHandle make(std::shared_ptr<detail::HandleState> state) { return LockHandle(std::move(state)); }
};
}  // namespace lockwatch
