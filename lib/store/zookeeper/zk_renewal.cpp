#include "store/zookeeper/zk_renewal.hpp"

#include <algorithm>
#include <map>
#include <optional>

#include "core/timing.hpp"
#include "store/zookeeper/zk_nodes.hpp"

namespace lockwatch::detail {

using std::chrono::milliseconds;

namespace {
// Check operations per multi: well within jute.maxbuffer for the longest
// paths.
constexpr std::size_t kZkChecksPerMulti = 256;
}  // namespace

std::size_t ZkRenewal::renew(std::span<const LockRef> locks, std::shared_ptr<const void> keepalive,
                             LockStore::RenewDone done) {
  auto shared_done = std::make_shared<LockStore::RenewDone>(std::move(done));
  // By session: one multi of checks per chunk.
  std::map<std::uint64_t, std::vector<RenewCheck>> by_session;
  std::vector<std::size_t> gone, transient;
  ZkHolds& holds = sessions_.holds;
  for (std::size_t i = 0; i < locks.size(); ++i) {
    std::string key = zk::hold_key(locks[i].name, locks[i].token);
    auto h = holds.held.find(key);
    ZkSession* s = h == holds.held.end() ? nullptr : sessions_.live(h->second.session);
    if (s == nullptr)
      gone.push_back(i);  // its session expired (or it was never ours)
    else if (!s->up)
      transient.push_back(i);
    else
      by_session[s->serial].push_back(RenewCheck{i, h->second.path, std::move(key), h->second.attempt, locks[i].ttl});
  }
  if (!gone.empty() || !transient.empty())
    sessions_.post([this, shared_done, gone, transient, keepalive] {
      for (auto i : gone) (*shared_done)(i, Renewed::kGone, nullptr);
      const StoreError down = sessions_.error(ZCONNECTIONLOSS, "the session is disconnected");
      for (auto i : transient) (*shared_done)(i, Renewed::kTransient, &down);
    });
  std::size_t commands = 0;
  for (auto& [serial, members] : by_session) {
    for (std::size_t from = 0; from < members.size(); from += kZkChecksPerMulti) {
      auto chunk = std::make_shared<std::vector<RenewCheck>>(
          members.begin() + from, members.begin() + std::min(members.size(), from + kZkChecksPerMulti));
      ++commands;
      sessions_.send(
          *sessions_.live(serial),
          [this, chunk, shared_done, keepalive, sent = Clock::now()](const ZkResult& r) {
            renew_answered(*chunk, *shared_done, sent, r);
          },
          [chunk](zhandle_t* zh, void* ctx) {
            auto* c = static_cast<ZkCtx*>(ctx);
            c->results.resize(chunk->size());
            std::vector<zoo_op_t> ops(chunk->size());
            for (std::size_t k = 0; k < chunk->size(); ++k) zoo_check_op_init(&ops[k], (*chunk)[k].path.c_str(), -1);
            return zoo_amulti(zh, static_cast<int>(ops.size()), ops.data(), c->results.data(), zk::on_void, ctx);
          });
    }
  }
  return commands;
}

void ZkRenewal::renew_answered(const std::vector<RenewCheck>& chunk, const LockStore::RenewDone& done,
                               Clock::time_point sent, const ZkResult& r) {
  // Confirmed: the lock's expiry moves on, unless the store removed it
  // meanwhile (its expiry passed): then it is gone.
  auto confirm = [&](const RenewCheck& c) {
    ZkHolds& holds = sessions_.holds;
    auto h = holds.held.find(c.key);
    if (h == holds.held.end() || h->second.attempt != c.attempt) return done(c.index, Renewed::kGone, nullptr);
    h->second.until = std::max(h->second.until, gone_by(watchdog_, sent, c.ttl));
    done(c.index, Renewed::kYes, nullptr);
  };
  // A check failed (the session answered): each operation says which.
  // Those before it were answered (ours, and the session alive); a node
  // gone is a lock gone; the rest were not tried. Otherwise the multi's
  // outcome is each lock's: a session expired, the lock is gone.
  const bool per_op = r.rc != ZOK && r.op_errors.size() == chunk.size() && !zk::unreachable(r.rc);
  std::optional<StoreError> e;  // made at the first lock it leaves in doubt
  for (std::size_t k = 0; k < chunk.size(); ++k) {
    const int rc = per_op ? r.op_errors[k] : r.rc;
    if (rc == ZOK) {
      confirm(chunk[k]);
    } else if (per_op ? rc == ZNONODE || rc == ZBADVERSION : rc == ZSESSIONEXPIRED) {
      done(chunk[k].index, Renewed::kGone, nullptr);
    } else {
      if (!e) e = per_op ? sessions_.error(ZCONNECTIONLOSS, "a renewal in a batch with a lost lock")
                         : sessions_.error(r.rc, "renewing");
      done(chunk[k].index, Renewed::kTransient, &*e);
    }
  }
}

void ZkRenewal::expire_held(Clock::time_point now) {
  ZkHolds& holds = sessions_.holds;
  // A scan of the held locks at most every 20 ms: their expiry is a ttl
  // away, and a lease's own deadline came earlier.
  if ((holds.held.empty() && holds.marks.empty()) || now < next_expiry_scan_) return;
  next_expiry_scan_ = now + milliseconds(20);
  std::vector<ZkRelease::Cleanup> gone;
  for (auto* table : {&holds.marks, &holds.held}) {
    std::erase_if(*table, [&](const auto& entry) {
      const auto& [key, node] = entry;
      if (node.until > now) return false;
      const auto zero = key.find('\0');
      gone.push_back(ZkRelease::Cleanup{key.substr(0, zero), key.substr(zero + 1), node.attempt, node.session});
      return true;
    });
  }
  for (auto& c : gone) release_.remove(std::move(c));
}

}  // namespace lockwatch::detail
