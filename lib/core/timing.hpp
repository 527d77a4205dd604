// lib/core/timing.hpp: the lease arithmetic, as pure functions of the
// options (the runtime schedules by them; a quorum judges validity by them).
#pragma once

#include <algorithm>
#include <chrono>

#include "lockwatch/options.hpp"

namespace lockwatch::detail {

// How much earlier than the ttl the holder assumes its lease gone (clock
// drift between this host and the store).
inline std::chrono::milliseconds drift_for(const Options& o, std::chrono::milliseconds ttl) {
  using std::chrono::milliseconds;
  auto d = milliseconds(static_cast<milliseconds::rep>(static_cast<double>(ttl.count()) * o.drift_factor));
  return d + o.drift_floor;
}

// How long after a renewal (or the acquisition) was sent the next one goes
// out: at ttl*weight, or earlier if that would leave less than
// Options::min_renewal_window before the local deadline, but never before
// half the ttl.
inline std::chrono::steady_clock::duration renew_after(const Options& o, std::chrono::milliseconds ttl,
                                                       double weight) {
  using Dur = std::chrono::duration<double, std::milli>;
  auto weighted = Dur(static_cast<double>(ttl.count()) * weight);
  auto latest = Dur(ttl - drift_for(o, ttl) - o.min_renewal_window);
  auto half = Dur(static_cast<double>(ttl.count()) / 2);
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::min(weighted, std::max(half, latest)));
}

}  // namespace lockwatch::detail
