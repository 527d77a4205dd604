// What only the ZooKeeper store (zookeeper://) has, against one real
// 3-member ensemble for the whole suite (Debian's zookeeper): its URL,
// the ttl bounded by the ensemble's session timeouts, a chroot missing on
// the ensemble, a member answering garbage, and the ensemble's faults: the
// leader killed and paused, a read lost with its connection (asked again
// on the same session), a minority down (locks still granted), a
// majority down (no lock granted, waiters fail at their wait, holders lose
// their leases by their deadline, their stop token fired first). Its
// kinds: a waiting writer's node stops later readers, readers take the
// last writer's token, permits that disagree on n leave nothing behind, a
// permit goes with its holder's session, and a majority down grants no
// share or permit either. The behaviour every store shares is in
// store_contract_test.cpp.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "core/loop.hpp"
#include "lockwatch/lockwatch.hpp"
#include "store/registry.hpp"
#include "store/zookeeper/zk_nodes.hpp"
#include "store_on_loop.hpp"
#include "support/zookeeper_ensemble.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

// A TCP connection on loopback as /proc/net/tcp{,6} list it (ports and
// queues; inode 0 for sockets of no process left).
struct TcpLine {
  unsigned local_port = 0, remote_port = 0, state = 0;
  unsigned long rx_queue = 0, inode = 0;
};

std::vector<TcpLine> tcp_lines() {
  std::vector<TcpLine> out;
  // A member (Java) accepts on an IPv6 socket: its end is in tcp6.
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);  // the heading
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout;
      TcpLine t;
      f >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> t.inode;
      t.local_port = std::stoul(local.substr(local.find(':') + 1), nullptr, 16);
      t.remote_port = std::stoul(remote.substr(remote.find(':') + 1), nullptr, 16);
      t.state = std::stoul(st, nullptr, 16);
      t.rx_queue = std::stoul(queues.substr(queues.find(':') + 1), nullptr, 16);
      out.push_back(t);
    }
  }
  return out;
}

// The sockets this process holds (their inodes).
std::set<unsigned long> own_sockets() {
  std::set<unsigned long> out;
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    auto target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) out.insert(std::stoul(target.substr(8)));
  }
  return out;
}

class ZooKeeperStoreTest : public ::testing::Test {
 protected:
  // Steady: on a loaded machine a member starved for half a second made
  // the others drop it and hold an election, with no fault injected
  // ("Read timed out", then LOOKING, in the members' logs): writes went
  // unanswered for the command timeout and a 1.5 s lease was lost before
  // the test's fault. A killed member's peers see its sockets close at
  // once; a paused leader is left after three seconds, within the waits
  // of the test that pauses it.
  static void SetUpTestSuite() { ensemble_ = new ZooKeeperEnsemble(3, ZooKeeperEnsemble::Timing::kSteady); }
  static void TearDownTestSuite() {
    delete ensemble_;
    ensemble_ = nullptr;
  }
  void TearDown() override {
    // What the members logged tells a stall from a client's fault.
    if (HasFailure())
      for (int i = 0; i < ensemble_->size(); ++i)
        std::fprintf(stderr, "--- ZooKeeper member %d's log, its end:\n%s", i + 1, ensemble_->log_tail(i).c_str());
    // A test that failed half-way leaves every member serving for the next.
    for (int i = 0; i < ensemble_->size(); ++i) {
      ensemble_->resume(i);
      ensemble_->start(i);
    }
    ASSERT_TRUE(ensemble_->wait_serving());
  }

