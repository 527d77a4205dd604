// lib/runtime/watchdog.hpp: the leases a runtime holds, kept alive while
// their work runs.
//
// Each lease has one timeout on the wheel, whose meaning is its Phase: the
// next renewal, or the local deadline while a renewal is in flight (send
// time of the last confirmed renewal + ttl - drift, less a tick: the wheel
// judges it on the first tick at or after it, so the holder is told the
// whole drift allowance before the store may expire the key). Renewals that come due
// in one tick go to the store as one batch (in chunks), so a hundred
// thousand leases cost a few commands a tick. A renewal that fails for a
// transient reason is retried every tick until the local deadline; "not
// yours" and the deadline are final: the lease is lost, its stop token
// fires (on the notifier thread: stop callbacks are user code) and its
// call will report LeaseLost. When the work ends the lease is released,
// and kept renewed until the store confirmed the release, unless the
// runtime hands the store's key to a local waiter instead (hand_off(),
// Options::handoff.enabled): the next lease takes the ended one's place, and
// a renewal reply still in flight goes to whichever lease holds it now.
//
// Threading: loop thread only, but held() (any thread).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/page_allocator.hpp"
#include "lockwatch/options.hpp"
#include "lockwatch/thread_pool.hpp"
#include "ops/events.hpp"
#include "runtime/acquisition.hpp"
#include "runtime/decisions.hpp"
#include "runtime/lease_record.hpp"
#include "ops/stats.hpp"
#include "runtime/wheel_clock.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // A lease that is over (released, or surely expired) is written to
  // `decisions`, once.
  Watchdog(LockStore& store, WheelClock& clock, ThreadPool& notifier, const Options& options, StatsCounters& stats,
           Events& events, Decisions& decisions);

  // A lease for the acquisition, taken with a request sent at `sent`.
  std::shared_ptr<LeaseRecord> grant(const Acquisition& a, std::uint64_t fence, Clock::time_point sent);
  // Any thread: the lease of `a`, taken by its caller's own request sent
  // at `sent` (Runtime::lock): the caller's until the loop adopts it, and
  // counted as held already. Not in the registry: no renewal is due yet.
  std::shared_ptr<LeaseRecord> grant_to_caller(const Acquisition& a, std::uint64_t fence, Clock::time_point sent);
  // The time by which the loop adopts a lease of grant_to_caller() whose
  // request went at `sent`: its first renewal at the earliest.
  static Clock::time_point adopt_by(const LeaseRecord& l, Clock::time_point sent) noexcept;
  // Loop thread: a lease of grant_to_caller() joins the registry, its
  // renewals counted from its grant's send.
  void adopt(const std::shared_ptr<LeaseRecord>& l);
  // Whether the store's key behind `l` (whose work is over) may pass to a
  // local holder now: not lost, no renewal failing, and a tick or more
  // before the local deadline (half a ttl once its renewals are spent).
  bool can_hand_off(const LeaseRecord& l, Clock::time_point now) const;
  // The lease of `a`, the next local holder of `from`'s store key: the same
  // owner token, deadline and renewal in flight, in `from`'s place in the
  // registry. `from` is over without a release (the caller finishes it).
  std::shared_ptr<LeaseRecord> hand_off(const std::shared_ptr<LeaseRecord>& from, const Acquisition& a,
                                        std::uint64_t fence);
  // The work starts after waiting for a worker long enough to have used
  // part of its ttl: renew it now, without spending a retry.
  // `answered` is set once the renewal is answered (at once if none goes).
  void renew_at_start(const std::shared_ptr<LeaseRecord>& l, std::shared_ptr<std::promise<void>> answered);
  // A set's keys, taken one after the other, are renewed now, in one
  // batch: from here on they come due in the same tick and travel together
  // (one request per node). It spends no retry.
  void renew_together(const std::vector<std::shared_ptr<LeaseRecord>>& leases);
  // The work is over (false if it was already), since `ended`: judged
  // against the local deadline. The runtime then hands the key on
  // (hand_off()), keeps it until it can (LeaseRecord::awaiting_tokens), or
  // calls release_ended(); or, the release written by the work's thread
  // (LeaseRecord::release_written), release_written() with its answer.
  bool end_work(const std::shared_ptr<LeaseRecord>& l, Clock::time_point ended = Clock::now());
  // After end_work(), the key going back to the store: a lost lease's
  // caller learns it at once; the release follows, then finish.
  // `confirmed`: when the answer came, if it came earlier than now (read
  // by its caller's thread, told to the loop later).
  void release_written(const std::shared_ptr<LeaseRecord>& l, Released status, const StoreError* why,
                       Clock::time_point confirmed = {});
  void release_ended(const std::shared_ptr<LeaseRecord>& l);
  // Releases `l`, whose work is over, then finishes it.
  void release(const std::shared_ptr<LeaseRecord>& l);
  // The hand-off streak of the store key `l` holds (made, with `l` its
  // holder, on first use).
  std::shared_ptr<HandOffStreak> streak_of(LeaseRecord& l);
  // Marks the lease lost (once) and asks its work to stop.
  void lose(const std::shared_ptr<LeaseRecord>& l, LostReason reason, std::string detail = {});
  // Work that ended past the lease's local deadline: the lease was lost
  // (see end_work); judge_late_end decides it once the renewal that was
  // in flight at the end is answered.
  void lose_past_deadline(const std::shared_ptr<LeaseRecord>& l);
  void judge_late_end(const std::shared_ptr<LeaseRecord>& l);
  // The runtime stops: every lease's work is asked to stop. Returns the
  // leases held through handles (nobody may be left to release them).
  std::vector<std::shared_ptr<LeaseRecord>> stop_all();
  // Sends the renewals queued in this tick (the wheel clock's hook).
  void flush();
  void on_timer(LeaseRecord* l);  // the lease's timeout fired
  std::size_t held() const noexcept { return stats_.held.load(std::memory_order_relaxed); }
  void clear() {
    for (auto& l : leases_) l->slot = LeaseRecord::kNoSlot;
    leases_.clear();
  }

 private:
  // A lease record for acquisition `a`'s holder: what comes from the
  // acquisition (its call, renewals, timing); the caller sets the store's
  // names and token, and its place in the registry.
  std::shared_ptr<LeaseRecord> new_lease(const Acquisition& a, std::uint64_t fence, Clock::time_point deadline,
                                         Clock::time_point last_sent);
  void schedule(LeaseRecord& l, LeaseRecord::Phase phase, Clock::time_point at);
  // The local deadline of a lease last set or extended by a request sent at
  // `sent`: lease_deadline() less a tick (but one nanosecond), so that the
  // tick that judges it comes no later than lease_deadline() itself.
  Clock::time_point deadline_of(Clock::time_point sent, std::chrono::milliseconds ttl) const;
  // Whether a renewal may go out: the work has not started, or it has
  // renewals left.
  bool may_renew(const LeaseRecord& l) const noexcept;
  // The next renewal, ttl * weight after the request sent at `extended_at`
  // (that extended the key), or, with the renewals spent, the deadline.
  void schedule_next(LeaseRecord& l, Clock::time_point extended_at);
  // A renewal due `at` moved early onto a grid its ttl shares with others
  // (at most a twentieth of the ttl), so that renewals coalesce.
  Clock::time_point coalesced(Clock::time_point at, std::chrono::milliseconds ttl) const noexcept;
  // How much earlier than due coalesced() may move a renewal: a twentieth
  // of the ttl.
  static Clock::duration most_early(std::chrono::milliseconds ttl) noexcept;
  // Queues `l`'s renewal for this tick's batch (flush()); `now`: the
  // caller's reading of the clock, if it has one.
  void send_renew(const std::shared_ptr<LeaseRecord>& l, Clock::time_point now = Clock::now());
  // A chunk of renewals sent together: its leases, and the text their
  // LockRefs view (each key's store name, token and ttl, as text).
  struct RenewBatch {
    std::vector<std::shared_ptr<LeaseRecord>> leases;
    std::unique_ptr<char[]> text;
  };
  // Sets refs_ to the batch's locks, writing their text, and counts each
  // lease's renewal as sent at `sent` (LeaseRecord::last_sent).
  void refer(RenewBatch& batch, Clock::time_point sent);
  void on_renew_result(const std::shared_ptr<LeaseRecord>& l, Clock::time_point sent, Renewed status,
                       const StoreError* why);
  void on_renew_result_now(const std::shared_ptr<LeaseRecord>& l, Clock::time_point sent, Renewed status,
                           const StoreError* why);
  void on_renewed(const std::shared_ptr<LeaseRecord>& l, Clock::time_point sent);
  void renewal_failed(const std::shared_ptr<LeaseRecord>& l, std::string why);
  // Why a key the store found gone was lost: kRemoved while its ttl could
  // not have run out by the local clock, else kExpired.
  LostReason gone_reason(const LeaseRecord& l) const noexcept;
  // `ended`: when the hold ended (default: now).
  void finish(const std::shared_ptr<LeaseRecord>& l, Clock::time_point ended = {});
  // The store's answer to release(`l`), come at `confirmed` (default: now).
  void released(const std::shared_ptr<LeaseRecord>& l, Released status, const StoreError* why,
                Clock::time_point confirmed = {});
  // Options::observability.hold_warning, when on: armed from the grant.
  void warn_on_hold(LeaseRecord& l, const std::string& key);
  void request_stop(const std::shared_ptr<LeaseRecord>& l);

  LockStore& store_;
  WheelClock& clock_;
  ThreadPool& notifier_;
  const Options& options_;
  StatsCounters& stats_;
  Events& events_;
  Decisions& decisions_;
  // Held; a lease knows its slot.
  std::vector<std::shared_ptr<LeaseRecord>, PageAllocator<std::shared_ptr<LeaseRecord>>> leases_;
  std::vector<std::shared_ptr<LeaseRecord>> due_;  // renewals due this tick
  std::vector<LockRef> refs_;                      // reused per chunk
  std::uint64_t drained_at_ = ~std::uint64_t{0};   // the advance that last read replies early
  // coalesced()'s grid of the ttl it was last asked for (most leases share
  // a ttl); a grid of 0: no coalescing.
  mutable std::chrono::milliseconds grid_ttl_{-1};
  mutable Clock::duration grid_{};
};

}  // namespace lockwatch::detail
