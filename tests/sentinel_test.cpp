// Sentinel: one master, one replica, three sentinels, all real processes.
// The runtime finds the master through the sentinels and follows a failover
// without the user doing anything. Each case runs in plaintext and over TLS
// (rediss-sentinel://: TLS to the sentinels and to the masters, and the
// servers replicate and talk among themselves over TLS). The servers are
// started once per transport for the suite, and again after a failover.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <stdlib.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "lockwatch/lockwatch.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

// A redis-server in sentinel mode, with its own config file and directory.
// With TLS it also listens on a TLS port (tls_port(); port() stays
// plaintext for the test's own queries) and reaches the servers and the
// other sentinels over TLS.
class SentinelProcess {
 public:
  SentinelProcess(int master_port, bool tls) : port_(free_loopback_port()), tls_port_(tls ? free_loopback_port() : 0) {
    char tmpl[] = "/tmp/lockwatch-sentinel-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::string conf = dir_ + "/sentinel.conf";
    std::ofstream out(conf);
    out << "port " << port_ << "\nbind 127.0.0.1\ndir " << dir_ << "\nlogfile " << dir_ << "/sentinel.log\n";
    if (tls) {
      const TestCertificates& c = test_certificates();
      out << "tls-port " << tls_port_ << "\ntls-cert-file " << c.server_cert << "\ntls-key-file " << c.server_key
          << "\ntls-ca-cert-file " << c.ca_cert << "\ntls-auth-clients no\ntls-replication yes\n";
    }
    out << "sentinel monitor mymaster 127.0.0.1 " << master_port << " 2\n"
        << "sentinel down-after-milliseconds mymaster 1000\n"
        << "sentinel failover-timeout mymaster 3000\n"
        << "sentinel parallel-syncs mymaster 1\n";
    out.close();
    proc_ = std::make_unique<ChildProcess>(std::vector<std::string>{"redis-server", conf, "--sentinel"});
    auto until = std::chrono::steady_clock::now() + kBound;
    while (std::chrono::steady_clock::now() < until) {
      if (query({"PING"}) == "PONG") return;
      std::this_thread::sleep_for(20ms);  // process start-up
    }
    throw std::runtime_error("sentinel did not start");
  }
  ~SentinelProcess() {
    proc_.reset();
    std::string cmd = "rm -rf '" + dir_ + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir_.c_str());
  }
  int port() const { return port_; }
  // Where lockwatch reaches it: the TLS port when there is one.
  int client_port() const { return tls_port_ != 0 ? tls_port_ : port_; }

  // One command on a fresh connection; "" on failure. Integers and arrays
  // come back as text (arrays: the first element's, or the field named
  // `field` in a flat field/value reply).
  std::string query(const std::vector<std::string>& args, const std::string& field = "") const {
    timeval tv{1, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (c == nullptr || c->err) {
      if (c) redisFree(c);
      return "";
    }
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    std::string out;
    if (r != nullptr) {
      if (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_STRING) out.assign(r->str, r->len);
      if (r->type == REDIS_REPLY_INTEGER) out = std::to_string(r->integer);
      if (r->type == REDIS_REPLY_ARRAY) {
        if (field.empty()) {
          out = std::to_string(r->elements);
        } else {
          for (std::size_t i = 0; i + 1 < r->elements; i += 2)
            if (r->element[i]->str != nullptr && field == r->element[i]->str && r->element[i + 1]->str != nullptr)
              out = r->element[i + 1]->str;
        }
      }
      freeReplyObject(r);
    }
    redisFree(c);
    return out;
  }

 private:
  int port_;
  int tls_port_;
  std::string dir_;
  std::unique_ptr<ChildProcess> proc_;
};

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds bound = kBound) {
  auto until = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(50ms);  // polling the cluster's state
  }
  return false;
}

