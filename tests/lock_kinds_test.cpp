// The kinds of lock (lockwatch/lock_kind.hpp): as a store keeps them, on
// the memory:// space's state (read-write locks and leased semaphores), and
// as a runtime on memory:// takes, waits for, renews and releases them
// (Runtime::acquire with a kind, LOCKED(...).shared() and .permits(n)). The
// same guarantees on every store: store_contract_test.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "lockwatch/lockwatch.hpp"
#include "store/memory/memory_space.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

using namespace std::chrono_literals;
using detail::Acquired;
using detail::LockRef;
using detail::Released;
using detail::Renewed;
using State = detail::MemorySpace::State;

LockRef ref(const char* token, LockKind kind, std::chrono::milliseconds ttl = 10s) {
  return LockRef{"k", token, "", ttl, kind};
}

TEST(LockKindsTest, ReadersShareAKeyAndAWriterWaitsForTheLast) {
  State s;
  auto r1 = s.acquire(ref("r1", LockKind::shared()));
  auto r2 = s.acquire(ref("r2", LockKind::shared()));
  EXPECT_EQ(r1.status, Acquired::Status::kTaken);
  EXPECT_EQ(r2.status, Acquired::Status::kTaken);
  auto w = s.acquire(ref("w", LockKind::exclusive()));
  EXPECT_EQ(w.status, Acquired::Status::kBusy);
  EXPECT_GT(w.busy_for, 0ms);
  EXPECT_EQ(s.release(ref("r1", LockKind::shared()), true), Released::kYes);
  EXPECT_EQ(s.acquire(ref("w", LockKind::exclusive())).status, Acquired::Status::kBusy);
  EXPECT_EQ(s.release(ref("r2", LockKind::shared()), true), Released::kYes);
  EXPECT_EQ(s.acquire(ref("w", LockKind::exclusive())).status, Acquired::Status::kTaken);
  // A writer holds it: no reader.
  EXPECT_EQ(s.acquire(ref("r3", LockKind::shared())).status, Acquired::Status::kBusy);
}

TEST(LockKindsTest, AWaitingWriterStopsNewReadersButNotTheOnesHoldingIt) {
  State s;
  ASSERT_EQ(s.acquire(ref("r1", LockKind::shared())).status, Acquired::Status::kTaken);
  EXPECT_EQ(s.acquire(ref("w", LockKind::exclusive())).status, Acquired::Status::kBusy);
  EXPECT_EQ(s.acquire(ref("r2", LockKind::shared())).status, Acquired::Status::kBusy) << "writer starved";
  // The reader that holds it keeps renewing.
  EXPECT_EQ(s.renew(ref("r1", LockKind::shared())), Renewed::kYes);
}

TEST(LockKindsTest, ReadersSeeTheLastWritersTokenAndWritersRaiseIt) {
  State s;
  auto w1 = s.acquire(ref("w1", LockKind::exclusive()));
  ASSERT_EQ(w1.status, Acquired::Status::kTaken);
  ASSERT_EQ(s.release(ref("w1", LockKind::exclusive()), true), Released::kYesUnheard);
  auto r = s.acquire(ref("r", LockKind::shared()));
  ASSERT_EQ(r.status, Acquired::Status::kTaken);
  EXPECT_EQ(r.fence, w1.fence);
  ASSERT_EQ(s.release(ref("r", LockKind::shared()), true), Released::kYes);
  auto w2 = s.acquire(ref("w2", LockKind::exclusive()));
  ASSERT_EQ(w2.status, Acquired::Status::kTaken);
  EXPECT_GT(w2.fence, w1.fence);
}

TEST(LockKindsTest, ASemaphoreAdmitsNHoldersEachWithARisingToken) {
  State s;
  std::uint64_t last = 0;
  for (const char* t : {"a", "b", "c"}) {
    auto got = s.acquire(ref(t, LockKind::permits(3)));
    ASSERT_EQ(got.status, Acquired::Status::kTaken) << t;
    EXPECT_GT(got.fence, last);
    last = got.fence;
  }
  EXPECT_EQ(s.acquire(ref("d", LockKind::permits(3))).status, Acquired::Status::kBusy);
  EXPECT_EQ(s.release(ref("b", LockKind::permits(3)), true), Released::kYes);
  EXPECT_EQ(s.acquire(ref("d", LockKind::permits(3))).status, Acquired::Status::kTaken);
  EXPECT_EQ(s.renew(ref("b", LockKind::permits(3))), Renewed::kGone);
}

