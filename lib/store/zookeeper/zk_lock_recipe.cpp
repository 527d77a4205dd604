#include "store/zookeeper/zk_lock_recipe.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "core/countdown.hpp"
#include "core/timing.hpp"
#include "store/kind_rules.hpp"
#include "store/zookeeper/zk_nodes.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

// Its Node: our node, once made (or found); `attempt` is in the node's
// name (this attempt's nodes only).
struct ZkLockRecipe::AcquireOp : ZkHolds::Node, OwnedLock {
  using OwnedLock::OwnedLock;
  std::size_t index = 0;
  std::shared_ptr<LockStore::AcquireDone> done;
  std::string dir;
  Clock::time_point sent;     // when the request that made (or found) the node went out
  bool repeat = false;     // a repeat of a granted acquisition: its fence again
  bool from_mark = false;  // a writer's attempt that found its own mark
};

void ZkLockRecipe::forget(const AcquireOp& op) {
  ZkHolds& holds = sessions_.holds;
  const std::string key = zk::hold_key(op.name, op.token);
  holds.held.erase(key);
  if (auto m = holds.marks.find(key); m != holds.marks.end() && m->second.attempt == op.attempt) holds.marks.erase(m);
}

void ZkLockRecipe::acquire(std::span<const LockRef> locks, LockStore::AcquireDone done) {
  auto shared_done = std::make_shared<LockStore::AcquireDone>(std::move(done));
  for (std::size_t i = 0; i < locks.size(); ++i) {
    auto op = std::make_shared<AcquireOp>(locks[i]);
    op->index = i;
    op->done = shared_done;
    op->dir = zk::dir_of(op->name);
    op->attempt = next_attempt_++;
    if (sessions_.closed())
      fail_later(op, sessions_.error(ZCLOSING, ""));
    else if (!repeated(op))
      create_node(std::move(op), false);
  }
}

void ZkLockRecipe::finish(const Op& op, const Acquired& out) { (*op->done)(op->index, out); }

void ZkLockRecipe::fail(const Op& op, const StoreError& e) { finish(op, Acquired::failed(e)); }

void ZkLockRecipe::fail_later(const Op& op, const StoreError& e) {
  sessions_.post([this, op, e] { fail(op, e); });
}

ZkSession* ZkLockRecipe::node_session(const Op& op) {
  ZkSession* s = sessions_.live(op->session);
  if (s != nullptr) return s;
  forget(*op);
  fail_later(op, sessions_.error(ZSESSIONEXPIRED, "the session that made the lock's node ended"));
  return nullptr;
}

// A repeat of an acquisition that took the lock: its node, if it is still
// there, and only within its session's timeout. A waiting writer that
// tries again: its node, still in the queue, and another span for its
// mark (any other's mark goes).
bool ZkLockRecipe::repeated(Op& op) {
  ZkHolds& holds = sessions_.holds;
  const std::string key = zk::hold_key(op->name, op->token);
  auto h = holds.held.find(key);
  ZkSession* s = h == holds.held.end() ? nullptr : sessions_.live(h->second.session);
  if (h != holds.held.end() && s == nullptr) holds.held.erase(h);
  op->sent = Clock::now();
  if (s != nullptr && op->ttl.count() > s->negotiated_ms) {
    fail_later(op, sessions_.refusal(fmt::format(
                       "a repeated acquisition asks a ttl of {} ms, longer than the {} ms session that holds the "
                       "lock: ZooKeeper cannot lengthen a session",
                       op->ttl.count(), s->negotiated_ms)));
    return true;
  }
  if (s != nullptr) {
    static_cast<ZkHolds::Node&>(*op) = h->second;
    op->repeat = true;
  } else if (auto m = holds.marks.find(key); m == holds.marks.end()) {
    return false;
  } else if (sessions_.live(m->second.session) != nullptr && op->kind.single_holder()) {
    static_cast<ZkHolds::Node&>(*op) = m->second;
    op->from_mark = true;
    m->second.until = op->sent + zk::mark_span(op->ttl, op->kind);
  } else {
    ZkRelease::Cleanup c{op->name, op->token, m->second.attempt, m->second.session};
    holds.marks.erase(m);
    release_.remove(std::move(c));
    return false;
  }
  list_nodes(std::move(op));
  return true;
}

