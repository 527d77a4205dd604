// lib/store/zookeeper/zk_operator_tools.hpp: what an operator asks of a
// ZooKeeper store (OperatorTools, LockListing): who holds a lock, a forced
// release, the locks under a prefix.
//
// The holder is the lowest node (a shared lock's, the readers below the
// first writer's node; permits(n)'s, the n lowest), each with the owner
// name in its data and its ctime as the grant time; a lock not held
// reports fencing token 0 (the ensemble keeps no counter apart from the
// nodes). The listing is the children of /lockwatch under the prefix, in
// order, inspected a window at a time until `limit` held ones are found.
//
// Costs: an inspection a listing and one read per holder; a listing one
// listing and an inspection per lock directory looked at.
//
// Threading: the loop thread.
#pragma once

#include "store/zookeeper/zk_release.hpp"

namespace lockwatch::detail {

class ZkOperatorTools final : public OperatorTools, public LockListing {
 public:
  // `store` encodes a listing's prefix; its key prefix is taken off the
  // names a listing reports.
  ZkOperatorTools(ZkSessions& sessions, ZkRelease& release, const LockStore& store)
      : sessions_(sessions), release_(release), store_(store) {}

  void inspect(std::string_view name, InspectDone done) override;
  void force_release(std::string_view name, ForceDone done) override;
  void list_locks(std::string_view prefix, std::size_t limit, ListDone done) override;

 private:
  struct Listing;
  void list_window(std::shared_ptr<Listing> listing, std::size_t from);
  // Reads the holders' nodes of `dir` (`nodes`, in order) into a LockInfo.
  void read_holders(ZkSession* s, const std::string& dir, std::vector<std::string> nodes,
                    OperatorTools::InspectDone done);

  ZkSessions& sessions_;
  ZkRelease& release_;
  const LockStore& store_;
};

}  // namespace lockwatch::detail