TEST(LockKindsTest, CallersThatDisagreeOnTheKindFailAndNothingIsOverAdmitted) {
  State s;
  ASSERT_EQ(s.acquire(ref("a", LockKind::permits(1))).status, Acquired::Status::kTaken);
  auto more = s.acquire(ref("b", LockKind::permits(5)));
  EXPECT_EQ(more.status, Acquired::Status::kFailed);
  EXPECT_EQ(more.error.kind, detail::StoreError::Kind::kInvalid);
  EXPECT_NE(more.error.message.find("1 permit"), std::string::npos) << more.error.message;
  EXPECT_EQ(s.acquire(ref("c", LockKind::exclusive())).status, Acquired::Status::kFailed);
  EXPECT_EQ(s.acquire(ref("d", LockKind::shared())).status, Acquired::Status::kFailed);
  // Once the last permit is gone the key is free for any kind.
  ASSERT_EQ(s.release(ref("a", LockKind::permits(1)), true), Released::kYes);
  EXPECT_EQ(s.acquire(ref("c", LockKind::exclusive())).status, Acquired::Status::kTaken);
  EXPECT_EQ(s.acquire(ref("e", LockKind::permits(2))).status, Acquired::Status::kFailed);
}

TEST(LockKindsTest, ADeadHoldersPermitComesBackAfterItsTtl) {
  State s;
  ASSERT_EQ(s.acquire(ref("dead", LockKind::permits(1), 50ms)).status, Acquired::Status::kTaken);
  auto busy = s.acquire(ref("next", LockKind::permits(1)));
  ASSERT_EQ(busy.status, Acquired::Status::kBusy);
  EXPECT_LE(busy.busy_for, 50ms);
  // The store's own clock decides: wait out the holder's ttl, as a waiter would.
  std::this_thread::sleep_for(busy.busy_for + 5ms);
  EXPECT_EQ(s.acquire(ref("next", LockKind::permits(1))).status, Acquired::Status::kTaken);
  EXPECT_EQ(s.renew(ref("dead", LockKind::permits(1))), Renewed::kGone);
}

TEST(LockKindsTest, ARetriedAcquireOfAHolderIsTheSameGrant) {
  State s;
  auto first = s.acquire(ref("a", LockKind::permits(2)));
  auto again = s.acquire(ref("a", LockKind::permits(2)));
  ASSERT_EQ(again.status, Acquired::Status::kTaken);
  EXPECT_EQ(again.fence, first.fence);
  EXPECT_EQ(s.acquire(ref("b", LockKind::permits(2))).status, Acquired::Status::kTaken);
  EXPECT_EQ(s.acquire(ref("c", LockKind::permits(2))).status, Acquired::Status::kBusy);
}

TEST(LockKindsTest, InspectAndForceReleaseSeeEveryHolder) {
  State s;
  ASSERT_EQ(s.acquire(ref("r1", LockKind::shared())).status, Acquired::Status::kTaken);
  EXPECT_TRUE(s.inspect("k").held);
  EXPECT_TRUE(s.force_release("k"));
  EXPECT_FALSE(s.inspect("k").held);
  EXPECT_EQ(s.renew(ref("r1", LockKind::shared())), Renewed::kGone);
}

