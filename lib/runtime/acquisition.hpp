// lib/runtime/acquisition.hpp: a call on its way to a lease.
//
// Made on the caller's thread by admission (Runtime::Impl), then owned by
// the loop thread: the wait queue tries to take the lock for it, the
// watchdog turns it into a lease. Lives until granted or failed.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "lockwatch/lock_handle.hpp"
#include "lockwatch/runtime.hpp"
#include "lockwatch/timer_wheel.hpp"
#include "ops/waits.hpp"
#include "runtime/lease_record.hpp"
#include "runtime/lock_spec.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class WaitQueue;
class Watchdog;

struct Acquisition;

// Runtime::Impl::acquire_together's handler: the index of the request.
using AcquireEach = std::function<void(std::size_t index, std::exception_ptr, LockHandle)>;

// The call behind Runtime::acquire until its lock is granted: no work, and
// one outcome, delivered through `complete` exactly once: by the loop
// (granted, or failed) or by AcquireTicket::cancel(), whichever claims it
// first. Once granted, the lease record itself is the handle's state.
struct HandleCall final : Call {
  using Complete = std::function<void(std::exception_ptr, LockHandle)>;

  void run() noexcept override {}
  // Loop thread: the acquisition failed.
  void finish(std::exception_ptr error) noexcept override {
    if (!claim(kDone)) return;  // cancelled: told already
    acquisition.reset();
    deliver(error ? error : std::make_exception_ptr(RuntimeStopped("lockwatch runtime stopped")), LockHandle());
  }
  // Loop thread, or the cancelling one. Calls `complete` and drops it
  // (with whatever it keeps: a promise holding a handle must not outlive
  // its future). Only after winning claim().
  void deliver(std::exception_ptr error, LockHandle handle) noexcept {
    Complete c = std::move(complete);
    complete = nullptr;
    try {
      c(error, std::move(handle));
    } catch (...) {
    }
  }
  // The outcome is ours to deliver: the grant or failure (kDone) or a
  // cancel (kCancelled). True for the first claimant only.
  bool claim(std::uint8_t to) noexcept {
    std::uint8_t pending = kPending;
    return state.compare_exchange_strong(pending, to, std::memory_order_acq_rel);
  }
  bool cancelled() const noexcept { return state.load(std::memory_order_acquire) == kCancelled; }
  enum : std::uint8_t { kPending, kDone, kCancelled };

  // Set on the caller's thread before the loop sees the call.
  Complete complete;
  std::string key;  // for Cancelled's message
  std::weak_ptr<Runtime::Impl> runtime;    // for a cancel
  // For a cancel: reset by whoever wins claim(kDone), as no cancel can
  // follow (a weak pointer would keep the acquisition's memory, made with
  // its count, for as long as the handle is held).
  std::weak_ptr<Acquisition> acquisition;
  // A set's acquisition (runtime/lock_set.hpp): cancels the key it is
  // taking now. Set before the ticket is handed out.
  std::function<void()> cancel_set;

  std::atomic<std::uint8_t> state{kPending};
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
  // Inline only (made for a nested call, none otherwise: a promise
  // allocates its state when made).
  std::unique_ptr<std::promise<std::shared_ptr<LeaseRecord>>> granted;
  std::shared_ptr<std::promise<void>> finished;

  // Loop thread.
  WaitQueue* queue = nullptr;  // the wait deadline goes there
  OwnerToken token;
  Timeout wait_timeout;
  bool done = false;
  WaitMark wait_mark;  // counted as waiting (ops/waits.hpp) until done
  // An attempt may have taken the lock without our learning it (it failed,
  // or was answered after the call ended): if the call ends without the
  // lock, the wait queue gives the token back (WaitQueue::abandon).
  bool maybe_held = false;
  Clock::time_point last_sent;  // the latest attempt's send time
  bool in_window = false;       // its attempt waits in the client for the window (WaitQueue)

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
};

}  // namespace lockwatch::detail
