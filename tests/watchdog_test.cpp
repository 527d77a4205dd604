// The watchdog on an in-memory store: cadence, retries, loss, release.
#include <gtest/gtest.h>

#include <thread>

#include "core/page_allocator.hpp"
#include "memory_runtime.hpp"

namespace lockwatch::testing {
namespace {

using detail::Acquired;
using detail::Released;
using detail::Renewed;

class WatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override { rt_ = memory_runtime(backend_, script_, options_); }
  void TearDown() override { rt_.reset(); }
  void restart(Options o) {
    rt_.reset();
    rt_ = memory_runtime(backend_, script_, std::move(o));
  }
  LockHandle hold(const std::string& key, std::chrono::milliseconds ttl, Retries retries = forever) {
    auto f = rt_->acquire({.key = key, .ttl = ttl, .retries = retries});
    return get_bounded(f);
  }
  std::vector<StoreScript::Call> renewals_of(const std::string& key) const {
    std::vector<StoreScript::Call> out;
    for (const auto& c : script_->calls())
      if (c.op == Op::kRenew && c.name == memory_name(key)) out.push_back(c);
    return out;
  }
  // Waits (bounded) until every lease was renewed once more, or one was lost.
  static bool all_renewed(const std::vector<LockHandle>& held) {
    std::vector<std::uint64_t> target;
    for (const auto& h : held) target.push_back(h.lease().renewals() + 1);
    auto until = std::chrono::steady_clock::now() + kBound;
    for (std::size_t i = 0; i < held.size();) {
      if (held[i].lease().lost()) return false;
      if (held[i].lease().renewals() >= target[i]) {
        ++i;
        continue;
      }
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(5ms);  // polling counters the watchdog moves
    }
    return true;
  }
  StoreScript::Call first(Op op, const std::string& key) const {
    for (const auto& c : script_->calls())
      if (c.op == op && c.name == memory_name(key)) return c;
    ADD_FAILURE() << "no such call";
    return {};
  }

  std::shared_ptr<MemoryBackend> backend_ = std::make_shared<MemoryBackend>();
  std::shared_ptr<StoreScript> script_ = std::make_shared<StoreScript>();
  Options options_ = memory_options();
  std::unique_ptr<Runtime> rt_;
};

TEST_F(WatchdogTest, TheFirstRenewalComesAtTheWeightedShareOfTheTtl) {
  auto f = locked("cadence", 400ms, forever).on(*rt_).renew_weight(0.5)([] {
    return renewed_again(this_lease(), 1);
  })();
  EXPECT_TRUE(get_bounded(f));
  auto took = first(Op::kAcquire, "cadence").at;
  auto renewed = first(Op::kRenew, "cadence").at;
  // 200 ms, moved early onto the renewal grid (20 ms for a 400 ms ttl:
  // the 5 ms tick times the largest power of two within ttl / 20), sent on
  // the last tick at or before it.
  EXPECT_GE(ms_between(took, renewed), 170ms);
  EXPECT_LT(ms_between(took, renewed), 300ms);
}

TEST_F(WatchdogTest, EachConfirmedRenewalSchedulesTheNextAtTheSameCadence) {
  auto h = hold("steady", 300ms);
  ASSERT_TRUE(renewed_again(h.lease(), 3));
  auto r = renewals_of("steady");
  ASSERT_GE(r.size(), 3u);
  for (std::size_t i = 1; i < 3; ++i) {
    // 300 ms * 0.9 = 270, pulled to 245 to leave the 50 ms window, less a
    // tick and up to a 10 ms grid step (ttl / 20 = 15 ms holds one of 10).
    EXPECT_GE(ms_between(r[i - 1].at, r[i].at), 225ms) << i;
    EXPECT_LT(ms_between(r[i - 1].at, r[i].at), 290ms) << i;
  }
  EXPECT_EQ(backend_->owner(memory_name("steady")).has_value(), true);
  h.release().get();
}

TEST_F(WatchdogTest, ShortTtlsAreRenewedEarlyEnoughToKeepTheWindow) {
  auto h = hold("short", 200ms);
  ASSERT_TRUE(renewed_again(h.lease(), 2));
  auto r = renewals_of("short");
  ASSERT_GE(r.size(), 2u);
  // 200 - 4 (drift) - 50 (window) = 146 ms, not 180.
  EXPECT_LT(ms_between(r[0].at, r[1].at), 170ms);
  EXPECT_GE(ms_between(r[0].at, r[1].at), 130ms);
  h.release().get();
}

TEST_F(WatchdogTest, ATransientFailureIsRetriedOnTheNextTickAndTheLeaseKept) {
  int failures = 1;
  script_->script_renew([&](const std::string&) -> std::optional<Renewed> {
    if (failures > 0) {
      failures--;
      return Renewed::kTransient;
    }
    return std::nullopt;
  });
  auto h = hold("blip", 300ms);
  ASSERT_TRUE(renewed_again(h.lease(), 1));
  auto r = renewals_of("blip");
  ASSERT_GE(r.size(), 2u);
  EXPECT_LT(ms_between(r[0].at, r[1].at), 40ms);  // a tick later, not a whole period
  EXPECT_FALSE(h.lease().lost());
  h.release().get();
}

TEST_F(WatchdogTest, ALostReplyCostsOneRetryNotTheLease) {
  script_->lose_replies(Op::kRenew, 2);
  auto h = hold("lost-reply", 300ms);
  ASSERT_TRUE(renewed_again(h.lease(), 2));
  EXPECT_GE(script_->count(Op::kRenew), 4u);
  EXPECT_FALSE(h.lease().lost());
  h.release().get();
}

TEST_F(WatchdogTest, TransientFailuresUntilTheLocalDeadlineLoseTheLeaseAsUnreachable) {
  script_->script_renew([](const std::string&) -> std::optional<Renewed> { return Renewed::kTransient; });
  auto f = locked("unreachable", 300ms, forever).on(*rt_)([] {
    return stopped_within_bound(this_lease().stop_token());
  })();
  auto err = error_of<LeaseLost>(f);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->reason(), LostReason::kStoreUnreachable);
  // Retried every tick until the deadline (300 - 5 ms), not given up early.
  EXPECT_GE(script_->count(Op::kRenew), 5u);
  auto took = first(Op::kAcquire, "unreachable").at;
  auto last = renewals_of("unreachable").back().at;
  EXPECT_GE(ms_between(took, last), 250ms);
}

