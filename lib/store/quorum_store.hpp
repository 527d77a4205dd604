// lib/store/quorum_store.hpp: Redlock, generic over any LockStore.
//
// N independent stores; every step needs a majority, Q = N/2 + 1:
// - acquire: every store is asked at once with the same token; the lock is
//   taken when Q stores took it within the validity time (ttl - elapsed -
//   drift). The fencing token is the largest of the Q counters, and before
//   it is handed out those Q stores are raised to it (raise_fence): a later
//   holder needs Q stores too, shares at least one with this majority, and
//   counts past it there. Anything short of a majority is given back on
//   every store before the caller hears.
// - renew: each store renews the batch; a lock is renewed once Q stores
//   confirmed, gone once more than N - Q said "not yours", and transient
//   when every store answered without either.
// - kinds (lock_kind.hpp): shared locks as exclusive ones, each store
//   keeping its readers; no permits (check_kind() says why).
// - release: goes to every store; confirmed when Q stores answered, and
//   answered only once every store did (or failed, bounded by its own
//   timeouts), so a reachable store never keeps the key after the caller
//   heard it was released.
// - claim_period (scheduled jobs): claimed only when Q stores claimed it in
//   this one call. Each store records a period at most once, and two
//   majorities share a store, so no two calls (of any leader) both reach Q
//   for one period. A store that already recorded it (a retry after a
//   partial claim) does not count: the retry needs Q others, or the period
//   is reported already run. Not leader once more than N - Q stores said
//   so. The store time is the median of the answers.
//
// The votes live in a tally per call, not in the leases. Threading: as
// LockStore.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockwatch/options.hpp"
#include "store/capabilities.hpp"
#include "store/store_base.hpp"

namespace lockwatch::detail {

class QuorumStore final : public StoreBase, public JobClaims, public OperatorTools, public LockListing {
 public:
  // `names` name the stores in error messages, one each.
  QuorumStore(std::vector<std::unique_ptr<LockStore>> stores, std::vector<std::string> names, const Options& options);

  std::size_t quorum() const noexcept { return quorum_; }

  // Each store's own names and key rules: they agree.
  std::string encode(std::string_view key) const override { return stores_.front()->encode(key); }
  const char* check_key(std::string_view key) const noexcept override { return stores_.front()->check_key(key); }
  // Exclusive and shared locks, where every store holds them: a reader's
  // majority and a writer's share a store, which holds one or the other.
  // Not permits: each store counts its own holders, and majorities of
  // different holders overlap (3 stores, n = 2: holders on {1,2}, {2,3} and
  // {1,3} leave 2 on each store), so more than n could hold. Not fair
  // locks: each store's queue has its own order.
  const char* check_kind(LockKind kind) const noexcept override {
    if (kind.mode() == LockKind::Mode::kFair)
      return "a quorum cannot keep one order of waiters: each store queues its own, and majorities of different "
             "queues could grant out of arrival order";
    if (kind.mode() == LockKind::Mode::kPermits)
      return "a quorum cannot bound a semaphore: each store counts its own holders, and majorities of different "
             "holders overlap, so more than n could hold";
    for (const auto& s : stores_)
      if (const char* why = s->check_kind(kind)) return why;
    return nullptr;
  }

  // Every call to every store; each lock decided by its majority (see above).
  LOCKWATCH_STORE_OPERATIONS;
  // On every store: a notice from any one wakes a waiter.
  LOCKWATCH_STORE_NOTICES;
  void poll_replies() override;
  // JobClaims: the median clock; claimed when a majority claimed.
  LOCKWATCH_JOB_CLAIMS_OPERATIONS;
  // OperatorTools: held when a majority holds it, with their highest token.
  LOCKWATCH_OPERATOR_TOOLS_OPERATIONS;
  // LockListing: each store's list, a lock kept when a majority holds it.
  LOCKWATCH_LOCK_LISTING_OPERATIONS;

 private:
  LockInfo majority_view(const std::vector<LockInfo>& infos, std::size_t& largest) const;
  void started() override;
  struct AcquireBatch;
  void on_acquire_vote(const std::shared_ptr<AcquireBatch>& b, std::size_t store, std::size_t index,
                       const Acquired& result);
  void raise_on(const std::shared_ptr<AcquireBatch>& b, std::size_t index, std::size_t store);
  void check_raised(const std::shared_ptr<AcquireBatch>& b, std::size_t index);
  void give_back(const std::shared_ptr<AcquireBatch>& b, std::size_t index, Acquired out);

  std::vector<std::unique_ptr<LockStore>> stores_;
  // Each store's capabilities, in stores_'s order (every store has them).
  std::vector<FenceRaising*> fences_;
  std::vector<JobClaims*> jobs_;
  std::vector<OperatorTools*> tools_;
  std::vector<LockListing*> listings_;
  std::vector<std::string> names_;
  const Options options_;
  const std::size_t quorum_;
};

}  // namespace lockwatch::detail
