// Redlock over five independent masters, with real failures: nodes killed
// while leases are held and while callers acquire, fencing tokens that keep
// rising when the majority changes.
#include <gtest/gtest.h>

#include <hiredis/hiredis.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "lockwatch/lockwatch.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

// A redis-server in a network namespace of its own, reached over a veth
// pair, so that the test can cut the link: packets are dropped silently, as
// in a real partition (no reset, no refusal). Needs root; the namespace,
// the link, the route and the server are removed again by the destructor.
//
// The node's traffic must never leave the machine. The link is cut at the
// namespace's end, so the host keeps its connected route (marked linkdown)
// and drops the packets on the veth; and a blackhole route for the /30,
// behind the connected one, keeps the addresses local whatever happens to
// the link (without it, a host end taken down would send them out by the
// default route).
class PartitionableRedis {
 public:
  PartitionableRedis() {
    int id = static_cast<int>(getpid() % 200) + 20;
    ns_ = "lw" + std::to_string(getpid());
    host_if_ = "lwh" + std::to_string(getpid());
    ns_if_ = "lwn" + std::to_string(getpid());
    const std::string& ns_if = ns_if_;
    addr_ = "10.231." + std::to_string(id) + ".2";
    std::string host_addr = "10.231." + std::to_string(id) + ".1/30";
    guard_ = "blackhole 10.231." + std::to_string(id) + ".0/30 metric 4242";
    ok_ = run("ip route add " + guard_) && run("ip netns add " + ns_) && run("ip link add " + host_if_ + " type veth peer name " + ns_if) &&
          run("ip link set " + ns_if + " netns " + ns_) && run("ip addr add " + host_addr + " dev " + host_if_) &&
          run("ip link set " + host_if_ + " up") && run(in_ns("ip addr add " + addr_ + "/30 dev " + ns_if)) &&
          run(in_ns("ip link set " + ns_if + " up")) && run(in_ns("ip link set lo up"));
    if (!ok_) return;
    char tmpl[] = "/tmp/lockwatch-netns-XXXXXX";
    dir_ = mkdtemp(tmpl);
    server_ = std::make_unique<ChildProcess>(std::vector<std::string>{
        "ip", "netns", "exec", ns_, "redis-server", "--bind", addr_, "--port", "6379", "--protected-mode", "no",
        "--save", "", "--appendonly", "no", "--dir", dir_, "--logfile", dir_ + "/redis.log"});
    auto until = std::chrono::steady_clock::now() + kBound;
    while (std::chrono::steady_clock::now() < until && !answers()) std::this_thread::sleep_for(20ms);  // start-up
    ok_ = answers();
  }
  ~PartitionableRedis() {
    server_.reset();
    run("ip netns del " + ns_ + " 2>/dev/null");
    run("ip link del " + host_if_ + " 2>/dev/null");
    run("ip route del " + guard_ + " 2>/dev/null");
    if (!dir_.empty()) run("rm -rf '" + dir_ + "'");
  }
  bool ok() const { return ok_; }
  std::string url() const { return "redis://" + addr_ + ":6379"; }
  void cut() { run(in_ns("ip link set " + ns_if_ + " down")); }
  // Brings the link back and waits (bounded) until the node answers again:
  // a link coming up takes a moment (carrier, neighbour discovery).
  bool heal() {
    run(in_ns("ip link set " + ns_if_ + " up"));
    auto until = std::chrono::steady_clock::now() + kBound;
    while (std::chrono::steady_clock::now() < until) {
      if (answers()) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
  bool answers() const {
    timeval tv{0, 300000};
    redisContext* c = redisConnectWithTimeout(addr_.c_str(), 6379, tv);
    bool up = c != nullptr && !c->err;
    if (up) {
      redisSetTimeout(c, tv);
      auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
      up = r != nullptr && r->type == REDIS_REPLY_STATUS;
      if (r) freeReplyObject(r);
    }
    if (c) redisFree(c);
    return up;
  }

 private:
  static bool run(const std::string& cmd) { return std::system(cmd.c_str()) == 0; }
  std::string in_ns(const std::string& cmd) const { return "ip netns exec " + ns_ + " " + cmd; }
  std::string ns_, host_if_, ns_if_, addr_, dir_, guard_;
  bool ok_ = false;
  std::unique_ptr<ChildProcess> server_;
};

class RedlockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 5; ++i) servers_.push_back(std::make_unique<RedisServer>());
  }
  std::string urls() const {
    std::string out;
    for (const auto& s : servers_) out += (out.empty() ? "" : ",") + s->url();
    return out;
  }
  Options options(std::size_t threads = 4) const {
    Options o;
    o.redis_url = urls();
    o.runtime.threads = threads;
    o.connection.connect_timeout = 500ms;
    o.connection.command_timeout = 500ms;
    return o;
  }
  // How many nodes hold the lock for `key`.
  int holders(const std::string& key) const {
    int n = 0;
    for (const auto& s : servers_)
      if (s->running() && exists(*s, key)) n++;
    return n;
  }
  std::vector<std::unique_ptr<RedisServer>> servers_;
};