TEST_F(WatchdogTest, TheLeaseIsNotLostBeforeTheLocalDeadline) {
  script_->set_down(false);
  script_->script_renew([](const std::string&) -> std::optional<Renewed> { return Renewed::kTransient; });
  auto h = hold("deadline", 400ms);
  auto t0 = std::chrono::steady_clock::now();
  std::promise<std::chrono::steady_clock::time_point> lost_at;
  std::stop_callback cb(h.lease().stop_token(), [&] { lost_at.set_value(std::chrono::steady_clock::now()); });
  auto fut = lost_at.get_future();
  ASSERT_EQ(fut.wait_for(kBound), std::future_status::ready);
  // Local deadline: 400 - (4 + 2) ms after the acquisition was sent.
  EXPECT_GE(ms_between(t0, fut.get()), 380ms);
  EXPECT_EQ(h.lease().lost_reason(), LostReason::kStoreUnreachable);
  EXPECT_EQ(h.lease().remaining(), 0ms);
}

TEST_F(WatchdogTest, TheHolderIsToldTheWholeDriftAllowanceBeforeTheStoreMayExpireTheKey) {
  // The wheel judges a deadline on the first tick at or after it: with a
  // coarse tick the holder would be told up to a tick after ttl - drift,
  // eating into the allowance that is its only margin. The deadline is
  // set a tick early, so it is told by then.
  Options o = memory_options();
  o.watchdog.tick = 50ms;
  restart(o);
  script_->script_renew([](const std::string&) -> std::optional<Renewed> { return Renewed::kTransient; });
  auto t0 = std::chrono::steady_clock::now();
  auto h = hold("margin", 2s);  // drift allowance 2000 * 0.01 + 2 = 22 ms
  EXPECT_LE(h.lease().remaining(), 2000ms - 22ms - 50ms + 1ms);
  std::promise<std::chrono::steady_clock::time_point> lost_at;
  std::stop_callback cb(h.lease().stop_token(), [&] { lost_at.set_value(std::chrono::steady_clock::now()); });
  auto fut = lost_at.get_future();
  ASSERT_EQ(fut.wait_for(kBound), std::future_status::ready);
  auto told = ms_between(t0, fut.get());
  EXPECT_LE(told, 2000ms - 22ms + 15ms);  // by the deadline, give or take the stop callback's thread
  EXPECT_GE(told, 2000ms - 22ms - 50ms);  // and not more than a tick before it
}

