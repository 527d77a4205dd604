// One Redis connection against real servers: the handshake (ROLE for
// masters learned from sentinels), answers after close(), and pub/sub pushes
// including sharded ones.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "core/loop.hpp"
#include "runtime/store_errors.hpp"
#include "store/redis/connection.hpp"
#include "store/redis/redis_error.hpp"
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
  // Runs one command on `conn` (on the loop) and waits for its answer; a
  // failure as the public error it maps to.
  std::pair<std::string, std::exception_ptr> run(RedisConnection& conn, std::vector<std::string> argv) {
    std::promise<std::pair<std::string, std::exception_ptr>> p;
    auto f = p.get_future();
    loop_.post([&] {
      conn.command(std::move(argv), [&p](const redisReply* r, const detail::StoreError* e) {
        p.set_value({r && r->str ? std::string(r->str, r->len) : std::string(), e ? detail::to_exception(*e) : nullptr});
      });
    });
    EXPECT_EQ(f.wait_for(kBound), std::future_status::ready);
    return f.get();
  }
  // A command connection to `server`, started with the given command
  // timeout, known to answer, and named (see still_the_first).
  std::unique_ptr<RedisConnection> started(const RedisServer& server, std::chrono::milliseconds command_timeout) {
    options_.connection.command_timeout = command_timeout;
    auto conn =
        std::make_unique<RedisConnection>(loop_, endpoint_of(server), settings(), RedisConnection::Mode::kCommands);
    loop_.post([c = conn.get()] { c->start(); });
    auto [ok, err] = run(*conn, {"CLIENT", "SETNAME", "first"});
    EXPECT_FALSE(err);
    EXPECT_EQ(ok, "OK");
    return conn;
  }
  // Whether a connection from started() was never reset: a new one would
  // have no name.
  bool still_the_first(RedisConnection& conn) {
    auto [name, err] = run(conn, {"CLIENT", "GETNAME"});
    return !err && name == "first";
  }
  void close_all(std::vector<RedisConnection*> conns) {
    loop_.shutdown([conns] {
      for (auto* c : conns) c->close();
    });
  }

  // What a connection reads of options_.
  detail::StoreSettings settings() const { return detail::StoreSettings::of(options_); }
  // A command connection to `server` with its direct lane, not started.
  std::unique_ptr<RedisConnection> laned(const RedisServer& server) {
    auto conn =
        std::make_unique<RedisConnection>(loop_, endpoint_of(server), settings(), RedisConnection::Mode::kCommands);
    conn->enable_lane();
    return conn;
  }

  Options options_;
  detail::Loop loop_;
};

