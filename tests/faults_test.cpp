// Bad input and Redis failures: every case ends in a typed error (or
// works), within a bound, and leaves no lock behind that the caller thinks
// is released. Each case runs in plaintext and over TLS.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "lockwatch/lockwatch.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

class FaultsTest : public ::testing::TestWithParam<Transport> {
 protected:
  static void SetUpTestSuite() {
    plain_ = new RedisServer();
    tls_ = new RedisServer(over(Transport::kTls));
  }
  static void TearDownTestSuite() {
    delete plain_;
    delete tls_;
    plain_ = tls_ = nullptr;
  }
  // The shared server that speaks this run's transport.
  static RedisServer& server() { return GetParam() == Transport::kTls ? *tls_ : *plain_; }
  // Options for `server` with `url` instead of its own.
  static Options options_with_url(const RedisServer& server, const std::string& url) {
    Options o = options_for(server);
    o.redis_url = url;
    return o;
  }
  static std::string scheme() { return GetParam() == Transport::kTls ? "rediss://" : "redis://"; }
  static RedisServer* plain_;
  static RedisServer* tls_;
};
RedisServer* FaultsTest::plain_ = nullptr;
RedisServer* FaultsTest::tls_ = nullptr;

TEST_P(FaultsTest, EmptyKeyIsInvalid) {
  Runtime rt(options_for(server()));
  auto f = locked([] { return std::string(); }, 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  EXPECT_TRUE(error_of<InvalidArgument>(fut));
}

TEST_P(FaultsTest, KeysOfAnyBytesWork) {
  Runtime rt(options_for(server()));
  std::string weird("a key with spaces\nnewlines \"quotes\" {braces} and \0 nul \xff bytes", 60);
  auto f = locked([&] { return weird; }, 1s, 0).on(rt)([] { return this_lease().key(); });
  auto fut = f();
  EXPECT_EQ(get_bounded(fut), weird);
  EXPECT_FALSE(exists(server(), weird));
}

TEST_P(FaultsTest, AMegabyteKeyWorksAndALargerOneIsRejected) {
  Runtime rt(options_for(server()));
  std::string mb(std::size_t{1} << 20, 'k');
  auto f = locked([&] { return mb; }, 2s, 0).on(rt)([] { return this_lease().key().size(); });
  auto fut = f();
  EXPECT_EQ(get_bounded(fut), mb.size());
  std::string too_big = mb + "x";
  auto g = locked([&] { return too_big; }, 2s, 0).on(rt)([] { return 0; });
  auto fut2 = g();
  EXPECT_TRUE(error_of<InvalidArgument>(fut2));
}

TEST_P(FaultsTest, TtlTooShortForTheTickIsInvalid) {
  Runtime rt(options_for(server()));
  // Renewing at half of 20 ms leaves 8 ms after the drift allowance; the
  // 5 ms tick needs 12.
  auto f = locked("short", 20ms, 1).on(rt)([] { return 1; });
  auto fut = f();
  auto err = error_of<InvalidArgument>(fut);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("too short"), std::string::npos) << err->what();
  // With the default options, 200 ms is accepted.
  auto g = locked("short-ok", 200ms, 1).on(rt)([] { return 1; });
  auto fut2 = g();
  EXPECT_EQ(get_bounded(fut2), 1);
}

TEST_P(FaultsTest, WithoutARenewalWindowTheWeightAloneDecidesWhatIsTooShort) {
  Options o = options_for(server());
  // 50 ms is accepted by default (renewed at 25 ms); renewing at exactly
  // 9/10 would leave 3 ms.
  Runtime with_window(o);
  auto f = locked("fifty", 50ms, 1).on(with_window)([] { return 1; });
  auto fut = f();
  EXPECT_EQ(get_bounded(fut), 1);
  o.watchdog.min_renewal_window = 0ms;
  Runtime exact(o);
  auto g = locked("fifty", 50ms, 1).on(exact)([] { return 1; });
  auto fut2 = g();
  EXPECT_TRUE(error_of<InvalidArgument>(fut2));
}

TEST_P(FaultsTest, TwoHundredMsTtlIsKeptAliveAcrossManyRenewals) {
  Runtime rt(options_for(server()));
  auto f = locked("ttl200", 200ms, forever).on(rt)([] {
    std::this_thread::sleep_for(1500ms);  // the work: 7 ttls
    return this_lease().renewals();
  });
  auto fut = f();
  EXPECT_GE(get_bounded(fut), 6u);
  auto slack = rt.stats().min_renewal_slack;
  EXPECT_GT(slack.count(), 0);
  EXPECT_LT(slack, 200ms);
  std::printf("closest renewal: %lld us before the local deadline\n", static_cast<long long>(slack.count()));
}