TEST_F(WatchdogTest, NotYoursIsFinalAtOnce) {
  auto h = hold("stolen", 1s);  // the answer has 88 ms before the local deadline
  backend_->set_owner(memory_name("stolen"), "someone-else", 10s);
  ASSERT_TRUE(stopped_within_bound(h.lease().stop_token()));
  EXPECT_EQ(h.lease().lost_reason(), LostReason::kTakenByOther);
  auto renewals = script_->count(Op::kRenew);
  EXPECT_EQ(renewals, 1u);  // the first renewal said "not yours": no retry
  auto rel = h.release();
  EXPECT_THROW(rel.get(), LeaseLost);
  EXPECT_EQ(backend_->owner(memory_name("stolen")), "someone-else");  // left alone
}

// A lease makes its stop state only when asked for a token; a stop
// requested before that still shows, and callbacks run once.
TEST(LeaseStopTest, AStopRequestedBeforeAnyTokenIsSeenByTheFirstToken) {
  detail::LeaseRecord early("k", 1, 1s, std::chrono::steady_clock::now() + 1s);
  early.request_stop();
  EXPECT_TRUE(early.stop_token().stop_requested());
  EXPECT_TRUE(early.stop_token().stop_requested());

  detail::LeaseRecord late("k", 2, 1s, std::chrono::steady_clock::now() + 1s);
  auto token = late.stop_token();
  EXPECT_FALSE(token.stop_requested());
  int ran = 0;
  std::stop_callback cb(token, [&] {
    ++ran;
    EXPECT_TRUE(late.stop_token().stop_requested());  // asking again from a callback does not deadlock
  });
  late.request_stop();
  late.request_stop();
  EXPECT_EQ(ran, 1);
  EXPECT_TRUE(token.stop_requested());
}

TEST(StoreNameTest, ShortNamesStayInlineAndLongOnesAreKeptWhole) {
  for (std::size_t n : {0u, 1u, 35u, 36u, 37u, 200u, 5000u}) {
    std::string text(n, 'x');
    for (std::size_t i = 0; i < n; ++i) text[i] = static_cast<char>('a' + i % 26);
    detail::StoreName name;
    name = text;
    EXPECT_EQ(name.view(), text) << n;
    name = "short";  // replacing a long name frees its block (ASan checks)
    EXPECT_EQ(name.view(), "short");
    name = text;
    EXPECT_EQ(name.view(), text) << n;
  }
}

// The store cannot say who deleted the key; found gone before its ttl
// could have run out, it was removed (release --force, a delete).
TEST_F(WatchdogTest, AKeyFoundGoneBeforeItsTtlRanOutIsReportedRemoved) {
  auto f = locked("gone", 300ms, forever).on(*rt_)([this] {
    backend_->erase(memory_name("gone"));
    return stopped_within_bound(this_lease().stop_token());
  })();
  auto err = error_of<LeaseLost>(f);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->reason(), LostReason::kRemoved);
}

TEST_F(WatchdogTest, SpentRetriesEndTheLeaseAtItsDeadline) {
  auto f = locked("two-renewals", 200ms, 2).on(*rt_)([] {
    stopped_within_bound(this_lease().stop_token());
    return this_lease().renewals();
  })();
  auto err = error_of<LeaseLost>(f);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->reason(), LostReason::kRenewalsExhausted);
  EXPECT_EQ(renewals_of("two-renewals").size(), 2u);
}

TEST_F(WatchdogTest, ZeroRetriesNeverRenews) {
  auto f = locked("no-renewals", 150ms, 0).on(*rt_)([] {
    return stopped_within_bound(this_lease().stop_token());
  })();
  auto err = error_of<LeaseLost>(f);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->reason(), LostReason::kRenewalsExhausted);
  EXPECT_EQ(script_->count(Op::kRenew), 0u);
}

TEST_F(WatchdogTest, ShortWorkWithZeroRetriesSucceeds) {
  auto f = locked("quick", 1s, 0).on(*rt_)([] { return this_lease().fencing_token(); })();
  EXPECT_EQ(get_bounded(f), 1u);
  EXPECT_FALSE(backend_->owner(memory_name("quick")));
}

TEST_F(WatchdogTest, ARenewalThatAnswersAfterTheDeadlineDoesNotSaveTheLease) {
  script_->set_delay(Op::kRenew, 500ms);  // longer than the 300 ms ttl
  auto h = hold("slow-store", 300ms);
  ASSERT_TRUE(stopped_within_bound(h.lease().stop_token()));
  EXPECT_EQ(h.lease().lost_reason(), LostReason::kStoreUnreachable);
  EXPECT_EQ(h.lease().renewals(), 0u);
}