void ZkLockRecipe::create_node(Op op, bool parents_made) {
  ZkSession* session = sessions_.session_for(op->ttl);
  op->session = session->serial;
  op->sent = Clock::now();
  std::string data = zk::node_data(op->token, op->ttl, owner_);
  const int size = static_cast<int>(data.size());
  auto created = [this, op, parents_made](const ZkResult& r) {
    if (r.rc == ZNONODE && !parents_made) return make_parents(op, 0);
    if (r.rc != ZOK) {
      // No answer: the node may be made yet (the client sends what it
      // queued once it connects), and the store removes it then.
      const StoreError e = sessions_.error(r.rc, "creating the lock's node");
      return zk::unreachable(r.rc) ? abandon(op, e) : fail(op, e);
    }
    op->path = r.value;
    op->czxid = r.stat.czxid;
    ZkSession* s = r.session;
    if (s == nullptr) return fail(op, sessions_.error(ZSESSIONEXPIRED, "the session ended"));
    // Its timeout was negotiated when it connected, before this was sent.
    if (op->ttl.count() > s->negotiated_ms) {
      // The ensemble's maxSessionTimeout is below the ttl: a lease
      // would outlive what guards it.
      return refuse(op, sessions_.refusal(fmt::format(
                            "the ttl {} ms is longer than the session timeout the ZooKeeper ensemble grants "
                            "({} ms: its maxSessionTimeout); a lock's ttl is its session's timeout",
                            op->ttl.count(), s->negotiated_ms)));
    }
    list_nodes(op);
  };
  sessions_.request(*session, std::move(created), false, zoo_acreate2,
                    zk::node_prefix(op->dir, op->token, op->attempt, op->kind), std::move(data), size,
                    sessions_.acl(), ZOO_EPHEMERAL_SEQUENTIAL, zk::on_created);
}

void ZkLockRecipe::requeue(const Op& op) {
  op->from_mark = false;
  op->attempt = next_attempt_++;
  create_node(op, true);
}

void ZkLockRecipe::abandon(const Op& op, const StoreError& e) {
  release_.remember_cleanup(ZkRelease::Cleanup{op->name, op->token, op->attempt, op->session});
  fail(op, e);
}

void ZkLockRecipe::make_parents(Op op, int step) {
  ZkSession* s = sessions_.session_for(op->ttl);
  sessions_.make_node(*s, step == 0 ? std::string(zk::kRoot) : op->dir, [this, op, step](int rc) {
    if (rc != ZOK) {
      const std::string& chroot = sessions_.target().chroot;
      return fail(op, sessions_.error(rc, rc == ZNONODE && !chroot.empty()
                                              ? fmt::format("the chroot {} does not exist on the ensemble", chroot)
                                              : std::string("creating the lock's directory")));
    }
    if (step == 0) return make_parents(op, 1);
    create_node(op, true);
  });
}

void ZkLockRecipe::list_nodes(Op op) {
  ZkSession* s = node_session(op);
  if (s == nullptr) return;
  sessions_.list(*s, op->dir, [this, op](const ZkResult& r) {
    auto nodes = zk::in_order(r.children);
    auto own = std::find(nodes.begin(), nodes.end(), op->path.substr(op->path.rfind('/') + 1));
    // Our node unconfirmed (the listing failed, or it is not there): forgotten here.
    if (r.failure() != ZOK || own == nodes.end()) {
      forget(*op);
      if (r.failure() != ZOK) return abandon(op, sessions_.error(r.failure(), "listing the lock's nodes"));
      // A writer's mark: the store removed it meanwhile (its span passed).
      if (op->from_mark) return requeue(op);
      // Otherwise its session expired meanwhile (or an operator removed it).
      return fail(op, sessions_.error(ZSESSIONEXPIRED, "the lock's node is gone"));
    }
    decide(op, nodes, static_cast<std::size_t>(own - nodes.begin()));
  });
}