// A master, its replica and three sentinels watching it, over plain TCP or
// TLS: made once per transport for the suite (the sentinels take seconds
// to find each other), again only after a case failed the master over.
struct SentinelTopology {
  explicit SentinelTopology(bool tls) {
    RedisServerOptions mo;
    if (tls) {
      mo.tls = RedisTls{};
      mo.extra_args = {"--tls-replication", "yes"};
    }
    master = std::make_unique<RedisServer>(mo);
    RedisServerOptions ro = mo;
    ro.extra_args.insert(ro.extra_args.end(), {"--replicaof", "127.0.0.1", std::to_string(master->port())});
    replica = std::make_unique<RedisServer>(ro);
    if (!eventually([&] {
          return master->command({"INFO", "replication"}).str.find("connected_slaves:1") != std::string::npos &&
                 replica->command({"INFO", "replication"}).str.find("master_link_status:up") != std::string::npos;
        }))
      return;
    for (int i = 0; i < 3; ++i) sentinels.push_back(std::make_unique<SentinelProcess>(master->port(), tls));
    // Sentinels find each other and the replica through the master.
    ready = eventually(
        [&] {
          for (auto& s : sentinels) {
            if (s->query({"SENTINEL", "master", "mymaster"}, "num-other-sentinels") != "2") return false;
            if (s->query({"SENTINEL", "master", "mymaster"}, "num-slaves") != "1") return false;
          }
          return true;
        },
        30s);
  }
  std::unique_ptr<RedisServer> master, replica;
  std::vector<std::unique_ptr<SentinelProcess>> sentinels;
  bool ready = false;        // replicating, and the sentinels know each other
  bool failed_over = false;  // a case killed the master: the next makes another
};

class SentinelTest : public ::testing::TestWithParam<bool> {
 protected:
  static void TearDownTestSuite() {
    for (auto& t : topologies_) t.reset();
  }
  void SetUp() override {
    auto& t = topologies_[GetParam() ? 1 : 0];
    if (t && (t->failed_over || !t->ready)) t.reset();
    if (!t) t = std::make_unique<SentinelTopology>(GetParam());
    ASSERT_TRUE(t->ready) << "the master, its replica and three sentinels did not come up";
    topology_ = t.get();
    master_ = t->master.get();
    replica_ = t->replica.get();
  }
  // The case is about to kill the master.
  void failing_over() { topology_->failed_over = true; }

  std::string url() const {
    std::string hosts;
    for (auto& s : topology_->sentinels)
      hosts += (hosts.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(s->client_port());
    return (GetParam() ? "rediss-sentinel://" : "redis-sentinel://") + hosts + "/mymaster";
  }
  Options options() const {
    Options o;
    o.redis_url = url();
    o.runtime.threads = 4;
    if (GetParam()) o.tls.ca_file = test_certificates().ca_cert;
    o.connection.connect_timeout = 500ms;
    o.connection.command_timeout = 1000ms;
    return o;
  }

  static std::array<std::unique_ptr<SentinelTopology>, 2> topologies_;  // plain, TLS
  SentinelTopology* topology_ = nullptr;
  RedisServer* master_ = nullptr;
  RedisServer* replica_ = nullptr;
};
std::array<std::unique_ptr<SentinelTopology>, 2> SentinelTest::topologies_;

TEST_P(SentinelTest, FindsTheMasterAndWaitsForTheReplica) {
  Options o = options();
  add_url_param(o, "min_replicas=1");
  Runtime rt(o);
  auto f = locked("sen", 2s, forever).on(rt)([&] { return exists(*master_, "sen") && exists(*replica_, "sen"); });
  auto fut = f();
  EXPECT_TRUE(get_bounded(fut));  // WAIT made the replica have it before the work ran
  {
    // A local hand-off's tokens, reserved on the master, reach the replica
    // before any is handed out, as the lock itself does: a failover cannot
    // give a later holder a token below one handed out here.
    Options slow = o;
    slow.handoff.max_time = 60s;  // the streak outlasts a loaded machine's round trips
    Runtime rt(slow);
    auto first_f = rt.acquire("sen-hand", 2s);
    LockHandle first = get_bounded(first_f);
    auto second_f = rt.acquire({.key = "sen-hand", .ttl = 2s, .retries = forever, .wait = kBound});
    auto back = first.release();
    LockHandle second = get_bounded(second_f);
    get_bounded(back);
    EXPECT_EQ(rt.stats().local_handoffs, 1u);
    const std::string on_replica = replica_->command({"GET", fence_key("sen-hand")}).str;
    ASSERT_FALSE(on_replica.empty());
    EXPECT_GE(std::stoull(on_replica), second.lease().fencing_token());
    auto done = second.release();
    get_bounded(done);
  }
  Options two = options();
  add_url_param(two, "min_replicas=2");
  Runtime rt2(two);
  auto g = locked("sen2", 2s, 0).on(rt2)([] { return 1; });
  auto fut2 = g();
  auto err = error_of<ConnectionError>(fut2);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("replicas"), std::string::npos) << err->what();
  EXPECT_FALSE(exists(*master_, "sen2"));
}

