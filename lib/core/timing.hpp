// lib/core/timing.hpp: the lease arithmetic, as pure functions of the
// watchdog's options (the runtime schedules by them; a quorum judges validity by them).
#pragma once

#include <algorithm>
#include <chrono>

#include "lockwatch/options.hpp"

namespace lockwatch::detail {

// How much earlier than the ttl the holder assumes its lease gone (clock
// drift between this host and the store).
inline std::chrono::milliseconds drift_for(const WatchdogOptions& o, std::chrono::milliseconds ttl) {
  using std::chrono::milliseconds;
  auto d = milliseconds(static_cast<milliseconds::rep>(static_cast<double>(ttl.count()) * o.drift_factor));
  return d + o.drift_floor;
}

// The holder's local deadline for a lease of `ttl` last set or extended by
// a request sent at `sent`: its ttl from the send, less the drift
// allowance (the store's clock may run that much faster than ours). Past
// it, the holder counts the lease gone.
inline std::chrono::steady_clock::time_point lease_deadline(const WatchdogOptions& o,
                                                            std::chrono::steady_clock::time_point sent,
                                                            std::chrono::milliseconds ttl) {
  return sent + ttl - drift_for(o, ttl);
}

// The other side of the same bound: when a lock of `ttl` last set or
// extended by a request sent at `sent` is gone from the store at the
// latest, if the store keeps it `kept` (the ttl, or more where it rounds
// the ttl up: LockStore::expiry_bound) and its clock runs up to the drift
// allowance slower than ours. Before it, the key may still be there.
inline std::chrono::steady_clock::time_point gone_by(const WatchdogOptions& o,
                                                     std::chrono::steady_clock::time_point sent,
                                                     std::chrono::milliseconds ttl, std::chrono::milliseconds kept) {
  return sent + kept + drift_for(o, ttl);
}
inline std::chrono::steady_clock::time_point gone_by(const WatchdogOptions& o,
                                                     std::chrono::steady_clock::time_point sent,
                                                     std::chrono::milliseconds ttl) {
  return gone_by(o, sent, ttl, ttl);
}

// How long after a renewal (or the acquisition) was sent the next one goes
// out: at ttl*weight, or earlier if that would leave less than
// Options::watchdog.min_renewal_window before the local deadline, but never before
// half the ttl.
inline std::chrono::steady_clock::duration renew_after(const WatchdogOptions& o, std::chrono::milliseconds ttl,
                                                       double weight) {
  using Dur = std::chrono::duration<double, std::milli>;
  auto weighted = Dur(static_cast<double>(ttl.count()) * weight);
  auto latest = Dur(ttl - drift_for(o, ttl) - o.min_renewal_window);
  auto half = Dur(static_cast<double>(ttl.count()) / 2);
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::min(weighted, std::max(half, latest)));
}

}  // namespace lockwatch::detail
