// One Redis connection against real servers: the handshake (ROLE for
// masters learned from sentinels), answers after close(), and pub/sub pushes
// including sharded ones.
#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>

#include "core/loop.hpp"
#include "store/redis/connection.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

using detail::RedisConnection;

class ConnectionTest : public ::testing::Test {
 protected:
  static Endpoint endpoint_of(const RedisServer& s) {
    Endpoint ep;
    ep.port = s.port();
    return ep;
  }
  // Runs one command on `conn` (on the loop) and waits for its answer.
  std::pair<std::string, std::exception_ptr> run(RedisConnection& conn, std::vector<std::string> argv) {
    std::promise<std::pair<std::string, std::exception_ptr>> p;
    auto f = p.get_future();
    loop_.post([&] {
      conn.command(std::move(argv), [&p](const redisReply* r, std::exception_ptr e) {
        p.set_value({r && r->str ? std::string(r->str, r->len) : std::string(), e});
      });
    });
    EXPECT_EQ(f.wait_for(kBound), std::future_status::ready);
    return f.get();
  }
  void close_all(std::vector<RedisConnection*> conns) {
    loop_.shutdown([conns] {
      for (auto* c : conns) c->close();
    });
  }

  Options options_;
  detail::Loop loop_;
};

TEST_F(ConnectionTest, ANodeThatIsNoMasterIsRefusedWhenAMasterIsRequired) {
  RedisServer master;
  RedisServerOptions ro;
  ro.extra_args = {"--replicaof", "127.0.0.1", std::to_string(master.port())};
  RedisServer replica(ro);
  RedisConnection to_replica(loop_, endpoint_of(replica), options_, RedisConnection::Mode::kCommands);
  RedisConnection to_master(loop_, endpoint_of(master), options_, RedisConnection::Mode::kCommands);
  to_replica.require_master();
  to_master.require_master();
  loop_.post([&] {
    to_replica.start();
    to_master.start();
  });
  auto [reply, err] = run(to_replica, {"PING"});
  ASSERT_TRUE(err);
  try {
    std::rethrow_exception(err);
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a master"), std::string::npos) << e.what();
    EXPECT_EQ(e.endpoint(), "127.0.0.1:" + std::to_string(replica.port()));
  }
  auto [pong, err2] = run(to_master, {"PING"});
  EXPECT_FALSE(err2);
  EXPECT_EQ(pong, "PONG");
  close_all({&to_replica, &to_master});
}

TEST_F(ConnectionTest, ACommandAfterCloseIsAnsweredOnceOutsideTheCall) {
  RedisServer server;
  RedisConnection conn(loop_, endpoint_of(server), options_, RedisConnection::Mode::kCommands);
  std::promise<std::pair<bool, bool>> p;  // (answered inside the call, an error)
  auto f = p.get_future();
  bool inside = false;  // loop thread
  loop_.post([&] {
    conn.start();
    conn.close();
    inside = true;
    conn.command({"PING"}, [&](const redisReply*, std::exception_ptr e) { p.set_value({inside, e != nullptr}); });
    inside = false;
  });
  ASSERT_EQ(f.wait_for(kBound), std::future_status::ready);
  auto [answered_inside, error] = f.get();
  EXPECT_FALSE(answered_inside);
  EXPECT_TRUE(error);
  EXPECT_EQ(loop_.shutdown([] {}), 0);
}

TEST_F(ConnectionTest, RequestsMadeBeforeTheHandshakeAnsweredRunAfterIt) {
  RedisServerOptions so;
  so.password = "pw";
  RedisServer server(so);
  Endpoint ep = endpoint_of(server);
  ep.password = "pw";
  ep.db = 3;
  RedisConnection conn(loop_, ep, options_, RedisConnection::Mode::kCommands);
  loop_.post([&] { conn.start(); });
  // Sent at once, queued behind AUTH and SELECT: it must land in db 3.
  auto [ok, err] = run(conn, {"SET", "where", "db3"});
  EXPECT_FALSE(err);
  EXPECT_EQ(server.command({"GET", "where"}).type, Reply::Type::kNil);  // not in db 0
  EXPECT_EQ(server.command({"EVAL", "redis.call('select', 3) return redis.call('get', 'where')", "0"}).str, "db3");
  close_all({&conn});
}

