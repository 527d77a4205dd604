#include "store/zookeeper/zk_release.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "core/countdown.hpp"
#include "core/timing.hpp"
#include "store/zookeeper/zk_nodes.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

ZkRelease::ZkRelease(ZkSessions& sessions, const StoreSettings& settings, const StoreEvents& events)
    : sessions_(sessions),
      settings_(settings),
      events_(events),
      cleanup_backoff_(settings.connection.reconnect_min, settings.connection.reconnect_max) {}

void ZkRelease::close() {
  for (auto& g : std::exchange(giving_up_, {})) g->settle(Released::kUnconfirmed);
}

void ZkRelease::tick(Clock::time_point now) {
  auto due = std::stable_partition(giving_up_.begin(), giving_up_.end(), [&](auto& g) { return g->next > now; });
  std::vector<std::shared_ptr<GiveUp>> looks(std::make_move_iterator(due), std::make_move_iterator(giving_up_.end()));
  giving_up_.erase(due, giving_up_.end());
  for (auto& g : looks) retry_give_up(g);
  // The cleanups run when due, and again at once on a new connection.
  const bool cleanup_due = next_cleanup_ != Clock::time_point{} && now >= next_cleanup_;
  if (cleanup_due) next_cleanup_ = {};
  const bool reconnected = sessions_.connections() != seen_connections_;
  seen_connections_ = sessions_.connections();
  if (cleanup_due || reconnected) run_cleanups();
}

// ---- release

void ZkRelease::release(std::span<const LockRef> locks, LockStore::ReleaseDone done) {
  auto shared_done = std::make_shared<LockStore::ReleaseDone>(std::move(done));
  ZkHolds& holds = sessions_.holds;
  for (std::size_t i = 0; i < locks.size(); ++i) {
    Cleanup c{std::string(locks[i].name), std::string(locks[i].token), 0, 0};
    const std::string key = zk::hold_key(c.name, c.token);
    // Held: on the session that made it, whose order puts this after
    // anything it sent before. Every node of the token goes, the held
    // one and any an earlier attempt of the same acquisition made late
    // (a request the ensemble ran after its answer was given up on).
    if (auto h = holds.held.extract(key)) c.session = h.mapped().session;
    holds.marks.erase(key);  // a waiting writer's node goes with the rest of the token's
    // Otherwise not known here (an acquisition whose answer was lost):
    // every node of the token, on any session.
    remove(c, [this, i, c, shared_done](Released st, const StoreError* e) {
      if (st != Released::kUnconfirmed) return (*shared_done)(i, st, e);
      // Held here when the release began: its node found gone afterwards
      // counts as released (docs/zookeeper.md, "What a lock is": release).
      give_up_release(c, *e, [i, shared_done, held = c.session != 0](Released st, const StoreError* err) {
        (*shared_done)(i, held && st == Released::kGone ? Released::kYes : st, err);
      });
    });
  }
}

void ZkRelease::withdraw(const LockRef& lock, WithdrawDone done) {
  auto m = sessions_.holds.marks.extract(zk::hold_key(lock.name, lock.token));
  if (!m) {
    // Not queued (never, or its place ran out): nothing to take out.
    return sessions_.post([done = std::move(done)] { done(nullptr); });
  }
  Cleanup c{std::string(lock.name), std::string(lock.token), m.mapped().attempt, m.mapped().session};
  remove(std::move(c), [done = std::move(done)](Released st, const StoreError* err) {
    done(st == Released::kUnconfirmed ? err : nullptr);
  });
}

// ---- the give-up machine

// A node this store could not remove lives as long as its session does:
// the sessions that may hold it end now, and the release is answered once
// the ensemble has surely expired them (their timeout plus the drift
// allowance), not before (docs/zookeeper.md, "What a lock is": release).
void ZkRelease::give_up_release(const Cleanup& c, StoreError why, Removed answer) {
  const milliseconds wait = end_sessions(c);
  auto g = std::make_shared<GiveUp>(GiveUp{Cleanup{c.name, c.token, 0, 0}, std::move(why), std::move(answer),
                                           gone_by(settings_.watchdog, Clock::now(), wait)});
  // No session was live: nothing to wait for.
  if (wait.count() == 0) return sessions_.post([g] { g->settle(Released::kUnconfirmed); });
  // Meanwhile the node is looked for from a new session, again and again:
  // found gone or removed, the release is confirmed after all (a quorum
  // that comes back gives every session a fresh timeout, so waiting alone
  // could end before the ensemble removes it).
  retry_give_up(std::move(g));
}

