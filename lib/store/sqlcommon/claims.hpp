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

namespace lockwatch::detail::sqlcommon {

// Fills `out`'s status and last period: `claimed` the write took, `ours`
// the lease is the caller's, `last` the last period run (none ever).
inline void decide_claim(ClaimResult& out, bool claimed, bool ours, std::optional<std::int64_t> last,
                         std::int64_t period) {
  out.last = last.value_or(0);
  if (claimed) {
    out.status = ClaimResult::Status::kClaimed;
    out.last = period;
  } else if (!ours) {
    out.status = ClaimResult::Status::kNotLeader;
  } else if (last && *last >= period) {
    out.status = ClaimResult::Status::kAlreadyRun;
  } else {
    out.status = ClaimResult::Status::kNotDue;
  }
}

}  // namespace lockwatch::detail::sqlcommon