// What a pubsub connection's on_message saw, for a test thread to wait on.
class Pushes {
 public:
  void add(std::string_view kind, std::string_view channel, std::string_view payload) {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back(std::string(kind) + " " + std::string(channel) + " " + std::string(payload));
    cv_.notify_all();
  }
  // Waits (bounded) until `line` ("kind channel payload") was seen.
  bool wait_for(const std::string& line) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kBound, [&] { return std::find(seen_.begin(), seen_.end(), line) != seen_.end(); });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> seen_;
};

// hiredis's async API aborted the process on `smessage`, the push of sharded
// pub/sub (Redis 7): every push now reaches on_message, whatever its kind.
TEST_F(ConnectionTest, ShardedMessagesReachOnMessageWithoutAborting) {
  RedisServer server;
  Pushes pushes;
  RedisConnection::Hooks hooks;
  hooks.on_message = [&](std::string_view kind, std::string_view channel, std::string_view payload) {
    pushes.add(kind, channel, payload);
  };
  hooks.on_connect_command = {"SSUBSCRIBE", "orders"};
  RedisConnection conn(loop_, endpoint_of(server), options_, RedisConnection::Mode::kPubSub, std::move(hooks));
  loop_.post([&] {
    conn.start();
    conn.subscribe("plain");
  });
  ASSERT_TRUE(pushes.wait_for("ssubscribe orders "));
  ASSERT_TRUE(pushes.wait_for("subscribe plain "));
  EXPECT_EQ(server.command({"SPUBLISH", "orders", "sharded hello"}).integer, 1);
  EXPECT_TRUE(pushes.wait_for("smessage orders sharded hello"));
  // The connection goes on as before: plain messages still arrive.
  EXPECT_EQ(server.command({"PUBLISH", "plain", "after"}).integer, 1);
  EXPECT_TRUE(pushes.wait_for("message plain after"));
  close_all({&conn});
}

// A host name is looked up off the loop thread, and connected to.
TEST_F(ConnectionTest, AHostNameIsResolvedAndConnected) {
  RedisServer server;
  Endpoint ep = endpoint_of(server);
  ep.host = "localhost";
  RedisConnection conn(loop_, ep, options_, RedisConnection::Mode::kCommands);
  loop_.post([&] { conn.start(); });
  auto [pong, err] = run(conn, {"PING"});
  EXPECT_FALSE(err);
  EXPECT_EQ(pong, "PONG");
  close_all({&conn});
}

// Commands written in one loop iteration share one write, and every one is
// answered, in order, exactly once.
TEST_F(ConnectionTest, RequestsQueuedTogetherAreAllAnsweredInOrder) {
  RedisServer server;
  RedisConnection conn(loop_, endpoint_of(server), options_, RedisConnection::Mode::kCommands);
  constexpr int kRequests = 2000;
  std::promise<std::vector<long long>> p;
  auto f = p.get_future();
  std::vector<long long> got;  // loop thread
  loop_.post([&] {
    conn.start();
    for (int i = 0; i < kRequests; ++i) {
      conn.command({"INCR", "n"}, [&](const redisReply* r, std::exception_ptr e) {
        got.push_back(e || r == nullptr ? -1 : r->integer);
        if (got.size() == kRequests) p.set_value(got);
      });
    }
  });
  ASSERT_EQ(f.wait_for(kBound), std::future_status::ready);
  auto values = f.get();
  for (int i = 0; i < kRequests; ++i) ASSERT_EQ(values[i], i + 1) << "reply " << i;
  close_all({&conn});
}

// A server that stops answering resets the connection after the command
// timeout: the request fails, and the next one, after the server is back,
// succeeds on a new connection.
TEST_F(ConnectionTest, AHungServerFailsTheRequestWithinTheCommandTimeout) {
  RedisServer server;
  options_.command_timeout = 300ms;
  RedisConnection conn(loop_, endpoint_of(server), options_, RedisConnection::Mode::kCommands);
  loop_.post([&] { conn.start(); });
  auto [pong, err0] = run(conn, {"PING"});
  ASSERT_FALSE(err0);
  server.pause();
  auto t0 = std::chrono::steady_clock::now();
  auto [nothing, err] = run(conn, {"PING"});
  auto waited = std::chrono::steady_clock::now() - t0;
  server.resume();
  ASSERT_TRUE(err);
  EXPECT_THROW(std::rethrow_exception(err), ConnectionError);
  EXPECT_LT(waited, 5s);
  auto [pong2, err2] = run(conn, {"PING"});
  EXPECT_FALSE(err2);
  EXPECT_EQ(pong2, "PONG");
  close_all({&conn});
}

}  // namespace
}  // namespace lockwatch::testing
