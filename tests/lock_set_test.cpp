// Sets of keys (lockwatch::all_of) on an in-memory store: one order
// whatever the caller's, all or none, one lease for the set, a token per
// key, reentrancy per key, and the bounds of a set. The same on every real
// store: store_contract_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "memory_runtime.hpp"
#include "store/redis/redis_error.hpp"
#include "transfers.hpp"

namespace lockwatch::testing {
namespace {

class LockSetTest : public ::testing::Test {
 protected:
  void SetUp() override { rt_ = memory_runtime(backend_, script_, memory_options(8)); }
  void TearDown() override { rt_.reset(); }

  // True when `key` can be taken at once (and gives it back).
  bool free_now(const std::string& key) {
    auto f = rt_->acquire({.key = key, .ttl = 5s, .wait = 0ms});
    try {
      LockHandle h = get_bounded(f);
      auto r = h.release();
      get_bounded(r);
      return true;
    } catch (const LockNotAcquired&) {
      return false;
    }
  }

  std::shared_ptr<MemoryBackend> backend_ = std::make_shared<MemoryBackend>();
  std::shared_ptr<StoreScript> script_ = std::make_shared<StoreScript>();
  std::unique_ptr<Runtime> rt_;
};

// Transfers between random pairs of accounts, each thread naming them in
// its own order (from == to included): balances stay exact, no call fails,
// no two transfers touching one account overlap.
TEST_F(LockSetTest, OppositeOrderTransfersNeitherDeadlockNorOverlap) {
  Ledger<4> ledger;
  auto transfer = LOCKED(all_of("acct:{0}", "acct:{1}"), 2s, forever, .on(*rt_).wait(20s))[&](int from, int to,
                                                                                              long cents) {
    ledger.move(from, to, cents);
  };
  run_transfers(ledger, 8, 40, 1, [&](int) { return transfer; });
  EXPECT_EQ(ledger.failures.load(), 0);
  EXPECT_EQ(ledger.overlaps.load(), 0);
  EXPECT_EQ(ledger.token_regressions.load(), 0);
  EXPECT_EQ(ledger.total(), 4000);
  EXPECT_EQ(rt_->held_leases(), 0u);
}

// A set's keys are distinct and in one order; its lease names each key's
// own token.
TEST_F(LockSetTest, ASetIsDistinctCanonicalAndFencedPerKey) {
  auto f = rt_->acquire({.key = all_of("set:c", "set:a", "set:b", "set:a"), .ttl = 5s});
  LockHandle h = get_bounded(f);
  const Lease& l = h.lease();
  ASSERT_EQ(l.keys().size(), 3u);
  EXPECT_EQ(l.keys()[0], "set:a");
  EXPECT_EQ(l.keys()[2], "set:c");
  EXPECT_EQ(l.key(), "all_of(set:a, set:b, set:c)");
  EXPECT_GT(l.fencing_token("set:a"), 0u);
  EXPECT_GT(l.fencing_token("set:c"), 0u);
  EXPECT_EQ(l.fencing_token(), l.fencing_token("set:a"));
  EXPECT_THROW((void)l.fencing_token("set:d"), InvalidArgument);
  EXPECT_GT(l.remaining(), 4s);
  EXPECT_EQ(rt_->held_leases(), 3u);
  EXPECT_FALSE(free_now("set:b"));
  auto r = h.release();
  get_bounded(r);
  EXPECT_TRUE(free_now("set:a"));
  EXPECT_TRUE(free_now("set:b"));
  EXPECT_TRUE(free_now("set:c"));

  // all_of(k, k) is the key k.
  auto one = rt_->acquire({.key = all_of("set:a", "set:a"), .ttl = 5s});
  LockHandle o = get_bounded(one);
  EXPECT_EQ(o.lease().key(), "set:a");
  EXPECT_EQ(o.lease().keys().size(), 1u);
  EXPECT_EQ(o.lease().fencing_token("set:a"), o.lease().fencing_token());
}

// A free set is tried whole: every key's request is sent before any is
// answered (one round trip), not one after another.
TEST_F(LockSetTest, AFreeSetIsTriedWholeInOneRoundTrip) {
  script_->set_delay(Op::kAcquire, 2s);
  auto f = rt_->acquire({.key = all_of("whole:a", "whole:b", "whole:c", "whole:d"), .ttl = 5s, .wait = 10s});
  EXPECT_TRUE(script_->wait_for(Op::kAcquire, 4, 1500ms)) << script_->count(Op::kAcquire) << " sent";
  LockHandle h = get_bounded(f);
  EXPECT_EQ(script_->count(Op::kAcquire), 4u);
  EXPECT_EQ(h.lease().keys().size(), 4u);
}

// A whole try answered "not now" (a deadlock the server broke, a cluster
// failing over) is not the call's end: a waiting set goes the ordered way
// and rides it out; one that does not wait reports it.
TEST_F(LockSetTest, AWholeTryAnsweredNotNowGoesTheOrderedWay) {
  auto refusals = std::make_shared<std::atomic<int>>(2);
  script_->script_acquire([refusals](const std::string&) -> std::optional<detail::Acquired> {
    if (refusals->fetch_sub(1) <= 0) return std::nullopt;  // the backend answers
    detail::Acquired a;
    a.error = detail::redis_reply_error("memory", "TRYAGAIN Multiple keys request during rehashing of slot");
    return a;
  });
  auto f = rt_->acquire({.key = all_of("again:a", "again:b"), .ttl = 5s, .wait = 10s});
  LockHandle h = get_bounded(f);
  EXPECT_EQ(h.lease().keys().size(), 2u);
  EXPECT_EQ(script_->count(Op::kAcquire), 4u);  // the whole try's two, then each key on its own
  auto r = h.release();
  get_bounded(r);
  refusals->store(2);
  auto once = rt_->acquire({.key = all_of("again:a", "again:b"), .ttl = 5s, .wait = 0ms});
  EXPECT_TRUE(error_of<StoreRefused>(once));
  EXPECT_TRUE(free_now("again:a"));
  EXPECT_TRUE(free_now("again:b"));
}

TEST_F(LockSetTest, AnEmptyOrOversizedSetIsInvalidBeforeAnythingStarts) {
  EXPECT_THROW((void)rt_->acquire({.key = all_of(std::vector<std::string>{}), .ttl = 5s}), InvalidArgument);
  std::vector<std::string> many;
  for (std::size_t i = 0; i <= max_set_keys; ++i) many.push_back("many:" + std::to_string(i));
  EXPECT_THROW((void)rt_->acquire({.key = all_of(many), .ttl = 5s}), InvalidArgument);
  many.pop_back();
  many.push_back("many:0");  // 64 distinct: taken
  auto f = rt_->acquire({.key = all_of(many), .ttl = 5s});
  LockHandle h = get_bounded(f);
  EXPECT_EQ(h.lease().keys().size(), max_set_keys);
  EXPECT_THROW((void)rt_->acquire({.key = all_of("ok", ""), .ttl = 5s}), InvalidArgument);
  std::promise<std::error_code> got;
  auto ticket = rt_->async_acquire({.key = all_of(std::vector<std::string>{}), .ttl = 5s},
                                   [&got](std::error_code ec, LockHandle) { got.set_value(ec); });
  auto code = got.get_future();
  EXPECT_EQ(get_bounded(code), errc::invalid_argument);
  EXPECT_FALSE(ticket);
  // A pattern that does not fit the call fails its future.
  auto bad = LOCKED(all_of("p:{0}", "p:{1}"), 5s, 0, .on(*rt_))[](int) { return 1; };
  auto call = bad(1);
  EXPECT_TRUE(error_of<InvalidArgument>(call));
}

// Busy past its wait: every key the set took is given back, and the error
// names the busy key.
TEST_F(LockSetTest, ASetThatCannotHaveEveryKeyGivesBackThoseItTook) {
  auto hf = rt_->acquire("part:b", 5s);
  LockHandle b = get_bounded(hf);
  for (auto wait : {0ms, 150ms}) {
    auto f = rt_->acquire({.key = all_of("part:c", "part:b", "part:a"), .ttl = 5s, .wait = wait});
    auto err = error_of<LockNotAcquired>(f);
    ASSERT_TRUE(err);
    EXPECT_NE(std::string(err->what()).find("part:b"), std::string::npos) << err->what();
    auto a = rt_->acquire({.key = "part:a", .ttl = 5s, .wait = 2s});  // its give-back may be a round trip away
    LockHandle ha = get_bounded(a);
    EXPECT_TRUE(free_now("part:c"));
    auto r = ha.release();
    get_bounded(r);
  }
  EXPECT_EQ(rt_->held_leases(), 1u);
}

// A waiting set cancelled: its handler gets Cancelled and the keys it
// holds are given back.
TEST_F(LockSetTest, ACancelledSetGivesBackItsKeys) {
  auto hf = rt_->acquire("cancel:b", 5s);
  LockHandle b = get_bounded(hf);
  std::promise<std::error_code> got;
  auto ticket = rt_->async_acquire({.key = all_of("cancel:a", "cancel:b"), .ttl = 5s, .wait = 20s},
                                   [&got](std::error_code ec, LockHandle) { got.set_value(ec); });
  // Once it holds cancel:a and waits for cancel:b (the whole-set try,
  // which waits for nothing, gave cancel:a back first): the wait for
  // cancel:b has subscribed to its release notices, which only the ordered
  // way's second step does, after it took cancel:a. (cancel:a held with a
  // waiter alone is no proof: the whole-set try's hold may still be on its
  // way back while the ordered way's first step waits for it.)
  auto holds_a_and_waits = [&] {
    const auto calls = script_->calls();
    const bool waits_for_b = std::any_of(calls.begin(), calls.end(), [](const StoreScript::Call& c) {
      return c.op == Op::kSubscribe && c.name == memory_name("cancel:b");
    });
    return waits_for_b && backend_->owner(memory_name("cancel:a")).has_value() &&
           rt_->metrics_text().find("\nlockwatch_waiting 1\n") != std::string::npos;
  };
  for (int i = 0; i < 20000 && !holds_a_and_waits(); ++i) std::this_thread::sleep_for(1ms);  // no event for it
  ASSERT_TRUE(holds_a_and_waits());
  EXPECT_FALSE(free_now("cancel:a"));
  EXPECT_TRUE(ticket.cancel());
  auto code = got.get_future();
  EXPECT_EQ(get_bounded(code), errc::cancelled);
  auto a = rt_->acquire({.key = "cancel:a", .ttl = 5s, .wait = 2s});
  LockHandle ha = get_bounded(a);
  auto r = b.release();
  get_bounded(r);
}

// Losing any key stops the set's work, and LeaseLost names that key.
TEST_F(LockSetTest, LosingOneKeyStopsTheWorkAndNamesTheKey) {
  std::promise<void> inside;
  auto work = LOCKED(all_of("lost:a", "lost:b"), 300ms, forever, .on(*rt_))[&] {
    inside.set_value();
    return stopped_within_bound(this_lease().stop_token());
  };
  auto done = work();
  auto in = inside.get_future();
  ASSERT_EQ(in.wait_for(kBound), std::future_status::ready);
  auto removed = rt_->force_release("lost:b");
  EXPECT_TRUE(get_bounded(removed));
  auto lost = error_of<LeaseLost>(done);
  ASSERT_TRUE(lost);
  EXPECT_EQ(lost->key(), "lost:b");
  EXPECT_TRUE(free_now("lost:a"));
}

// Within a set's call, a call on one of its keys is reentrant, and a set
// nested in it borrows the keys it holds and takes the others.
TEST_F(LockSetTest, ReentrancyFollowsEachKeyOfTheSet) {
  auto inner = LOCKED("re:{0}", 5s, forever, .on(*rt_))[](const std::string&) { return this_lease().key(); };
  auto nested = LOCKED(all_of("re:a", "re:c"), 5s, forever, .on(*rt_))[] {
    const Lease& l = this_lease();
    return l.fencing_token("re:a") > 0 && l.fencing_token("re:c") > 0 ? l.key() : std::string("no token");
  };
  auto outer = LOCKED(all_of("re:a", "re:b"), 5s, forever, .on(*rt_))[&] {
    std::uint64_t token_a = this_lease().fencing_token("re:a");
    auto one = inner(std::string("b"));
    std::string one_key = get_bounded(one);
    auto two = nested();
    std::string two_key = get_bounded(two);
    bool same_a = this_lease().fencing_token("re:a") == token_a;
    return one_key + "|" + two_key + "|" + (same_a ? "same" : "other");
  };
  auto f = outer();
  EXPECT_EQ(get_bounded(f), "re:b|all_of(re:a, re:c)|same");
  EXPECT_TRUE(free_now("re:a"));
  EXPECT_TRUE(free_now("re:c"));
}

}  // namespace
}  // namespace lockwatch::testing