  static Options options(const std::string& url = "") {
    Options o;
    o.redis_url = url.empty() ? "zookeeper://" + ensemble_->hosts() : url;
    o.runtime.threads = 2;
    // Long enough for a waiter to ride out an election (the ensemble's
    // tick is 100 ms; members close their clients' connections meanwhile).
    o.connection.connect_timeout = 5s;
    // A new session is committed through the leader before its first
    // request goes: on a loaded machine that alone can take a second, and a
    // member falling behind its leader under load can stall a write for more.
    o.connection.command_timeout = 5s;
    return o;
  }
  // A key unique to the running test.
  static std::string key(const std::string& suffix = "") {
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + suffix;
  }
  static LockHandle take(Runtime& rt, const std::string& k, std::chrono::milliseconds ttl,
                         std::chrono::milliseconds wait = 0ms) {
    auto f = rt.acquire({.key = k, .ttl = ttl, .retries = forever, .wait = wait});
    return get_bounded(f);
  }
  // Where the ensemble keeps the lock named `name` (the store's name).
  static std::string lock_dir(const std::string& name) { return detail::zk::dir_of(name); }
  // The lock's nodes (sequential ones, not `fence`) as the ensemble has them.
  static std::vector<std::string> lock_nodes(const std::string& name) {
    ZooKeeperClient zk(ensemble_->hosts());
    auto all = zk.children(lock_dir(name));
    std::erase_if(all, [](const std::string& c) { return c.rfind("lock-", 0) != 0; });
    return all;
  }
  // Members other than the leader, in order.
  static std::vector<int> followers(int leader) {
    std::vector<int> out;
    for (int i = 0; i < ensemble_->size(); ++i)
      if (i != leader) out.push_back(i);
    return out;
  }

  static ZooKeeperEnsemble* ensemble_;
};
ZooKeeperEnsemble* ZooKeeperStoreTest::ensemble_ = nullptr;

TEST_F(ZooKeeperStoreTest, MalformedUrlsAreInvalidArgumentsThatHideThePassword) {
  expect_refused_urls(
      {
        "zookeeper://",                                   // no host
        "zookeeper://u:secret@",                          // no host, with credentials
        "zookeeper://127.0.0.1:x",                        // bad port
        "zookeeper://127.0.0.1:70000",                    // port out of range
        "zookeeper://127.0.0.1:2181,,127.0.0.1:2182",     // an empty member
        "zookeeper://u:secret@127.0.0.1:2181/a//b",       // an empty chroot segment
        "zookeeper://u:secret@127.0.0.1:2181/a/../b",     // '..' in the chroot
        "zookeeper://u:secret@127.0.0.1:2181/zookeeper",  // ZooKeeper's own tree
        "zookeeper://u:secret@127.0.0.1:2181?timeout=1",  // parameters
        "zookeeper://usersecret@127.0.0.1:2181",          // digest credentials without a password
        "zookeeper://u:secret@127.0.0.1:2181/a%zz",       // a bad escape
      },
      [](const char* url) { return options(url); }, "zookeeper");
  Options replicas = options();
  add_url_param(replicas, "min_replicas=1");  // a Redis setting
  EXPECT_THROW(replicas.validate(), InvalidArgument);
  for (const char* fine : {"zookeeper://zk1:2181,zk2:2181,zk3:2181/apps/locks", "zookeeper://u:p%40ss@[::1]:2181",
                           "zookeeper://zk", "zookeeper://a:b@zk1,zk2:2182/"}) {
    Options o = options(fine);
    EXPECT_NO_THROW(o.validate()) << fine;
  }
}

TEST_F(ZooKeeperStoreTest, ATtlAboveTheEnsemblesSessionTimeoutIsRefused) {
  // The ensemble grants sessions of 200 ms to 60 s (tests/support).
  Runtime rt(options());
  auto f = rt.acquire({.key = key(), .ttl = 120s, .retries = forever});
  auto err = error_of<InvalidArgument>(f);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("60000 ms"), std::string::npos) << err->what();
  // Nothing left behind: a ttl in range takes the lock at once.
  Runtime other(options());
  auto h = take(other, key(), 2s);
  EXPECT_GE(h.lease().fencing_token(), 1u);
  // A ttl below the ensemble's minimum gets the minimum: still a lock.
  auto small = take(other, key("-small"), 100ms);
  EXPECT_GE(small.lease().fencing_token(), 1u);
}