milliseconds ZkRelease::end_sessions(const Cleanup& c) {
  std::vector<ZkSession*> ending;
  auto add = [&](std::uint64_t serial) {
    ZkSession* s = sessions_.live(serial);
    if (s != nullptr && std::find(ending.begin(), ending.end(), s) == ending.end()) ending.push_back(s);
  };
  if (c.session != 0) add(c.session);
  for (const auto& other : cleanups_)
    if (other.token == c.token && other.name == c.name && other.session != 0) add(other.session);
  milliseconds wait{0};
  for (ZkSession* s : ending) {
    wait = std::max(wait, milliseconds(std::max<long long>(s->negotiated_ms, s->requested_ms)));
    const bool had_locks = sessions_.retire(s);
    if (events_.log)
      events_.log(true, fmt::format("{}: a lock's release could not be confirmed; its session ends so that the "
                                    "ensemble removes its node{}",
                                    sessions_.endpoint(),
                                    had_locks ? " (the session's other locks are lost with it)" : ""));
    if (events_.subscriptions_lost) events_.subscriptions_lost();
  }
  return wait;
}

void ZkRelease::retry_give_up(std::shared_ptr<GiveUp> g) {
  delete_nodes(g->c, [this, g](Released st, const StoreError*) {
    if (st != Released::kUnconfirmed || Clock::now() >= g->until || sessions_.closed()) return g->settle(st);
    g->next = std::min(g->until, Clock::now() + settings_.connection.reconnect_min);
    giving_up_.push_back(g);
  });
}

// ---- removing nodes

void ZkRelease::delete_nodes(const Cleanup& c, Removed done) {
  ZkSession* s = c.session != 0 ? sessions_.live(c.session) : sessions_.any_session();
  if (s == nullptr && sessions_.expired(c.session)) {
    // The ensemble expired its session: it removed its nodes with it.
    return sessions_.post([done = std::move(done)] { done(Released::kGone, nullptr); });
  }
  // A session this store ended itself may live on in the ensemble until
  // it expires there: its nodes are looked for from another.
  if (s == nullptr) s = sessions_.any_session();
  const std::string dir = zk::dir_of(c.name);
  sessions_.list(*s, dir, [this, dir, c, done = std::move(done)](const ZkResult& r) {
    if (r.rc == ZNONODE || (r.rc == ZSESSIONEXPIRED && c.session != 0)) return done(Released::kGone, nullptr);
    if (r.failure() != ZOK)
      return sessions_.answer_failed(done, r.failure(), "listing the lock's nodes", Released::kUnconfirmed);
    const std::string token = zk::escape(c.token);
    const std::string attempt = std::to_string(c.attempt);
    std::vector<std::string> mine;
    for (const auto& n : r.children) {
      const zk::NodeName node = zk::parse_node(n);
      if (node.token == token && (c.attempt == 0 || node.attempt == attempt)) mine.push_back(dir + "/" + n);
    }
    if (mine.empty()) return done(Released::kGone, nullptr);
    delete_paths(*r.session, mine, [this, done](int rc) {
      if (rc == ZOK) return done(Released::kYes, nullptr);
      sessions_.answer_failed(done, rc, "deleting the lock's node", Released::kUnconfirmed);
    });
  });
}

void ZkRelease::remove(Cleanup c, Removed done) {
  delete_nodes(c, [this, c, done = std::move(done)](Released st, const StoreError* err) {
    if (st == Released::kUnconfirmed) remember_cleanup(c);
    if (done) done(st, err);
  });
}

void ZkRelease::delete_paths(ZkSession& s, std::vector<std::string> paths, std::function<void(int rc)> done) {
  auto all = Countdown<int>::make(paths.size(), {}, [done = std::move(done)](auto& c) {
    done(c.failure.value_or(ZOK));  // ZNONODE: gone already
  });
  for (const auto& p : paths)
    sessions_.request(
        s, [all](const ZkResult& r) { all->answered(zk::failure_unless_gone(r)); }, false, zoo_adelete, p, -1,
        zk::on_void);
}

// ---- cleanups

void ZkRelease::remember_cleanup(Cleanup c) {
  if (sessions_.closed()) return;
  cleanups_.push_back(std::move(c));
  if (!cleaning_) next_cleanup_ = Clock::now() + cleanup_backoff_.next();
}

void ZkRelease::run_cleanups() {
  if (cleaning_ || sessions_.closed() || cleanups_.empty()) return;
  cleaning_ = true;
  // Once every one answered, those still unconfirmed are kept at again.
  auto all = Countdown<int, std::vector<Cleanup>>::make(cleanups_.size(), {}, [this](auto& again) {
    cleaning_ = false;
    if (again.empty() && cleanups_.empty()) return cleanup_backoff_.reset();
    for (auto& each : again) remember_cleanup(std::move(each));
    if (again.empty() && !cleanups_.empty()) run_cleanups();
  });
  for (auto& c : std::exchange(cleanups_, {}))
    delete_nodes(c, [all, c](Released st, const StoreError*) {
      if (st == Released::kUnconfirmed) all->push_back(c);
      all->answered();
    });
}

}  // namespace lockwatch::detail
