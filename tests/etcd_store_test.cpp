// What only the etcd store (etcd://) has, against one real cluster of
// three members for the whole suite (and one of a single member with
// authentication on, for the credential tests): its URL, its lease per
// lock, the fencing token from the key's create_revision, waiting by
// Watch, the operators' tools, members unreachable or refusing the
// credentials, TLS (etcds://, a cluster of one member of its own), a
// member killed or paused while locks are taken, and scheduled jobs: the
// members' clock read from their HTTP Date headers and period claims.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <future>
#include <thread>
#include <vector>

#include "core/loop.hpp"
#include "lockwatch/lockwatch.hpp"
#include "runtime/store_errors.hpp"
#include "store/etcd/etcd_clock.hpp"
#include "store/etcd/etcd_store.hpp"
#include "store_on_loop.hpp"
#include "support/etcd_cluster.hpp"
#include "support/redis_server.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

class EtcdStoreTest : public ::testing::Test {
 protected:
  // Requests over 64 KiB are refused, so that a member answering an error
  // is easy to make.
  static void SetUpTestSuite() {
    cluster_ = new EtcdCluster(EtcdClusterOptions{.extra_flags = " --max-request-bytes 65536"});
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void TearDown() override {
    // A test that failed half-way leaves every member running for the next.
    for (int i = 0; i < cluster_->size(); ++i) {
      cluster_->resume(i);
      if (!cluster_->running(i)) cluster_->start(i);
    }
  }

  static Options options(const std::string& url, std::size_t threads = 2) {
    Options o;
    o.store_url = url;
    o.runtime.threads = threads;
    o.connection.connect_timeout = 2s;
    o.connection.command_timeout = 1s;
    return o;
  }
  static Options options() { return options(cluster_->url()); }
  // A key unique to the running test.
  static std::string key(const std::string& suffix = "") {
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + suffix;
  }

  static EtcdCluster* cluster_;
};
EtcdCluster* EtcdStoreTest::cluster_ = nullptr;

// Takes `key`, waiting for it at most `wait`.
LockHandle take(Runtime& rt, const std::string& key, std::chrono::milliseconds ttl,
                std::chrono::milliseconds wait = 0ms) {
  auto f = rt.acquire({.key = key, .ttl = ttl, .retries = forever, .wait = wait});
  return get_bounded(f);
}

TEST_F(EtcdStoreTest, MalformedUrlsAreInvalidArgumentsThatHideThePassword) {
  expect_refused_urls(
      {
        "etcd://",                                // no member
        "etcd://127.0.0.1:x",                     // bad port
        "etcd://127.0.0.1:70000",                 // port out of range
        "etcd://127.0.0.1:2379,",                 // an empty member
        "etcd://u:secret@127.0.0.1:2379/prefix",  // a path
        "etcd://u:secret@127.0.0.1:2379?tls=1",   // parameters
        "etcd://:secret@127.0.0.1:2379",          // a password without a user
        "etcd://[::1:2379",                       // an unclosed bracket
        "etcd://ho st:2379",                      // not a host name
        "etcd://u:secret%zz@127.0.0.1:2379",      // a bad escape
      },
      [](const char* url) { return options(url); }, "etcd");
  Options replicas = options();
  add_url_param(replicas, "min_replicas=1");  // a Redis setting
  EXPECT_THROW(replicas.validate(), InvalidArgument);
  for (const char* fine : {"etcd://127.0.0.1", "etcd://u:p%40ss@etcd-1.example:2379,etcd-2.example:2379,[::1]:2380/",
                           "etcd://u@[::1]"}) {
    Options o = options(fine);
    EXPECT_NO_THROW(o.validate()) << fine;
  }
}

TEST_F(EtcdStoreTest, TheFenceIsTheKeysCreateRevisionAndRisesAcrossKeys) {
  StoreOnLoop store(options());
  const std::string a = store.encode(key("a")), b = store.encode(key("b"));
  auto first = store.acquire(a, "token-1", 5s);
  ASSERT_EQ(first.status, detail::Acquired::Status::kTaken) << first.error.describe();
  EXPECT_GT(first.fence, 0u);
  auto rev = cluster_->etcdctl("get " + a + " -w json");
  EXPECT_NE(rev.find("\"create_revision\":" + std::to_string(first.fence)), std::string::npos) << rev;

  // The same owner again: the same acquisition.
  auto again = store.acquire(a, "token-1", 5s);
  ASSERT_EQ(again.status, detail::Acquired::Status::kTaken);
  EXPECT_EQ(again.fence, first.fence);

  // Another owner: busy for what the holder's lease has left (whole
  // seconds, and a second more).
  auto other = store.acquire(a, "token-2", 5s);
  ASSERT_EQ(other.status, detail::Acquired::Status::kBusy);
  EXPECT_GT(other.busy_for, 1s);
  EXPECT_LE(other.busy_for, 7s);

  // Another key later: a higher token, from the one revision counter.
  auto second = store.acquire(b, "token-3", 5s);
  ASSERT_EQ(second.status, detail::Acquired::Status::kTaken);
  EXPECT_GT(second.fence, first.fence);

  EXPECT_EQ(store.release(a, "token-2"), detail::Released::kTakenByOther);
  EXPECT_EQ(store.release(a, "token-1"), detail::Released::kYes);
  EXPECT_EQ(store.release(a, "token-1"), detail::Released::kGone);
  auto third = store.acquire(a, "token-4", 5s);
  ASSERT_EQ(third.status, detail::Acquired::Status::kTaken);
  EXPECT_GT(third.fence, second.fence);
  EXPECT_EQ(store.release(a, "token-4"), detail::Released::kYes);
  EXPECT_EQ(store.release(b, "token-3"), detail::Released::kYes);
}

TEST_F(EtcdStoreTest, ALeaseIsGivenBackWithItsLock) {
  StoreOnLoop store(options());
  const std::string a = store.encode(key());
  auto before = cluster_->etcdctl("lease list");
  ASSERT_EQ(store.acquire(a, "t1", 30s).status, detail::Acquired::Status::kTaken);
  // A busy attempt's lease is revoked at once.
  ASSERT_EQ(store.acquire(a, "t2", 30s).status, detail::Acquired::Status::kBusy);
  EXPECT_EQ(store.release(a, "t1"), detail::Released::kYes);
  EXPECT_EQ(cluster_->etcdctl("lease list"), before);
}

TEST_F(EtcdStoreTest, TheWatchdogKeepsALockPastItsTtl) {
  // The suites' steady ttl for etcd (2 s): with etcd's shortest, 1 s, a
  // renewal under the sanitizers on a loaded machine went unconfirmed past
  // the local deadline now and then.
  Runtime rt(options());
  auto h = take(rt, key(), 2s);
  auto before = rt.stats();
  auto after = after_renewals(rt, before, 3);
  EXPECT_GE(after.renewals_sent - before.renewals_sent, 3u);
  EXPECT_FALSE(h.lease().lost());
  Runtime other(options());
  auto f = other.acquire({.key = key(), .ttl = 1s, .retries = 0});
  EXPECT_TRUE(error_of<LockNotAcquired>(f));
  give_back(h);
}

TEST_F(EtcdStoreTest, AWaiterWakesOnTheReleaseNotAtTheTtl) {
  Runtime holder(options()), waiter(options());
  auto h = take(holder, key(), 20s);
  const std::uint64_t first = h.lease().fencing_token();
  auto t0 = std::chrono::steady_clock::now();
  auto f = waiter.acquire({.key = key(), .ttl = 20s, .retries = forever, .wait = 20s});
  std::this_thread::sleep_for(300ms);  // the waiter is watching by now
  give_back(h);
  auto got = get_bounded(f);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_GT(got.lease().fencing_token(), first);
  give_back(got);
}

TEST_F(EtcdStoreTest, AKilledHoldersLockIsFreeAfterItsLease) {
  const char* holder_exe = std::getenv("LOCKWATCH_LOCK_HOLDER");
  ASSERT_NE(holder_exe, nullptr);
  ChildProcess holder({holder_exe, cluster_->url(), key(), "1000"});
  auto line = holder.read_line(10s);
  ASSERT_TRUE(line && line->rfind("held ", 0) == 0) << (line ? *line : "no line");
  const std::uint64_t held = std::stoull(line->substr(5));
  holder.kill(SIGKILL);
  holder.wait(5s);
  Runtime rt(options());
  auto t0 = std::chrono::steady_clock::now();
  auto h = take(rt, key(), 1s, 10s);
  // etcd's shortest lease here is a second; its expiry is checked by the
  // leader every half second.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
  EXPECT_GT(h.lease().fencing_token(), held);
  give_back(h);
}

TEST_F(EtcdStoreTest, InspectAndForceRelease) {
  Runtime rt(options()), other(options());
  auto h = take(rt, key(), 3s);
  auto s = rt.inspect(key());
  auto state = get_bounded(s);
  EXPECT_TRUE(state.held);
  EXPECT_EQ(state.fencing_token, h.lease().fencing_token());
  EXPECT_GT(state.ttl, 1s);
  auto waiting = other.acquire({.key = key(), .ttl = 10s, .retries = forever, .wait = 10s});
  auto forced = rt.force_release(key());
  EXPECT_TRUE(get_bounded(forced));
  auto got = get_bounded(waiting);
  EXPECT_GT(got.lease().fencing_token(), h.lease().fencing_token());
  // The holder's next renewal finds its lease revoked.
  auto deadline = std::chrono::steady_clock::now() + 15s;
  while (!h.lease().lost() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(h.lease().lost());
  const std::uint64_t last = got.lease().fencing_token();
  give_back(got);
  auto after = rt.inspect(key());
  auto free = get_bounded(after);
  EXPECT_FALSE(free.held);
  EXPECT_GE(free.fencing_token, last);
}

// The members' clock read from their HTTP Date headers, by a process
// whose own clock is 3.7 s fast: the members run on this machine, so
// their clock is the real one.
TEST_F(EtcdStoreTest, TheClockIsTheMembersWithinATenthOfASecondWhateverOurs) {
  static constexpr auto kSkew = 3700ms;
  detail::Loop loop;
  auto clock = std::make_unique<detail::EtcdClock>(loop, detail::EtcdTarget::parse(cluster_->url()),
                                                   detail::StoreSettings::of(options()),
                                                   [] { return std::chrono::system_clock::now() + kSkew; });
  auto read = [&] {
    auto p = std::make_shared<std::promise<std::chrono::system_clock::time_point>>();
    auto f = p->get_future();
    loop.post([&clock, p] {
      clock->now([p](std::chrono::system_clock::time_point t, const detail::StoreError* e) {
        if (e) ADD_FAILURE() << e->describe();
        p->set_value(t);
      });
    });
    auto t = get_bounded(f);
    return std::pair{t, std::chrono::system_clock::now()};
  };
  auto t0 = std::chrono::steady_clock::now();
  auto [first, real] = read();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "a measurement samples at most ~1.2 s";
  EXPECT_LT(std::chrono::abs(first - real), 100ms)
      << std::chrono::duration_cast<std::chrono::milliseconds>(first - real).count() << " ms off";
  // Kept: the next reads cost no measurement.
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) {
    auto [t, r] = read();
    EXPECT_LT(std::chrono::abs(t - r), 100ms);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 200ms);
  std::promise<std::chrono::milliseconds> u;
  loop.post([&] { u.set_value(clock->uncertainty()); });
  auto uf = u.get_future();
  const auto uncertainty = get_bounded(uf);
  EXPECT_LT(uncertainty, 100ms);
  std::printf("members' clock read %lld ms off (uncertainty %lld ms)\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(first - real).count()),
              static_cast<long long>(uncertainty.count()));
  EXPECT_EQ(loop.shutdown([&] { clock->close(); }), 0);
  clock.reset();
}

TEST_F(EtcdStoreTest, APeriodIsClaimedOnceAndRecordedInTheJobsPeriodKey) {
  StoreOnLoop store(options());
  const std::string lock = store.encode("job:" + key());
  ASSERT_EQ(store.acquire(lock, "leader", 10s).status, detail::Acquired::Status::kTaken);
  auto now = store.server_time();
  ASSERT_FALSE(now.error) << now.error->describe();
  EXPECT_LT(std::chrono::abs(now.now - std::chrono::system_clock::now()), 100ms);

  auto first = store.claim(lock, "leader", 5);
  ASSERT_EQ(first.status, detail::ClaimResult::Status::kClaimed) << first.error.describe();
  EXPECT_LT(std::chrono::abs(first.store_time - std::chrono::system_clock::now()), 100ms);
  EXPECT_EQ(cluster_->etcdctl("get --print-value-only " + detail::EtcdStore::period_key(lock)), "5\n");
  // The same period again, or an older one: already run.
  for (std::int64_t p : {5, 4}) {
    auto again = store.claim(lock, "leader", p);
    EXPECT_EQ(again.status, detail::ClaimResult::Status::kAlreadyRun) << p;
    EXPECT_EQ(again.last, 5) << p;
  }
  EXPECT_EQ(store.claim(lock, "leader", 6).status, detail::ClaimResult::Status::kClaimed);
  // A period not yet due on the members' clock: not claimed, not recorded.
  auto early = store.claim(lock, "leader", 7, std::chrono::system_clock::now() + 30s);
  EXPECT_EQ(early.status, detail::ClaimResult::Status::kNotDue);
  EXPECT_EQ(cluster_->etcdctl("get --print-value-only " + detail::EtcdStore::period_key(lock)), "6\n");
  EXPECT_EQ(store.release(lock, "leader"), detail::Released::kYes);
}

TEST_F(EtcdStoreTest, AClaimByATokenThatNoLongerHoldsTheLockIsRefused) {
  StoreOnLoop store(options());
  const std::string lock = store.encode("job:" + key());
  const std::string period_key = detail::EtcdStore::period_key(lock);
  ASSERT_EQ(store.acquire(lock, "old", 10s).status, detail::Acquired::Status::kTaken);
  ASSERT_EQ(store.claim(lock, "old", 1).status, detail::ClaimResult::Status::kClaimed);
  // Another holder's lock (forced off, taken by another token).
  EXPECT_EQ(store.claim(lock, "intruder", 2).status, detail::ClaimResult::Status::kNotLeader);
  EXPECT_EQ(store.release(lock, "old"), detail::Released::kYes);
  // No holder at all.
  EXPECT_EQ(store.claim(lock, "old", 2).status, detail::ClaimResult::Status::kNotLeader);
  ASSERT_EQ(store.acquire(lock, "new", 10s).status, detail::Acquired::Status::kTaken);
  EXPECT_EQ(store.claim(lock, "old", 2).status, detail::ClaimResult::Status::kNotLeader);
  EXPECT_EQ(cluster_->etcdctl("get --print-value-only " + period_key), "1\n");
  EXPECT_EQ(store.claim(lock, "new", 2).status, detail::ClaimResult::Status::kClaimed);
  EXPECT_EQ(store.release(lock, "new"), detail::Released::kYes);
  // Garbage in the period key: a clear error, never a claim.
  cluster_->etcdctl("put " + period_key + " not-a-number");
  ASSERT_EQ(store.acquire(lock, "new", 10s).status, detail::Acquired::Status::kTaken);
  auto bad = store.claim(lock, "new", 3);
  EXPECT_EQ(bad.status, detail::ClaimResult::Status::kFailed);
  EXPECT_NE(bad.error.describe().find("not-a-number"), std::string::npos) << bad.error.describe();
  EXPECT_EQ(store.release(lock, "new"), detail::Released::kYes);
}

TEST_F(EtcdStoreTest, AClusterThatDoesNotAnswerGivesAConnectionErrorNeverAClaim) {
  // Nothing listening: the clock cannot be read.
  {
    StoreOnLoop store(options("etcd://127.0.0.1:" + std::to_string(free_loopback_port())));
    auto t0 = std::chrono::steady_clock::now();
    auto now = store.server_time();
    ASSERT_TRUE(now.error);
    EXPECT_TRUE(now.error->unavailable());
    EXPECT_THROW(std::rethrow_exception(detail::to_exception(*now.error)), ConnectionError);
    auto claim = store.claim(store.encode("job:" + key()), "t", 1);
    EXPECT_EQ(claim.status, detail::ClaimResult::Status::kFailed);
    EXPECT_TRUE(claim.error.unavailable()) << claim.error.describe();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  }
  // A server that is not etcd (no /version as etcd answers it).
  {
    RedisServer redis;
    StoreOnLoop store(options("etcd://127.0.0.1:" + std::to_string(redis.port())));
    auto now = store.server_time();
    ASSERT_TRUE(now.error);
    EXPECT_THROW(std::rethrow_exception(detail::to_exception(*now.error)), ConnectionError);
  }
  // A hung cluster: with the clock kept, the claim's transaction gets no
  // answer within the command timeout.
  StoreOnLoop store(options());
  const std::string lock = store.encode("job:" + key());
  ASSERT_EQ(store.acquire(lock, "leader", 10s).status, detail::Acquired::Status::kTaken);
  ASSERT_FALSE(store.server_time().error);
  for (int i = 0; i < cluster_->size(); ++i) cluster_->pause(i);
  auto t0 = std::chrono::steady_clock::now();
  auto claim = store.claim(lock, "leader", 1);
  auto took = std::chrono::steady_clock::now() - t0;
  for (int i = 0; i < cluster_->size(); ++i) cluster_->resume(i);
  EXPECT_EQ(claim.status, detail::ClaimResult::Status::kFailed);
  EXPECT_TRUE(claim.error.unavailable()) << claim.error.describe();
  EXPECT_LT(took, 5s);
  // And a fresh store's clock from a hung cluster: an error within the timeouts.
  for (int i = 0; i < cluster_->size(); ++i) cluster_->pause(i);
  StoreOnLoop fresh(options());
  t0 = std::chrono::steady_clock::now();
  auto none = fresh.server_time();
  took = std::chrono::steady_clock::now() - t0;
  for (int i = 0; i < cluster_->size(); ++i) cluster_->resume(i);
  ASSERT_TRUE(none.error);
  EXPECT_TRUE(none.error->unavailable()) << none.error->describe();
  EXPECT_LT(took, 3 * 1s + 2s);  // a command timeout per member, and slack
}

TEST_F(EtcdStoreTest, UnreachableMembersAreConnectionErrorsWithinTheTimeouts) {
  std::string url = "etcd://127.0.0.1:" + std::to_string(free_loopback_port()) + ",127.0.0.1:" +
                    std::to_string(free_loopback_port());
  Runtime rt(options(url));
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt.acquire({.key = key(), .ttl = 1s, .retries = 0});
  auto err = error_of<ConnectionError>(f);
  ASSERT_TRUE(err);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_NE(std::string(err->what()).find("127.0.0.1"), std::string::npos) << err->what();
}

TEST_F(EtcdStoreTest, ADeadFirstMemberIsPassedOver) {
  // The URL names a closed port first: calls move on to the cluster.
  std::string url = "etcd://127.0.0.1:" + std::to_string(free_loopback_port()) + "," + cluster_->endpoints();
  Runtime rt(options(url));
  auto f = rt.acquire({.key = key(), .ttl = 2s, .retries = 0});
  auto h = get_bounded(f);
  EXPECT_GT(h.lease().fencing_token(), 0u);
  give_back(h);
  // The dead member is reported down.
  StoreOnLoop store(options(url));
  const std::string name = store.encode(key("direct"));
  EXPECT_EQ(store.acquire(name, "t", 2s).status, detail::Acquired::Status::kTaken);
  EXPECT_GE(store.downs(), 1);
  EXPECT_EQ(store.release(name, "t"), detail::Released::kYes);
}

TEST_F(EtcdStoreTest, WrongCredentialsAreAuthErrorsThatHideThePassword) {
  EtcdCluster secured(EtcdClusterOptions{.members = 1, .auth = true});
  {
    Runtime rt(options(secured.url()));
    auto h = take(rt, key(), 2s);
    EXPECT_GT(h.lease().fencing_token(), 0u);
    give_back(h);
  }
  for (const char* credentials : {"lockwatch:not-the-password", "nobody-here:pw"}) {
    Runtime rt(options("etcd://" + std::string(credentials) + "@127.0.0.1:" + std::to_string(secured.client_port(0))));
    auto t0 = std::chrono::steady_clock::now();
    auto f = rt.acquire({.key = key(), .ttl = 1s, .retries = 0});
    auto err = error_of<AuthError>(f);
    ASSERT_TRUE(err) << credentials;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
    EXPECT_EQ(std::string(err->what()).find("not-the-password"), std::string::npos) << err->what();
  }
  // The clock is read without credentials (etcd answers /version to anyone).
  {
    StoreOnLoop store(options(secured.url()));
    auto now = store.server_time();
    ASSERT_FALSE(now.error) << now.error->describe();
    EXPECT_LT(std::chrono::abs(now.now - std::chrono::system_clock::now()), 100ms);
  }
  // No credentials at all: refused too.
  Runtime anonymous(options("etcd://127.0.0.1:" + std::to_string(secured.client_port(0))));
  auto f = anonymous.acquire({.key = key(), .ttl = 1s, .retries = 0});
  EXPECT_TRUE(error_of<AuthError>(f));
}

TEST_F(EtcdStoreTest, EtcdsSpeaksTlsWithTheTlsOptions) {
  EtcdCluster secured(EtcdClusterOptions{.members = 1, .tls = true});
  const TestCertificates& c = test_certificates();
  auto with_tls = [&](Options o) {
    o.tls.ca_file = c.ca_cert;
    o.tls.cert_file = c.client_cert;
    o.tls.key_file = c.client_key;
    return o;
  };
  {
    Runtime rt(with_tls(options(secured.url())));
    auto h = take(rt, key(), 2s);
    EXPECT_GT(h.lease().fencing_token(), 0u);
    give_back(h);
  }
  // The clock over HTTPS, with the same options.
  {
    StoreOnLoop store(with_tls(options(secured.url())));
    auto now = store.server_time();
    ASSERT_FALSE(now.error) << now.error->describe();
    EXPECT_LT(std::chrono::abs(now.now - std::chrono::system_clock::now()), 100ms);
    // A CA that did not sign the member's certificate: no clock either.
    Options untrusted = with_tls(options(secured.url()));
    untrusted.tls.ca_file = c.untrusted_cert;
    StoreOnLoop refused(untrusted);
    auto none = refused.server_time();
    ASSERT_TRUE(none.error);
    EXPECT_NE(none.error->describe().find("TLS"), std::string::npos) << none.error->describe();
  }
  // Refused, each within the timeouts: plain text to a TLS member, no
  // client certificate, a CA that did not sign the member's, a name its
  // certificate does not carry.
  std::vector<std::pair<std::string, Options>> refused;
  refused.emplace_back("plain text", options("etcd://127.0.0.1:" + std::to_string(secured.client_port(0))));
  Options no_cert = options(secured.url());
  no_cert.tls.ca_file = c.ca_cert;
  refused.emplace_back("no client certificate", no_cert);
  Options untrusted = with_tls(options(secured.url()));
  untrusted.tls.ca_file = c.untrusted_cert;
  refused.emplace_back("an untrusted CA", untrusted);
  Options wrong_name = with_tls(options(secured.url()));
  wrong_name.tls.server_name = "wrong.example";
  refused.emplace_back("a wrong name", wrong_name);
  for (auto& [what, o] : refused) {
    Runtime rt(o);
    auto t0 = std::chrono::steady_clock::now();
    auto f = rt.acquire({.key = key(), .ttl = 1s, .retries = 0});
    EXPECT_TRUE(error_of<ConnectionError>(f)) << what;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s) << what;
  }
  Options unverified = with_tls(options(secured.url()));
  unverified.tls.verify = false;
  EXPECT_THROW(unverified.validate(), InvalidArgument);
  Options unreadable = with_tls(options(secured.url()));
  unreadable.tls.ca_file = "/nonexistent/ca.crt";
  EXPECT_THROW(unreadable.validate(), InvalidArgument);
}

