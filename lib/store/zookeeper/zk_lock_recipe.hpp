// lib/store/zookeeper/zk_lock_recipe.hpp: ZooKeeper's lock recipe, as the
// ZooKeeper store acquires: a node per attempt, the listing that decides
// who holds and who waits how (decide()), the fair queue, the fencing
// tokens (grant()); docs/zookeeper.md ("What a lock is", "Kinds of lock",
// "The fencing token") says what each step does and why. A repeat with
// the same token finds the node it made: the same acquisition, the same
// fence.
//
// Costs: an acquisition three round trips (create, list, the fence; four
// when busy, a busy permit n + 3).
//
// Threading: the loop thread.
#pragma once

#include "store/zookeeper/zk_release.hpp"

namespace lockwatch::detail {

class ZkLockRecipe {
 public:
  // `owner` is Options::runtime.owner_name, in each node's data.
  ZkLockRecipe(ZkSessions& sessions, ZkRelease& release, const WatchdogOptions& watchdog, std::string owner)
      : sessions_(sessions), release_(release), watchdog_(watchdog), owner_(std::move(owner)) {}

  void acquire(std::span<const LockRef> locks, LockStore::AcquireDone done);

 private:
  using Clock = std::chrono::steady_clock;
  struct AcquireOp;
  using Op = std::shared_ptr<AcquireOp>;

  // A repeat of an acquisition that took the lock, or of a waiting one
  // that kept its node: listed again (true), or not one (false).
  bool repeated(Op& op);
  void create_node(Op op, bool parents_made);
  void make_parents(Op op, int step);
  void list_nodes(Op op);
  // The decision on a listing in which our node is at `at`.
  void decide(const Op& op, const std::vector<std::string>& nodes, std::size_t at);
  void grant(const Op& op);
  // Refuses the call with `e` once our node is gone (confirmed, or left to
  // the cleanups): nothing of a refused call stays in the queue.
  void refuse(const Op& op, const StoreError& e);
  // A waiter's node lost to its span: a new one, at the back of the queue.
  void requeue(const Op& op);
  // Busy: our node goes, forgotten here (or stays, a writer's mark),
  // `watch` is read with watches, and the answer is busy for their
  // shortest ttl (at most `cap`).
  void wait_behind(const Op& op, std::vector<std::string> watch, bool keep_node, std::chrono::milliseconds cap);
  void read_watched(const Op& op, const std::vector<std::string>& watch, std::chrono::milliseconds cap);
  // Sets the directory's `fence` node to `data` (made if missing); `done`
  // gets the outcome and the write's zxid.
  void write_fence(ZkSession& s, const std::string& dir, std::string data,
                   std::function<void(int rc, std::int64_t zxid)> done, int step = 0);
  void forget(const AcquireOp& op);
  void finish(const Op& op, const Acquired& out);
  void fail(const Op& op, const StoreError& e);
  void fail_later(const Op& op, const StoreError& e);
  // The session that made op's node; null when it ended (op forgotten
  // and failed, on the next turn).
  ZkSession* node_session(const Op& op);
  // Fails the call with `e`, leaving a node this attempt may have made to
  // the cleanups.
  void abandon(const Op& op, const StoreError& e);

  ZkSessions& sessions_;
  ZkRelease& release_;
  const WatchdogOptions& watchdog_;  // the drift allowance
  const std::string owner_;
  std::uint64_t next_attempt_ = 1;
};

}  // namespace lockwatch::detail
