// A holder paused past its lease (SIGSTOP) learns the loss before it
// touches the protected resource again, and the resource refuses its stale
// token.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <set>
#include <thread>
#include <vector>

#include "../samples/fenced_store.hpp"
#include "lockwatch/lockwatch.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

TEST(FencingTest, APausedHolderLearnsItsLossAndItsStaleTokenIsRefused) {
  const char* writer = std::getenv("LOCKWATCH_FENCED_WRITER");
  ASSERT_NE(writer, nullptr);
  RedisServer server;
  ChildProcess a({writer, "--redis", server.url(), "--key", "ledger", "--ttl-ms", "1000", "--writes", "400",
                  "--interval-ms", "20"});
  auto held = a.read_line(kBound);
  ASSERT_TRUE(held && held->rfind("held ", 0) == 0) << held.value_or("<none>");
  std::uint64_t a_token = std::stoull(held->substr(5));
  auto first = a.read_line(kBound);
  ASSERT_TRUE(first && *first == "wrote " + std::to_string(a_token) + " ok") << first.value_or("<none>");

  a.kill(SIGSTOP);  // a long GC pause, as far as the lock knows
  // Another holder takes the lock once A's ttl ran out, and writes.
  Runtime rt(options_for(server));
  std::uint64_t b_token = 0;
  auto b = locked("ledger", 1s, forever).on(rt).wait(10s)([&] {
    b_token = this_lease().fencing_token();
    FencedStore store(server.host(), server.port());
    return store.write("ledger", "from B", b_token);
  });
  auto b_done = b();
  EXPECT_TRUE(get_bounded(b_done));
  EXPECT_GT(b_token, a_token);

  a.kill(SIGCONT);
  // A's next line: it learned the loss; it did not write.
  std::string line;
  for (int i = 0; i < 1000; ++i) {
    auto l = a.read_line(kBound);
    ASSERT_TRUE(l.has_value());
    line = *l;
    if (line.rfind("wrote ", 0) != 0) break;
    // Lines written before the pause may still be in the pipe; none may be
    // a write accepted after B's.
    ASSERT_EQ(server.command({"HGET", "fenced:ledger", "token"}).str, std::to_string(b_token));
  }
  EXPECT_EQ(line, "lost");
  EXPECT_EQ(a.wait(kBound), 3);  // the future said LeaseLost
  EXPECT_EQ(server.command({"HGET", "fenced:ledger", "value"}).str, "from B");
  // Had A written anyway, the store refuses its token.
  FencedStore store(server.host(), server.port());
  EXPECT_FALSE(store.write("ledger", "stale", a_token));
  EXPECT_EQ(server.command({"HGET", "fenced:ledger", "value"}).str, "from B");
}

// The store keeps one fencing counter per Redis Cluster slot, not one per
// name: 20,000 names of `sku:{0}` locked and released leave 11,090 keys
// (they use that many slots; 20,000 with a counter per name), never more
// than 16,384. Each name's tokens still rise across holders.
TEST(FencingTest, TwentyThousandNamesLeaveAtMostOneCounterPerSlot) {
  constexpr int kNames = 20000;
  constexpr int kInFlight = 2000;
  RedisServer server;
  Runtime rt(options_for(server));
  lock_names_twice(rt, kNames, kInFlight);
  if (::testing::Test::HasFatalFailure()) return;
  // Every call's release came before its future: only counters are left.
  const long long left = server.command({"DBSIZE"}).integer;
  EXPECT_LE(left, 16384);
  EXPECT_EQ(left, 11090);
  std::set<unsigned> slots;
  for (int i = 0; i < kNames; ++i) slots.insert(lock_slot("sku:" + std::to_string(i)));
  EXPECT_EQ(slots.size(), 11090u);
  for (const char* probe : {"sku:0", "sku:19999"})
    EXPECT_EQ(server.command({"EXISTS", fence_key(probe)}).integer, 1) << probe;
}

// A store written by a version with a counter per name (`lockwatch:{K}:fence`)
// keeps its tokens rising: inspect shows the old counter, the next holder's
// token is above it, and the old key is gone once folded into the slot's.
TEST(FencingTest, TokensKeepRisingAcrossTheUpgradeFromPerNameCounters) {
  RedisServer server;
  Runtime rt(options_for(server));
  server.command({"SET", lock_key("sku:7") + ":fence", "1000"});
  auto before = rt.inspect("sku:7");
  EXPECT_EQ(get_bounded(before).fencing_token, 1000u);

  auto token_of = locked("sku:{0}", 10s, 0).on(rt)([](int) { return this_lease().fencing_token(); });
  auto first = token_of(7);
  EXPECT_EQ(get_bounded(first), 1001u);
  EXPECT_EQ(server.command({"EXISTS", lock_key("sku:7") + ":fence"}).integer, 0);
  EXPECT_EQ(server.command({"GET", fence_key("sku:7")}).str, "1001");
  auto second = token_of(7);
  EXPECT_EQ(get_bounded(second), 1002u);
  auto after = rt.inspect("sku:7");
  EXPECT_EQ(get_bounded(after).fencing_token, 1002u);
}

}  // namespace
}  // namespace lockwatch::testing
