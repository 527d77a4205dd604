// The kinds of lock (lockwatch/lock_kind.hpp) as a store keeps them, on
// the memory:// space's state: read-write locks and leased semaphores.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "store/memory/memory_space.hpp"

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
  ASSERT_EQ(s.release(ref("w1", LockKind::exclusive()), true), Released::kYes);
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

}  // namespace
}  // namespace lockwatch::testing