TEST_F(ZooKeeperStoreTest, AChrootMissingOnTheEnsembleIsAnErrorNamingIt) {
  Runtime rt(options("zookeeper://" + ensemble_->hosts() + "/no/such/root"));
  auto f = rt.acquire({.key = key(), .ttl = 1s, .retries = forever});
  auto err = error_of<StoreRefused>(f);
  ASSERT_TRUE(err);
  EXPECT_STREQ(err->backend_code().category().name(), "lockwatch.zookeeper") << err->what();
  EXPECT_LT(err->backend_code().value(), 0) << err->what();  // ZooKeeper's return codes are negative
  EXPECT_NE(std::string(err->what()).find("/no/such/root"), std::string::npos) << err->what();
}

TEST_F(ZooKeeperStoreTest, AMemberAnsweringGarbageIsAConnectionErrorWithinTheConnectTimeout) {
  // A listener that answers every connection with bytes that are not
  // ZooKeeper's, then closes it.
  LoopbackListener listener;
  std::atomic<bool> stop{false};
  std::thread garbage([&] {
    while (!stop) {
      int c = ::accept(listener.fd(), nullptr, nullptr);
      if (c < 0) break;
      const char junk[] = "-ERR this is not ZooKeeper\r\n\0\0\0\x05hello";
      (void)::send(c, junk, sizeof junk, MSG_NOSIGNAL);
      ::close(c);
    }
  });
  Options o = options("zookeeper://127.0.0.1:" + std::to_string(listener.port()));
  o.connection.connect_timeout = 1s;
  {
    Runtime rt(o);
    auto t0 = std::chrono::steady_clock::now();
    auto f = rt.acquire({.key = key(), .ttl = 1s, .retries = forever});
    EXPECT_TRUE(error_of<ConnectionError>(f));  // no ASSERT: the listener's thread is joined below
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  }
  stop = true;
  listener.shut();
  garbage.join();
}

TEST_F(ZooKeeperStoreTest, ADeadMemberInTheListIsPassedOver) {
  const std::string dead = "127.0.0.1:" + std::to_string(free_loopback_port());
  Runtime rt(options("zookeeper://" + dead + "," + ensemble_->hosts()));
  auto h = take(rt, key(), 2s);
  EXPECT_GE(h.lease().fencing_token(), 1u);
}