// Who holds, from one listing in sequence order: only what is below our
// node decides (docs/zookeeper.md, "Kinds of lock"). A node of another
// family there refuses the call (InvalidArgument), and our node goes.
void ZkLockRecipe::decide(const Op& op, const std::vector<std::string>& nodes, std::size_t at) {
  const auto below = nodes.begin() + static_cast<std::ptrdiff_t>(at);
  auto other =
      std::find_if(nodes.begin(), below, [&](const auto& n) { return !kinds::same_family(zk::kind_of(n), op->kind); });
  if (other != below) {
    forget(*op);
    return refuse(op, sessions_.refusal(kinds::refusal(op->name, zk::kind_of(*other), op->kind)));
  }
  const std::string dir = op->dir + "/";
  switch (op->kind.mode()) {
    case LockKind::Mode::kFair:
    case LockKind::Mode::kExclusive: {
      if (at == 0) break;
      // A fair waiter's node is its place in the queue; a writer's behind
      // readers only stays too (a mark that stops new readers). Either
      // mark watches the node just below.
      const bool fair = op->kind.mode() == LockKind::Mode::kFair;
      if (fair || std::none_of(nodes.begin(), below, [](const auto& n) { return zk::kind_of(n).exclusive_kind(); }))
        return wait_behind(op, {dir + nodes[at - 1]}, true, zk::mark_span(op->ttl, op->kind) / (fair ? 3 : 2));
      return wait_behind(op, {dir + nodes.front()}, false, milliseconds::max());
    }
    case LockKind::Mode::kShared: {
      // The nearest writer's node below ours is watched; not the lowest, it
      // is a waiting writer's mark: the next try comes by its end.
      for (std::size_t i = at; i-- > 0;)
        if (zk::kind_of(nodes[i]).exclusive_kind())
          return wait_behind(op, {dir + nodes[i]}, false, i == 0 ? milliseconds::max() : kinds::kWriterMark);
      break;
    }
    case LockKind::Mode::kPermits: {
      const std::size_t n = op->kind.permit_count();
      if (at < n) break;
      std::vector<std::string> holders;
      for (std::size_t i = 0; i < n; ++i) holders.push_back(dir + nodes[i]);
      return wait_behind(op, std::move(holders), false, milliseconds::max());
    }
  }
  grant(op);
}

void ZkLockRecipe::refuse(const Op& op, const StoreError& e) {
  ZkSession* s = sessions_.live(op->session);
  if (s == nullptr) return fail(op, e);
  release_.delete_paths(*s, {op->path}, [this, op, e](int rc) {
    rc != ZOK ? abandon(op, e) : fail(op, e);
  });
}

// A grant's fencing token (docs/zookeeper.md, "The fencing token"): a
// writer's (and a fair holder's) node's czxid, written to `fence` before
// the answer; a reader's, `fence` read after the listing that let it in; a
// permit's, the zxid of its write to `fence`. A repeat of a granted
// acquisition answers the token it was given.
void ZkLockRecipe::grant(const Op& op) {
  ZkHolds& holds = sessions_.holds;
  const std::string key = zk::hold_key(op->name, op->token);
  if (op->from_mark) {
    auto m = holds.marks.find(key);
    // The mark's span passed as the listing came back: the store is
    // removing the node.
    if (m == holds.marks.end() || m->second.attempt != op->attempt) return requeue(op);
    holds.marks.erase(m);
  }
  auto done = [this, op, key](std::uint64_t fence) {
    op->until = gone_by(watchdog_, op->sent, op->ttl);
    op->fence = fence;
    sessions_.holds.held[key] = *op;
    finish(op, Acquired::taken(fence));
  };
  if (op->repeat) return done(op->fence);
  ZkSession* s = node_session(op);
  if (s == nullptr) return;
  if (op->kind.mode() == LockKind::Mode::kShared) {
    return sessions_.read(*s, op->dir + "/" + zk::kFenceNode, false, [this, op, done](const ZkResult& r) {
      if (r.rc != ZOK && r.rc != ZNONODE)
        return abandon(op, sessions_.error(r.rc, "reading the last writer's fencing token"));
      std::uint64_t fence = 0;
      if (r.rc == ZOK) std::from_chars(r.value.data(), r.value.data() + r.value.size(), fence);
      done(fence);
    });
  }
  const bool permit = op->kind.mode() == LockKind::Mode::kPermits;
  write_fence(*s, op->dir, std::to_string(op->czxid), [this, op, done, permit](int rc, std::int64_t zxid) {
    if (rc != ZOK) return abandon(op, sessions_.error(rc, "setting the lock's fencing token"));
    done(static_cast<std::uint64_t>(permit ? zxid : op->czxid));
  });
}

