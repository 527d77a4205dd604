#include "support/redis_server.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

namespace lockwatch::testing {
namespace {

using namespace std::chrono_literals;

struct ContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// A connection that does not authenticate, with a short reply timeout, to
// look at the server the way an arbitrary client would.
ContextPtr raw_connect(const RedisServer& server, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ContextPtr c(redisConnectWithTimeout(server.host().c_str(), server.port(), tv));
  if (c && c->err == 0) redisSetTimeout(c.get(), tv);
  return c;
}

TEST(RedisServerTest, StartsAndAnswersCommands) {
  RedisServer server;
  EXPECT_TRUE(server.running());
  EXPECT_GT(server.pid(), 0);
  EXPECT_EQ(server.host(), "127.0.0.1");
  EXPECT_EQ(server.url(), "redis://127.0.0.1:" + std::to_string(server.port()));

  Reply set = server.command({"SET", "key", std::string("va\0ue", 5)});
  EXPECT_EQ(set.type, Reply::Type::kStatus);
  EXPECT_EQ(set.str, "OK");
  Reply get = server.command({"GET", "key"});
  EXPECT_EQ(get.type, Reply::Type::kString);
  EXPECT_EQ(get.str, std::string("va\0ue", 5));
  EXPECT_EQ(server.command({"GET", "missing"}).type, Reply::Type::kNil);
  EXPECT_EQ(server.command({"INCRBY", "n", "5"}).integer, 5);

  server.command({"RPUSH", "list", "a", "b"});
  Reply range = server.command({"LRANGE", "list", "0", "-1"});
  ASSERT_EQ(range.type, Reply::Type::kArray);
  ASSERT_EQ(range.elements.size(), 2u);
  EXPECT_EQ(range.elements[1].str, "b");

  Reply wrong = server.command({"INCR", "list"});
  EXPECT_EQ(wrong.type, Reply::Type::kError);
  EXPECT_EQ(wrong.str.rfind("WRONGTYPE", 0), 0u) << wrong.str;
}

TEST(RedisServerTest, PasswordServerRejectsUnauthenticatedCommands) {
  RedisServerOptions options;
  options.password = "s3cret";
  RedisServer server(options);
  EXPECT_EQ(server.url(), "redis://:s3cret@127.0.0.1:" + std::to_string(server.port()));

  ContextPtr anonymous = raw_connect(server, 2000ms);
  ASSERT_TRUE(anonymous && anonymous->err == 0);
  ReplyPtr refused(static_cast<redisReply*>(redisCommand(anonymous.get(), "GET key")));
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->type, REDIS_REPLY_ERROR);
  EXPECT_EQ(std::string(refused->str).rfind("NOAUTH", 0), 0u) << refused->str;

  EXPECT_EQ(server.command({"SET", "key", "v"}).str, "OK");
  EXPECT_EQ(server.command({"GET", "key"}).str, "v");
}

TEST(RedisServerTest, ExtraArgsReachTheServer) {
  RedisServerOptions options;
  options.extra_args = {"--maxmemory", "1mb"};
  RedisServer server(options);
  Reply config = server.command({"CONFIG", "GET", "maxmemory"});
  ASSERT_EQ(config.elements.size(), 2u);
  EXPECT_EQ(config.elements[1].str, "1048576");
}

TEST(RedisServerTest, KilledServerStartsAgainOnTheSamePort) {
  RedisServer server;
  const int port = server.port();
  server.kill();
  EXPECT_FALSE(server.running());
  EXPECT_EQ(server.pid(), -1);
  EXPECT_THROW(server.command({"PING"}), std::runtime_error);
  server.kill();  // idempotent

  server.start();
  EXPECT_TRUE(server.running());
  EXPECT_EQ(server.port(), port);
  EXPECT_EQ(server.command({"PING"}).str, "PONG");

  server.stop();
  EXPECT_FALSE(server.running());
  server.stop();  // idempotent
}

TEST(RedisServerTest, AppendonlyDataSurvivesAKill) {
  RedisServerOptions options;
  options.appendonly = true;
  RedisServer server(options);
  ASSERT_EQ(server.command({"SET", "durable", "yes"}).str, "OK");
  server.kill();
  server.start();
  EXPECT_EQ(server.command({"GET", "durable"}).str, "yes");
}

TEST(RedisServerTest, PausedServerAnswersNothingUntilResumed) {
  RedisServer server;
  server.pause();
  EXPECT_TRUE(server.running());
  {
    ContextPtr c = raw_connect(server, 200ms);
    // The kernel still accepts the connection; the reply never comes.
    ASSERT_TRUE(c);
    ASSERT_EQ(c->err, 0) << c->errstr;
    ReplyPtr reply(static_cast<redisReply*>(redisCommand(c.get(), "PING")));
    EXPECT_FALSE(reply);
  }
  server.resume();
  EXPECT_EQ(server.command({"PING"}).str, "PONG");
}

TEST(RedisServerTest, FreeLoopbackPortIsUsable) {
  int port = free_loopback_port();
  ASSERT_GT(port, 0);
  // It can be bound and listened on right away.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::listen(fd, 1), 0);
  ::close(fd);
}

TEST(ChildProcessTest, ReadsTheChildsOutputLineByLine) {
  ChildProcess echo({"/bin/echo", "hi"});
  EXPECT_GT(echo.pid(), 0);
  EXPECT_EQ(echo.read_line(5000ms), "hi");
  EXPECT_EQ(echo.read_line(5000ms), std::nullopt);  // output ended
  EXPECT_EQ(echo.wait(5000ms), 0);
  EXPECT_EQ(echo.wait(5000ms), 0);  // the status is kept
}

TEST(ChildProcessTest, ExtraEnvironmentReachesTheChild) {
  ChildProcess sh({"sh", "-c", "printf '%s\\n%s' \"$LOCKWATCH_A\" \"$LOCKWATCH_B\"; exit 3"},
                  {"LOCKWATCH_A=one", "LOCKWATCH_B=two"});
  EXPECT_EQ(sh.read_line(5000ms), "one");
  EXPECT_EQ(sh.read_line(5000ms), "two");  // a last line without '\n'
  EXPECT_EQ(sh.wait(5000ms), 3);
}

TEST(ChildProcessTest, KilledChildReportsTheSignal) {
  ChildProcess sleeper({"sleep", "30"});
  EXPECT_EQ(sleeper.read_line(50ms), std::nullopt);  // nothing printed yet
  sleeper.kill(SIGKILL);
  EXPECT_EQ(sleeper.wait(5000ms), 128 + SIGKILL);
}

TEST(ChildProcessTest, WaitTimeoutKillsTheChildAndThrows) {
  ChildProcess sleeper({"sleep", "30"});
  EXPECT_THROW(sleeper.wait(50ms), std::runtime_error);
  EXPECT_EQ(sleeper.wait(5000ms), 128 + SIGKILL);
}

TEST(ChildProcessTest, MissingProgramThrows) {
  EXPECT_THROW(ChildProcess({"/nonexistent/lockwatch-no-such-program"}), std::runtime_error);
}

}  // namespace
}  // namespace lockwatch::testing
