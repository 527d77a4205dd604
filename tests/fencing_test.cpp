// A holder paused past its lease (SIGSTOP) learns the loss before it
// touches the protected resource again, and the resource refuses its stale
// token.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <thread>

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

}  // namespace
}  // namespace lockwatch::testing