TEST_F(EtcdStoreTest, ARequestTheClusterRefusesIsStoreRefusedWithItsGrpcStatus) {
  // 20 KiB: within the store's own limit, but a transaction naming it six
  // times is over the cluster's 64 KiB.
  Runtime rt(options());
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt.acquire({.key = std::string(20 * 1024, 'k'), .ttl = 1s, .retries = 0});
  auto err = error_of<StoreRefused>(f);
  ASSERT_TRUE(err);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_STREQ(err->backend_code().category().name(), "lockwatch.etcd") << err->what();
  EXPECT_EQ(err->backend_code().value(), 3) << err->what();  // grpc::StatusCode::INVALID_ARGUMENT
  EXPECT_EQ(err->backend_code().message(), "INVALID_ARGUMENT") << err->what();
  EXPECT_NE(err->endpoint().find("etcd://127.0.0.1:"), std::string::npos) << err->endpoint();
  // The store goes on.
  auto h = take(rt, key(), 1s);
  give_back(h);
}

TEST_F(EtcdStoreTest, AServerThatIsNotEtcdIsAConnectionError) {
  RedisServer redis;
  Runtime rt(options("etcd://127.0.0.1:" + std::to_string(redis.port())));
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt.acquire({.key = key(), .ttl = 1s, .retries = 0});
  EXPECT_TRUE(error_of<ConnectionError>(f));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST_F(EtcdStoreTest, LocksAreGrantedWithTheLeaderPaused) {
  Runtime rt(options());
  auto h = take(rt, key("held"), 3s);
  const std::uint64_t held = h.lease().fencing_token();
  const int leader = cluster_->leader();
  cluster_->pause(leader);
  // The others elect a leader; calls to the paused one time out and move on.
  auto f = rt.acquire({.key = key(), .ttl = 2s, .retries = forever, .wait = 10s});
  auto got = get_bounded(f);
  EXPECT_GT(got.lease().fencing_token(), held);
  EXPECT_FALSE(h.lease().lost());
  give_back(got);
  give_back(h);
  cluster_->resume(leader);
}

TEST_F(EtcdStoreTest, LocksAreGrantedWithTheLeaderKilled) {
  Runtime rt(options());
  auto h = take(rt, key("held"), 3s);
  const int leader = cluster_->leader();
  cluster_->kill(leader);
  // A new leader within an election or two; a waiter rides it out.
  auto f = rt.acquire({.key = key(), .ttl = 2s, .retries = forever, .wait = 10s});
  auto got = get_bounded(f);
  EXPECT_GT(got.lease().fencing_token(), h.lease().fencing_token());
  EXPECT_FALSE(h.lease().lost());
  give_back(got);
  give_back(h);
  cluster_->start(leader);
}

TEST_F(EtcdStoreTest, NoLockIsGrantedWithoutAMajority) {
  const int leader = cluster_->leader();
  std::vector<int> others;
  for (int i = 0; i < cluster_->size(); ++i)
    if (i != leader) others.push_back(i);
  Runtime rt(options(cluster_->member_url(leader))), waiting(options(cluster_->member_url(leader)));
  auto h = take(rt, key("held"), 2s);
  // A waiter for the held lock, waiting at most 2 s.
  auto waiter_started = std::chrono::steady_clock::now();
  auto waiter = waiting.acquire({.key = key("held"), .ttl = 2s, .retries = forever, .wait = 2s});
  cluster_->kill(others[0]);
  cluster_->kill(others[1]);
  auto t0 = std::chrono::steady_clock::now();
  auto f = rt.acquire({.key = key(), .ttl = 2s, .retries = 0});
  auto err = error_of<ConnectionError>(f);
  EXPECT_TRUE(err);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  // The holder's renewals get no answer: its lease is lost by its deadline.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!h.lease().lost() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(h.lease().lost());
  // The waiter fails at its wait (or as the store is unreachable), not later.
  std::error_code waited;
  try {
    get_bounded(waiter);
  } catch (const Error& e) {
    waited = e.code();
  }
  EXPECT_TRUE(waited == errc::busy || waited == errc::unreachable) << waited.message();
  EXPECT_LT(std::chrono::steady_clock::now() - waiter_started, 2s + 3s);
  cluster_->start(others[0]);
  cluster_->start(others[1]);
}

}  // namespace
}  // namespace lockwatch::testing