TEST(LockKindsTest, AFairLockGoesToItsWaitersInArrivalOrderWithRisingTokens) {
  State s;
  auto held = s.acquire(ref("h", LockKind::fair()));
  ASSERT_EQ(held.status, Acquired::Status::kTaken);
  for (const char* w : {"w1", "w2", "w3"}) {
    auto busy = s.acquire(ref(w, LockKind::fair(), 9s));
    ASSERT_EQ(busy.status, Acquired::Status::kBusy);
    EXPECT_LE(busy.busy_for, 3s);  // a third of the ttl: its next attempt keeps its place
  }
  ASSERT_EQ(s.release(ref("h", LockKind::fair()), true), Released::kYes);
  // Free now, but only for the first waiter.
  EXPECT_EQ(s.acquire(ref("w3", LockKind::fair())).status, Acquired::Status::kBusy);
  EXPECT_EQ(s.acquire(ref("w2", LockKind::fair())).status, Acquired::Status::kBusy);
  auto first = s.acquire(ref("w1", LockKind::fair()));
  ASSERT_EQ(first.status, Acquired::Status::kTaken);
  EXPECT_GT(first.fence, held.fence);
  EXPECT_EQ(s.acquire(ref("w1", LockKind::fair())).fence, first.fence);  // a retry: the same grant
  ASSERT_EQ(s.release(ref("w1", LockKind::fair()), true), Released::kYes);
  auto second = s.acquire(ref("w2", LockKind::fair()));
  ASSERT_EQ(second.status, Acquired::Status::kTaken);
  EXPECT_GT(second.fence, first.fence);
}

TEST(LockKindsTest, AFairWaiterThatWithdrawsOrStopsAttemptingLeavesTheQueue) {
  State s;
  ASSERT_EQ(s.acquire(ref("h", LockKind::fair())).status, Acquired::Status::kTaken);
  ASSERT_EQ(s.acquire(ref("gives-up", LockKind::fair())).status, Acquired::Status::kBusy);
  ASSERT_EQ(s.acquire(ref("dies", LockKind::fair(), 50ms)).status, Acquired::Status::kBusy);
  ASSERT_EQ(s.acquire(ref("last", LockKind::fair())).status, Acquired::Status::kBusy);
  s.withdraw(ref("gives-up", LockKind::fair()));
  ASSERT_EQ(s.release(ref("h", LockKind::fair()), true), Released::kYes);
  // "dies" is first and never comes: its place runs out 50 ms after its
  // attempt, on the store's clock; the waiter behind it is told so.
  auto busy = s.acquire(ref("last", LockKind::fair()));
  ASSERT_EQ(busy.status, Acquired::Status::kBusy);
  EXPECT_LE(busy.busy_for, 50ms);
  std::this_thread::sleep_for(busy.busy_for + 5ms);
  EXPECT_EQ(s.acquire(ref("last", LockKind::fair())).status, Acquired::Status::kTaken);
}

TEST(LockKindsTest, AKeyIsFairOrAnotherKindNeverBoth) {
  State s;
  ASSERT_EQ(s.acquire(ref("f", LockKind::fair())).status, Acquired::Status::kTaken);
  for (LockKind other : {LockKind::exclusive(), LockKind::shared(), LockKind::permits(2)}) {
    auto refused = s.acquire(ref("o", other));
    EXPECT_EQ(refused.status, Acquired::Status::kFailed) << other.describe();
    EXPECT_EQ(refused.error.kind, detail::StoreError::Kind::kInvalid) << other.describe();
  }
  ASSERT_EQ(s.release(ref("f", LockKind::fair()), true), Released::kYes);
  ASSERT_EQ(s.acquire(ref("r", LockKind::shared())).status, Acquired::Status::kTaken);
  EXPECT_EQ(s.acquire(ref("f", LockKind::fair())).status, Acquired::Status::kFailed);
}

// ------------------------------------------------------------ the runtime

Options space(const std::string& name) {
  Options o;
  o.redis_url = "memory://" + name;
  o.runtime.threads = 4;
  return o;
}

template <class T>
bool ready(std::future<T>& f) {
  return f.wait_for(0s) == std::future_status::ready;
}

