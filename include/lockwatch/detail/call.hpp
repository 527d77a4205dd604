/// @file
/// lockwatch/detail/call.hpp: what the library's header-only adapters
/// (LOCKED, lockwatch/asio.hpp) hand the runtime. Not part of the API: its
/// names may change in any release.
#pragma once

#include <exception>
#include <functional>

#include "lockwatch/lock_handle.hpp"

namespace lockwatch::detail {

/// One decorated invocation, as the runtime sees it. run() executes the
/// callable on a pool thread (keeping its result or exception); finish() is
/// called exactly once, after the lock is released, to make the future
/// ready: with `error` if the call failed or the lease was lost, otherwise
/// with what run() kept.
class Call {
 public:
  virtual ~Call() = default;
  virtual void run() noexcept = 0;
  virtual void finish(std::exception_ptr error) noexcept = 0;
};

/// LOCKED on a coroutine (lockwatch/asio.hpp) keeps the typed exceptions
/// of the future form: it takes the lock with this handler.
using AcquireCallback = std::function<void(std::exception_ptr error, LockHandle handle)>;

/// The runtime's inside (lib/runtime/runtime_impl.hpp).
class RuntimeImpl;
/// A handle's acquisition on its way (lib/runtime/completion.hpp).
struct HandleCall;

}  // namespace lockwatch::detail
