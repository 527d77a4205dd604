// lib/runtime/step.hpp: the steps of one lock's life, one name each.
//
//   requested  the call was admitted (detail::RuntimeImpl::make_acquisition, on
//              the caller's thread) and is on its way to the loop;
//   waiting    its attempts go to the store (WaitQueue), until one takes
//              the lock, the wait runs out, it is cancelled or it fails;
//   held       the lease is ours (Watchdog::grant): the work runs or the
//              handle is out, and the watchdog renews it;
//   releasing  the work is over (Watchdog::end_work): the key goes on to
//              the next caller here (runtime/handoff.cpp) or back to the
//              store, renewed until the release is confirmed;
//   ended      released, lost, or never taken: nothing more happens to it.
//
// An Acquisition carries the first two and how its wait ended (held: it
// became a lease; ended: it failed); the LeaseRecord carries the last
// three. Steps only move forward.
#pragma once

#include <cstdint>

namespace lockwatch::detail {

enum class Step : std::uint8_t { kRequested, kWaiting, kHeld, kReleasing, kEnded };

// "requested", "waiting", "held", "releasing", "ended" (for messages and tests).
constexpr const char* step_name(Step s) noexcept {
  switch (s) {
    case Step::kRequested:
      return "requested";
    case Step::kWaiting:
      return "waiting";
    case Step::kHeld:
      return "held";
    case Step::kReleasing:
      return "releasing";
    case Step::kEnded:
      return "ended";
  }
  return "?";
}

}  // namespace lockwatch::detail
