// lib/store/sqlcommon/claims.hpp: a scheduled job's period claim on the
// SQL stores (JobClaims), decided once from what either server answered.
//
// The claim is one conditional write on the job's lock row (the lease is
// the caller's and unexpired, the server's clock has reached the period's
// start, no period as late was run), read back in the same round trip:
// whether the write took, whether the lease is the caller's, and the last
// period run. Pure function; any thread.
#pragma once

#include <cstdint>
#include <optional>

#include "store/capabilities.hpp"
#include "store/sqlcommon/values.hpp"

namespace lockwatch::detail::sqlcommon {

// Fills `out` from the answer's row at columns `at`..`at + 3`: the
// server's clock, whether the lease is the caller's, whether the period
// is due (not read: the others decide) and the last period run (NULL:
// none ever); `claimed` the write took.
inline void read_claim(ClaimResult& out, const Rows& rows, int at, bool claimed, std::int64_t period) {
  out.store_time = from_micros(rows.micros(0, at));
  const std::optional<long long> last = rows.maybe(0, at + 3);
  out.last = last.value_or(0);
  if (claimed) {
    out.status = ClaimResult::Status::kClaimed;
    out.last = period;
  } else if (!rows.yes(0, at + 1)) {
    out.status = ClaimResult::Status::kNotLeader;
  } else if (last && *last >= period) {
    out.status = ClaimResult::Status::kAlreadyRun;
  } else {
    out.status = ClaimResult::Status::kNotDue;
  }
}

}  // namespace lockwatch::detail::sqlcommon
