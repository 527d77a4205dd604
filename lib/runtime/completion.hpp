// lib/runtime/completion.hpp: how a call on its way to a lease ends.
//
// A call ends one of three ways, and its acquisition carries exactly one:
//   run on the pool   a LOCKED call: once granted, its work runs on a pool
//                     thread (LockTable::run_on_pool); the call
//                     completes when the lease ends
//                     (LeaseRecord::complete_call);
//   run inline        a LOCKED call nested in one that holds another key:
//                     the calling thread waits for the grant, runs the work
//                     itself, and returns once the lease ended;
//   deliver a handle  Runtime::acquire, async_acquire, each key of
//                     acquire_together: the handle (or the error) goes to
//                     the caller's handler, unless its ticket's cancel
//                     claimed the outcome first (HandleCall).
// The runtime tells a completion that no lock will come (fail(), once) or
// hands a granted lease on as its way says (LockTable::start_lease).
//
// Threading: made on the caller's thread before the loop sees the call,
// then the loop thread's, but for what each part says of itself. Costs: a
// handle's call and an inline call's two promises are made with the
// completion; a call on the pool makes nothing more.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "lockwatch/lock_handle.hpp"
#include "lockwatch/errors.hpp"
#include "lockwatch/locked_work.hpp"

namespace lockwatch::detail {

struct Acquisition;
struct LeaseRecord;
class RuntimeImpl;

// How the runtime's inner callers (async_acquire, the scheduler, LOCKED on
// a coroutine) take a handle: the error as its typed exception.
using AcquireCallback = std::function<void(std::exception_ptr error, LockHandle handle)>;

// A handle's outcome until its lock is granted, delivered through
// `complete` exactly once: by the loop (granted, or failed) or by
// AcquireTicket::cancel(), whichever claims it first. Once granted, the
// lease record itself is the handle's state.
struct HandleCall final {
  using Complete = std::function<void(std::exception_ptr, LockHandle)>;

  // Loop thread: the acquisition failed (none: the runtime stopped).
  void fail(std::exception_ptr error) noexcept {
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
  std::string key;                       // for Cancelled's message
  std::weak_ptr<detail::RuntimeImpl> runtime;  // for a cancel
  // For a cancel: reset by whoever wins claim(kDone), as no cancel can
  // follow (a weak pointer would keep the acquisition's memory, made with
  // its count, for as long as the handle is held).
  std::weak_ptr<Acquisition> acquisition;
  // A set's acquisition (runtime/lock_set.hpp): cancels the key it is
  // taking now. Set before the ticket is handed out.
  std::function<void()> cancel_set;

  std::atomic<std::uint8_t> state{kPending};
};

class Completion {
 public:
  enum class Way : std::uint8_t { kPool, kInline, kHandle };

  // An inline call's waits: the calling thread waits for the grant (a
  // null lease: none came), then for the lease's end.
  struct InlineWait {
    std::promise<std::shared_ptr<LeaseRecord>> granted;
    std::shared_ptr<std::promise<void>> finished = std::make_shared<std::promise<void>>();
  };

  static Completion on_pool(std::shared_ptr<LockedWork> work) {
    return Completion(Way::kPool, std::move(work), nullptr);
  }
  static Completion run_inline(std::shared_ptr<LockedWork> work) {
    Completion c(Way::kInline, std::move(work), nullptr);
    c.inline_ = std::make_unique<InlineWait>();
    return c;
  }
  static Completion deliver(std::shared_ptr<HandleCall> handle) {
    return Completion(Way::kHandle, nullptr, std::move(handle));
  }

  Way way() const noexcept { return way_; }
  // The work a granted lease runs: none for a handle (its lease is its own
  // state).
  const std::shared_ptr<LockedWork>& work() const noexcept { return work_; }
  // A handle's call (none for work).
  HandleCall* handle() const noexcept { return handle_.get(); }
  // An inline call's waits (none otherwise).
  InlineWait* inline_wait() const noexcept { return inline_.get(); }
  // A handle whose ticket cancelled it.
  bool cancelled() const noexcept { return handle_ && handle_->cancelled(); }

  // Loop thread (or the caller's, when the loop took nothing), once: no
  // lock will be granted; the caller learns `error`.
  void fail(std::exception_ptr error) noexcept {
    if (handle_) {
      handle_->fail(error);
      return;
    }
    work_->finish(error);
    if (inline_) {
      inline_->granted.set_value(nullptr);
      inline_->finished->set_value();
    }
  }

 private:
  Completion(Way way, std::shared_ptr<LockedWork> work, std::shared_ptr<HandleCall> handle) noexcept
      : way_(way), work_(std::move(work)), handle_(std::move(handle)) {}

  Way way_;
  std::shared_ptr<LockedWork> work_;
  std::shared_ptr<HandleCall> handle_;
  std::unique_ptr<InlineWait> inline_;
};

}  // namespace lockwatch::detail
