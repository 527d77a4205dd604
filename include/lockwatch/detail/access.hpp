/// @file
/// lockwatch/detail/access.hpp: how the library's header-only adapters
/// (LOCKED, lockwatch/asio.hpp) reach the runtime's entry points that take
/// its internal types. Not part of the API: its names may change in any
/// release.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <utility>

#include "lockwatch/detail/call.hpp"
#include "lockwatch/lock_handle.hpp"
#include "lockwatch/runtime.hpp"

namespace lockwatch::detail {

/// LOCKED's and the coroutine form's ways in.
struct DispatchAccess {
  static void dispatch(Runtime& rt, LockRequest request, std::shared_ptr<Call> call) {
    rt.dispatch(std::move(request), std::move(call));
  }
  static AcquireTicket dispatch_acquire(Runtime& rt, LockRequest request, AcquireCallback handler) {
    return rt.dispatch_acquire(std::move(request), std::move(handler));
  }
};

/// How lockwatch/asio.hpp's LOCKED releases with the typed exception.
struct ReleaseAccess {
  static void release(LockHandle& h, std::function<void(std::exception_ptr)> handler) {
    h.release_typed(std::move(handler));
  }
};

}  // namespace lockwatch::detail
