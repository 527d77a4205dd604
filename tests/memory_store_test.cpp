// memory:// as a user sees it: runtimes naming one space share its locks,
// other names are separate, a space goes with its last runtime, a runtime
// gone while its space held its requests hears nothing after, and the
// environment can point LOCKED's default runtime at a space. What every
// store does (exclusion, fencing, waiting, renewal, faults) is in
// store_contract_test and scheduler_stores_test, which run on memory://
// too.
#include <gtest/gtest.h>

#include <cstdlib>
#include <future>

#include "lockwatch/lockwatch.hpp"
#include "store/memory/memory_space.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

using detail::MemorySpace;

Options on(const std::string& url) {
  Options o;
  o.redis_url = url;
  o.runtime.threads = 2;
  return o;
}

LockHandle take(Runtime& rt, const std::string& key, std::chrono::milliseconds ttl = 5s) {
  auto f = rt.acquire(key, ttl);
  return get_bounded(f);
}

bool held(Runtime& rt, const std::string& key) {
  auto f = rt.inspect(key);
  return get_bounded(f).held;
}

TEST(MemoryStoreTest, RuntimesNamingOneSpaceExcludeEachOtherAndAnotherSpaceDoesNot) {
  Runtime a(on("memory://a")), also_a(on("memory://a")), b(on("memory://b"));
  auto h = take(a, "shared");
  const auto token = h.lease().fencing_token();
  auto refused = also_a.acquire({.key = "shared", .ttl = 5s, .retries = 0});
  EXPECT_TRUE(error_of<LockNotAcquired>(refused));
  EXPECT_TRUE(held(also_a, "shared"));
  // Another space: its own lock, and its own counter.
  EXPECT_FALSE(held(b, "shared"));
  auto other = take(b, "shared");
  EXPECT_EQ(token, 1u);
  EXPECT_EQ(other.lease().fencing_token(), 1u);
  give_back(other);
  // Released in `a`: the other runtime of the space takes it, with a
  // higher token.
  give_back(h);
  auto next = take(also_a, "shared");
  EXPECT_GT(next.lease().fencing_token(), token);
  give_back(next);
}

TEST(MemoryStoreTest, ASpaceIsFreedWhenItsLastRuntimeGoes) {
  ASSERT_EQ(MemorySpace::find("freed"), nullptr);
  std::uint64_t second = 0;
  {
    Runtime first(on("memory://freed"));
    {
      Runtime short_lived(on("memory://freed"));
      auto h = take(short_lived, "k");
      EXPECT_EQ(h.lease().fencing_token(), 1u);
      give_back(h);
    }
    // `first` still uses the space: its counters stay.
    EXPECT_NE(MemorySpace::find("freed"), nullptr);
    auto h = take(first, "k");
    second = h.lease().fencing_token();
    give_back(h);
  }
  EXPECT_EQ(second, 2u);
  EXPECT_EQ(MemorySpace::find("freed"), nullptr);
  // The next runtime to name it starts an empty space.
  Runtime again(on("memory://freed"));
  auto h = take(again, "k");
  EXPECT_EQ(h.lease().fencing_token(), 1u);
  give_back(h);
}

// Requests held by a paused space fail at the runtime's command timeout;
// once the runtime is gone, resuming the space runs none of them and
// posts it nothing (a post to a runtime that is gone is what ASan would
// catch here).
TEST(MemoryStoreTest, ARuntimeGoneWhileItsSpaceHeldItsRequestsHearsNothingAfter) {
  auto space = MemorySpace::open("held");
  Options o = on("memory://held");
  o.connection.command_timeout = 200ms;
  Runtime other(o);
  auto h = take(other, "busy");
  auto t0 = std::chrono::steady_clock::now();
  {
    Runtime rt(o);
    auto waiting = rt.acquire({.key = "busy", .ttl = 5s, .retries = forever, .wait = 10s});  // subscribed to "busy"'s releases
    space->pause();
    auto late = rt.acquire("late", 30s);
    EXPECT_TRUE(error_of<ConnectionError>(late));
  }  // the wait ends with the runtime; its give-back of "late" is held too
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  space->resume();
  // The runtime's held acquisition of "late" was dropped with it, not
  // run now for nobody: the name was never locked.
  auto late = other.inspect("late");
  auto state = get_bounded(late);
  EXPECT_FALSE(state.held);
  EXPECT_EQ(state.fencing_token, 0u);
  give_back(h);  // a release notice with nobody of `rt` left to tell
  EXPECT_FALSE(held(other, "busy"));
}

TEST(MemoryStoreTest, TheEnvironmentNamesTheDefaultSpaceForLockedWithoutARuntime) {
  ASSERT_EQ(::setenv("LOCKWATCH_REDIS_URL", "memory://", 1), 0);
  EXPECT_EQ(Options::from_env().redis_url, "memory://");
  Runtime explicit_rt;  // from the environment, as default_runtime()
  // Taken on another thread: this thread's own handle would make the
  // call below reentrant.
  auto h = std::async(std::launch::async, [&] { return take(explicit_rt, "report"); }).get();
  auto report = LOCKED("report", 1s, 0)[] { return 1; };
  auto busy = report();
  EXPECT_TRUE(error_of<LockNotAcquired>(busy)) << "both runtimes use the default space";
  give_back(h);
  auto runs = report();
  EXPECT_EQ(get_bounded(runs), 1);
  ::unsetenv("LOCKWATCH_REDIS_URL");
}

// A release says whether its notice reached a store other than the
// releasing one: the runtime's waiters sit out a hand-off streak's end only
// for others who heard it.
TEST(MemoryStoreTest, AReleaseSaysWhetherItsNoticeReachedAnotherStore) {
  auto space = MemorySpace::open("notice-listeners");
  detail::Loop loop;
  auto mine = std::make_shared<detail::MemoryLink>(loop, nullptr);
  auto theirs = std::make_shared<detail::MemoryLink>(loop, nullptr);
  auto cycle = [&](bool notify = true) {
    auto out = detail::Released::kUnconfirmed;
    space->run(mine, [&](MemorySpace::State& s) {
      detail::LockRef ref{"k", "me", "10000", 10s, LockKind::exclusive()};
      if (s.acquire(ref).status == detail::Acquired::Status::kTaken) out = s.release(ref, notify, mine.get());
    });
    return out;
  };
  using detail::Released;
  EXPECT_EQ(cycle(), Released::kYesUnheard) << "nobody listens";
  space->subscribe(mine, "k");
  EXPECT_EQ(cycle(), Released::kYesUnheard) << "only the releasing store listens";
  space->subscribe(theirs, "k");
  EXPECT_EQ(cycle(), Released::kYes) << "another listens too";
  EXPECT_EQ(cycle(false), Released::kYesUnheard) << "no notice sent";
  space->unsubscribe(mine, "k");
  EXPECT_EQ(cycle(), Released::kYes) << "only another listens";
  space->unsubscribe(theirs, "k");
  EXPECT_EQ(cycle(), Released::kYesUnheard) << "nobody listens any more";
  EXPECT_EQ(loop.shutdown([&] {
    mine->close();
    theirs->close();
  }),
            0);
}

TEST(MemoryStoreTest, AnUnsupportedSchemeListsMemory) {
  try {
    Runtime rt(on("memcached://x"));
    ADD_FAILURE() << "an unknown scheme was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("memory://"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockwatch::testing
