// lib/runtime/job_host.hpp: what the scheduled jobs (jobs/) use of a
// runtime, and nothing more. detail::RuntimeImpl implements it; the jobs see
// neither its members nor its lease records.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "lockwatch/lease.hpp"
#include "lockwatch/runtime.hpp"
#include "lockwatch/thread_pool.hpp"
#include "lockwatch/timer_wheel.hpp"
#include "runtime/acquisition.hpp"
#include "store/capabilities.hpp"

namespace lockwatch::detail {

class Events;

class JobHost {
 public:
  static JobHost& of(Runtime& runtime) noexcept;

  // Any thread.
  // The store's name for `key`.
  virtual std::string store_name(std::string_view key) const = 0;
  // The store's period claims; throws Unsupported when it has none.
  virtual JobClaims& job_claims() = 0;
  // Throws InvalidArgument for a lease the runtime would refuse (its key
  // or ttl), RuntimeStopped once it is stopping.
  virtual void check_lease(LockSpec& spec) const = 0;
  // Metrics, observers and the log.
  virtual Events& job_events() noexcept = 0;
  // Runs `task` on the loop thread; false once the loop is closed.
  virtual bool post(UniqueFunction task) = 0;
  // The handler form of Runtime::acquire, for a spec check_lease() passed.
  virtual AcquireTicket acquire(LockSpec spec, AcquireCallback handler) = 0;
  // Runs `work` on the pool; throws once the pool stopped.
  virtual void run_on_pool(UniqueFunction work) = 0;

  // Loop thread: `task` runs at `when` (on the runtime's wheel).
  virtual Timeout at(TimerTask& task, std::chrono::steady_clock::time_point when) = 0;

  // The thread that runs `body`: this_lease() is `lease` (one of this
  // runtime's) while it runs.
  virtual void with_lease(const Lease& lease, const std::function<void()>& body) = 0;

  // The lease's owner token (the store's record of who holds it).
  virtual std::string owner_token(const Lease& lease) const = 0;

 protected:
  ~JobHost() = default;
};

}  // namespace lockwatch::detail
