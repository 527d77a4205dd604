// lib/store/zookeeper/zk_release.hpp: how the ZooKeeper store removes its
// nodes: releases, a fair waiter's withdrawal, the removal of nodes whose
// first removal found no answer (the cleanups, kept at after each
// reconnect and on a back-off, due at the store's sweep, until an answer
// settles it or the session ends), and the give-up machine for a release
// that could not be confirmed (give_up_release()). docs/zookeeper.md
// ("What a lock is", release) says why a node left behind ends its session.
//
// Costs: a release two round trips (list, delete); every release wakes
// the holder's watchers (ZooKeeper has no quiet delete).
//
// Threading: the loop thread.
#pragma once

#include "core/backoff.hpp"
#include "store/capabilities.hpp"
#include "store/store_settings.hpp"
#include "store/zookeeper/zk_session.hpp"

namespace lockwatch::detail {

class ZkRelease final : public FairQueue {
 public:
  using Clock = std::chrono::steady_clock;
  // Nodes to remove: of `token` under `name`, of one attempt (0: all), on
  // one session (0: any).
  struct Cleanup {
    std::string name;
    std::string token;
    std::uint64_t attempt = 0;
    std::uint64_t session = 0;
  };
  using Removed = std::function<void(Released, const StoreError*)>;

  ZkRelease(ZkSessions& sessions, const StoreSettings& settings, const StoreEvents& events);

  // Answers the releases waiting out their sessions' expiry. After
  // ZkSessions::stop_requests().
  void close();

  void release(std::span<const LockRef> locks, LockStore::ReleaseDone done);
  // A fair waiter (or a waiting writer) that gives up deletes its node (the
  // next one's watch fires: its notice).
  void withdraw(const LockRef& lock, WithdrawDone done) override;

  void delete_nodes(const Cleanup& c, Removed done);
  // Deletes the nodes `c` names, kept at as a cleanup if unconfirmed;
  // `done` (if any) gets the outcome.
  void remove(Cleanup c, Removed done = {});
  // Deletes `paths` (one or more) on `s`; `done` gets ZOK once each is
  // gone (or was).
  void delete_paths(ZkSession& s, std::vector<std::string> paths, std::function<void(int rc)> done);
  // Nodes whose removal is unconfirmed, tried again (see above).
  void remember_cleanup(Cleanup c);

  // From the store's sweep.
  void tick(Clock::time_point now);

 private:
  // A release given up on: see give_up_release().
  struct GiveUp {
    Cleanup c;
    StoreError why;
    Removed answer;  // found gone or removed meanwhile, else unconfirmed after `until`
    Clock::time_point until;
    Clock::time_point next{};  // its next look, while in giving_up_
    // Once: it is in giving_up_ (settled by close()), looking (settled by
    // its look's answer) or, with no session to wait out, posted (settled
    // on the next turn), never two of them.
    void settle(Released st) { answer(st, st == Released::kUnconfirmed ? &why : nullptr); }
  };
  void give_up_release(const Cleanup& c, StoreError why, Removed answer);
  // Ends the sessions that may hold `c`'s nodes; how long the ensemble may
  // keep them (0: none was live).
  std::chrono::milliseconds end_sessions(const Cleanup& c);
  void retry_give_up(std::shared_ptr<GiveUp> g);
  void run_cleanups();

  ZkSessions& sessions_;
  const StoreSettings& settings_;
  const StoreEvents& events_;
  std::vector<Cleanup> cleanups_;  // nodes whose removal is unconfirmed
  std::vector<std::shared_ptr<GiveUp>> giving_up_;
  bool cleaning_ = false;
  Backoff cleanup_backoff_;
  Clock::time_point next_cleanup_{};  // when the cleanups run again ({}: not scheduled)
  std::uint64_t seen_connections_ = 0;  // ZkSessions::connections() at the last tick
};

}  // namespace lockwatch::detail