TEST_F(ConnectionTest, ANodeThatIsNoMasterIsRefusedWhenAMasterIsRequired) {
  RedisServer master;
  RedisServerOptions ro;
  ro.extra_args = {"--replicaof", "127.0.0.1", std::to_string(master.port())};
  RedisServer replica(ro);
  RedisConnection to_replica(loop_, endpoint_of(replica), settings(), RedisConnection::Mode::kCommands);
  RedisConnection to_master(loop_, endpoint_of(master), settings(), RedisConnection::Mode::kCommands);
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
  RedisConnection conn(loop_, endpoint_of(server), settings(), RedisConnection::Mode::kCommands);
  std::promise<std::pair<bool, bool>> p;  // (answered inside the call, an error)
  auto f = p.get_future();
  bool inside = false;  // loop thread
  loop_.post([&] {
    conn.start();
    conn.close();
    inside = true;
    conn.command({"PING"}, [&](const redisReply*, const detail::StoreError* e) { p.set_value({inside, e != nullptr}); });
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
  RedisConnection conn(loop_, ep, settings(), RedisConnection::Mode::kCommands);
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
  RedisConnection conn(loop_, endpoint_of(server), settings(), RedisConnection::Mode::kPubSub, std::move(hooks));
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

// Sharded mode against a real server: SSUBSCRIBE is confirmed and reported,
// SPUBLISH arrives as smessage, our own SUNSUBSCRIBE's answer is no drop,
// and a reconnect subscribes again what is still wanted.
TEST_F(ConnectionTest, ShardedModeSubscribesConfirmsAndResubscribesAfterAReconnect) {
  RedisServer server;
  Pushes pushes;
  std::vector<std::string> dropped;  // loop thread
  RedisConnection::Hooks hooks;
  hooks.on_message = [&](std::string_view kind, std::string_view channel, std::string_view payload) {
    pushes.add(kind, channel, payload);
  };
  hooks.on_dropped = [&](std::string_view channel, const detail::StoreError*) { dropped.emplace_back(channel); };
  RedisConnection conn(loop_, endpoint_of(server), settings(), RedisConnection::Mode::kShardedPubSub, std::move(hooks));
  loop_.post([&] {
    conn.start();
    conn.subscribe("kept");
    conn.subscribe("left");
  });
  ASSERT_TRUE(pushes.wait_for("ssubscribe kept "));
  ASSERT_TRUE(pushes.wait_for("ssubscribe left "));
  loop_.post([&] { conn.unsubscribe("left"); });
  ASSERT_TRUE(pushes.wait_for("sunsubscribe left "));
  EXPECT_EQ(server.command({"SPUBLISH", "kept", "one"}).integer, 1);
  EXPECT_EQ(server.command({"SPUBLISH", "left", "none"}).integer, 0);
  EXPECT_TRUE(pushes.wait_for("smessage kept one"));
  // The server drops every client: the reconnect subscribes "kept" again.
  server.command({"CLIENT", "KILL", "TYPE", "pubsub"});
  auto until = std::chrono::steady_clock::now() + kBound;
  while (server.command({"PUBSUB", "SHARDNUMSUB", "kept"}).elements.at(1).integer != 1 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);  // the server's count is the only sign of the resubscription
  EXPECT_EQ(server.command({"SPUBLISH", "kept", "two"}).integer, 1);
  EXPECT_TRUE(pushes.wait_for("smessage kept two"));
  EXPECT_EQ(server.command({"PUBSUB", "SHARDNUMSUB", "left"}).elements.at(1).integer, 0);
  close_all({&conn});
  EXPECT_TRUE(dropped.empty());
}

// One loopback listener that plays a Redis node from a script: it waits
// until a connection has sent `expect` (bounded), answers `reply` and keeps
// reading until the client goes; one step per connection accepted.
class ScriptedNode {
 public:
  explicit ScriptedNode(std::vector<std::pair<std::string, std::string>> steps) : listener_(4) {
    thread_ = std::thread([this, steps = std::move(steps)] { serve(steps); });
  }
  ~ScriptedNode() {
    stop_ = true;
    thread_.join();
  }
  int port() const { return listener_.port(); }
  // What the i-th connection had sent when it reached its step's `expect`.
  std::string received(std::size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return i < received_.size() ? received_[i] : std::string();
  }
  // Waits (bounded) until `connections` connections reached their `expect`.
  bool reached(std::size_t connections) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kBound, [&] { return reached_ >= connections; });
  }

 private:
  // Waits (bounded, polled so that the destructor can stop it) for `fd`.
  bool readable(int fd, std::chrono::steady_clock::time_point until) {
    while (!stop_ && std::chrono::steady_clock::now() < until) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) return true;
    }
    return false;
  }
  void serve(const std::vector<std::pair<std::string, std::string>>& steps) {
    for (const auto& [expect, reply] : steps) {
      auto until = std::chrono::steady_clock::now() + kBound;
      if (!readable(listener_.fd(), until)) return;
      int c = ::accept(listener_.fd(), nullptr, nullptr);
      if (c < 0) return;
      std::string got;
      char buf[4096];
      while (got.find(expect) == std::string::npos && readable(c, until)) {
        ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        got.append(buf, static_cast<std::size_t>(n));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        received_.push_back(got);
        reached_++;
        cv_.notify_all();
      }
      (void)!::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
      // Until the client closes (or the test ends).
      while (readable(c, std::chrono::steady_clock::now() + kBound)) {
        if (::recv(c, buf, sizeof buf, 0) <= 0) break;
      }
      ::close(c);
    }
  }

  LoopbackListener listener_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> received_;
  std::size_t reached_ = 0;
};

