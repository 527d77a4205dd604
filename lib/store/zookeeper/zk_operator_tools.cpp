#include "store/zookeeper/zk_operator_tools.hpp"

#include <algorithm>

#include "core/countdown.hpp"
#include "store/zookeeper/zk_nodes.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

void ZkOperatorTools::inspect(std::string_view name, InspectDone done) {
  const std::string dir = zk::dir_of(name);
  sessions_.list(*sessions_.any_session(), dir, [this, dir, done = std::move(done)](const ZkResult& r) {
    // No directory (ZNONODE): no nodes, not held.
    if (zk::failure_unless_gone(r)) return sessions_.answer_failed(done, r.rc, "listing the lock's nodes", LockInfo{});
    read_holders(r.session, dir, zk::holding(zk::in_order(r.children)), done);
  });
}

namespace {

// A lock's LockInfo from its holders' nodes as read (`reads`, in order; a
// node gone meanwhile is left out): not held if none was there.
LockInfo holders_of(LockKind kind, const std::vector<ZkResult>& reads) {
  LockInfo info;
  info.kind = kind;
  for (const ZkResult& r : reads) {
    if (r.rc != ZOK) continue;
    HolderInfo h;
    auto [token, ttl_ms] = zk::parse_data(r.value, &h.owner_name);
    h.token = std::move(token);
    // ctime: the ensemble's clock when the node was made (the grant, or the
    // place a fair holder waited in); its age on this host's clock.
    h.since = std::chrono::system_clock::time_point(milliseconds(r.stat.ctime));
    h.held_for =
        std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now() - h.since));
    if (&r == &reads.front()) info.fencing_token = static_cast<std::uint64_t>(r.stat.czxid);
    info.held = true;
    info.ttl = std::max(info.ttl, milliseconds(ttl_ms));
    info.holders.push_back(std::move(h));
  }
  if (!info.held) return LockInfo{};
  if (info.kind.single_holder()) info.owner = info.holders.front().token;
  return info;
}

}  // namespace

void ZkOperatorTools::read_holders(ZkSession* s, const std::string& dir, std::vector<std::string> nodes,
                                   OperatorTools::InspectDone done) {
  if (nodes.empty() || s == nullptr) return done(LockInfo{}, nullptr);
  auto all = Countdown<int, std::vector<ZkResult>>::make(
      nodes.size(), std::vector<ZkResult>(nodes.size()),
      [this, kind = zk::kind_of(nodes.front()), done = std::move(done)](auto& c) {
        if (!c.failure) return done(holders_of(kind, c), nullptr);
        sessions_.answer_failed(done, *c.failure, "reading the holders' nodes", LockInfo{});
      });
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    sessions_.read(*s, dir + "/" + nodes[i], false, [all, i](const ZkResult& r) {
      (*all)[i] = r;
      all->answered(zk::failure_unless_gone(r));
    });
  }
}

struct ZkOperatorTools::Listing {
  std::vector<std::string> names{};  // under the prefix, in order
  std::size_t limit = 0;
  std::vector<LockInfo> found{};
  LockListing::ListDone done;
};

void ZkOperatorTools::list_locks(std::string_view prefix, std::size_t limit, ListDone done) {
  const std::string escaped = zk::escape(store_.encode(prefix));
  auto listing = std::make_shared<Listing>(Listing{.limit = limit, .done = std::move(done)});
  sessions_.list(*sessions_.any_session(), zk::kRoot, [this, listing, escaped](const ZkResult& r) {
    // No /lockwatch (ZNONODE): no names, an empty listing.
    if (zk::failure_unless_gone(r))
      return sessions_.answer_failed(listing->done, r.rc, "listing the locks' directories", std::vector<LockInfo>{});
    // Escaping is per byte: a name under the prefix escapes to a child under the escaped prefix.
    for (const auto& child : r.children) {
      std::string name;
      if (child.compare(0, escaped.size(), escaped) == 0 && zk::unescape(child, name))
        listing->names.push_back(std::move(name));
    }
    std::sort(listing->names.begin(), listing->names.end());
    list_window(listing, 0);
  });
}

// A directory stays once made: the names are inspected a window at a time
// (each window's requests at once, from the name at `from`), until
// `limit` held ones are found.
void ZkOperatorTools::list_window(std::shared_ptr<Listing> listing, std::size_t from) {
  constexpr std::size_t kWindow = 64;
  const std::size_t to = std::min(listing->names.size(), from + kWindow);
  if (from == to || listing->found.size() >= listing->limit) {
    if (listing->found.size() > listing->limit) listing->found.resize(listing->limit);
    return listing->done(std::move(listing->found), nullptr);
  }
  // The window's LockInfos, in its names' order.
  using Window = std::vector<LockInfo>;
  const std::size_t n = to - from;
  auto all = Countdown<StoreError, Window>::make(n, Window(n), [this, listing, from, to](auto& w) {
    if (w.failure) return listing->done({}, &*w.failure);
    for (std::size_t k = 0; k < w.size(); ++k) {
      if (!w[k].held) continue;
      w[k].key = listing->names[from + k].substr(store_.traits().keys.prefix.size());
      listing->found.push_back(std::move(w[k]));
    }
    list_window(listing, to);
  });
  for (std::size_t i = from; i < to; ++i)
    inspect(listing->names[i], [all, i, from](const LockInfo& info, const StoreError* e) {
      (*all)[i - from] = info;
      all->answered(e);
    });
}

void ZkOperatorTools::force_release(std::string_view name, ForceDone done) {
  const std::string dir = zk::dir_of(name);
  sessions_.list(*sessions_.any_session(), dir, [this, dir, done = std::move(done)](const ZkResult& r) {
    if (r.rc == ZNONODE) return done(false, nullptr);
    auto nodes = zk::in_order(r.children);
    if (r.failure() != ZOK) return sessions_.answer_failed(done, r.failure(), "listing the lock's nodes", false);
    if (nodes.empty()) return done(false, nullptr);
    release_.delete_paths(*r.session, {dir + "/" + nodes.front()}, [this, done](int rc) {
      if (rc == ZOK) return done(true, nullptr);
      sessions_.answer_failed(done, rc, "deleting the holder's node", false);
    });
  });
}

}  // namespace lockwatch::detail
