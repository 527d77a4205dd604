// lib/store/zookeeper/zk_claims.hpp: scheduled jobs' claims (JobClaims) on
// a ZooKeeper ensemble: the clock is the mtime a write to /lockwatch gets,
// a job's last period the `period` node set by one multi that checks our
// lock's node (docs/zookeeper.md, "What a lock is": scheduled jobs).
//
// Costs: a claim three round trips (the clock, the read, the multi), more
// when another claim changed the version meanwhile (at most 5 tries).
//
// Threading: the loop thread.
#pragma once

#include "store/capabilities.hpp"
#include "store/zookeeper/zk_session.hpp"

namespace lockwatch::detail {

class ZkClaims final : public JobClaims {
 public:
  explicit ZkClaims(ZkSessions& sessions) : sessions_(sessions) {}

  void server_time(TimeDone done) override;
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) override;

 private:
  struct Claim;
  // Reads the period node, then claim_write().
  void claim_step(std::shared_ptr<Claim> c);
  // One multi: our lock's node is there, and the period node is as read.
  void claim_write(ZkSession& s, std::shared_ptr<Claim> c, bool exists, int version);

  ZkSessions& sessions_;
};

}  // namespace lockwatch::detail