// Member names are looked up off the loop, then the session is made on
// their addresses; a name that resolves to nothing is passed over, and
// none resolving is a ConnectionError within the connect timeout.
TEST_F(ZooKeeperStoreTest, MemberNamesAreResolvedAndANameWithoutAddressIsAConnectionError) {
  std::string by_name;
  for (int i = 0; i < ensemble_->size(); ++i)
    by_name += (i ? ",localhost:" : "localhost:") + std::to_string(ensemble_->client_port(i));
  Runtime rt(options("zookeeper://no-such-member.invalid:2181," + by_name));
  auto h = take(rt, key(), 2s);
  EXPECT_GE(h.lease().fencing_token(), 1u);
  auto released = h.release();
  get_bounded(released);

  Options o = options("zookeeper://no-such-member.invalid:2181");
  o.connection.connect_timeout = 1s;
  Runtime nowhere(o);
  auto t0 = std::chrono::steady_clock::now();
  auto f = nowhere.acquire({.key = key("-nowhere"), .ttl = 1s, .retries = forever});
  auto err = error_of<ConnectionError>(f);
  ASSERT_TRUE(err);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST_F(ZooKeeperStoreTest, EveryKindIsKept) {
  detail::Loop loop;
  auto store = detail::make_store(loop, options());
  EXPECT_EQ(store->check_kind(LockKind::shared()), nullptr);
  EXPECT_EQ(store->check_kind(LockKind::permits(3)), nullptr);
  EXPECT_EQ(store->check_kind(LockKind::exclusive()), nullptr);
  EXPECT_EQ(store->check_kind(LockKind::fair()), nullptr);
  EXPECT_EQ(loop.shutdown([&] { store->close(); }), 0);
}

TEST_F(ZooKeeperStoreTest, AWaitingWriterStopsLaterReadersWhoThenSeeItsToken) {
  Runtime rt(options());
  StoreOnLoop store(options());
  const std::string name = store.encode(key());
  using Status = detail::Acquired::Status;
  auto w1 = store.acquire(name, "w1", 5s);
  ASSERT_EQ(w1.status, Status::kTaken) << w1.error.describe();
  ASSERT_EQ(store.release(name, "w1"), detail::Released::kYes);
  // A reader after it sees its token.
  auto first = rt.acquire({.key = key(), .ttl = 10s, .kind = LockKind::shared()});
  LockHandle reader = get_bounded(first);
  EXPECT_EQ(reader.lease().fencing_token(), w1.fence);
  // A writer finds the reader: busy, its node kept in the queue.
  auto w2 = store.acquire(name, "w2", 10s);
  ASSERT_EQ(w2.status, Status::kBusy) << w2.error.describe();
  auto nodes = lock_nodes(name);
  EXPECT_EQ(nodes.size(), 2u);
  EXPECT_TRUE(std::any_of(nodes.begin(), nodes.end(), [](const std::string& n) { return n.find("w2") != n.npos; }));
  // A later reader is stopped by it, though only a reader holds (the
  // writer's next attempt first, as its runtime's would come: its node is
  // removed 2 s after the last).
  ASSERT_EQ(store.acquire(name, "w2", 10s).status, Status::kBusy);
  auto later = rt.acquire({.key = key(), .ttl = 10s, .retries = forever, .wait = 0ms, .kind = LockKind::shared()});
  EXPECT_TRUE(error_of<LockNotAcquired>(later));
  give_back(reader);
  // The writer's next attempt holds, under a higher token. The reader's
  // node went through another session, perhaps on another member, which
  // a read may trail for a moment (ZooKeeper orders a client's own reads
  // and writes, not another's): the attempt is made again while it finds
  // the lock busy, as the writer's runtime would on the watch, within 5 s.
  auto again = store.acquire(name, "w2", 10s);
  for (auto until = std::chrono::steady_clock::now() + 5s;
       again.status == Status::kBusy && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(20ms);
    again = store.acquire(name, "w2", 10s);
  }
  ASSERT_EQ(again.status, Status::kTaken) << again.error.describe();
  EXPECT_GT(again.fence, w1.fence);
  // A reader waiting for it is let in by its release, with its token.
  auto waiting = rt.acquire({.key = key(), .ttl = 10s, .retries = forever, .wait = 10s, .kind = LockKind::shared()});
  ASSERT_EQ(store.release(name, "w2"), detail::Released::kYes);
  LockHandle next = get_bounded(waiting);
  EXPECT_EQ(next.lease().fencing_token(), again.fence);
  give_back(next);
}

TEST_F(ZooKeeperStoreTest, PermitsThatDisagreeOnNAreRefusedAndLeaveNothingBehind) {
  Runtime a(options()), b(options());
  auto f = a.acquire({.key = key(), .ttl = 10s, .kind = LockKind::permits(2)});
  LockHandle held = get_bounded(f);
  const std::string name = a.options().runtime.key_prefix + key();
  auto more = b.acquire({.key = key(), .ttl = 10s, .retries = forever, .wait = 0ms, .kind = LockKind::permits(3)});
  auto e = error_of<InvalidArgument>(more);
  ASSERT_TRUE(e);
  EXPECT_NE(std::string(e->what()).find("2 permits"), std::string::npos) << e->what();
  EXPECT_NE(std::string(e->what()).find("3 permits"), std::string::npos) << e->what();
  auto writer = b.acquire({.key = key(), .ttl = 10s, .retries = forever, .wait = 0ms});
  EXPECT_TRUE(error_of<InvalidArgument>(writer));
  // Only the holder's node is there: the refused calls' nodes went first.
  EXPECT_EQ(lock_nodes(name).size(), 1u);
  EXPECT_FALSE(held.lease().lost());
  give_back(held);
}

TEST_F(ZooKeeperStoreTest, APermitGoesWithItsHoldersSession) {
  // The lock's directory, made open to every client by a first use
  // without credentials.
  {
    Runtime open(options());
    auto f = open.acquire({.key = key(), .ttl = 5s, .kind = LockKind::permits(1)});
    LockHandle h = get_bounded(f);
    give_back(h);
  }
  // With credentials: the holder's node below is made by the same identity.
  Runtime rt(options("zookeeper://u:p@" + ensemble_->hosts()));
  const std::string dir = lock_dir(rt.options().runtime.key_prefix + key());
  // A holder of the one permit on a session of its own, as a process of
  // this store's makes it.
  auto holder = std::make_unique<ZooKeeperClient>(ensemble_->hosts(), "u:p");
  holder->create_ephemeral_sequential(dir + "/lock-other.1.p1-", "other\n5000");
  auto busy = rt.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 0ms, .kind = LockKind::permits(1)});
  EXPECT_TRUE(error_of<LockNotAcquired>(busy));
  auto waiting = rt.acquire({.key = key(), .ttl = 5s, .retries = forever, .wait = 10s, .kind = LockKind::permits(1)});
  // Its session ends (as a killed holder's expires): the permit is back.
  auto t0 = std::chrono::steady_clock::now();
  holder.reset();
  LockHandle h = get_bounded(waiting);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  give_back(h);
}

