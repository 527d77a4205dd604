// lib/runtime/acquisition.hpp: a call on its way to a lease.
//
// Made on the caller's thread by admission (Runtime::Impl), then owned by
// the loop thread: the wait queue tries to take the lock for it, the
// watchdog turns it into a lease. Lives until granted or failed.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>

#include "lockwatch/lock_handle.hpp"
#include "lockwatch/runtime.hpp"
#include "lockwatch/timer_wheel.hpp"
#include "runtime/lease_record.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class WaitQueue;
class Watchdog;

// The call behind Runtime::acquire until its lock is granted: no work, and
// one outcome. Once granted, the lease record itself is the handle's state.
struct HandleCall final : Call {
  void run() noexcept override {}
  // Loop thread: the acquisition failed.
  void finish(std::exception_ptr error) noexcept override {
    failed.store(true, std::memory_order_release);
    try {
      acquired.set_exception(error ? error : std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped")));
    } catch (...) {
    }
  }
  std::promise<LockHandle> acquired;  // given up at grant

  // For reentrancy on the thread that asked for the handle (see
  // Runtime::Impl::handle_held_here): the lease once granted.
  std::shared_ptr<LeaseRecord> lease() const {
    std::lock_guard lk(mu);
    return lease_.lock();
  }
  void set_lease(const std::shared_ptr<LeaseRecord>& l) {
    std::lock_guard lk(mu);
    lease_ = l;
    granted.store(true, std::memory_order_release);
  }
  std::atomic<bool> failed{false};
  std::atomic<bool> granted{false};

 private:
  mutable std::mutex mu;
  std::weak_ptr<LeaseRecord> lease_;
};

struct Acquisition final : TimerTask {
  using Clock = std::chrono::steady_clock;

  // Set on the caller's thread, read-only after.
  LockSpec spec;
  std::shared_ptr<Call> call;
  std::string name;    // the store's name for spec.key
  TtlText ttl_ms;      // spec.ttl as decimal text
  Clock::time_point started;
  bool inline_run = false;  // a nested call: the calling thread runs the work
  std::shared_ptr<HandleCall> handle;  // Runtime::acquire: granted makes a LockHandle
  std::promise<std::shared_ptr<LeaseRecord>> granted;  // inline only
  std::shared_ptr<std::promise<void>> finished;        // inline only

  // Loop thread.
  WaitQueue* queue = nullptr;  // the wait deadline goes there
  OwnerToken token;
  Timeout wait_timeout;
  bool done = false;
  // An attempt may have taken the lock without our learning it (it failed,
  // or was answered after the call ended): if the call ends without the
  // lock, the wait queue gives the token back (WaitQueue::abandon).
  bool maybe_held = false;
  Clock::time_point last_sent;  // the latest attempt's send time

  LockRef ref() const noexcept { return LockRef{name, token.view(), ttl_ms.view(), spec.ttl}; }
  void run(Timeout) noexcept override;  // the wait deadline
};

}  // namespace lockwatch::detail

namespace lockwatch {
struct HandleAccess {
  static LockHandle make(std::shared_ptr<detail::HandleState> state) { return LockHandle(std::move(state)); }
};
}  // namespace lockwatch
