// lib/store/quorum_store.hpp: Redlock, generic over any LockStore.
//
// N independent stores; every step needs a majority, Q = N/2 + 1. How
// acquire (the validity time, the fence raised on the Q takers before it is
// handed out, the give-back), renew and release count: docs/stores.md
// ("Redlock over N independent masters", "Fencing tokens"). Renew is
// transient when every store answered without Q confirmations or more than
// N - Q "not yours"; release answers once every store did (or failed,
// bounded by its own timeouts). Kinds (lock_kind.hpp): shared locks as
// exclusive ones, each store keeping its readers; no permits.
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

#include "lockwatch/options.hpp"
#include "store/capabilities.hpp"
#include "store/store_base.hpp"

namespace lockwatch::detail {

class QuorumStore final : public StoreBase, public JobClaims, public OperatorTools, public LockListing {
 public:
  // `names` name the stores in error messages, one each; `watchdog` gives
  // the drift allowance a majority's lease is judged by.
  QuorumStore(std::vector<std::unique_ptr<LockStore>> stores, std::vector<std::string> names,
              const WatchdogOptions& watchdog);

  std::size_t quorum() const noexcept { return quorum_; }

  void acquire(std::span<const LockRef> locks, AcquireDone done) override;
  std::size_t renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive, RenewDone done) override;
  void release(std::span<const LockRef> locks, bool notify, ReleaseDone done) override;
  void close() override;
  void subscribe(std::string_view name) override;
  void unsubscribe(std::string_view name) override;
  void poll_replies() override;
  void server_time(TimeDone done) override;
  void claim_period(std::string_view name, std::string_view token, std::int64_t period,
                    std::chrono::system_clock::time_point start, ClaimDone done) override;
  void inspect(std::string_view name, InspectDone done) override;
  void force_release(std::string_view name, ForceDone done) override;
  // LockListing: each store's list, a lock kept when a majority holds it.
  void list_locks(std::string_view prefix, std::size_t limit, ListDone done) override;

 private:
  std::pair<LockInfo, std::size_t> majority_view(const std::vector<LockInfo>& infos) const;
  void started() override;
  struct AcquireBatch;
  void on_acquire_vote(const std::shared_ptr<AcquireBatch>& b, std::size_t store, std::size_t index,
                       const Acquired& result);
  void raise_on(const std::shared_ptr<AcquireBatch>& b, std::size_t index, std::size_t store);
  void check_raised(const std::shared_ptr<AcquireBatch>& b, std::size_t index);
  void give_back(const std::shared_ptr<AcquireBatch>& b, std::size_t index, Acquired out);

  std::vector<std::unique_ptr<LockStore>> stores_;
  std::vector<std::string> names_;
  const WatchdogOptions watchdog_;
  const std::size_t quorum_;
};

}  // namespace lockwatch::detail