// The owner record lives beside the lock on the master found
// (and so reaches its replica), and the listing reads it there.
TEST_P(SentinelTest, TheOwnerIsShownAndListedOnTheMasterFound) {
  Options o = options();
  o.runtime.owner_name = "sentinel owner";
  Runtime rt(o);
  auto f = rt.acquire("sen-who", 5s);
  LockHandle h = get_bounded(f);
  auto l = rt.list("sen-who", 10);
  const auto listed = get_bounded(l);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].owner, "sentinel owner");
  // Kept in the lock's own value (token, grant time, owner name): no other key.
  const std::string value = master_->command({"GET", lock_key("sen-who")}).str;
  EXPECT_TRUE(value.ends_with(" sentinel owner")) << value;
  EXPECT_EQ(master_->command({"EXISTS", lock_key("sen-who") + ":owners"}).integer, 0);
  auto done = h.release();
  get_bounded(done);
  EXPECT_EQ(master_->command({"EXISTS", lock_key("sen-who")}).integer, 0) << "gone with the lock";
}

TEST_P(SentinelTest, SharedAndPermitLocksOnTheMasterFoundReachItsReplica) {
  Options o = options();
  add_url_param(o, "min_replicas=1");
  Runtime rt(o);
  auto r1 = rt.acquire({.key = "sen-rw", .ttl = 2s, .kind = LockKind::shared()});
  auto r2 = rt.acquire({.key = "sen-rw", .ttl = 2s, .kind = LockKind::shared()});
  LockHandle a = get_bounded(r1), b = get_bounded(r2);
  EXPECT_TRUE(exists(*master_, "sen-rw") && exists(*replica_, "sen-rw"));
  auto writer = rt.acquire({.key = "sen-rw", .ttl = 2s, .retries = forever, .wait = 0ms});
  EXPECT_TRUE(error_of<LockNotAcquired>(writer));
  auto p1 = rt.acquire({.key = "sen-sem", .ttl = 2s, .kind = LockKind::permits(1)});
  LockHandle p = get_bounded(p1);
  auto p2 = rt.acquire({.key = "sen-sem", .ttl = 2s, .retries = forever, .wait = 0ms, .kind = LockKind::permits(1)});
  EXPECT_TRUE(error_of<LockNotAcquired>(p2));
  // A set's keys each reach the replica before the set is granted.
  auto s1 = rt.acquire({.key = all_of("sen-set-b", "sen-set-a"), .ttl = 2s});
  LockHandle set = get_bounded(s1);
  EXPECT_TRUE(exists(*replica_, "sen-set-a") && exists(*replica_, "sen-set-b"));
  for (LockHandle* h : {&a, &b, &p, &set}) {
    auto f = h->release();
    get_bounded(f);
  }
  EXPECT_FALSE(exists(*master_, "sen-rw"));
  EXPECT_FALSE(exists(*master_, "sen-set-a"));
}