TEST_F(WatchdogTest, RenewalsDueInOneTickShareOneBatch) {
  std::vector<LockHandle> held;
  std::vector<std::future<LockHandle>> pending;
  for (int i = 0; i < 64; ++i) pending.push_back(rt_->acquire("batch:" + std::to_string(i), 300ms));
  for (auto& p : pending) held.push_back(get_bounded(p));
  ASSERT_TRUE(all_renewed(held));
  auto renew_requests = script_->count(Op::kRenew);
  auto renewed_locks = script_->locks(Op::kRenew);
  EXPECT_GE(renewed_locks, 64u);
  EXPECT_LT(renew_requests * 4, renewed_locks);  // many leases per request
  auto s = rt_->stats();
  EXPECT_EQ(s.renew_commands, renew_requests);
  EXPECT_GE(s.renewals_sent, 64u);
}

TEST_F(WatchdogTest, RenewalsDueApartComeDueOnOneGridAndShareABatch) {
  // Eight leases of 2 s granted 12 ms apart: each renewal is due in its
  // own tick at ttl * 0.9, but is moved early (at most a twentieth of the
  // ttl) onto a grid of 80 ms (5 ms ticks times 16), so the eight go out
  // in as many batches as grid points their grants span, not eight.
  std::vector<LockHandle> held;
  auto first = std::chrono::steady_clock::now();
  for (int i = 0; i < 8; ++i) {
    if (i > 0) std::this_thread::sleep_for(12ms);  // spreads the grants; nothing waits on it
    held.push_back(hold("apart:" + std::to_string(i), 2s));
  }
  auto span = std::chrono::steady_clock::now() - first;
  ASSERT_TRUE(all_renewed(held));
  auto renew_requests = script_->count(Op::kRenew);
  EXPECT_GE(script_->locks(Op::kRenew), 8u);
  EXPECT_LE(renew_requests, static_cast<std::size_t>(span / 80ms) + 2) << "grants spread over "
      << std::chrono::duration_cast<std::chrono::milliseconds>(span).count() << " ms";
  for (auto& h : held) h.release().get();
}

TEST_F(WatchdogTest, ABatchIsSplitIntoChunksOf512) {
  std::vector<std::future<LockHandle>> pending;
  for (int i = 0; i < 1100; ++i) pending.push_back(rt_->acquire("chunk:" + std::to_string(i), 600ms));
  std::vector<LockHandle> held;
  for (auto& p : pending) held.push_back(get_bounded(p));
  ASSERT_TRUE(all_renewed(held));
  std::size_t largest = 0;
  for (const auto& c : script_->calls())
    if (c.op == Op::kRenew) largest = std::max(largest, c.batch);
  EXPECT_EQ(largest <= 512, true) << largest;
  EXPECT_GT(largest, 1u);
}

TEST_F(WatchdogTest, TheLockIsReleasedBeforeTheFutureIsReady) {
  auto f = locked("release-first", 1s, forever).on(*rt_)([] { return 7; })();
  EXPECT_EQ(get_bounded(f), 7);
  EXPECT_FALSE(backend_->owner(memory_name("release-first")));
  EXPECT_EQ(script_->count(Op::kRelease), 1u);
}

TEST_F(WatchdogTest, AHandleWhoseFutureWasDroppedUnreadReleasesTheLock) {
  {
    script_->set_delay(Op::kAcquire, 100ms);  // the grant comes after the future is gone
    auto f = rt_->acquire({.key = "dropped", .ttl = 10s, .retries = forever});
  }
  script_->set_delay(Op::kAcquire, 0ms);
  // The next caller queues behind the dropped one and gets the lock once it
  // is released: long before its 10 s ttl could free it.
  auto t0 = std::chrono::steady_clock::now();
  auto next = rt_->acquire({.key = "dropped", .ttl = 1s, .retries = forever, .wait = 5s});
  auto h = get_bounded(next);
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 5s);
  EXPECT_EQ(script_->count(Op::kRelease), 1u);
  EXPECT_FALSE(h.lease().lost());
}

TEST_F(WatchdogTest, WorkThatThrowsIsStillReleased) {
  auto f = locked("throws", 1s, forever).on(*rt_)([]() -> int { throw std::runtime_error("boom"); })();
  EXPECT_TRUE(error_of<std::runtime_error>(f));
  EXPECT_FALSE(backend_->owner(memory_name("throws")));
  EXPECT_EQ(script_->count(Op::kRelease), 1u);
}