std::string bulk(std::string_view s) { return "$" + std::to_string(s.size()) + "\r\n" + std::string(s) + "\r\n"; }
std::string push(std::initializer_list<std::string_view> parts) {
  std::string out = "*" + std::to_string(parts.size()) + "\r\n";
  for (auto p : parts) out += bulk(p);
  return out;
}

// The reader meets pushes of every kind, well-formed and not, in one
// stream: each well-formed one is reported (or, sharded bookkeeping, taken
// as the answer it is), the malformed ones are skipped, the connection
// stays up. A MOVED answering an SSUBSCRIBE and an unsolicited sunsubscribe
// drop exactly their channels, which the reconnect then leaves out. A
// RESP3 push (which hiredis 0.14 cannot read) resets the connection
// instead of aborting the process.
TEST_F(ConnectionTest, PushFramesOfEveryKindNeitherAbortNorConfuseTheReader) {
  const std::string binary("a\r\nb\0c", 6);
  std::string frames;
  frames += "*3\r\n" + bulk("ssubscribe") + bulk("lockwatch:{a}:rel") + ":1\r\n";
  frames += "-MOVED 1234 127.0.0.1:7001\r\n";  // answers the SSUBSCRIBE of {b}
  frames += "*3\r\n" + bulk("ssubscribe") + bulk("lockwatch:{c}:rel") + ":2\r\n";
  frames += push({"smessage", "lockwatch:{a}:rel", "1"});
  frames += push({"smessage", "lockwatch:{a}:rel", binary});
  frames += push({"smessage", "lockwatch:{a}:rel"});                        // no payload
  frames += "*3\r\n" + bulk("smessage") + ":5\r\n" + bulk("x");           // no channel name
  frames += "*3\r\n" + bulk("smessage") + bulk("arr") + "*1\r\n" + bulk("q");  // payload not a string
  frames += push({"message", "plain", "m"});
  frames += push({"pmessage", "p*", "pq", "pay"});
  frames += "*3\r\n" + bulk("subscribe") + bulk("s1") + ":1\r\n";
  frames += "*3\r\n" + bulk("psubscribe") + bulk("p*") + ":2\r\n";
  frames += "*3\r\n" + bulk("unsubscribe") + bulk("s1") + ":1\r\n";
  frames += "*3\r\n" + bulk("punsubscribe") + bulk("p*") + ":0\r\n";
  frames += "*0\r\n";                                                       // an empty array
  frames += "*3\r\n" + bulk("sunsubscribe") + bulk("lockwatch:{c}:rel") + ":1\r\n";  // unsolicited
  frames += "*3\r\n" + bulk("sunsubscribe") + bulk("never") + ":0\r\n";   // of nothing we wanted
  frames += push({"smessage", "lockwatch:{a}:rel", "end"});
  frames += ">3\r\n" + bulk("smessage") + bulk("lockwatch:{a}:rel") + bulk("resp3");

  ScriptedNode node({{"lockwatch:{c}:rel", frames}, {"lockwatch:{a}:rel\r\n", ""}});
  Pushes pushes;
  std::vector<std::string> dropped;  // loop thread until close_all
  std::promise<void> down;
  bool down_seen = false;  // loop thread
  RedisConnection::Hooks hooks;
  hooks.on_message = [&](std::string_view kind, std::string_view channel, std::string_view payload) {
    pushes.add(kind, channel, payload);
  };
  hooks.on_dropped = [&](std::string_view channel, const detail::StoreError* why) {
    // A refusal arrives parsed (a MOVED with its slot and target); null: the
    // node unsubscribed the channel on its own.
    dropped.push_back(std::string(channel) + " " +
                      (why == nullptr ? std::string("unsolicited")
                       : why->redirect() ? fmt::format("redirect {} {}:{}", detail::cluster_redirect(*why)->slot,
                                                       detail::cluster_redirect(*why)->host,
                                                       detail::cluster_redirect(*why)->port)
                                         : why->message));
  };
  hooks.on_down = [&] {
    if (!down_seen) down.set_value();
    down_seen = true;
  };
  Endpoint ep;
  ep.port = node.port();
  options_.connection.reconnect_min = 20ms;
  hooks.named = false;  // the script answers the subscriptions only
  RedisConnection conn(loop_, ep, settings(), RedisConnection::Mode::kShardedPubSub, std::move(hooks));
  loop_.post([&] {
    conn.start();
    conn.subscribe("lockwatch:{a}:rel");
    conn.subscribe("lockwatch:{b}:rel");
    conn.subscribe("lockwatch:{c}:rel");
  });
  EXPECT_TRUE(pushes.wait_for("smessage lockwatch:{a}:rel end"));
  for (const std::string& line : std::vector<std::string>{"ssubscribe lockwatch:{a}:rel ", "ssubscribe lockwatch:{c}:rel ", "smessage lockwatch:{a}:rel 1",
        "smessage lockwatch:{a}:rel " + binary, "smessage lockwatch:{a}:rel ", "smessage arr ",
        "message plain m", "pmessage pq pay", "subscribe s1 ", "psubscribe p* ", "unsubscribe s1 ",
        "punsubscribe p* ", "sunsubscribe never "})
    EXPECT_TRUE(pushes.wait_for(line)) << line;
  // The RESP3 frame after "end" is a protocol error: the link is reset.
  ASSERT_EQ(down.get_future().wait_for(kBound), std::future_status::ready);
  // The reconnect subscribes again only what was not dropped.
  ASSERT_TRUE(node.reached(2));
  close_all({&conn});
  const std::string again = node.received(1);
  EXPECT_NE(again.find("SSUBSCRIBE\r\n$17\r\nlockwatch:{a}:rel"), std::string::npos) << again;
  EXPECT_EQ(again.find("{b}"), std::string::npos) << again;
  EXPECT_EQ(again.find("{c}"), std::string::npos) << again;
  EXPECT_EQ(dropped, (std::vector<std::string>{"lockwatch:{b}:rel redirect 1234 127.0.0.1:7001",
                                               "lockwatch:{c}:rel unsolicited"}));
}