TEST_P(SentinelTest, FairLocksOnTheMasterFoundGrantInArrivalOrder) {
  Runtime a(options()), b(options()), c(options());
  auto first = a.acquire({.key = "sen-fair", .ttl = 2s, .kind = LockKind::fair()});
  LockHandle holder = get_bounded(first);
  const std::uint64_t holder_token = holder.lease().fencing_token();
  EXPECT_TRUE(exists(*master_, "sen-fair"));
  auto queued = [&](long long n) {
    return eventually([&] { return master_->command({"ZCARD", lock_key("sen-fair") + ":queue"}).integer == n; });
  };
  auto one = b.acquire({.key = "sen-fair", .ttl = 2s, .retries = forever, .wait = kBound, .kind = LockKind::fair()});
  ASSERT_TRUE(queued(1));
  auto two = c.acquire({.key = "sen-fair", .ttl = 2s, .retries = forever, .wait = kBound, .kind = LockKind::fair()});
  ASSERT_TRUE(queued(2));
  auto back = holder.release();
  get_bounded(back);
  LockHandle h1 = get_bounded(one);
  EXPECT_GT(h1.lease().fencing_token(), holder_token);
  EXPECT_NE(two.wait_for(0s), std::future_status::ready);  // the second waits for the first
  const std::uint64_t t1 = h1.lease().fencing_token();
  auto back1 = h1.release();
  get_bounded(back1);
  LockHandle h2 = get_bounded(two);
  EXPECT_GT(h2.lease().fencing_token(), t1);
  auto back2 = h2.release();
  get_bounded(back2);
}

TEST_P(SentinelTest, FailoverWhileLeasesAreHeldAndCallersWait) {
  Runtime rt(options());
  Gate held_started;
  std::atomic<std::uint64_t> held_token{0};
  auto hold = locked("fo", 4s, forever).on(rt)([&] {
    held_token = this_lease().fencing_token();
    held_started.open();
    // Work through the failover: about 3 s of it.
    auto until = std::chrono::steady_clock::now() + 6s;
    while (std::chrono::steady_clock::now() < until && !this_lease().lost()) std::this_thread::sleep_for(20ms);
    return this_lease().fencing_token();
  });
  auto held = hold();
  ASSERT_TRUE(held_started.wait());
  // A waiter rides out a master it cannot reach for up to the connect
  // timeout (a wait is for a busy lock, not for a store that is down): one
  // that is to outlast a failover needs a connect timeout longer than it.
  Options patient = options();
  patient.connection.connect_timeout = 15s;
  Runtime waiting_rt(patient);
  auto waiter = locked("fo", 4s, forever).on(waiting_rt).wait(40s)([] { return this_lease().fencing_token(); });
  auto waiting = waiter();

  failing_over();
  master_->kill();
  // The sentinels promote the replica. Promoting it, a sentinel drops its
  // clients (CLIENT KILL TYPE normal): a question cut off so is asked again.
  ASSERT_TRUE(eventually([&] {
    try {
      return replica_->command({"INFO", "replication"}).str.find("role:master") != std::string::npos;
    } catch (const std::exception&) {
      return false;
    }
  }, 30s));

  // The held lease is either kept or reported lost: never another outcome.
  try {
    EXPECT_EQ(get_bounded(held), held_token.load());
  } catch (const LeaseLost& e) {
    SUCCEED() << "lost across the failover: " << e.what();
  }
  // The waiter gets the lock through the new master, with a higher token.
  auto waiter_token = get_bounded(waiting);
  EXPECT_GT(held_token.load(), 0u);
  EXPECT_GT(waiter_token, held_token.load());
  // And locking goes on there, with no user action.
  auto after = locked("fo-after", 2s, 0).on(rt)([&] { return exists(*replica_, "fo-after"); });
  auto fut = after();
  EXPECT_TRUE(get_bounded(fut));
}

INSTANTIATE_TEST_SUITE_P(Transports, SentinelTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Tls" : "Plain"; });

}  // namespace
}  // namespace lockwatch::testing
