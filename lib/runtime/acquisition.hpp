// lib/runtime/acquisition.hpp: a call on its way to a lease.
//
// Made on the caller's thread by admission (detail::RuntimeImpl), then owned by
// the loop thread: the wait queue tries to take the lock for it, the
// watchdog turns it into a lease. Lives until granted or failed.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "lockwatch/timer_wheel.hpp"
#include "ops/waits.hpp"
#include "runtime/completion.hpp"
#include "runtime/lease_record.hpp"
#include "runtime/lock_spec.hpp"
#include "runtime/step.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class WaitQueue;
class Watchdog;

struct Acquisition;

// detail::RuntimeImpl::acquire_together's handler: the index of the request.
using AcquireEach = std::function<void(std::size_t index, std::exception_ptr, LockHandle)>;

struct Acquisition final : TimerTask {
  using Clock = std::chrono::steady_clock;

  explicit Acquisition(Completion how) noexcept : completion(std::move(how)) {}

  // Set on the caller's thread, read-only after.
  LockSpec spec;
  Completion completion;  // how the call ends: run on the pool, inline, or a handle
  StoreName name;         // the store's name for spec.key
  TtlText ttl_ms;         // spec.ttl as decimal text
  Clock::time_point started;

  // Loop thread.
  WaitQueue* queue = nullptr;  // the wait deadline goes there
  OwnerToken token;
  Timeout wait_timeout;
  // Requested until the wait queue takes it, then waiting; held once
  // granted (the lease goes on from there), ended when it failed.
  Step step = Step::kRequested;
  WaitMark wait_mark;  // counted as waiting (ops/waits.hpp) until the wait is over
  // An attempt may have taken the lock without our learning it (it failed,
  // or was answered after the call ended): if the call ends without the
  // lock, the wait queue gives the token back (WaitQueue::abandon).
  bool maybe_held = false;
  Clock::time_point last_sent;  // the latest attempt's send time
  bool in_window = false;       // its attempt waits in the client for the window (WaitQueue)
  // While an attempt (WaitQueue::send_attempt, one at a time) awaits the
  // store's answer, which comes exactly once: the acquisition itself, and
  // whether the attempt is its key's waiters' (found by name then), so that
  // the answer's handler keeps two pointers and fits in its std::function
  // without a heap block.
  std::shared_ptr<Acquisition> attempt_hold;
  bool attempt_for_waiters = false;

  // A fair lock's waiter (LockKind::fair()) asks the store on its own, not
  // only when first in line here: each attempt keeps its place in the
  // store's queue (WaitQueue::attempt_fair).
  struct FairRetry final : TimerTask {
    Acquisition* owner = nullptr;
    void run(Timeout) noexcept override;
  };
  FairRetry fair_retry;
  Timeout fair_timeout;         // its next attempt
  bool fair_in_flight = false;  // its attempt awaits the answer
  bool fair_again = false;      // a wake-up came meanwhile

  // Its wait is over: granted or failed (the steps after waiting).
  bool wait_over() const noexcept { return step >= Step::kHeld; }
  // Ends the wait: held (`granted`) or ended; it no longer counts as
  // waiting and its timers are off.
  void end_wait(bool granted) noexcept {
    step = granted ? Step::kHeld : Step::kEnded;
    wait_mark.end();
    wait_timeout.cancel();
    fair_timeout.cancel();
  }

  bool fair() const noexcept { return spec.kind.mode() == LockKind::Mode::kFair; }
  LockRef ref() const noexcept {
    return LockRef{name, token.view(), ttl_ms.view(), spec.ttl, spec.kind, spec.wait.count() > 0};
  }
  void run(Timeout) noexcept override;  // the wait deadline
};

struct HandleAccess {
  static LockHandle make(std::shared_ptr<HandleState> state) { return LockHandle(std::move(state)); }
  static LockHandle make_set(std::shared_ptr<HandleState> state) { return LockHandle(std::move(state), true); }
  static std::shared_ptr<HandleState> state(const LockHandle& h) { return h.state_; }
  // Empties a handle whose release was taken in hand (it releases nothing
  // when destroyed).
  static void forget(LockHandle& h) noexcept { h.state_.reset(); }
  // An empty handle that says why its acquisition failed (failure()).
  static LockHandle failed(std::exception_ptr error) noexcept { return LockHandle(std::move(error)); }
  // LockHandle::release(handler) with the error as the typed exception.
  static void release(LockHandle& h, std::function<void(std::exception_ptr)> handler);
};

}  // namespace lockwatch::detail
