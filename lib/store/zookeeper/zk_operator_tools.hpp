// lib/store/zookeeper/zk_operator_tools.hpp: what an operator asks of a
// ZooKeeper store (OperatorTools, LockListing): who holds a lock, a forced
// release, the locks under a prefix. Uses the sessions and the release
// part.
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

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "store/capabilities.hpp"
#include "store/zookeeper/zk_release.hpp"
#include "store/zookeeper/zk_session.hpp"

namespace lockwatch::detail {

class ZkOperatorTools {
 public:
  // `key_prefix` is the store's (taken off the names a listing reports).
  ZkOperatorTools(ZkSessions& sessions, ZkRelease& release, std::size_t key_prefix)
      : sessions_(sessions), release_(release), key_prefix_(key_prefix) {}
  ZkOperatorTools(const ZkOperatorTools&) = delete;
  ZkOperatorTools& operator=(const ZkOperatorTools&) = delete;

  void inspect(std::string_view name, OperatorTools::InspectDone done);
  void force_release(std::string_view name, OperatorTools::ForceDone done);
  // `prefix` is a lock name's (LockStore::encode() of the user's prefix).
  void list_locks(std::string_view prefix, std::size_t limit, LockListing::ListDone done);

 private:
  struct Listing;
  void list_window(std::shared_ptr<Listing> listing);
  // Reads the holders' nodes of `dir` (`nodes`, in order) into a LockInfo.
  void read_holders(std::uint64_t serial, const std::string& dir, std::vector<std::string> nodes,
                    OperatorTools::InspectDone done);

  ZkSessions& sessions_;
  ZkRelease& release_;
  const std::size_t key_prefix_;
};

}  // namespace lockwatch::detail
