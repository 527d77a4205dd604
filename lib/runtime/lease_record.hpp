// lib/runtime/lease_record.hpp: a held lease as the watchdog tracks it.
//
// Ownership: the public part (Lease) is read by the work from any thread
// (atomics). `call` is run once on the thread that does the work (a pool
// thread, or the caller's for a nested call); everything else belongs to
// the loop thread.
#pragma once

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "lockwatch/lease.hpp"
#include "lockwatch/runtime.hpp"
#include "lockwatch/timer_wheel.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class Watchdog;

struct LeaseRecord final : Lease, TimerTask, std::enable_shared_from_this<LeaseRecord> {
  // What the lease's one wheel timeout means when it fires.
  enum class Phase {
    kRenewDue,       // time to renew
    kAwaitingReply,  // a renewal is in flight; the timeout is the local deadline
    kRetryDue,       // a renewal failed transiently; try again
    kExhausted,      // no renewals left; the timeout is the local deadline
    kReleasing,      // the work finished; release in flight or awaiting expiry
  };

  LeaseRecord(Watchdog* watchdog, std::string key, std::uint64_t fence, std::chrono::milliseconds ttl,
              Clock::time_point deadline)
      : Lease(std::move(key), fence, ttl, deadline), watchdog(watchdog) {}

  void run(Timeout timeout) noexcept override;

  Clock::time_point deadline() const noexcept {
    return Clock::time_point(Clock::duration(deadline_ns_.load(std::memory_order_relaxed)));
  }
  using Lease::mark_lost;
  using Lease::set_deadline;
  void request_stop() noexcept { stop_.request_stop(); }
  void bump_renewals() noexcept { renewals_.fetch_add(1, std::memory_order_relaxed); }
  LockRef ref() const noexcept { return LockRef{name, token, ttl_ms, ttl()}; }

  Watchdog* const watchdog;  // outlives every lease (both belong to the runtime)
  // Set once at grant, then read-only.
  std::shared_ptr<Call> call;
  std::string name;    // the store's name for the key
  std::string token;   // the owner token
  std::string ttl_ms;  // the ttl as the store takes it, formatted once
  std::int64_t retries = 0;        // < 0: forever
  Clock::duration renew_after{};   // from a renewal's send to the next one (a tick early)
  std::chrono::milliseconds drift{0};
  bool is_handle = false;  // held through a LockHandle, not by running work
  Clock::time_point granted_at;  // for the hold time
  std::shared_ptr<std::promise<void>> finished;  // a nested call's thread waits on it
  // Loop thread.
  Phase phase = Phase::kRenewDue;
  Timeout timeout;
  Clock::time_point last_sent;  // the latest request that may have extended the key
  std::string lost_detail;
  bool work_finished = false;
  bool releasing = false;  // release in flight: renewals go on until it is confirmed
};

// The leases of the locked calls running on this thread, innermost last.
struct HeldOnThread {
  const void* runtime;  // the Runtime::Impl that granted it
  LeaseRecord* lease;
};
std::vector<HeldOnThread>& leases_on_this_thread() noexcept;

// Pushes a lease for the scope of the work on this thread.
class ThreadLeaseScope {
 public:
  ThreadLeaseScope(const void* runtime, LeaseRecord* lease) { leases_on_this_thread().push_back({runtime, lease}); }
  ~ThreadLeaseScope() { leases_on_this_thread().pop_back(); }
  ThreadLeaseScope(const ThreadLeaseScope&) = delete;
  ThreadLeaseScope& operator=(const ThreadLeaseScope&) = delete;
};

}  // namespace lockwatch::detail
