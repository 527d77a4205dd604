/// @file
/// lockwatch/election.hpp: leader election on a lock.
///
///   lockwatch::Election election(rt, "scheduler", 5s);
///   lockwatch::Leadership me = election.campaign().get();  // waits its turn
///   write_fenced(data, me.term());        // a fencing token: rises with each leader
///   if (me.stop_token().stop_requested()) ...             // leadership lost
///   election.resign().get();
///
/// Leadership is holding the election's key, an exclusive lock (the key is
/// the election's name) renewed by the runtime's watchdog like any other:
/// the term is the lock's fencing token, so terms rise strictly from leader
/// to leader and two leaders never hold a term at once (the store grants the
/// key to one holder at a time, and a leader that cannot renew in time stops
/// before its ttl ends: its stop_token fires then). A leader that dies is
/// replaced once its ttl ran out; a candidate waits by release notices
/// (never polling the key) and takes over at once when the leader resigns.
///
/// leader() and on_change() read the store's view of the key (the
/// operators' inspect, which every store offers). What they guarantee:
///   - LeaderInfo::identity is the leader's owner token, the same text as
///     Leadership::identity() in the leader's process.
///   - LeaderInfo::term: in the process of the leader, its exact term. In
///     other processes, what the store reports for the key when this
///     Election first saw that leader: on memory://, MariaDB, PostgreSQL and
///     ZooKeeper the key's own fencing token, the exact term; on Redis (one
///     node, Sentinel, Cluster, Redlock) its slot's counter, which other keys
///     of the slot raise too: at least the term, and below the next
///     leader's. Either way the terms an Election reports rise strictly from
///     leader to leader and stay the same for one leader.
///   - on_change: the handler is called with the current view first, then at
///     each change, in order, on a thread of the Election's own. This
///     Election's own wins, resignations and losses are reported as they
///     happen. Other processes' changes are seen by reading the store: on
///     each release notice for the key (stores with notices: every one but
///     MariaDB), then every 10 ms doubling while nobody leads, just after
///     the leader's lease would end unrenewed (a leader that died), and at
///     the latest every ttl (at most 1 s); on a store without notices,
///     every ttl/4 (at most 1 s). A leadership that begins and ends between
///     two reads may go unseen. No change is reported twice or out of order.
///
/// Threading: every member is safe from any thread. Costs: a campaign is one
/// waiting acquisition; on_change adds one thread, the key's release
/// notices, and one inspect of the key per read while a handler is attached.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>

#include "lockwatch/lease.hpp"
#include "lockwatch/runtime.hpp"

namespace lockwatch {

/// Who leads an election, as Election::leader() and on_change() report it.
struct LeaderInfo {
  /// The leader's owner token: Leadership::identity() in its process.
  std::string identity;
  /// The leader's term (see the header comment for what each store gives).
  std::uint64_t term = 0;
  /// The leader's owner name (its runtime's Options::runtime.owner_name, such as
  /// "host:pid:program"), as the store records it; empty where it keeps none.
  std::string owner;
  /// Equal when of the same leader and term.
  bool operator==(const LeaderInfo& other) const noexcept {
    return identity == other.identity && term == other.term;
  }
};

/// A won campaign (Election::campaign()): held until Election::resign(),
/// until it is lost, or until its Election is destroyed. A copyable view;
/// every accessor is safe from any thread.
class Leadership {
 public:
  Leadership() = default;
  /// The term: the fencing token of the grant, strictly higher than every
  /// earlier leader's. Pass it along with writes that must come from the
  /// leader. Precondition: a Leadership made by campaign().
  std::uint64_t term() const noexcept;
  /// Fires when the leadership ends: lost (the lease could not be renewed in
  /// time, or was taken away), resigned, or its Election destroyed.
  std::stop_token stop_token() const noexcept;
  /// This leader's identity, as LeaderInfo::identity shows it everywhere.
  const std::string& identity() const noexcept;
  /// The lease behind it (its key, remaining time, renewals, lost reason).
  const Lease& lease() const noexcept;
  /// True when made by campaign().
  explicit operator bool() const noexcept { return state_ != nullptr; }

  struct State;

 private:
  friend class Election;
  explicit Leadership(std::shared_ptr<State> state) noexcept : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

/// A leader election among the processes that name the same election on the
/// same store (see the header comment).
class Election {
 public:
  /// An election named `name` (the key of its lock) with leaderships of
  /// `ttl`, renewed by `runtime`'s watchdog. Throws InvalidArgument for a
  /// key or ttl the runtime refuses. `runtime` must outlive the Election.
  Election(Runtime& runtime, std::string name, std::chrono::milliseconds ttl);
  /// Resigns (without waiting for the store) and stops on_change's thread.
  ~Election();
  Election(const Election&) = delete;
  Election& operator=(const Election&) = delete;

  /// Waits for leadership, as long as it takes: the future holds the
  /// Leadership once this candidate leads, or the error that stopped the
  /// campaign (ConnectionError after the store was unreachable for the
  /// connect timeout, RuntimeStopped, Cancelled by resign()). Throws
  /// InvalidArgument when a campaign of this Election is running or leads.
  std::future<Leadership> campaign();
  /// campaign() without a future: `handler` runs once, on the runtime's
  /// notifier thread and never inside this call, with the Leadership (and
  /// no error) or the code of the error that stopped the campaign. Throws
  /// as campaign() does, and InvalidArgument for an empty handler.
  /// (lockwatch/asio.hpp: async_campaign.)
  void campaign(std::function<void(std::error_code, Leadership)> handler);
  /// Gives up: a campaign still waiting fails with Cancelled; a leadership
  /// ends (its stop_token fires) and the key is released, so the next
  /// candidate takes over at once. The future is ready once the store
  /// confirmed the release (at once when there was nothing to give up).
  /// Never throws.
  std::future<void> resign();
  /// resign() without a future: `handler` runs once, on the runtime's
  /// notifier thread and never inside this call, once the release is
  /// confirmed (with the code of the release's error, if any), or at once
  /// there when there was nothing to give up. InvalidArgument for an empty
  /// handler. (lockwatch/asio.hpp: async_resign.)
  void resign(std::function<void(std::error_code)> handler);
  /// Who leads now, read from the store (one round trip; blocks for it, at
  /// most the runtime's command timeout): std::nullopt when nobody does.
  /// Throws ConnectionError and the like when the store cannot answer.
  std::optional<LeaderInfo> leader();
  /// Calls `handler` with the current leader (or std::nullopt), then at each
  /// change (see the header comment), on a thread of the Election's own
  /// (keep it short). Handlers are kept for the Election's life. A handler
  /// may call the Election's members.
  void on_change(std::function<void(const std::optional<LeaderInfo>&)> handler);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace lockwatch