// A reply answers the oldest request written, never one not yet sent: a
// server answering twice, read with a request its first answer's callback
// made, resets the connection (out of step) and fails that request instead
// of handing it the stray answer.
TEST_F(ConnectionTest, AStrayReplyIsNeverTakenAsTheAnswerToARequestNotYetWritten) {
  ScriptedNode node({{std::string("PING"), std::string("+PONG\r\n:42\r\n")}});
  Endpoint ep;
  ep.port = node.port();
  RedisConnection::Hooks unnamed;
  unnamed.named = false;  // the script answers PING only
  RedisConnection conn(loop_, ep, settings(), RedisConnection::Mode::kCommands, unnamed);
  std::promise<std::string> next;  // what the request made on the first answer got
  loop_.post([&] {
    conn.start();
    conn.command({"PING"}, [&](const redisReply*, const detail::StoreError*) {
      conn.command({"GET", "k"}, [&](const redisReply* r, const detail::StoreError* e) {
        next.set_value(e ? "error: " + e->message : "reply of type " + std::to_string(r ? r->type : -1));
      });
    });
  });
  auto f = next.get_future();
  ASSERT_EQ(f.wait_for(kBound), std::future_status::ready);
  const std::string got = f.get();
  EXPECT_NE(got.find("out of step"), std::string::npos) << got;
  close_all({&conn});
}

// A host name is looked up off the loop thread, and connected to.
TEST_F(ConnectionTest, AHostNameIsResolvedAndConnected) {
  RedisServer server;
  Endpoint ep = endpoint_of(server);
  ep.host = "localhost";
  RedisConnection conn(loop_, ep, settings(), RedisConnection::Mode::kCommands);
  loop_.post([&] { conn.start(); });
  auto [pong, err] = run(conn, {"PING"});
  EXPECT_FALSE(err);
  EXPECT_EQ(pong, "PONG");
  close_all({&conn});
}