TEST_F(RedlockTest, AMajorityHoldsTheLockAndEveryNodeIsReleased) {
  Runtime rt(options());
  auto f = locked("rl", 2s, forever).on(rt)([&] { return holders("rl"); });
  auto fut = f();
  // The work may start once a majority took the lock (a fifth node's
  // acquire can still be on its way); release reaches every node.
  EXPECT_GE(get_bounded(fut), 3);
  EXPECT_EQ(holders("rl"), 0);
}

// A set (lockwatch::all_of) is held on a majority for each of its keys,
// and released from every node.
TEST_F(RedlockTest, ASetIsHeldOnAMajorityAndReleasedEverywhere) {
  Runtime rt(options());
  auto f = LOCKED(all_of("rl-b", "rl-a"), 2s, forever, .on(rt))[&] {
    return std::min(holders("rl-a"), holders("rl-b")) * 10 + (this_lease().fencing_token("rl-b") > 0 ? 1 : 0);
  };
  auto fut = f();
  EXPECT_GE(get_bounded(fut), 31);
  EXPECT_EQ(holders("rl-a"), 0);
  EXPECT_EQ(holders("rl-b"), 0);
}

// A majority's holder is shown with its owner name and grant
// time, and listed, though one node has lost the lock.
TEST_F(RedlockTest, InspectAndListShowTheMajoritysOwner) {
  Options o = options();
  o.runtime.owner_name = "redlock owner";
  Runtime rt(o);
  auto f = rt.acquire("rl-who", 5s);
  LockHandle h = get_bounded(f);
  servers_[0]->command({"DEL", lock_key("rl-who")});  // one node forgets it: a majority still holds it
  auto s = rt.inspect("rl-who");
  const LockState state = get_bounded(s);
  ASSERT_TRUE(state.held);
  EXPECT_EQ(state.owner, "redlock owner");
  ASSERT_EQ(state.holders.size(), 1u);
  EXPECT_LT(state.held_for, 5s);
  auto l = rt.list("rl-", 10);
  const auto listed = get_bounded(l);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].key, "rl-who");
  EXPECT_EQ(listed[0].owner, "redlock owner");
  auto done = h.release();
  get_bounded(done);
}