TEST_F(WatchdogTest, AnUnconfirmedReleaseCompletesOnlyOnceTheKeyHasSurelyExpired) {
  auto h = hold("unconfirmed", 300ms);
  script_->set_down(true);
  auto t0 = std::chrono::steady_clock::now();
  auto rel = h.release();
  ASSERT_EQ(rel.wait_for(kBound), std::future_status::ready);
  EXPECT_GE(ms_between(t0, std::chrono::steady_clock::now()), 250ms);
  script_->set_down(false);
  EXPECT_FALSE(backend_->owner(memory_name("unconfirmed")));  // expired by then
}

// A store that may keep a lock past its ttl (etcd's leases count whole
// seconds): an unconfirmed release waits its expiry bound, not the ttl.
TEST_F(WatchdogTest, AnUnconfirmedReleaseWaitsTheStoresExpiryBound) {
  script_->set_expiry_slack(700ms);
  restart(options_);  // the store reads it when it is made
  auto h = hold("unconfirmed-bound", 300ms);
  script_->set_down(true);
  auto t0 = std::chrono::steady_clock::now();
  auto rel = h.release();
  ASSERT_EQ(rel.wait_for(kBound), std::future_status::ready);
  EXPECT_GE(ms_between(t0, std::chrono::steady_clock::now()), 700ms);  // the ttl alone: under 300 ms
  script_->set_down(false);
}

// A store that may keep a lock past any bound (etcd: a new leader renews
// every lease): an unconfirmed release is a lost lease to the caller, never
// a release, for a handle and for LOCKED alike.
TEST_F(WatchdogTest, AnUnconfirmedReleaseOnAStoreWithoutAnExpiryBoundIsALostLease) {
  script_->set_expiry_bounded(false);
  restart(options_);  // the store reads it when it is made
  auto h = hold("unconfirmed-unbounded", 300ms);
  script_->set_down(true);
  auto rel = h.release();
  ASSERT_EQ(rel.wait_for(kBound), std::future_status::ready);
  auto err = error_of<LeaseLost>(rel);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->reason(), LostReason::kStoreUnreachable);
  EXPECT_NE(std::string(err->what()).find("release not confirmed"), std::string::npos) << err->what();
  script_->set_down(false);

  auto f = locked("unconfirmed-locked", 300ms, forever).on(*rt_)([&] {
    script_->set_down(true);
    return 7;
  })();
  auto lost = error_of<LeaseLost>(f);
  ASSERT_TRUE(lost);
  EXPECT_NE(std::string(lost->what()).find("not counted released"), std::string::npos) << lost->what();
  script_->set_down(false);
}

TEST_F(WatchdogTest, AReleaseThatFindsAnotherOwnerReportsTakenByOther) {
  auto f = locked("taken-at-release", 5s, forever).on(*rt_)([this] {
    backend_->set_owner(memory_name("taken-at-release"), "intruder", 5s);
  })();
  auto err = error_of<LeaseLost>(f);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->reason(), LostReason::kTakenByOther);
  EXPECT_EQ(backend_->owner(memory_name("taken-at-release")), "intruder");
}

TEST_F(WatchdogTest, AReleaseThatFindsTheKeyGoneWithinItsTtlReportsRemoved) {
  auto f = locked("gone-at-release", 5s, forever).on(*rt_)([this] { backend_->erase(memory_name("gone-at-release")); })();
  auto err = error_of<LeaseLost>(f);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->reason(), LostReason::kRemoved);
}

TEST_F(WatchdogTest, ALeaseIsKeptRenewedWhileItsReleaseIsInFlight) {
  auto h = hold("slow-release", 300ms);
  script_->set_delay(Op::kRelease, 700ms);
  auto rel = h.release();
  ASSERT_EQ(rel.wait_for(kBound), std::future_status::ready);
  EXPECT_NO_THROW(rel.get());  // not lost while the release waited
  EXPECT_GE(script_->count(Op::kRenew), 2u);
  EXPECT_FALSE(backend_->owner(memory_name("slow-release")));
}

TEST_F(WatchdogTest, RemainingMovesForwardWithEachRenewal) {
  auto h = hold("remaining", 300ms);
  auto before = h.lease().remaining();
  EXPECT_LE(before, 300ms);
  ASSERT_TRUE(renewed_again(h.lease(), 1));
  auto after = h.lease().remaining();
  EXPECT_GT(after, 200ms);  // refreshed: the renewal was sent moments ago
  h.release().get();
}