TEST_P(FaultsTest, UnreachableRedisFailsWithinTheConnectTimeout) {
  Options o = options_with_url(server(), scheme() + "127.0.0.1:" + std::to_string(free_loopback_port()));
  o.connection.connect_timeout = 500ms;
  Runtime rt(o);
  auto f = locked("k", 1s, 0).on(rt)([] { return 1; });
  auto t0 = std::chrono::steady_clock::now();
  auto fut = f();
  auto err = error_of<ConnectionError>(fut);
  ASSERT_TRUE(err);
  EXPECT_NE(err->endpoint().find("127.0.0.1:"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST_P(FaultsTest, WrongPasswordIsAnAuthError) {
  RedisServerOptions secured_opts;
  secured_opts.password = "right";
  RedisServer secured(over(GetParam(), secured_opts));
  Options o = options_with_url(secured, scheme() + ":wrong@127.0.0.1:" + std::to_string(secured.port()));
  Runtime rt(o);
  auto f = locked("k", 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  EXPECT_TRUE(error_of<AuthError>(fut));

  Options ok = options_for(secured);
  Runtime good(ok);
  auto g = locked("k", 1s, 0).on(good)([] { return 1; });
  auto fut2 = g();
  EXPECT_EQ(get_bounded(fut2), 1);
}

TEST_P(FaultsTest, ARefusedSelectFailsClearlyInsteadOfUsingDbZero) {
  Options o = options_for(server());
  o.redis_url = server().url() + "/99";  // the server has 16 databases
  Runtime rt(o);
  auto f = locked("select-refused", 1s, 0).on(rt)([] { return 1; });
  auto t0 = std::chrono::steady_clock::now();
  auto fut = f();
  // A configuration error, at once: not retried as an unreachable server
  // for the connect timeout (2 s).
  auto err = error_of<InvalidArgument>(fut);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("SELECT 99 was refused"), std::string::npos) << err->what();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
  EXPECT_FALSE(exists(server(), "select-refused"));  // nothing went to db 0
}

TEST_P(FaultsTest, AKeyStartingWithACloseBraceIsRejected) {
  Runtime rt(options_for(server()));
  // Its hash tag would be empty: the lock and its fencing counter would
  // hash to different Cluster slots.
  auto f = locked([] { return std::string("}x"); }, 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  EXPECT_TRUE(error_of<InvalidArgument>(fut));
  auto g = locked([] { return std::string("x}"); }, 1s, 0).on(rt)([] { return this_lease().key(); });
  auto fut2 = g();
  EXPECT_EQ(get_bounded(fut2), "x}");
}

TEST_P(FaultsTest, APrefixWithABraceIsRejected) {
  for (std::string prefix : {"app{1}:", "app{", "app}"}) {
    Options o = options_for(server());
    o.runtime.key_prefix = prefix;
    EXPECT_THROW(Runtime rt(o), InvalidArgument) << prefix;
  }
}

TEST_P(FaultsTest, AKeyOfTheWrongTypeIsStoreRefusedWithRedisCode) {
  Runtime rt(options_for(server()));
  // The lock key of another type: the script's own refusal.
  server().command({"HSET", lock_key("wrongtype"), "f", "v"});
  auto f = locked("wrongtype", 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  auto err = error_of<StoreRefused>(fut);
  ASSERT_TRUE(err);
  EXPECT_STREQ(err->backend_code().category().name(), "lockwatch.redis") << err->what();
  EXPECT_EQ(err->backend_code().message(), "LOCKWATCH") << err->what();
  // Its fencing counter of another type: Redis's WRONGTYPE.
  server().command({"HSET", lock_key("wrongcounter") + ":fence", "f", "v"});
  auto w = locked("wrongcounter", 1s, 0).on(rt)([] { return 1; });
  auto wfut = w();
  auto wrong = error_of<StoreRefused>(wfut);
  ASSERT_TRUE(wrong);
  EXPECT_STREQ(wrong->backend_code().category().name(), "lockwatch.redis") << wrong->what();
  EXPECT_EQ(wrong->backend_code().message(), "WRONGTYPE") << wrong->what();
  EXPECT_EQ(wrong->server_message().rfind("WRONGTYPE", 0), 0u) << wrong->server_message();
  server().command({"SET", lock_key("badfence") + ":fence", "not-a-number"});
  auto g = locked("badfence", 1s, 0).on(rt)([] { return 1; });
  auto fut2 = g();
  EXPECT_TRUE(error_of<StoreRefused>(fut2));
  EXPECT_FALSE(exists(server(), "badfence"));  // the failed script wrote nothing
}

TEST_P(FaultsTest, OutOfMemoryIsStoreRefused) {
  Runtime rt(options_for(server()));
  server().command({"CONFIG", "SET", "maxmemory", "1"});
  auto f = locked("oom", 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  auto err = error_of<StoreRefused>(fut);
  server().command({"CONFIG", "SET", "maxmemory", "0"});
  ASSERT_TRUE(err);
  EXPECT_NE(err->server_message().find("OOM"), std::string::npos) << err->server_message();
}

TEST_P(FaultsTest, AHolderKilledBlocksOthersOnlyUntilItsTtlEnds) {
  const char* holder = std::getenv("LOCKWATCH_LOCK_HOLDER");
  ASSERT_NE(holder, nullptr);
  ChildProcess child({holder, server().url(), "killed-holder", "1000"}, env_for(server()));
  auto line = child.read_line(kBound);
  ASSERT_TRUE(line.has_value());
  ASSERT_EQ(line->rfind("held ", 0), 0u) << *line;
  child.kill(SIGKILL);
  auto killed_at = std::chrono::steady_clock::now();
  Runtime rt(options_for(server()));
  auto f = locked("killed-holder", 1s, 0).on(rt).wait(10s)([] { return this_lease().fencing_token(); });
  auto fut = f();
  auto token = get_bounded(fut);
  auto blocked = std::chrono::steady_clock::now() - killed_at;
  EXPECT_GT(token, std::stoull(line->substr(5)));
  EXPECT_LT(blocked, 1500ms);  // at most the holder's ttl (1 s), plus slack
}

TEST_P(FaultsTest, RedisRestartedMidLeaseWithoutPersistenceReportsTheLoss) {
  RedisServer volatile_server(over(GetParam()));
  Options o = options_for(volatile_server);
  Runtime rt(o);
  Gate started;
  auto f = locked("restart", 1s, forever).on(rt)([&] {
    started.open();
    auto stop = this_lease().stop_token();
    auto until = std::chrono::steady_clock::now() + kBound;
    while (!stop.stop_requested() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
    return 1;
  });
  auto fut = f();
  ASSERT_TRUE(started.wait());
  volatile_server.kill();
  volatile_server.start();  // empty: the key and the script cache are gone
  auto err = error_of<LeaseLost>(fut);
  ASSERT_TRUE(err);
  // After the restart locking works again (EVALSHA falls back on NOSCRIPT).
  auto g = locked("restart", 1s, 0).on(rt)([] { return this_lease().fencing_token(); });
  auto fut2 = g();
  EXPECT_GE(get_bounded(fut2), 1u);
}

TEST_P(FaultsTest, RedisRestartedMidLeaseWithPersistenceKeepsTheLease) {
  RedisServerOptions durable_opts;
  durable_opts.appendonly = true;
  RedisServer durable(over(GetParam(), durable_opts));
  Runtime rt(options_for(durable));
  Gate started, restarted;
  auto f = locked("durable", 5s, forever).on(rt)([&] {
    started.open();
    EXPECT_TRUE(restarted.wait());
    EXPECT_TRUE(renewed_again(this_lease(), 1));  // the first renewal after the restart
    return this_lease().renewals();
  });
  auto fut = f();
  ASSERT_TRUE(started.wait());
  durable.kill();
  durable.start();
  restarted.open();
  EXPECT_GE(get_bounded(fut), 1u);
}

TEST_P(FaultsTest, AHungRedisCannotHangACall) {
  RedisServer hung(over(GetParam()));
  Options o = options_for(hung);
  o.connection.command_timeout = 500ms;
  Runtime rt(o);
  auto warm = locked("hung", 1s, 0).on(rt)([] { return 1; });
  auto w = warm();
  ASSERT_EQ(get_bounded(w), 1);
  hung.pause();
  auto fut = warm();
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(error_of<ConnectionError>(fut));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  hung.resume();
}

// Runtime::lock() against a hung server (on a plaintext connection it
// waits on its own connection): it fails within the command timeout, the
// lock it may have taken is given back once the server answers again, and
// lock() works again after.
TEST_P(FaultsTest, AHungRedisCannotHangALockAndLeavesNothingHeld) {
  RedisServer hung(over(GetParam()));
  Options o = options_for(hung);
  o.connection.command_timeout = 500ms;
  Runtime rt(o);
  rt.lock({.key = "hung", .ttl = 30s}).unlock();
  hung.pause();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(thrown<ConnectionError>([&] { (void)rt.lock({.key = "hung", .ttl = 30s}); }));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  hung.resume();
  // Its token is given back (a 30 s ttl would outlast the bound).
  const auto until = std::chrono::steady_clock::now() + kBound;
  while (exists(hung, "hung") && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  EXPECT_FALSE(exists(hung, "hung"));
  LockHandle h;
  while (!h && std::chrono::steady_clock::now() < until) {
    try {
      h = rt.lock({.key = "hung", .ttl = 30s});
    } catch (const ConnectionError&) {  // the connections coming back: tried again, paced
      std::this_thread::sleep_for(10ms);
    }
  }
  ASSERT_TRUE(h);
  h.unlock();
  EXPECT_FALSE(exists(hung, "hung"));
}

// Work that ended in time is not lost however long its release waits for
// an answer. The server hangs as the work ends and stays hung past the
// lease's local deadline; the release (written by the work's thread itself
// on a plaintext connection, by the loop over TLS) fails with the command
// timeout, and renewals meanwhile fail too. The call completes, without
// LeaseLost, once the key has surely expired.
TEST_P(FaultsTest, AReleaseUnansweredPastTheDeadlineLosesNoWorkThatEndedInTime) {
  RedisServer hung(over(GetParam()));
  Options o = options_for(hung);
  o.connection.command_timeout = 1500ms;
  Runtime rt(o);
  auto call = locked("ended-in-time", 500ms, forever).on(rt)([&hung] {
    hung.pause();
    return 1;
  });
  auto fut = call();
  const auto t0 = std::chrono::steady_clock::now();
  const bool ready = fut.wait_for(kBound) == std::future_status::ready;
  const auto took = std::chrono::steady_clock::now() - t0;
  hung.resume();
  ASSERT_TRUE(ready);
  EXPECT_EQ(fut.get(), 1);
  EXPECT_EQ(rt.stats().leases_lost, 0u);
  EXPECT_GE(took, 1s) << "answered before the release could have been";
}

// Tells once that a renewal failed (written, then unanswered within the
// command timeout).
class FirstRenewalFailure : public Observer {
 public:
  void on_renewal_failed(std::string_view, std::string_view) override {
    if (!told_.exchange(true)) failed_.set_value();
  }
  bool wait() const { return seen_.wait_for(kBound) == std::future_status::ready; }

 private:
  std::atomic<bool> told_{false};
  std::promise<void> failed_;
  std::shared_future<void> seen_ = failed_.get_future().share();
};

// A hung server runs what it had read once it resumes: a renewal written
// before the release, and never answered, may extend the key then, later
// than any bound counted from its send. A release that cannot be confirmed
// after such a renewal is a lost lease to the caller, never a release. Here
// the renewal (at half the ttl) is written to the hung server and times
// out; the work ends within the lease; the release cannot be confirmed
// (its connection's handshake, or the release itself, gets no answer).
TEST_P(FaultsTest, AReleaseUnconfirmedAfterAnUnansweredRenewalIsALostLease) {
  RedisServer hung(over(GetParam()));
  Options o = options_for(hung);
  o.connection.command_timeout = 150ms;
  o.connection.connect_timeout = 150ms;
  o.watchdog.renew_weight = 0.5;
  Runtime rt(o);
  auto failure = std::make_shared<FirstRenewalFailure>();
  rt.add_observer(failure);
  bool renewal_failed = false;
  bool within_lease = false;
  auto call = locked("late-renewal", 2s, forever).on(rt)([&] {
    hung.pause();  // before the renewal, due at 1 s
    renewal_failed = failure->wait();
    within_lease = !this_lease().lost();
    return 1;
  });
  auto fut = call();
  const bool ready = fut.wait_for(kBound) == std::future_status::ready;
  hung.resume();
  ASSERT_TRUE(ready);
  EXPECT_TRUE(renewal_failed);
  EXPECT_TRUE(within_lease);
  auto lost = error_of<LeaseLost>(fut);
  ASSERT_TRUE(lost) << "the release was reported done; the key's owner after the server resumed: "
                    << hung.command({"GET", lock_key("late-renewal")}).str;
  EXPECT_EQ(lost->reason(), LostReason::kStoreUnreachable);
  EXPECT_NE(std::string(lost->what()).find("not counted released"), std::string::npos) << lost->what();
}

// Plaintext only: the counter sample does its racy GET and SET with hiredis,
// which has no TLS.
TEST(FaultsPlaintextTest, SeveralProcessesCountExactly) {
  RedisServer server;
  const char* counter = std::getenv("LOCKWATCH_COUNTER");
  ASSERT_NE(counter, nullptr);
  std::vector<std::unique_ptr<ChildProcess>> procs;
  for (int i = 0; i < 3; ++i) {
    procs.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
        counter, "--redis", server.url(), "--key", "multiproc", "--increments", "40", "--threads", "2"}));
  }
  for (auto& p : procs) EXPECT_EQ(p->wait(60s), 0);
  EXPECT_EQ(server.command({"GET", "counter:multiproc"}).str, "120");
}

INSTANTIATE_TEST_SUITE_P(Transports, FaultsTest, ::testing::Values(Transport::kPlain, Transport::kTls), transport_name);

}  // namespace
}  // namespace lockwatch::testing
