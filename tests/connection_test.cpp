// One Redis connection's handshake against real servers: ROLE for masters
// learned from sentinels, and answers after close().
#include <gtest/gtest.h>

#include <future>

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

}  // namespace
}  // namespace lockwatch::testing
