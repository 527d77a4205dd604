// lib/runtime/handoff.hpp: the local hand-off (Options::handoff), in one
// place.
//
// When the work on a lock ends while another caller of this runtime waits
// for the same key (exclusive, the same ttl, renewals on), the runtime
// hands the store's key to it instead of releasing it and taking it again:
// the next lease keeps the owner token, the deadline and any renewal in
// flight, and gets the next of a block of fencing tokens the store
// reserved for this run of holders (a streak: TokenBlocks). A streak ends
// at Options::handoff.max_streak hand-offs or max_time, or when a
// reservation fails; the key then goes back to the store and this
// runtime's waiters sit out a turn (WaitQueue::hold_back), so that callers
// elsewhere are not starved.
//
// The parts: LockTable::work_ended() (handoff.cpp) decides, when work
// ends, between a hand-off and a release; hand_off_fits(), reserve_ahead()
// and reserve() keep tokens in stock while a caller waits here;
// Watchdog::hand_off() puts the next lease in the ended one's place in the
// registry; a streak (below) is shared by its leases (LeaseRecord::Rare).
//
// Threading: the loop thread's, as the leases' state.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>

namespace lockwatch::detail {

struct LeaseRecord;

// The leases that held one store key in a row within this runtime, by
// local hand-off: the current holder (a renewal reply sent for an earlier
// one is its), when the runtime took the key from the store, and the
// fencing tokens reserved for the next holders (Options::handoff.enabled).
struct HandOffStreak {
  std::weak_ptr<LeaseRecord> holder;
  std::chrono::steady_clock::time_point started;
  // Local hand-offs so far in this streak.
  std::uint32_t handoffs = 0;
  // Fencing tokens the store reserved for this streak (TokenBlocks), not
  // handed out yet: next .. last, then the block after it (none: next >
  // last). They are good only while the store's key stays ours without a
  // break: the streak's end drops them.
  std::uint64_t next = 1, last = 0;
  std::uint64_t after_next = 1, after_last = 0;
  bool reserving = false;  // a reservation is on its way
  bool refused = false;    // one failed or found the key not ours: no more hand-offs
  // The lease whose work ended while no token was in stock: it keeps the
  // key (renewed) until the reservation's answer hands it on or releases it.
  std::shared_ptr<LeaseRecord> deferred;

  std::uint64_t in_stock() const noexcept {
    return (last >= next ? last - next + 1 : 0) + (after_last >= after_next ? after_last - after_next + 1 : 0);
  }
  // The next token (0: none in stock).
  std::uint64_t take() noexcept {
    if (next > last) {
      next = std::exchange(after_next, 1);
      last = std::exchange(after_last, 0);
    }
    return next <= last ? next++ : 0;
  }
  // A reserved block, first .. last.
  void add(std::uint64_t first, std::uint64_t to) noexcept {
    if (next > last) {
      next = first;
      last = to;
    } else {
      after_next = first;
      after_last = to;
    }
  }
};

}  // namespace lockwatch::detail
