// lib/store/zookeeper/zk_renewal.hpp: the ZooKeeper store's renewals (one
// multi of check operations per session and batch: answered, the session
// is alive and the nodes are there) and its own expiry of the locks it
// holds and of waiting nodes whose span passed (docs/zookeeper.md, "What
// a lock is": renew, expiry). A renewal answered after the store removed
// its lock reports the lock gone.
//
// Costs: renewals one request per session and 256 locks; the expiry a
// scan of the held locks at most every 20 ms.
//
// Threading: the loop thread.
#pragma once

#include "store/zookeeper/zk_release.hpp"

namespace lockwatch::detail {

class ZkRenewal {
 public:
  using Clock = std::chrono::steady_clock;

  ZkRenewal(ZkSessions& sessions, ZkRelease& release, const WatchdogOptions& watchdog)
      : sessions_(sessions), release_(release), watchdog_(watchdog) {}

  std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, LockStore::RenewDone done);
  // From the store's sweep: removes what expired (see above).
  void expire_held(Clock::time_point now);

 private:
  // A renewal's check of one held node: one multi per session and chunk.
  struct RenewCheck {
    std::size_t index;
    std::string path;
    std::string key;  // in ZkHolds::held
    std::uint64_t attempt;
    std::chrono::milliseconds ttl;
  };
  void renew_answered(const std::vector<RenewCheck>& chunk, const LockStore::RenewDone& done, Clock::time_point sent,
                      const ZkResult& r);

  ZkSessions& sessions_;
  ZkRelease& release_;
  const WatchdogOptions& watchdog_;  // the drift allowance
  Clock::time_point next_expiry_scan_{};
};

}  // namespace lockwatch::detail