TEST(LockKindsRuntimeTest, SharedCallsRunTogetherAndAnExclusiveOneAlone) {
  Runtime rt(space("rw-overlap"));
  constexpr int kReaders = 3;
  Rendezvous together(kReaders);
  std::atomic<int> readers{0};
  std::atomic<bool> writer_saw_reader{false};
  auto read = LOCKED("doc", 5s, forever, .shared().wait(kBound).on(rt))[&] {
    readers.fetch_add(1);
    bool met = together.arrive();
    readers.fetch_sub(1);
    return met;
  };
  auto write = lockwatch::locked("doc", 5s, forever).on(rt).wait(kBound)([&] {
    if (readers.load() != 0) writer_saw_reader = true;
  });
  std::vector<std::future<bool>> reads;
  for (int i = 0; i < kReaders; ++i) reads.push_back(read());
  auto w = write();
  for (auto& f : reads) EXPECT_TRUE(get_bounded(f)) << "the readers were never inside together";
  get_bounded(w);
  EXPECT_FALSE(writer_saw_reader);
}

// Tries a shared lock of `key` without waiting, until one is refused (a
// writer's wait stops new readers), bounded; a lock it gets is given back.
bool readers_stopped(Runtime& rt, const std::string& key) {
  const auto until = std::chrono::steady_clock::now() + kBound;
  while (std::chrono::steady_clock::now() < until) {
    auto f = rt.acquire({.key = key, .ttl = 5s, .retries = forever, .wait = 0ms, .kind = LockKind::shared()});
    if (f.wait_for(kBound) != std::future_status::ready) return false;
    try {
      LockHandle h = f.get();
      give_back(h);
    } catch (const LockNotAcquired&) {
      return true;
    }
  }
  return false;
}

TEST(LockKindsRuntimeTest, AWaitingWriterGoesBeforeReadersThatCameAfterIt) {
  Runtime rt(space("rw-order")), other(space("rw-order"));
  auto first = rt.acquire({.key = "doc", .ttl = 5s, .kind = LockKind::shared()});
  LockHandle reader = get_bounded(first);
  // A writer in another runtime of the space waits; once its attempt has
  // reached the store, new readers wait behind it.
  auto writer = other.acquire({.key = "doc", .ttl = 5s, .retries = forever, .wait = kBound, .kind = LockKind::exclusive()});
  ASSERT_TRUE(readers_stopped(rt, "doc"));
  auto later = rt.acquire({.key = "doc", .ttl = 5s, .retries = forever, .wait = kBound, .kind = LockKind::shared()});
  give_back(reader);
  // Had the later reader gone in first, the writer would still wait.
  LockHandle w = get_bounded(writer);
  EXPECT_FALSE(ready(later)) << "a reader went in beside the writer";
  const auto token = w.lease().fencing_token();
  give_back(w);
  LockHandle r = get_bounded(later);
  EXPECT_EQ(r.lease().fencing_token(), token) << "readers see the last writer's token";
  give_back(r);
}

TEST(LockKindsRuntimeTest, LocalReadersGoInTogetherAndALocalWriterWaitsForThemAll) {
  // All in one runtime: its wait queue lets readers in side by side, and a
  // writer queued behind them waits for the last.
  Runtime rt(space("rw-local"));
  auto r1 = rt.acquire({.key = "doc", .ttl = 5s, .retries = forever, .wait = kBound, .kind = LockKind::shared()});
  auto r2 = rt.acquire({.key = "doc", .ttl = 5s, .retries = forever, .wait = kBound, .kind = LockKind::shared()});
  LockHandle a = get_bounded(r1), b = get_bounded(r2);
  auto w = rt.acquire({.key = "doc", .ttl = 5s, .retries = forever, .wait = kBound, .kind = LockKind::exclusive()});
  auto r3 = rt.acquire({.key = "doc", .ttl = 5s, .retries = forever, .wait = kBound, .kind = LockKind::shared()});
  give_back(a);
  EXPECT_EQ(w.wait_for(50ms), std::future_status::timeout) << "a writer beside a reader";
  give_back(b);
  LockHandle writer = get_bounded(w);
  EXPECT_FALSE(ready(r3));
  give_back(writer);
  LockHandle c = get_bounded(r3);
  give_back(c);
}

