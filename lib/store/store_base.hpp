// lib/store/store_base.hpp: what most stores share, so that a store
// class declares only what is its own.
//
// - The events start() hands over, kept in events_; a store's own start
//   work goes in started().
// - No-op subscriptions, for a store without release notices (one with
//   them overrides subscribe() and unsubscribe()).
// - FullStore: a store that tells its releases and holds every kind and
//   offers every capability (Redis, memory), or holds what its traits say
//   and offers none (Redis in the redisson layout).
#pragma once

#include <utility>

#include "store/capabilities.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class StoreBase : public LockStore {
 public:
  void start(StoreEvents events) final {
    events_ = std::move(events);
    started();
  }
  void subscribe(std::string_view) override {}
  void unsubscribe(std::string_view) override {}

 protected:
  explicit StoreBase(StoreTraits traits) : LockStore(std::move(traits)) {}
  // start()'s work beyond keeping the events (connections, timers).
  virtual void started() {}
  // The traits of a store that tells its releases and holds every kind.
  static StoreTraits every_kind(KeyRules keys) {
    return {.keys = std::move(keys), .release_events = true, .no_shared = nullptr, .no_permits = nullptr};
  }

  StoreEvents events_;
};

class FullStore : public StoreBase,
                  public FenceRaising,
                  public JobClaims,
                  public OperatorTools,
                  public LockListing,
                  public FairQueue,
                  public TokenBlocks {
 protected:
  explicit FullStore(KeyRules keys) : FullStore(every_kind(std::move(keys)), true) {}
  // A store holding what `traits` say, offering every capability or none.
  FullStore(StoreTraits traits, bool capable) : StoreBase(std::move(traits)) {
    if (capable)
      offer({.fence_raising = this,
             .job_claims = this,
             .operator_tools = this,
             .lock_listing = this,
             .fair_queue = this,
             .token_blocks = this});
  }
};

}  // namespace lockwatch::detail