TEST_F(ZooKeeperStoreTest, TheLeaderKilledOrPausedKeepsLeasesAndGrantsLocks) {
  // The waiter below rides an unanswered request out for the connect
  // timeout: under ASan on a loaded machine, the create sent as the leader
  // stopped went unanswered for the whole command timeout (5 s) once.
  Options patient = options();
  patient.connection.connect_timeout = 12s;
  Runtime rt(options()), other(patient);
  // Longer than an election takes on a loaded machine: the lock is kept
  // through it.
  auto held = take(rt, key("-held"), 15s);
  const auto fence = held.lease().fencing_token();
  for (bool pause : {false, true}) {
    int leader = ensemble_->leader();
    ASSERT_GE(leader, 0);
    if (pause)
      ensemble_->pause(leader);
    else
      ensemble_->kill(leader);
    // The others elect a leader; a new lock is granted meanwhile (the
    // waiter rides out the election), and the held one stays held.
    auto next = other.acquire({.key = key(pause ? "-paused" : "-killed"), .ttl = 5s, .retries = forever, .wait = 15s});
    auto h = get_bounded(next);
    EXPECT_GT(h.lease().fencing_token(), fence);
    auto busy = other.acquire({.key = key("-held"), .ttl = 5s, .retries = forever});
    EXPECT_TRUE(error_of<LockNotAcquired>(busy));
    if (pause)
      ensemble_->resume(leader);
    else
      ensemble_->start(leader);
    ASSERT_TRUE(ensemble_->wait_serving());
  }
  EXPECT_FALSE(held.lease().lost());
  auto f = held.release();
  get_bounded(f);
}

TEST_F(ZooKeeperStoreTest, AMinorityDownStillGrantsLocksOneAtATime) {
  int leader = ensemble_->leader();
  ASSERT_GE(leader, 0);
  const int down = followers(leader).front();
  ensemble_->kill(down);
  Runtime a(options()), b(options());
  auto h = take(a, key(), 2s);
  const auto first = h.lease().fencing_token();
  auto busy = b.acquire({.key = key(), .ttl = 2s, .retries = forever});
  EXPECT_TRUE(error_of<LockNotAcquired>(busy));
  auto f = h.release();
  get_bounded(f);
  auto again = take(b, key(), 2s);
  EXPECT_GT(again.lease().fencing_token(), first);
  ensemble_->start(down);
}

