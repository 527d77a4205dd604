// Bad input and Redis failures: every case ends in a typed error (or
// works), within a bound, and leaves no lock behind that the caller thinks
// is released.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "lockwatch/lockwatch.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

class FaultsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new RedisServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static RedisServer* server_;
};
RedisServer* FaultsTest::server_ = nullptr;

TEST_F(FaultsTest, EmptyKeyIsInvalid) {
  Runtime rt(options_for(*server_));
  auto f = locked([] { return std::string(); }, 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  EXPECT_TRUE(error_of<InvalidArgument>(fut));
}

TEST_F(FaultsTest, KeysOfAnyBytesWork) {
  Runtime rt(options_for(*server_));
  std::string weird("a key with spaces\nnewlines \"quotes\" {braces} and \0 nul \xff bytes", 60);
  auto f = locked([&] { return weird; }, 1s, 0).on(rt)([] { return this_lease().key(); });
  auto fut = f();
  EXPECT_EQ(get_bounded(fut), weird);
  EXPECT_FALSE(exists(*server_, weird));
}

TEST_F(FaultsTest, AMegabyteKeyWorksAndALargerOneIsRejected) {
  Runtime rt(options_for(*server_));
  std::string mb(std::size_t{1} << 20, 'k');
  auto f = locked([&] { return mb; }, 2s, 0).on(rt)([] { return this_lease().key().size(); });
  auto fut = f();
  EXPECT_EQ(get_bounded(fut), mb.size());
  std::string too_big = mb + "x";
  auto g = locked([&] { return too_big; }, 2s, 0).on(rt)([] { return 0; });
  auto fut2 = g();
  EXPECT_TRUE(error_of<InvalidArgument>(fut2));
}

TEST_F(FaultsTest, TtlTooShortForTheTickIsInvalid) {
  Runtime rt(options_for(*server_));
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

TEST_F(FaultsTest, WithoutARenewalWindowTheWeightAloneDecidesWhatIsTooShort) {
  Options o = options_for(*server_);
  // 50 ms is accepted by default (renewed at 25 ms); renewing at exactly
  // 9/10 would leave 3 ms.
  Runtime with_window(o);
  auto f = locked("fifty", 50ms, 1).on(with_window)([] { return 1; });
  auto fut = f();
  EXPECT_EQ(get_bounded(fut), 1);
  o.min_renewal_window = 0ms;
  Runtime exact(o);
  auto g = locked("fifty", 50ms, 1).on(exact)([] { return 1; });
  auto fut2 = g();
  EXPECT_TRUE(error_of<InvalidArgument>(fut2));
}

TEST_F(FaultsTest, TwoHundredMsTtlIsKeptAliveAcrossManyRenewals) {
  Runtime rt(options_for(*server_));
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

TEST_F(FaultsTest, UnreachableRedisFailsWithinTheConnectTimeout) {
  Options o;
  o.redis_url = "redis://127.0.0.1:" + std::to_string(free_loopback_port());
  o.connect_timeout = 500ms;
  Runtime rt(o);
  auto f = locked("k", 1s, 0).on(rt)([] { return 1; });
  auto t0 = std::chrono::steady_clock::now();
  auto fut = f();
  auto err = error_of<ConnectionError>(fut);
  ASSERT_TRUE(err);
  EXPECT_NE(err->endpoint().find("127.0.0.1:"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST_F(FaultsTest, WrongPasswordIsAnAuthError) {
  RedisServerOptions secured_opts;
  secured_opts.password = "right";
  RedisServer secured(secured_opts);
  Options o;
  o.redis_url = "redis://:wrong@127.0.0.1:" + std::to_string(secured.port());
  Runtime rt(o);
  auto f = locked("k", 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  EXPECT_TRUE(error_of<AuthError>(fut));

  Options ok;
  ok.redis_url = secured.url();
  Runtime good(ok);
  auto g = locked("k", 1s, 0).on(good)([] { return 1; });
  auto fut2 = g();
  EXPECT_EQ(get_bounded(fut2), 1);
}

TEST_F(FaultsTest, ARefusedSelectFailsClearlyInsteadOfUsingDbZero) {
  Options o = options_for(*server_);
  o.redis_url = server_->url() + "/99";  // the server has 16 databases
  o.connect_timeout = 500ms;
  Runtime rt(o);
  auto f = locked("select-refused", 1s, 0).on(rt)([] { return 1; });
  auto t0 = std::chrono::steady_clock::now();
  auto fut = f();
  auto err = error_of<ConnectionError>(fut);
  ASSERT_TRUE(err);
  EXPECT_NE(std::string(err->what()).find("SELECT 99 was refused"), std::string::npos) << err->what();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_FALSE(exists(*server_, "select-refused"));  // nothing went to db 0
}

TEST_F(FaultsTest, AKeyStartingWithACloseBraceIsRejected) {
  Runtime rt(options_for(*server_));
  // Its hash tag would be empty: the lock and its fencing counter would
  // hash to different Cluster slots.
  auto f = locked([] { return std::string("}x"); }, 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  EXPECT_TRUE(error_of<InvalidArgument>(fut));
  auto g = locked([] { return std::string("x}"); }, 1s, 0).on(rt)([] { return this_lease().key(); });
  auto fut2 = g();
  EXPECT_EQ(get_bounded(fut2), "x}");
}

TEST_F(FaultsTest, APrefixWithABraceIsRejected) {
  for (std::string prefix : {"app{1}:", "app{", "app}"}) {
    Options o = options_for(*server_);
    o.key_prefix = prefix;
    EXPECT_THROW(Runtime rt(o), InvalidArgument) << prefix;
  }
}

TEST_F(FaultsTest, AKeyOfTheWrongTypeIsARedisError) {
  Runtime rt(options_for(*server_));
  server_->command({"HSET", lock_key("wrongtype"), "f", "v"});
  auto f = locked("wrongtype", 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  EXPECT_TRUE(error_of<RedisError>(fut));
  server_->command({"SET", lock_key("badfence") + ":fence", "not-a-number"});
  auto g = locked("badfence", 1s, 0).on(rt)([] { return 1; });
  auto fut2 = g();
  EXPECT_TRUE(error_of<RedisError>(fut2));
  EXPECT_FALSE(exists(*server_, "badfence"));  // the failed script wrote nothing
}

TEST_F(FaultsTest, OutOfMemoryIsARedisError) {
  Runtime rt(options_for(*server_));
  server_->command({"CONFIG", "SET", "maxmemory", "1"});
  auto f = locked("oom", 1s, 0).on(rt)([] { return 1; });
  auto fut = f();
  auto err = error_of<RedisError>(fut);
  server_->command({"CONFIG", "SET", "maxmemory", "0"});
  ASSERT_TRUE(err);
  EXPECT_NE(err->redis_message().find("OOM"), std::string::npos) << err->redis_message();
}

TEST_F(FaultsTest, AHolderKilledBlocksOthersOnlyUntilItsTtlEnds) {
  const char* holder = std::getenv("LOCKWATCH_LOCK_HOLDER");
  ASSERT_NE(holder, nullptr);
  ChildProcess child({holder, server_->url(), "killed-holder", "1000"});
  auto line = child.read_line(kBound);
  ASSERT_TRUE(line.has_value());
  ASSERT_EQ(line->rfind("held ", 0), 0u) << *line;
  child.kill(SIGKILL);
  auto killed_at = std::chrono::steady_clock::now();
  Runtime rt(options_for(*server_));
  auto f = locked("killed-holder", 1s, 0).on(rt).wait(10s)([] { return this_lease().fencing_token(); });
  auto fut = f();
  auto token = get_bounded(fut);
  auto blocked = std::chrono::steady_clock::now() - killed_at;
  EXPECT_GT(token, std::stoull(line->substr(5)));
  EXPECT_LT(blocked, 1500ms);  // at most the holder's ttl (1 s), plus slack
}

TEST_F(FaultsTest, SeveralProcessesCountExactly) {
  const char* counter = std::getenv("LOCKWATCH_COUNTER");
  ASSERT_NE(counter, nullptr);
  std::vector<std::unique_ptr<ChildProcess>> procs;
  for (int i = 0; i < 3; ++i) {
    procs.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
        counter, "--redis", server_->url(), "--key", "multiproc", "--increments", "40", "--threads", "2"}));
  }
  for (auto& p : procs) EXPECT_EQ(p->wait(60s), 0);
  EXPECT_EQ(server_->command({"GET", "counter:multiproc"}).str, "120");
}

TEST_F(FaultsTest, RedisRestartedMidLeaseWithoutPersistenceReportsTheLoss) {
  RedisServer volatile_server;
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

TEST_F(FaultsTest, RedisRestartedMidLeaseWithPersistenceKeepsTheLease) {
  RedisServerOptions durable_opts;
  durable_opts.appendonly = true;
  RedisServer durable(durable_opts);
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

TEST_F(FaultsTest, AHungRedisCannotHangACall) {
  RedisServer hung;
  Options o = options_for(hung);
  o.command_timeout = 500ms;
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

}  // namespace
}  // namespace lockwatch::testing