TEST_F(WatchdogTest, TheClosestCallIsReportedAsTheLeastRenewalSlack) {
  EXPECT_EQ(rt_->stats().min_renewal_slack, std::chrono::microseconds::max());
  script_->set_delay(Op::kRenew, 100ms);
  auto h = hold("slack", 2s);
  ASSERT_TRUE(renewed_again(h.lease(), 1));
  auto slack = rt_->stats().min_renewal_slack;
  // Renewed at 1,800 ms less up to a tick (5 ms: a renewal is due a tick
  // early, so as not to lose its tick) and up to 80 ms more (moved early
  // onto the renewal grid: the tick times the largest power of two within
  // a twentieth of the ttl), or later on a busy machine, and confirmed
  // 100 ms later, of a 1,978 ms deadline (the ttl less its drift
  // allowance): at most 163 ms to spare.
  EXPECT_LT(slack, 164ms);
  EXPECT_GT(slack, 0ms);
  h.release().get();
}

TEST_F(WatchdogTest, NoRenewalIsSentAfterTheWorkEnds) {
  auto f = locked("ends", 200ms, forever).on(*rt_)([] { return 1; })();
  EXPECT_EQ(get_bounded(f), 1);
  auto renewals = script_->count(Op::kRenew);
  std::this_thread::sleep_for(400ms);  // two periods in which nothing may happen
  EXPECT_EQ(script_->count(Op::kRenew), renewals);
}

TEST_F(WatchdogTest, StoppingTheRuntimeStopsTheWorkAndReleasesEveryLock) {
  Gate entered;
  auto f = locked("stop", 300ms, forever).on(*rt_)([&] {
    entered.open();
    return stopped_within_bound(this_lease().stop_token());
  })();
  auto h = hold("stop-handle", 300ms);
  ASSERT_TRUE(entered.wait());
  rt_.reset();
  EXPECT_TRUE(get_bounded(f));
  EXPECT_FALSE(backend_->owner(memory_name("stop")));
  EXPECT_FALSE(backend_->owner(memory_name("stop-handle")));
}

TEST_F(WatchdogTest, StatsCountLeasesAcquiredAndLost) {
  auto h = hold("stats-a", 300ms);
  auto h2 = hold("stats-b", 300ms);
  EXPECT_EQ(rt_->held_leases(), 2u);
  EXPECT_EQ(rt_->stats().acquired, 2u);
  backend_->set_owner(memory_name("stats-b"), "other", 5s);
  ASSERT_TRUE(stopped_within_bound(h2.lease().stop_token()));
  EXPECT_EQ(rt_->stats().leases_lost, 1u);
  h.release().get();
  EXPECT_THROW(h2.release().get(), LeaseLost);
  EXPECT_EQ(rt_->held_leases(), 0u);
}

TEST_F(WatchdogTest, FencingTokensRiseAcrossHolders) {
  std::uint64_t last = 0;
  for (int i = 0; i < 5; ++i) {
    auto h = hold("fenced", 1s);
    EXPECT_GT(h.lease().fencing_token(), last);
    last = h.lease().fencing_token();
    h.release().get();
  }
  EXPECT_EQ(backend_->fence(memory_name("fenced")), last);
}

TEST_F(WatchdogTest, TheStoreRefusesKeysItCannotHold) {
  EXPECT_THROW(rt_->acquire("refused:x", 1s), InvalidArgument);
}

// The registry's allocator: small blocks from malloc, large ones mapped
// and unmapped; a vector on it grows past the threshold, keeps what it
// holds through the moves, and shrinks back.
TEST(PageAllocatorTest, AVectorGrowsPastTheMappedThresholdAndShrinksBack) {
  using Slot = std::shared_ptr<int>;
  std::vector<Slot, detail::PageAllocator<Slot>> v;
  constexpr int kCount = 200'000;  // 3.2 MB of slots: mapped
  for (int i = 0; i < kCount; ++i) v.push_back(std::make_shared<int>(i));
  ASSERT_GE(v.capacity() * sizeof(Slot), detail::PageAllocator<Slot>::kMapFrom);
  for (int i = 0; i < kCount; i += 997) ASSERT_EQ(*v[i], i);
  v.resize(10);
  v.shrink_to_fit();
  EXPECT_LT(v.capacity() * sizeof(Slot), detail::PageAllocator<Slot>::kMapFrom);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(*v[i], i);
  EXPECT_EQ(v[9].use_count(), 1);  // moved, not copied, across every block
}

}  // namespace
}  // namespace lockwatch::testing