// A release its member does not answer ends the session holding the
// node, and looks for the node from another session until that one
// surely expired. Found gone (removed here, after the work, as the
// ensemble removes an ended session's nodes), the node is the release
// done: the work ended within its lease, and its caller gets its result,
// not a lost lease.
TEST_F(ZooKeeperStoreTest, ANodeGoneWithTheSessionEndedForItsReleaseIsNoLostLease) {
  const int leader = ensemble_->leader();
  ASSERT_GE(leader, 0);
  const int member = followers(leader).front();  // the runtime's only one
  LogLines log;
  Options o = options("zookeeper://127.0.0.1:" + std::to_string(ensemble_->client_port(member)));
  o.connection.command_timeout = 500ms;
  o.observability.log = log.sink();
  Runtime rt(o), other(options());
  Gate started, finish;
  auto work = locked(key(), 10s, forever).on(rt)([&] {
    started.open();
    finish.wait();
    return this_lease().fencing_token();
  });
  auto done = work();
  ASSERT_TRUE(started.wait());
  const std::string name = options().runtime.key_prefix + key();  // the store's name for it
  const auto nodes = lock_nodes(name);
  ASSERT_EQ(nodes.size(), 1u);
  ensemble_->pause(member);
  finish.open();  // its release goes unanswered
  ASSERT_TRUE(log.wait_for("release could not be confirmed; its session ends"));
  // The other two still serve: the node goes while the store cannot look.
  ZooKeeperClient(ensemble_->hosts(member)).remove(lock_dir(name) + "/" + nodes[0]);
  ensemble_->resume(member);
  ASSERT_TRUE(ensemble_->wait_serving());
  // Answered once the node is found gone, well before the 10 s ttl the
  // release would otherwise wait out.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_GT(get_bounded(done), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 8s);
  auto next = other.acquire({.key = key(), .ttl = 2s, .retries = forever});
  auto h = get_bounded(next);
  EXPECT_GE(h.lease().fencing_token(), 1u);
  give_back(h);
}

TEST_F(ZooKeeperStoreTest, AReadLostWithItsConnectionIsAskedAgainOnTheSameSession) {
  Options o = options();
  o.connection.command_timeout = 8s;  // room for the session to connect to another member
  Runtime rt(o);
  {
    auto first = rt.inspect(key());  // the session connects
    EXPECT_FALSE(get_bounded(first).held);
  }
  // The member its one connection is to, and the member's end of it.
  int member = -1;
  unsigned client_port = 0;
  const auto own = own_sockets();
  for (const auto& t : tcp_lines())
    for (int i = 0; i < ensemble_->size(); ++i)
      if (t.state == 1 && t.remote_port == static_cast<unsigned>(ensemble_->client_port(i)) && own.count(t.inode)) {
        ASSERT_EQ(member, -1) << "one connection expected";
        member = i;
        client_port = t.local_port;
      }
  ASSERT_GE(member, 0);
  // The member stops answering; a read is sent to it (its bytes wait in the
  // member's queue), then the member dies and the connection with it.
  ensemble_->pause(member);
  auto reading = rt.inspect(key());
  const auto bound = std::chrono::steady_clock::now() + 5s;
  bool queued = false;
  while (!queued && std::chrono::steady_clock::now() < bound) {
    for (const auto& t : tcp_lines())
      if (t.local_port == static_cast<unsigned>(ensemble_->client_port(member)) && t.remote_port == client_port &&
          t.rx_queue > 0)
        queued = true;
    if (!queued) std::this_thread::sleep_for(5ms);  // polling /proc: no event to wait on
  }
  ASSERT_TRUE(queued);
  ensemble_->kill(member);
  // Answered on the same session through another member: the read is asked
  // again, not failed with the connection.
  auto state = get_bounded(reading);
  EXPECT_FALSE(state.held);
  // A lock is had and inspected on it as before.
  auto h = take(rt, key(), 5s);
  auto held = rt.inspect(key());
  EXPECT_TRUE(get_bounded(held).held);
  give_back(h);
  ensemble_->start(member);
  EXPECT_TRUE(ensemble_->wait_serving());
}

