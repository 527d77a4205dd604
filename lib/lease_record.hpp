// lib/lease_record.hpp: a held lease as the runtime tracks it. The public
// part (Lease) is read by the work; the rest belongs to the I/O thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockwatch/lease.hpp"
#include "lockwatch/runtime.hpp"
#include "lockwatch/timer_wheel.hpp"

namespace lockwatch::detail {

struct LeaseRecord final : Lease, TimerTask, std::enable_shared_from_this<LeaseRecord> {
  // What the lease's one wheel timeout means when it fires.
  enum class Phase {
    kRenewDue,       // time to renew
    kAwaitingReply,  // a renewal is in flight; the timeout is the local deadline
    kRetryDue,       // a renewal failed transiently; try again
    kExhausted,      // no renewals left; the timeout is the local deadline
    kReleasing,      // the work finished; release in flight or awaiting expiry
  };

  LeaseRecord(Runtime::Impl* rt, std::string key, std::uint64_t fence, std::chrono::milliseconds ttl,
              Clock::time_point deadline)
      : Lease(std::move(key), fence, ttl, deadline), rt(rt) {}

  void run(Timeout timeout) noexcept override;

  Clock::time_point deadline() const noexcept {
    return Clock::time_point(Clock::duration(deadline_ns_.load(std::memory_order_relaxed)));
  }
  using Lease::mark_lost;
  using Lease::set_deadline;
  void request_stop() noexcept { stop_.request_stop(); }
  void bump_renewals() noexcept { renewals_.fetch_add(1, std::memory_order_relaxed); }

  Runtime::Impl* rt;
  std::shared_ptr<Call> call;
  std::string token;
  std::string lock_key;
  std::string channel;
  std::int64_t retries = 0;  // < 0: forever
  Clock::duration renew_after{};  // from a renewal's send to the next one (a tick early)
  std::chrono::milliseconds drift{0};
  Phase phase = Phase::kRenewDue;
  Timeout timeout;
  Clock::time_point last_sent;  // the latest request that may have extended the key
  std::string lost_detail;
  // The renewal round in flight and its votes (one per node).
  std::uint64_t renew_round = 0;
  std::size_t renew_ok = 0, renew_no = 0, renew_replies = 0;
  bool renew_taken = false, renew_decided = false;
  std::string renew_error;
  std::string ttl_ms;  // the ttl as the scripts take it, formatted once
  bool work_finished = false;
  bool releasing = false;  // release in flight: renewals go on until it is confirmed
  bool is_handle = false;  // held through a LockHandle, not by running work
  std::shared_ptr<std::promise<void>> finished;  // inline calls wait on it
};

// The leases of the locked calls running on this thread, innermost last.
struct HeldOnThread {
  const Runtime::Impl* rt;
  LeaseRecord* lease;
};
std::vector<HeldOnThread>& leases_on_this_thread() noexcept;

// Pushes a lease for the scope of the work on this thread.
class ThreadLeaseScope {
 public:
  ThreadLeaseScope(const Runtime::Impl* rt, LeaseRecord* lease) { leases_on_this_thread().push_back({rt, lease}); }
  ~ThreadLeaseScope() { leases_on_this_thread().pop_back(); }
  ThreadLeaseScope(const ThreadLeaseScope&) = delete;
  ThreadLeaseScope& operator=(const ThreadLeaseScope&) = delete;
};

}  // namespace lockwatch::detail