// A name with no address fails its requests within the connect timeout,
// with an error that names the host.
TEST_F(ConnectionTest, AHostNameWithNoAddressFailsItsRequestsNamingIt) {
  Endpoint ep;
  ep.host = "no-such-host.invalid";
  options_.connection.connect_timeout = 1s;
  RedisConnection conn(loop_, ep, settings(), RedisConnection::Mode::kCommands);
  loop_.post([&] { conn.start(); });
  auto t0 = std::chrono::steady_clock::now();
  auto [pong, err] = run(conn, {"PING"});
  ASSERT_TRUE(err);
  auto e = thrown<ConnectionError>([&] { std::rethrow_exception(err); });
  ASSERT_TRUE(e);
  EXPECT_NE(std::string(e->what()).find("cannot resolve no-such-host.invalid"), std::string::npos) << e->what();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  close_all({&conn});
}

// Commands written in one loop iteration share one write, and every one is
// answered, in order, exactly once.
TEST_F(ConnectionTest, RequestsQueuedTogetherAreAllAnsweredInOrder) {
  RedisServer server;
  RedisConnection conn(loop_, endpoint_of(server), settings(), RedisConnection::Mode::kCommands);
  constexpr int kRequests = 2000;
  std::promise<std::vector<long long>> p;
  auto f = p.get_future();
  std::vector<long long> got;  // loop thread
  loop_.post([&] {
    conn.start();
    for (int i = 0; i < kRequests; ++i) {
      conn.command({"INCR", "n"}, [&](const redisReply* r, const detail::StoreError* e) {
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

// Script calls large enough to be written from their own buffer go out
// in their place among small requests, whole, also through writes the
// socket takes only in part (the server is paused while they are sent);
// and after the server forgot the script (NOSCRIPT), each is sent again as
// EVAL with the same arguments.
TEST_F(ConnectionTest, LargeScriptCallsKeepTheirPlaceAndTheirArgumentsThroughANoscript) {
  RedisServer server;
  options_.connection.command_timeout = 10s;
  auto owned = started(server, 10s);
  auto& conn = *owned;
  constexpr std::string_view kCheck =
      "if #ARGV[1] ~= tonumber(ARGV[2]) then return -1 end return redis.call('incr', KEYS[1])";
  auto [sha, err] = run(conn, {"SCRIPT", "LOAD", std::string(kCheck)});
  ASSERT_FALSE(err);
  const detail::Script check{kCheck, sha, "check", "INCR"};
  for (bool forgotten : {false, true}) {
    if (forgotten) {
      ASSERT_FALSE(run(conn, {"SCRIPT", "FLUSH"}).second);
    }
    constexpr int kPairs = 16;
    std::promise<std::vector<long long>> p;
    auto f = p.get_future();
    std::vector<long long> got;  // loop thread
    auto add = [&](const redisReply* r, const detail::StoreError* e) {
      if (e != nullptr) ADD_FAILURE() << e->message;
      got.push_back(e != nullptr || r == nullptr || r->type != REDIS_REPLY_INTEGER ? -2 : r->integer);
      if (got.size() == 2 * kPairs) p.set_value(got);
    };
    std::promise<void> sent;
    server.pause();
    loop_.post([&] {
      for (int i = 0; i < kPairs; ++i) {
        conn.command({"INCR", "n"}, add);
        const std::string big(std::size_t{100'000} + 250'000 * static_cast<std::size_t>(i), 'x');
        detail::EvalRequest request(check, 1, 3, big.size());
        request.arg("n").arg(big).arg(std::to_string(big.size()));
        conn.eval(std::move(request), add);
      }
      sent.set_value();
    });
    const bool all_sent = sent.get_future().wait_for(kBound) == std::future_status::ready;
    server.resume();
    ASSERT_TRUE(all_sent);
    ASSERT_EQ(f.wait_for(kBound), std::future_status::ready);
    const auto values = f.get();
    const long long first = forgotten ? 2 * kPairs + 1 : 1;
    for (int i = 0; i < 2 * kPairs; ++i) {
      ASSERT_EQ(values[i], first + i) << "reply " << i << (forgotten ? " (after SCRIPT FLUSH)" : "");
    }
  }
  EXPECT_TRUE(still_the_first(conn));
  close_all({&conn});
}

// A server that stops answering resets the connection after the command
// timeout: the request fails, and the next one, after the server is back,
// succeeds on a new connection.
TEST_F(ConnectionTest, AHungServerFailsTheRequestWithinTheCommandTimeout) {
  RedisServer server;
  auto owned = started(server, 300ms);
  auto& conn = *owned;
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
  EXPECT_FALSE(still_the_first(conn)) << "the hung connection was kept";
  close_all({&conn});
}

// The command timeout is the server's delay, not the client's: the loop's
// thread kept busy past it (as by heavy work on the loop) neither fails a
// request made just before (written only after the busy spell) nor one
// whose reply came during it (unread when the timers run, which is before
// the loop reads). Both are answered, on the same connection.
TEST_F(ConnectionTest, ALoopKeptBusyPastTheCommandTimeoutIsNoServerTimeout) {
  RedisServer server;
  auto owned = started(server, 200ms);
  auto& conn = *owned;
  auto busy = [] {
    const auto until = std::chrono::steady_clock::now() + 500ms;
    while (std::chrono::steady_clock::now() < until) {
    }
  };
  std::promise<std::exception_ptr> made_before, written_before;
  auto answer_to = [](std::promise<std::exception_ptr>& p) {
    return [&p](const redisReply* r, const detail::StoreError* e) {
      p.set_value(e ? detail::to_exception(*e)
                    : (r && r->type == REDIS_REPLY_STATUS ? nullptr
                                                          : std::make_exception_ptr(std::runtime_error("no PONG"))));
    };
  };
  auto text = [](std::exception_ptr e) -> std::string {
    if (!e) return "";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    }
  };
  auto made = made_before.get_future();
  loop_.post([&] {
    conn.command({"PING"}, answer_to(made_before));
    busy();  // before the loop's flush writes it
  });
  ASSERT_EQ(made.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(text(made.get()), "") << "a request made before the busy spell";
  auto written = written_before.get_future();
  loop_.post([&] {
    conn.command({"PING"}, answer_to(written_before));
    // A task posted from the loop runs in a later iteration, after the
    // flush that writes the PING: its reply comes while the loop is busy.
    loop_.post(busy);
  });
  ASSERT_EQ(written.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(text(written.get()), "") << "a request written before the busy spell";
  EXPECT_TRUE(still_the_first(conn)) << "the connection was reset";
  close_all({&conn});
}

// A server answering steadily is no hung server, however long the queue
// of requests behind its answers: six requests written at once, each
// taking the server 100 ms, are all answered on the same connection with a
// 400 ms command timeout, although the last waits about 600 ms. (Redis
// sends the replies to what one read of a client brought in together, and
// reads at most 16 KiB at a time: requests of 20 kB are answered one by one.)
TEST_F(ConnectionTest, AServerAnsweringSteadilyIsNoTimeoutHoweverLongTheQueue) {
  RedisServer server;
  auto owned = started(server, 400ms);
  auto& conn = *owned;
  // Busy for 100 ms by the server's clock.
  const std::string busy =
      "local t = redis.call('TIME') local stop = t[1] * 1000000 + t[2] + 100000 "
      "repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop return 1";
  constexpr int kRequests = 6;
  std::promise<std::vector<std::string>> p;
  auto f = p.get_future();
  std::vector<std::string> errors;  // loop thread
  int answered = 0;                 // loop thread
  const auto t0 = std::chrono::steady_clock::now();
  loop_.post([&] {
    for (int i = 0; i < kRequests; ++i) {
      conn.command({"EVAL", busy, "0", std::string(20'000, 'x')}, [&](const redisReply*, const detail::StoreError* e) {
        if (e) errors.push_back(e->message);
        if (++answered == kRequests) p.set_value(errors);
      });
    }
  });
  ASSERT_EQ(f.wait_for(kBound), std::future_status::ready);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(f.get(), std::vector<std::string>{});
  EXPECT_GT(took, 400ms) << "the queue must outlast the command timeout to test anything";
  EXPECT_TRUE(still_the_first(conn)) << "the connection was reset";
  close_all({&conn});
}

// A reply trickling in a byte at a time, never whole, is no answer: the
// request fails within about the command timeout, not when the trickle ends.
TEST_F(ConnectionTest, AReplyThatTricklesInAndNeverEndsIsNoAnswer) {
  LoopbackListener listener(1);
  std::atomic<bool> done{false};
  // Accepts one connection and sends the start of a long bulk string, then
  // one byte every 20 ms, for at most kBound.
  std::thread server([&] {
    pollfd p{listener.fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kBound).count())) <= 0) return;
    int c = ::accept(listener.fd(), nullptr, nullptr);
    if (c < 0) return;
    (void)!::send(c, "$100000\r\n", 9, MSG_NOSIGNAL);
    const auto until = std::chrono::steady_clock::now() + kBound;
    while (!done && std::chrono::steady_clock::now() < until && ::send(c, "x", 1, MSG_NOSIGNAL) == 1)
      std::this_thread::sleep_for(20ms);  // the trickle's pace, not a wait for an event
    ::close(c);
  });
  Endpoint ep;
  ep.port = listener.port();
  options_.connection.command_timeout = 300ms;
  RedisConnection conn(loop_, ep, settings(), RedisConnection::Mode::kCommands);
  loop_.post([&] { conn.start(); });
  const auto t0 = std::chrono::steady_clock::now();
  auto [nothing, err] = run(conn, {"GET", "k"});
  const auto waited = std::chrono::steady_clock::now() - t0;
  done = true;
  server.join();
  ASSERT_TRUE(err);
  EXPECT_THROW(std::rethrow_exception(err), ConnectionError);
  EXPECT_LT(waited, 2s) << "failed only when the trickle ended";
  close_all({&conn});
}

// The direct lane: a thread other than the loop's writes script calls on
// the socket itself (while the connection is idle; else they go the
// loop's way), while the loop sends its own requests on the same
// connection. Each source counts its own key, so a reply matched to the
// wrong request shows as a number out of its sequence; every callback runs
// on the loop thread, exactly once.
TEST_F(ConnectionTest, RequestsWrittenByAnotherThreadAreAnsweredOnTheLoopInTheirPlace) {
  RedisServer server;
  options_.connection.command_timeout = 5s;
  auto owned = laned(server);
  auto& conn = *owned;
  loop_.post([&] { conn.start(); });
  constexpr std::string_view kIncr = "return redis.call('incr', KEYS[1])";
  auto [sha, err] = run(conn, {"SCRIPT", "LOAD", std::string(kIncr)});
  ASSERT_FALSE(err);
  const detail::Script incr{kIncr, sha, "incr", "INCR"};
  std::thread::id loop_thread;
  {
    std::promise<std::thread::id> id;
    auto got = id.get_future();
    loop_.post([&] { id.set_value(std::this_thread::get_id()); });
    ASSERT_EQ(got.wait_for(kBound), std::future_status::ready);
    loop_thread = got.get();
  }
  constexpr int kEach = 2000;
  struct Answers {
    std::vector<long long> direct, loop;  // loop thread
    int off_loop = 0;                     // callbacks run elsewhere
    std::promise<void> all;
    void add(std::vector<long long>& to, const redisReply* r, std::thread::id loop_thread) {
      to.push_back(r != nullptr && r->type == REDIS_REPLY_INTEGER ? r->integer : -1);
      if (std::this_thread::get_id() != loop_thread) ++off_loop;
      if (direct.size() == kEach && loop.size() == kEach) all.set_value();
    }
  } answers;
  auto done = answers.all.get_future();
  // The loop's own requests, ten a turn, while this thread writes.
  std::function<void(int)> loop_burst = [&](int left) {
    for (int i = 0; i < 10; ++i)
      conn.command({"INCR", "l"}, [&](const redisReply* r, const detail::StoreError*) {
        answers.add(answers.loop, r, loop_thread);
      });
    if (left > 10) loop_.post([&, left] { loop_burst(left - 10); });
  };
  int direct = 0;
  for (int i = 0; i < kEach; ++i) {
    if (i == 1) loop_.post([&] { loop_burst(kEach); });  // the first went on an idle connection
    detail::EvalRequest request(incr, 1, 1);
    request.arg("d");
    detail::ReplyCallback cb = [&](const redisReply* r, const detail::StoreError*) {
      answers.add(answers.direct, r, loop_thread);
    };
    if (conn.send_direct(request, cb)) {
      ++direct;
      continue;
    }
    ASSERT_NE(i, 0) << "the lane refused a request on an idle connection";
    // Not now (the loop's bytes go first): the loop's way, in order.
    auto shared = std::make_shared<std::pair<detail::EvalRequest, detail::ReplyCallback>>(std::move(request),
                                                                                          std::move(cb));
    loop_.post([&conn, shared] { conn.eval(std::move(shared->first), std::move(shared->second)); });
  }
  ASSERT_EQ(done.wait_for(kBound), std::future_status::ready);
  EXPECT_GT(direct, 0) << "the lane never took a request";
  EXPECT_EQ(answers.off_loop, 0);
  for (int i = 0; i < kEach; ++i) {
    ASSERT_EQ(answers.loop[i], i + 1) << "the loop's reply " << i;
    ASSERT_EQ(answers.direct[i], i + 1) << "the direct reply " << i << " (" << direct << " written directly)";
  }
  close_all({&conn});
}

// The lane is closed until the connection is usable (and with it closed,
// nothing is taken: the request and its callback stay the caller's); a
// request written on it while the server hangs fails within the command
// timeout, even with the connection idle before (no request timer ran).
TEST_F(ConnectionTest, ADirectRequestToAHungServerFailsWithinTheCommandTimeout) {
  RedisServer server;
  options_.connection.command_timeout = 300ms;
  auto owned = laned(server);
  auto& conn = *owned;
  const detail::Script& ping = detail::script(detail::ScriptId::kAcquire);
  {
    detail::EvalRequest request(ping, 0, 0);
    detail::ReplyCallback cb = [](const redisReply*, const detail::StoreError*) {};
    EXPECT_FALSE(conn.send_direct(request, cb)) << "written before the connection started";
    ASSERT_TRUE(cb);
  }
  loop_.post([&] { conn.start(); });
  auto [pong, err] = run(conn, {"PING"});
  ASSERT_FALSE(err);
  auto [sha, load_err] = run(conn, {"SCRIPT", "LOAD", "return 1"});
  ASSERT_FALSE(load_err);
  const detail::Script one{"return 1", sha, "one", ""};
  server.pause();
  auto failed = std::make_shared<std::promise<bool>>();
  auto got = failed->get_future();
  detail::EvalRequest request(one, 0, 0);
  detail::ReplyCallback cb = [failed](const redisReply* r, const detail::StoreError* e) {
    failed->set_value(r == nullptr && e != nullptr && e->kind == detail::StoreError::Kind::kUnavailable);
  };
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(conn.send_direct(request, cb));
  ASSERT_EQ(got.wait_for(kBound), std::future_status::ready);
  const auto waited = std::chrono::steady_clock::now() - t0;
  server.resume();
  EXPECT_TRUE(got.get()) << "answered, or not as unavailable";
  EXPECT_LT(waited, 2s);
  auto [pong2, err2] = run(conn, {"PING"});
  EXPECT_FALSE(err2);
  EXPECT_EQ(pong2, "PONG");
  close_all({&conn});
}

}  // namespace
}  // namespace lockwatch::testing