TEST_F(ZooKeeperStoreTest, AMajorityDownGrantsNothingAndHoldersLoseTheirLeasesByTheirDeadline) {
  Options o = options();
  o.connection.command_timeout = 500ms;
  Runtime rt(o), waiter_rt(o);
  // Long enough for renewals to be confirmed through a loaded machine's
  // stalls before the fault (1.5 s leases were lost before it).
  constexpr auto kTtl = 3s;
  std::atomic<bool> stopped_before_lost{false};
  std::atomic<std::chrono::steady_clock::rep> stopped_at{0};
  Gate started;
  auto work = locked(key("-held"), kTtl, forever).on(rt)([&] {
    started.open();
    bool stopped = stopped_within_bound(this_lease().stop_token());
    stopped_at = std::chrono::steady_clock::now().time_since_epoch().count();
    stopped_before_lost = stopped;
    return stopped;
  });
  // The call opens the runtime's session within the short timeout; on a
  // loaded machine that can fail before any fault: it is made again.
  std::future<bool> holding;
  ASSERT_TRUE(started.wait_remaking(work, holding, 4));
  const std::string name = rt.options().runtime.key_prefix + key("-held");
  auto held_nodes = lock_nodes(name);
  ASSERT_EQ(held_nodes.size(), 1u);
  int leader = ensemble_->leader();
  ASSERT_GE(leader, 0);
  // The waiter is told the lock is busy (it watches the holder's node)
  // before the quorum goes: it sleeps until a release notice or the
  // holder's ttl, which is its whole wait.
  auto waiting = waiter_rt.acquire({.key = key("-held"), .ttl = kTtl, .retries = forever, .wait = kTtl});
  ASSERT_TRUE(ensemble_->wait_watched(lock_dir(name) + "/" + held_nodes.front()));
  ensemble_->kill(followers(leader).front());
  auto lost_at = std::chrono::steady_clock::now();  // the quorum goes with the next
  ensemble_->kill(leader);
  // The holder's lease ends by its deadline (the ttl), its stop token fired.
  // Its stop token fires by the lease's deadline: at most a ttl after the
  // last renewal the ensemble answered, which came before the quorum went.
  EXPECT_TRUE(error_of<LeaseLost>(holding));
  auto stopped_after = std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(stopped_at.load())) - lost_at;
  std::printf("stop token fired %lld ms after the quorum went (ttl 3000 ms)\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(stopped_after).count()));
  EXPECT_LT(stopped_after, kTtl + 200ms);
  EXPECT_TRUE(stopped_before_lost.load());
  // The waiter fails at its wait, with the ensemble's error: not a grant,
  // nor a lock held by another owner. Only its session's lost connection
  // sends it to the ensemble again within its wait, and that attempt's
  // timeout (0.5 s) tells it the ensemble is unreachable.
  auto err = error_of<ConnectionError>(waiting);
  EXPECT_TRUE(err);
  // A new lock is not granted either; it fails within its timeouts.
  auto t0 = std::chrono::steady_clock::now();
  auto fresh = waiter_rt.acquire({.key = key("-fresh"), .ttl = 1s, .retries = forever});
  EXPECT_TRUE(error_of<ConnectionError>(fresh));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  for (int i = 0; i < ensemble_->size(); ++i) ensemble_->start(i);
  ASSERT_TRUE(ensemble_->wait_serving());
  // Once a quorum serves again, the lock is granted (the lost holder's
  // session expired with its node, or it gave the node back).
  auto after = waiter_rt.acquire({.key = key("-held"), .ttl = 2s, .retries = forever, .wait = 15s});
  auto h = get_bounded(after);
  EXPECT_GE(h.lease().fencing_token(), 1u);
}

TEST_F(ZooKeeperStoreTest, AMajorityDownGrantsNoShareAndNoPermit) {
  Options o = options();
  o.connection.command_timeout = 500ms;
  Runtime rt(o);
  int leader = ensemble_->leader();
  ASSERT_GE(leader, 0);
  ensemble_->kill(followers(leader).front());
  ensemble_->kill(leader);
  for (LockKind kind : {LockKind::shared(), LockKind::permits(3)}) {
    auto t0 = std::chrono::steady_clock::now();
    auto f = rt.acquire({.key = key(), .ttl = 1s, .kind = kind});
    EXPECT_TRUE(error_of<ConnectionError>(f)) << kind.describe();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 7s) << kind.describe();
  }
  for (int i = 0; i < ensemble_->size(); ++i) ensemble_->start(i);
  ASSERT_TRUE(ensemble_->wait_serving());
}

}  // namespace
}  // namespace lockwatch::testing
