#include "store/zookeeper/zk_claims.hpp"

#include <charconv>

#include "store/zookeeper/zk_nodes.hpp"

namespace lockwatch::detail {

namespace {
constexpr int kClaimAttempts = 5;  // a version changed under us: read again
using Time = std::chrono::system_clock::time_point;
}  // namespace

struct ZkClaims::Claim : StoreClaim {
  std::string lock_path;    // our lock's node
  std::string period_path;  // the job's `period` node
};

void ZkClaims::server_time(JobClaims::TimeDone done) {
  auto shared = std::make_shared<JobClaims::TimeDone>(std::move(done));
  sessions_.request(
      *sessions_.any_session(),
      [this, shared](const ZkResult& r) {
        // No /lockwatch yet (no lock was taken on this ensemble): made,
        // then the clock read again.
        const int rc = r.rc == ZNONODE && r.session == nullptr ? ZSESSIONEXPIRED : r.rc;
        if (rc == ZNONODE)
          return sessions_.make_node(*r.session, zk::kRoot, [this, shared](int made) {
            if (made != ZOK) return sessions_.answer_failed(*shared, made, "creating /lockwatch", Time{});
            server_time([shared](Time t, const StoreError* e) { (*shared)(t, e); });
          });
        if (rc != ZOK) return sessions_.answer_failed(*shared, rc, "reading the ensemble's clock", Time{});
        (*shared)(Time(std::chrono::milliseconds(r.stat.mtime)), nullptr);
      },
      false, zoo_aset, zk::kRoot, "", 0, -1, zk::on_stat_set);
}

void ZkClaims::claim_period(std::string_view name, std::string_view token, std::int64_t period,
                            std::chrono::system_clock::time_point start, JobClaims::ClaimDone done) {
  // The clock first: a claim runs only once the ensemble's clock reached
  // the period's start (the write after it is later still).
  auto c = StoreClaim::make<Claim>(name, token, period, std::move(done));
  server_time(StoreClaim::when_due(std::move(c), start, [this](std::shared_ptr<Claim> c) { claim_step(c); }));
}

void ZkClaims::claim_step(std::shared_ptr<Claim> c) {
  ZkHolds& holds = sessions_.holds;
  auto h = holds.held.find(zk::hold_key(c->name, c->token));
  ZkSession* s = h == holds.held.end() ? nullptr : sessions_.live(h->second.session);
  if (s == nullptr) return c->finish(ClaimResult::Status::kNotLeader);
  c->lock_path = h->second.path;
  c->period_path = zk::dir_of(c->name) + "/" + zk::kPeriodNode;
  sessions_.read(*s, c->period_path, false, [this, c](const ZkResult& r) {
    if (r.rc != ZOK && r.rc != ZNONODE) return c->failed(sessions_.error(r.rc, "reading the job's last period"));
    const bool exists = r.rc == ZOK;
    std::int64_t last = -1;
    if (exists) std::from_chars(r.value.data(), r.value.data() + r.value.size(), last);
    if (exists && last >= c->period) {
      c->out.last = last;
      return c->finish(ClaimResult::Status::kAlreadyRun);
    }
    if (r.session == nullptr) return c->finish(ClaimResult::Status::kNotLeader);
    claim_write(*r.session, c, exists, exists ? r.stat.version : -1);
  });
}

void ZkClaims::claim_write(ZkSession& s, std::shared_ptr<Claim> c, bool exists, int version) {
  ACL_vector* acl = sessions_.acl();
  sessions_.send(
      s,
      [this, c](const ZkResult& r) {
        if (r.rc == ZOK) {
          c->out.last = c->period;
          return c->finish(ClaimResult::Status::kClaimed);
        }
        if (r.op_errors.size() == 2 && r.op_errors[0] == ZNONODE) return c->finish(ClaimResult::Status::kNotLeader);
        if (r.op_errors.size() == 2 && (r.op_errors[1] == ZBADVERSION || r.op_errors[1] == ZNODEEXISTS) &&
            ++c->attempt < kClaimAttempts) {
          return claim_step(c);  // another claim came first: read again
        }
        c->failed(sessions_.error(r.rc, "claiming the period"));
      },
      [c, acl, exists, version, value = std::to_string(c->period)](zhandle_t* zh, void* ctx) {
        auto* x = static_cast<ZkCtx*>(ctx);
        x->results.resize(2);
        x->created.resize(c->period_path.size() + 64);
        zoo_op_t ops[2];
        zoo_check_op_init(&ops[0], c->lock_path.c_str(), -1);
        if (exists)
          zoo_set_op_init(&ops[1], c->period_path.c_str(), value.data(), static_cast<int>(value.size()), version,
                          nullptr);
        else
          zoo_create_op_init(&ops[1], c->period_path.c_str(), value.data(), static_cast<int>(value.size()), acl,
                             ZOO_PERSISTENT, x->created.data(), static_cast<int>(x->created.size()));
        return zoo_amulti(zh, 2, ops, x->results.data(), zk::on_void, ctx);
      });
}

}  // namespace lockwatch::detail