// Step 0 sets the node; missing (or made meanwhile), step 1 makes it;
// made by another meanwhile, step 2 sets it after all.
void ZkLockRecipe::write_fence(ZkSession& s, const std::string& dir, std::string data,
                               std::function<void(int, std::int64_t)> done, int step) {
  const std::string path = dir + "/" + zk::kFenceNode;
  auto reply = [this, dir, data, done, step](const ZkResult& r) {
    const bool again = step == 0 ? r.rc == ZNONODE || r.rc == ZNODEEXISTS : step == 1 && r.rc == ZNODEEXISTS;
    if (!again) return done(r.rc, r.rc == ZOK ? r.stat.mzxid : 0);
    if (r.session == nullptr) return done(step == 0 ? r.rc : ZSESSIONEXPIRED, 0);
    write_fence(*r.session, dir, data, done, step + 1);
  };
  const int size = static_cast<int>(data.size());
  if (step == 1)
    return sessions_.request(s, reply, false, zoo_acreate2, path, data, size, sessions_.acl(), ZOO_PERSISTENT,
                             zk::on_created);
  sessions_.request(s, reply, false, zoo_aset, path, data, size, -1, zk::on_stat_set);
}

void ZkLockRecipe::wait_behind(const Op& op, std::vector<std::string> watch, bool keep_node, milliseconds cap) {
  ZkSession* s = node_session(op);
  if (s == nullptr) return;
  if (keep_node) {
    // A waiting writer's mark: the store removes it unless the same
    // acquisition tries again within its span.
    op->until = Clock::now() + zk::mark_span(op->ttl, op->kind);
    sessions_.holds.marks[zk::hold_key(op->name, op->token)] = *op;
    return read_watched(op, watch, cap);
  }
  // Our node goes (confirmed first, so that none is left to come to the
  // front unowned).
  forget(*op);
  release_.delete_paths(*s, {op->path}, [this, op, watch = std::move(watch), cap](int rc) {
    if (rc != ZOK) return abandon(op, sessions_.error(rc, "removing a waiter's node"));
    read_watched(op, watch, cap);
  });
}

// The nodes waited on are read with a watch: a deletion is the release
// notice, and their ttl the busy time.
void ZkLockRecipe::read_watched(const Op& op, const std::vector<std::string>& watch, milliseconds cap) {
  ZkSession* s = node_session(op);
  if (s == nullptr) return;
  struct Busy {
    milliseconds busy_for;
  };
  auto all = Countdown<int, Busy>::make(watch.size(), {cap}, [this, op](auto& c) {
    if (c.failure) return fail(op, sessions_.error(*c.failure, "watching the holder's node"));
    finish(op, Acquired::busy(c.busy_for));
  });
  for (const auto& path : watch) {
    sessions_.read(*s, path, true, [op, all](const ZkResult& r) {
      if (r.rc == ZOK) {
        auto [token, ttl_ms] = zk::parse_data(r.value);
        all->busy_for = std::min(all->busy_for, milliseconds(ttl_ms > 0 ? ttl_ms : op->ttl.count()));
      } else if (r.rc == ZNONODE) {
        all->busy_for = milliseconds(1);  // released meanwhile: try again now
      }
      all->answered(zk::failure_unless_gone(r));
    });
  }
}

}  // namespace lockwatch::detail