TEST_F(RedlockTest, ContendedCallsNeverOverlapAndTokensRise) {
  std::vector<std::unique_ptr<Runtime>> rts;
  for (int i = 0; i < 2; ++i) rts.push_back(std::make_unique<Runtime>(options(2)));
  std::atomic<int> inside{0}, overlaps{0}, done{0}, regressions{0};
  std::atomic<std::uint64_t> last{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto inc = locked("rl-count", 2s, forever).on(*rts[t % 2]).wait(30s)([&] {
        if (inside.fetch_add(1) != 0) overlaps++;
        auto token = this_lease().fencing_token();
        if (token <= last.load()) regressions++;
        last = token;
        std::this_thread::sleep_for(1ms);
        inside.fetch_sub(1);
        done++;
      });
      for (int i = 0; i < 10; ++i) {
        auto fut = inc();
        if (!completes(fut)) return;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(done.load(), 40);
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(regressions.load(), 0);
}

TEST_F(RedlockTest, ReadWriteLocksHoldOnAMajorityAndPermitsAreUnsupported) {
  std::vector<std::unique_ptr<Runtime>> rts;
  for (int i = 0; i < 2; ++i) rts.push_back(std::make_unique<Runtime>(options(3)));
  // A reader's majority and a writer's share a node, which holds one or
  // the other: never a reader with a writer.
  std::atomic<int> readers{0}, writers{0}, violations{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto read = locked("rl-rw", 2s, forever).on(*rts[t % 2]).shared().wait(30s)([&] {
        readers.fetch_add(1);
        if (writers.load() != 0) violations++;
        std::this_thread::sleep_for(2ms);
        readers.fetch_sub(1);
        done++;
      });
      auto write = locked("rl-rw", 2s, forever).on(*rts[t % 2]).wait(30s)([&] {
        if (writers.fetch_add(1) != 0 || readers.load() != 0) violations++;
        std::this_thread::sleep_for(2ms);
        writers.fetch_sub(1);
        done++;
      });
      for (int i = 0; i < 5; ++i) {
        auto r = read();
        auto w = write();
        if (!completes(r) || !completes(w)) return;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(done.load(), 40);
  EXPECT_EQ(violations.load(), 0);
  // Each node counts its own permit holders, and majorities of different
  // holders overlap: a quorum cannot bound a semaphore, so it refuses one.
  try {
    (void)rts[0]->acquire({.key = "rl-sem", .ttl = 2s, .kind = LockKind::permits(2)});
    ADD_FAILURE() << "a quorum took a semaphore";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("2 permits"), std::string::npos) << e.what();
  }
}

TEST_F(RedlockTest, LosingTwoOfFiveNodesKeepsLeasesAndLocking) {
  // Each renewal of the 600 ms lease sent 200 ms before its local deadline,
  // on connections already made: a loaded machine's slow setup and late
  // ticks must not cost the lease (what is tested is the two nodes' loss).
  Options o = options();
  o.watchdog.min_renewal_window = 200ms;
  Runtime rt(o);
  {
    auto warm = rt.acquire("rl-warm", 2s);
    LockHandle h = get_bounded(warm);
    auto released = h.release();
    get_bounded(released);
  }
  Gate started, killed;
  auto hold = locked("rl-hold", 600ms, forever).on(rt)([&] {
    started.open();
    EXPECT_TRUE(killed.wait());
    auto r0 = this_lease().renewals();
    // Work on through several renewals with two nodes gone.
    EXPECT_TRUE(renewed_again(this_lease(), 3));
    return this_lease().renewals() - r0;
  });
  auto held = hold();
  ASSERT_TRUE(started.wait());
  // Acquisitions in flight while the nodes die.
  std::vector<std::future<LockHandle>> acquiring;
  for (int i = 0; i < 20; ++i) acquiring.push_back(rt.acquire("rl-during-" + std::to_string(i), 2s));
  servers_[0]->kill();
  servers_[3]->kill();
  killed.open();
  EXPECT_GE(get_bounded(held), 3u);
  int ok = 0;
  for (auto& f : acquiring) {
    try {
      LockHandle h = get_bounded(f);
      ok++;
    } catch (const ConnectionError&) {
      // Acceptable only for attempts whose votes were decided by the dying nodes.
    }
  }
  EXPECT_GE(ok, 1);
  auto after = rt.acquire("rl-after", 2s);
  LockHandle h = get_bounded(after);
  EXPECT_TRUE(h);
  EXPECT_EQ(holders("rl-after"), 3);
}

TEST_F(RedlockTest, LosingThreeOfFiveFailsAcquisitionAndReportsHeldLeasesLostByTheirDeadline) {
  Runtime rt(options());
  auto acquiring = rt.acquire("rl-lose", 1s);
  LockHandle h = get_bounded(acquiring);
  auto stop = h.lease().stop_token();
  std::atomic<bool> stopped{false};
  std::stop_callback on_stop(stop, [&] { stopped = true; });
  auto deadline_bound = std::chrono::steady_clock::now() + h.lease().remaining() + 1s + 50ms;
  servers_[1]->kill();
  servers_[2]->kill();
  servers_[4]->kill();
  // The lease: no renewal can reach a majority, so it ends at its deadline.
  auto until = std::chrono::steady_clock::now() + kBound;
  while (!stopped && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  auto lost_at = std::chrono::steady_clock::now();
  EXPECT_TRUE(stopped);
  EXPECT_TRUE(h.lease().lost());
  EXPECT_EQ(h.lease().lost_reason(), LostReason::kStoreUnreachable);
  // One renewal may land before the kill: the deadline is at most ttl past it.
  EXPECT_LT(lost_at, deadline_bound);
  // New acquisitions fail with an error naming the nodes.
  auto next = rt.acquire("rl-lose-2", 1s);
  try {
    get_bounded(next);
    ADD_FAILURE() << "acquired without a majority";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("no majority"), std::string::npos) << e.what();
    EXPECT_NE(e.endpoint().find(std::to_string(servers_[1]->port())), std::string::npos) << e.endpoint();
  }
  auto released = h.release();
  EXPECT_THROW(get_bounded(released), LeaseLost);
}

TEST_F(RedlockTest, FencingTokensRiseWhenTheMajorityChanges) {
  // Counters that disagree: nodes 0 and 1 are far ahead.
  for (int i : {0, 1}) servers_[i]->command({"SET", lock_key("rl-fence") + ":fence", "100"});
  Runtime rt(options());
  auto token_now = [&] {
    // A wait rides out the reconnects to the restarted nodes.
    auto f = rt.acquire({.key = "rl-fence", .ttl = 2s, .retries = forever, .wait = 10s});
    LockHandle h = get_bounded(f);
    auto t = h.lease().fencing_token();
    auto r = h.release();
    get_bounded(r);
    return t;
  };
  servers_[3]->kill();
  servers_[4]->kill();
  auto first = token_now();  // majority {0, 1, 2}
  EXPECT_EQ(first, 101u);
  servers_[3]->start();  // empty: counters at zero
  servers_[4]->start();
  servers_[0]->kill();
  servers_[1]->kill();
  auto second = token_now();  // majority {2, 3, 4}: only node 2 saw 101, raised
  EXPECT_GT(second, first);
}

TEST_F(RedlockTest, TwoNodesThatStopAnsweringDoNotStopLocking) {
  // A paused node keeps its connections and answers nothing, as a node
  // behind a partition would; requests to it end at the command timeout.
  Runtime rt(options());
  auto acquiring = rt.acquire("rl-pause", 1s);
  LockHandle h = get_bounded(acquiring);
  servers_[2]->pause();
  servers_[4]->pause();
  EXPECT_TRUE(renewed_again(h.lease(), 3));
  auto other = rt.acquire("rl-pause-2", 1s);
  LockHandle h2 = get_bounded(other);
  EXPECT_GT(h2.lease().fencing_token(), 0u);
  servers_[2]->resume();
  servers_[4]->resume();
}

TEST_F(RedlockTest, APartitionedNodeDoesNotStopLocking) {
  if (geteuid() != 0) GTEST_SKIP() << "a network partition needs root (network namespaces)";
  PartitionableRedis far;
  if (!far.ok()) GTEST_SKIP() << "network namespaces are not available here";
  // Four nodes on loopback, one behind the veth link.
  std::string urls;
  for (int i = 0; i < 4; ++i) urls += servers_[i]->url() + ",";
  urls += far.url();
  Options o = options();
  o.redis_url = urls;
  Runtime rt(o);
  auto acquiring = rt.acquire("rl-part", 1s);
  LockHandle h = get_bounded(acquiring);
  far.cut();
  EXPECT_TRUE(renewed_again(h.lease(), 3));
  auto during = rt.acquire("rl-part-2", 1s);
  LockHandle h2 = get_bounded(during);
  EXPECT_TRUE(h2);
  EXPECT_TRUE(far.heal());
  auto released = h.release();
  get_bounded(released);
}

}  // namespace
}  // namespace lockwatch::testing
