// lib/ops/stats.hpp: the counters behind Runtime::stats(). Written on
// the loop thread, read from any thread (relaxed atomics, each on its own).
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>

#include "ops/waits.hpp"

namespace lockwatch::detail {

struct StatsCounters {
  std::atomic<std::uint64_t> held{0};
  std::atomic<std::uint64_t> acquired{0};
  std::atomic<std::uint64_t> renewals_sent{0};
  std::atomic<std::uint64_t> renew_commands{0};
  std::atomic<std::uint64_t> leases_lost{0};
  std::atomic<std::uint64_t> timer_wakeups{0};
  std::atomic<std::uint64_t> local_handoffs{0};
  std::atomic<std::uint64_t> token_reservations{0};
  std::atomic<std::uint64_t> attempts_queued{0};
  // In microseconds.
  std::atomic<std::int64_t> min_renewal_slack_us{std::numeric_limits<std::int64_t>::max()};
  // The calls waiting for a busy lock (the wait queue marks them).
  Waits waits;
};

}  // namespace lockwatch::detail