TEST(LockKindsRuntimeTest, ASharedLeaseIsRenewedLikeAnyOther) {
  Runtime rt(space("rw-renew"));
  auto f = rt.acquire({.key = "doc", .ttl = 300ms, .kind = LockKind::shared()});
  LockHandle h = get_bounded(f);
  EXPECT_TRUE(renewed_again(h.lease(), 3));
  auto writer = rt.acquire({.key = "doc", .ttl = 5s, .retries = forever, .wait = 0ms, .kind = LockKind::exclusive()});
  EXPECT_TRUE(error_of<LockNotAcquired>(writer));
  EXPECT_FALSE(h.lease().lost());
  give_back(h);
}

TEST(LockKindsRuntimeTest, PermitsLetNHoldersInAndTheNextWaitsForOneToComeBack) {
  Runtime rt(space("sem"));
  std::vector<LockHandle> held;
  std::uint64_t last = 0;
  for (int i = 0; i < 3; ++i) {
    auto f = rt.acquire({.key = "gpu", .ttl = 5s, .kind = LockKind::permits(3)});
    held.push_back(get_bounded(f));
    EXPECT_GT(held.back().lease().fencing_token(), last) << "each permit's grant raises the token";
    last = held.back().lease().fencing_token();
  }
  auto refused = rt.acquire({.key = "gpu", .ttl = 5s, .retries = forever, .wait = 0ms, .kind = LockKind::permits(3)});
  EXPECT_TRUE(error_of<LockNotAcquired>(refused));
  auto next = rt.acquire({.key = "gpu", .ttl = 5s, .retries = forever, .wait = kBound, .kind = LockKind::permits(3)});
  EXPECT_EQ(next.wait_for(50ms), std::future_status::timeout);
  give_back(held[1]);
  LockHandle got = get_bounded(next);
  give_back(got);
  give_back(held[0]);
  give_back(held[2]);
}

TEST(LockKindsRuntimeTest, ACallerWithAnotherNOrKindGetsInvalidArgumentNeverAnExtraPermit) {
  Runtime rt(space("sem-n"));
  auto f = rt.acquire({.key = "gpu", .ttl = 5s, .kind = LockKind::permits(1)});
  LockHandle one = get_bounded(f);
  auto more = rt.acquire({.key = "gpu", .ttl = 5s, .retries = forever, .wait = 0ms, .kind = LockKind::permits(2)});
  auto e = error_of<InvalidArgument>(more);
  ASSERT_TRUE(e);
  EXPECT_NE(std::string(e->what()).find("1 permit"), std::string::npos) << e->what();
  auto exclusive = rt.acquire({.key = "gpu", .ttl = 5s, .retries = forever, .wait = 0ms});
  EXPECT_TRUE(error_of<InvalidArgument>(exclusive));
  EXPECT_THROW(rt.acquire({.key = "gpu", .ttl = 5s, .kind = LockKind::permits(0)}), InvalidArgument);
  EXPECT_THROW((void)lockwatch::locked("gpu", 5s, 0).permits(0), InvalidArgument);
  give_back(one);
}

TEST(LockKindsRuntimeTest, ACallInsideAHoldingRunsWithinItOnlyIfTheHoldingCoversIt) {
  Runtime rt(space("reentrant"));
  auto write = lockwatch::locked("doc", 5s, forever).on(rt)([&] {
    // Exclusive covers shared: runs inline, on the same lease.
    auto read = LOCKED("doc", 5s, forever, .shared().on(rt))[&] { return this_lease().fencing_token(); };
    auto f = read();
    return get_bounded(f) == this_lease().fencing_token();
  });
  auto w = write();
  EXPECT_TRUE(get_bounded(w));
  auto read = LOCKED("doc", 5s, forever, .shared().on(rt))[&] {
    auto upgrade = lockwatch::locked("doc", 5s, forever).on(rt)([] {});
    auto f = upgrade();
    return static_cast<bool>(error_of<InvalidArgument>(f));
  };
  auto r = read();
  EXPECT_TRUE(get_bounded(r)) << "a writer inside a reader of its own key would wait for itself";
}

}  // namespace
}  // namespace lockwatch::testing
