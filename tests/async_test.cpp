// The handler path without Asio, on an in-memory store: Runtime::async_acquire
// (once, off the calling thread, error codes, cancellable, no lock leaked
// by a cancel racing the grant), LockHandle::release with a handler,
// Lease::on_lost, and lockwatch::mutex under the standard lock types.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "memory_runtime.hpp"

namespace lockwatch::testing {
namespace {

// What a handler was called with, and where.
struct Outcome {
  std::error_code error;
  LockHandle handle;
  std::thread::id thread;
};

// A handler that counts its calls and hands the first outcome to a future.
struct Recorder {
  std::shared_ptr<std::promise<Outcome>> promise = std::make_shared<std::promise<Outcome>>();
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  std::future<Outcome> future = promise->get_future();

  AcquireHandler handler() {
    return [p = promise, calls = calls](std::error_code e, LockHandle h) {
      if (calls->fetch_add(1) == 0) p->set_value(Outcome{e, std::move(h), std::this_thread::get_id()});
    };
  }
};

class AsyncTest : public ::testing::Test {
 protected:
  void SetUp() override { rt_ = memory_runtime(backend_, script_, memory_options()); }
  void TearDown() override { rt_.reset(); }

  // Waits (bounded) until nothing holds `key` in the store and the runtime
  // holds no lease: a cancelled or given-back lock is released a round
  // trip after its handler ran.
  bool nothing_held(const std::string& key) {
    auto until = std::chrono::steady_clock::now() + kBound;
    while (std::chrono::steady_clock::now() < until) {
      if (!backend_->owner(memory_name(key)) && rt_->held_leases() == 0 && rt_->stats().held_leases == 0) return true;
      std::this_thread::sleep_for(1ms);  // polling the store, which has no event for this
    }
    return false;
  }

  // Waits (bounded) until an acquisition asked for now is answered: the
  // runtime has then dealt with every request made before it (its I/O
  // thread takes them in order), a cancelled one's attempt included, whose
  // lock may be on its way back to the store.
  bool caught_up() {
    Recorder r;
    rt_->async_acquire({.key = "caught-up", .ttl = 1s, .retries = forever, .wait = 0ms}, r.handler());
    if (r.future.wait_for(kBound) != std::future_status::ready) return false;
    Outcome o = r.future.get();
    if (o.handle) {
      auto released = o.handle.release();
      get_bounded(released);
    }
    return true;
  }

  std::shared_ptr<MemoryBackend> backend_ = std::make_shared<MemoryBackend>();
  std::shared_ptr<StoreScript> script_ = std::make_shared<StoreScript>();
  std::unique_ptr<Runtime> rt_;
};

TEST_F(AsyncTest, HandlerGetsTheHandleOnceOffTheCallingThread) {
  Recorder r;
  auto ticket = rt_->async_acquire({.key = "h", .ttl = 1s, .retries = forever, .wait = 0ms}, r.handler());
  ASSERT_EQ(r.future.wait_for(kBound), std::future_status::ready);
  Outcome o = r.future.get();
  EXPECT_FALSE(o.error);
  ASSERT_TRUE(o.handle);
  EXPECT_NE(o.thread, std::this_thread::get_id());
  EXPECT_EQ(o.handle.lease().key(), "h");
  EXPECT_TRUE(backend_->owner(memory_name("h")));
  EXPECT_FALSE(ticket.cancel());  // completed: nothing to cancel
  auto released = o.handle.release();
  get_bounded(released);
  rt_.reset();  // the notifier is joined: every handler that was going to run ran
  EXPECT_EQ(r.calls->load(), 1);
}

TEST_F(AsyncTest, HandlerNeverRunsInsideTheCall) {
  // The handler blocks until the call returned: if it ran inside the
  // call, on this thread, the call would never return and the bound fails.
  std::promise<void> returned;
  std::shared_future<void> call_returned = returned.get_future().share();
  std::promise<bool> waited;
  auto ok = waited.get_future();
  rt_->async_acquire({.key = "inline", .ttl = 1s, .retries = forever, .wait = 0ms}, [call_returned, &waited](std::error_code, LockHandle) {
    waited.set_value(call_returned.wait_for(kBound) == std::future_status::ready);
  });
  returned.set_value();
  ASSERT_EQ(ok.wait_for(kBound), std::future_status::ready);
  EXPECT_TRUE(ok.get());
}

TEST_F(AsyncTest, ErrorsReachTheHandlerAsErrorCodes) {
  auto held = rt_->acquire("busy", 5s);
  auto h = get_bounded(held);
  Recorder r;
  rt_->async_acquire({.key = "busy", .ttl = 1s, .retries = forever, .wait = 0ms}, r.handler());
  ASSERT_EQ(r.future.wait_for(kBound), std::future_status::ready);
  Outcome o = r.future.get();
  EXPECT_EQ(o.error, errc::busy);
  EXPECT_EQ(o.error.category(), error_category());
  EXPECT_FALSE(o.handle);
  // The empty handle says more than the code: the typed exception.
  ASSERT_TRUE(o.handle.failure());
  try {
    std::rethrow_exception(o.handle.failure());
  } catch (const LockNotAcquired& e) {
    EXPECT_EQ(e.key(), "busy");
    EXPECT_EQ(e.code(), o.error);
  } catch (...) {
    ADD_FAILURE() << "not LockNotAcquired";
  }
  EXPECT_FALSE(h.failure());  // a held lock's handle failed at nothing

  // A bad request reaches the handler (once, off this thread), never as
  // an exception: nothing starts, and the ticket is empty.
  for (LockRequest bad : {LockRequest{.key = "", .ttl = 1s}, LockRequest{.key = "k", .ttl = 0ms},
                          LockRequest{.key = "k", .ttl = 1s, .wait = -1ms},
                          LockRequest{.key = "k", .ttl = 1s, .kind = LockKind::permits(0)}}) {
    Recorder refused;
    AcquireTicket ticket;
    EXPECT_NO_THROW(ticket = rt_->async_acquire(bad, refused.handler()));
    EXPECT_FALSE(ticket);
    ASSERT_EQ(refused.future.wait_for(kBound), std::future_status::ready);
    Outcome o = refused.future.get();
    EXPECT_EQ(o.error, errc::invalid_argument) << o.error.message();
    EXPECT_NE(o.thread, std::this_thread::get_id());
    EXPECT_FALSE(o.handle);
    EXPECT_THROW(std::rethrow_exception(o.handle.failure()), InvalidArgument);
  }
  // Only an empty handler, which nothing could tell, is thrown.
  EXPECT_THROW(rt_->async_acquire({.key = "k", .ttl = 1s}, AcquireHandler()), InvalidArgument);

}

// Work of one's own under a lock (locked_work.hpp): where it runs, what it
// sees, and when it learns the outcome.
struct RecordedWork final : LockedWork {
  std::function<void()> body;
  std::thread::id ran_on;
  std::string lease_key;  // this_lease() as run() saw it
  std::promise<std::exception_ptr> finished;
  std::atomic<int> finishes{0};

  void run() noexcept override {
    ran_on = std::this_thread::get_id();
    lease_key = this_lease().key();
    if (body) body();
  }
  void finish(std::exception_ptr error) noexcept override {
    if (finishes.fetch_add(1) == 0) finished.set_value(error);
  }
};

TEST_F(AsyncTest, WorkRunsOnThePoolUnderItsLeaseAndFinishesOnceReleased) {
  auto work = std::make_shared<RecordedWork>();
  bool held_while_running = false;
  work->body = [&] { held_while_running = backend_->owner(memory_name("w")).has_value(); };
  auto done = work->finished.get_future();
  rt_->async_acquire({.key = "w", .ttl = 1s}, work);
  ASSERT_EQ(done.wait_for(kBound), std::future_status::ready);
  EXPECT_FALSE(done.get());
  EXPECT_NE(work->ran_on, std::this_thread::get_id());
  EXPECT_EQ(work->lease_key, "w");
  EXPECT_TRUE(held_while_running);
  EXPECT_FALSE(backend_->owner(memory_name("w")));  // released before finish()
  EXPECT_EQ(work->finishes.load(), 1);
}

TEST_F(AsyncTest, WorkMadeInsideALockedCallRunsThereAndReturnsFinished) {
  // Nested on the key the outer work holds: reentrant, on the same thread,
  // finished when async_acquire returns.
  auto inner = std::make_shared<RecordedWork>();
  auto outer = std::make_shared<RecordedWork>();
  bool inner_finished_on_return = false;
  outer->body = [&] {
    rt_->async_acquire({.key = "nest", .ttl = 1s}, inner);
    inner_finished_on_return = inner->finishes.load() == 1;
  };
  auto done = outer->finished.get_future();
  rt_->async_acquire({.key = "nest", .ttl = 1s}, outer);
  ASSERT_EQ(done.wait_for(kBound), std::future_status::ready);
  EXPECT_FALSE(done.get());
  EXPECT_TRUE(inner_finished_on_return);
  EXPECT_EQ(inner->ran_on, outer->ran_on);
  EXPECT_EQ(inner->lease_key, "nest");
}

TEST_F(AsyncTest, WorkLearnsABusyLockOrABadRequestThroughFinish) {
  auto held = rt_->acquire("taken", 5s);
  auto h = get_bounded(held);
  auto busy = std::make_shared<RecordedWork>();
  auto done = busy->finished.get_future();
  rt_->async_acquire({.key = "taken", .ttl = 1s}, busy);
  ASSERT_EQ(done.wait_for(kBound), std::future_status::ready);
  EXPECT_THROW(std::rethrow_exception(done.get()), LockNotAcquired);
  EXPECT_EQ(busy->ran_on, std::thread::id());  // never ran

  // A bad request finishes the work before async_acquire returns.
  auto bad = std::make_shared<RecordedWork>();
  auto refused = bad->finished.get_future();
  EXPECT_NO_THROW(rt_->async_acquire({.key = "", .ttl = 1s}, bad));
  ASSERT_EQ(refused.wait_for(0s), std::future_status::ready);
  EXPECT_THROW(std::rethrow_exception(refused.get()), InvalidArgument);
  EXPECT_THROW(rt_->async_acquire({.key = "k", .ttl = 1s}, std::shared_ptr<LockedWork>()), InvalidArgument);
}

TEST_F(AsyncTest, CancelEndsAPendingWaitAndTheWaiterNeverTakesTheLock) {
  auto held = rt_->acquire("wait", 5s);
  auto h = get_bounded(held);
  Recorder r;
  auto ticket = rt_->async_acquire({.key = "wait", .ttl = 1s, .retries = forever, .wait = 10s}, r.handler());
  ASSERT_TRUE(script_->wait_for(Op::kAcquire, 2));  // the waiter asked once and sleeps
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(ticket.cancel());
  EXPECT_FALSE(ticket.cancel());  // only the first wins
  ASSERT_EQ(r.future.wait_for(kBound), std::future_status::ready);
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 1000ms);  // not the 10 s wait
  Outcome o = r.future.get();
  EXPECT_EQ(o.error, errc::cancelled);
  EXPECT_EQ(o.error, std::errc::operation_canceled);  // as any cancelled operation
  EXPECT_FALSE(o.handle);
  // The holder's release wakes nobody: the cancelled waiter left the queue.
  // The cancel completed the handler on this thread and took the waiter out
  // on the loop, where a retry of its may have run first: a call on another
  // key, posted after the cancel, ends only after the waiter is gone.
  auto later = rt_->acquire("other", 1s);
  auto later_released = get_bounded(later).release();
  get_bounded(later_released);
  auto attempts = script_->count(Op::kAcquire);
  auto released = h.release();
  get_bounded(released);
  EXPECT_TRUE(nothing_held("wait"));
  EXPECT_EQ(script_->count(Op::kAcquire), attempts);
  rt_.reset();
  EXPECT_EQ(r.calls->load(), 1);
}

TEST_F(AsyncTest, CancelWhileTheGrantIsInFlightGivesTheLockBack) {
  // The store takes the lock, but its answer comes 50 ms later: the cancel
  // wins, and the lock granted meanwhile is released, never handed out.
  for (auto wait : {0ms, 5000ms}) {
    script_->set_delay(Op::kAcquire, 50ms);
    Recorder r;
    auto before = script_->count(Op::kAcquire);
    auto ticket = rt_->async_acquire({.key = "race", .ttl = 1s, .retries = forever, .wait = wait}, r.handler());
    ASSERT_TRUE(script_->wait_for(Op::kAcquire, before + 1));
    EXPECT_TRUE(ticket.cancel());
    ASSERT_EQ(r.future.wait_for(kBound), std::future_status::ready);
    Outcome o = r.future.get();
    EXPECT_EQ(o.error, errc::cancelled) << "wait " << wait.count();
    EXPECT_FALSE(o.handle);
    script_->set_delay(Op::kAcquire, 0ms);
    EXPECT_TRUE(nothing_held("race")) << "wait " << wait.count();
  }
}

TEST_F(AsyncTest, CancelRacingTheGrantEitherWinsOrDeliversTheHandleNeverBoth) {
  // Cancels from this thread while the loop grants: each acquisition ends
  // exactly once, as a handle or as Cancelled, and no lock stays held.
  int handles = 0, cancelled = 0;
  for (int i = 0; i < 300; ++i) {
    Recorder r;
    const std::string key = "race" + std::to_string(i % 3);
    auto ticket = rt_->async_acquire({.key = key, .ttl = 1s, .retries = forever, .wait = (i % 2) ? 1s : 0ms}, r.handler());
    if (i % 5 != 0) std::this_thread::yield();
    bool won = ticket.cancel();
    ASSERT_EQ(r.future.wait_for(kBound), std::future_status::ready);
    Outcome o = r.future.get();
    if (won) {
      EXPECT_EQ(o.error, errc::cancelled);
      EXPECT_FALSE(o.handle);
      ++cancelled;
      // Given back before the key's next round. The attempt may not have
      // reached the store yet (nothing held so far): once a later request
      // is answered, it has.
      ASSERT_TRUE(caught_up());
      ASSERT_TRUE(nothing_held(key));
    } else {
      EXPECT_FALSE(o.error) << o.error.message() << " (round " << i << ")";
      ASSERT_TRUE(o.handle);
      ++handles;
      auto released = o.handle.release();  // before the key's next round
      get_bounded(released);
    }
  }
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(nothing_held("race" + std::to_string(k)));
  EXPECT_EQ(handles + cancelled, 300);
}

TEST_F(AsyncTest, ReleaseWithAHandlerReportsTheOutcome) {
  auto f = rt_->acquire("rel", 1s);
  auto h = get_bounded(f);
  std::promise<std::pair<std::error_code, std::thread::id>> done;
  auto result = done.get_future();
  h.release([&done](std::error_code e) { done.set_value({e, std::this_thread::get_id()}); });
  EXPECT_FALSE(h);
  ASSERT_EQ(result.wait_for(kBound), std::future_status::ready);
  auto [error, thread] = result.get();
  EXPECT_FALSE(error);
  EXPECT_NE(thread, std::this_thread::get_id());
  EXPECT_FALSE(backend_->owner(memory_name("rel")));
  EXPECT_THROW(h.release([](std::error_code) {}), InvalidArgument);

  // A lease lost while held: LeaseLost.
  auto g = rt_->acquire("rel2", 200ms);
  auto h2 = get_bounded(g);
  backend_->erase(memory_name("rel2"));
  ASSERT_TRUE(stopped_within_bound(h2.lease().stop_token()));
  std::promise<std::error_code> lost;
  auto lost_result = lost.get_future();
  h2.release([&lost](std::error_code e) { lost.set_value(e); });
  ASSERT_EQ(lost_result.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(lost_result.get(), errc::lease_lost);
}

TEST_F(AsyncTest, OnLostTellsTheReasonOrThatTheLeaseWasReleased) {
  auto f = rt_->acquire("watched", 200ms);
  auto h = get_bounded(f);
  std::promise<std::optional<LostReason>> told;
  auto reason = told.get_future();
  auto watch = h.lease().on_lost([&told](std::optional<LostReason> r) { told.set_value(r); });
  std::atomic<int> cancelled_calls{0};
  auto cancelled_watch = h.lease().on_lost([&](std::optional<LostReason>) { ++cancelled_calls; });
  EXPECT_TRUE(cancelled_watch.cancel());
  EXPECT_EQ(reason.wait_for(300ms), std::future_status::timeout);  // renewed meanwhile: not lost
  backend_->erase(memory_name("watched"));
  ASSERT_EQ(reason.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(reason.get(), LostReason::kRemoved);
  EXPECT_FALSE(watch.cancel());  // told already
  // Asked after the loss: told at once, with the reason.
  std::promise<std::optional<LostReason>> late;
  auto late_reason = late.get_future();
  h.lease().on_lost([&late](std::optional<LostReason> r) { late.set_value(r); });
  ASSERT_EQ(late_reason.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(late_reason.get(), LostReason::kRemoved);

  // Released while held: std::nullopt.
  auto g = rt_->acquire("watched2", 1s);
  auto h2 = get_bounded(g);
  std::promise<std::optional<LostReason>> ended;
  auto end = ended.get_future();
  h2.lease().on_lost([&ended](std::optional<LostReason> r) { ended.set_value(r); });
  auto released = h2.release();
  get_bounded(released);
  ASSERT_EQ(end.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(end.get(), std::nullopt);
  rt_.reset();
  EXPECT_EQ(cancelled_calls.load(), 0);
}

TEST_F(AsyncTest, HandlersOfAHandleOutlivingItsRuntimeStillRunOnceOffTheCallingThread) {
  auto f = rt_->acquire("outlived", 30s);
  auto h = get_bounded(f);
  rt_.reset();  // releases the key; the handle reads lost from now on
  std::promise<std::pair<std::optional<LostReason>, std::thread::id>> told;
  auto reason = told.get_future();
  h.lease().on_lost([&told](std::optional<LostReason> r) { told.set_value({r, std::this_thread::get_id()}); });
  ASSERT_EQ(reason.wait_for(kBound), std::future_status::ready);
  auto [why, where] = reason.get();
  EXPECT_EQ(why, LostReason::kRuntimeStopped);
  EXPECT_NE(where, std::this_thread::get_id());
  std::promise<std::error_code> released;
  auto result = released.get_future();
  h.release([&released](std::error_code e) { released.set_value(e); });
  ASSERT_EQ(result.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(result.get(), errc::lease_lost);
}

// ------------------------------------------------------------ the mutex

TEST_F(AsyncTest, MutexWorksWithUniqueLockAndScopedLock) {
  lockwatch::mutex a(*rt_, "m:a", 1s);
  lockwatch::mutex b(*rt_, "m:b", 1s);
  {
    std::unique_lock lk(a);
    EXPECT_TRUE(lk.owns_lock());
    EXPECT_TRUE(a.locked());
    EXPECT_TRUE(backend_->owner(memory_name("m:a")));
    EXPECT_GT(a.lease().fencing_token(), 0u);
  }
  EXPECT_FALSE(a.locked());
  EXPECT_THROW((void)a.lease(), NoActiveLease);
  {
    std::scoped_lock both(a, b);
    EXPECT_TRUE(a.locked());
    EXPECT_TRUE(b.locked());
  }
  EXPECT_TRUE(nothing_held("m:a"));
  EXPECT_TRUE(nothing_held("m:b"));
}

TEST_F(AsyncTest, MutexTryLockOnABusyLockIsFalseNotAnError) {
  lockwatch::mutex holder(*rt_, "m:busy", 2s);
  lockwatch::mutex other(*rt_, "m:busy", 2s);
  holder.lock();
  EXPECT_FALSE(other.try_lock());
  std::unique_lock lk(other, std::try_to_lock);
  EXPECT_FALSE(lk.owns_lock());
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(other.try_lock_for(100ms));
  EXPECT_GE(ms_between(t0, std::chrono::steady_clock::now()), 95ms);
  // try_lock_for is woken by the release, long before its bound.
  std::thread releaser([&] {
    std::this_thread::sleep_for(50ms);  // the release comes while the other waits
    holder.unlock();
  });
  t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(other.try_lock_for(10s));
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 5s);
  releaser.join();
  other.unlock();
}

TEST_F(AsyncTest, MutexIsALeaseNotAThreadsLock) {
  lockwatch::mutex m(*rt_, "m:lease", 1s);
  m.lock();
  std::thread([&] { m.unlock(); }).join();  // unlocked from another thread
  EXPECT_TRUE(nothing_held("m:lease"));
  EXPECT_TRUE(m.try_lock());
  m.unlock();
}

TEST_F(AsyncTest, MutexGivesExactCountsUnderContention) {
  // Four threads, each with its own mutex on one key, make racy
  // read-yield-write increments: none is lost.
  constexpr int kThreads = 4, kEach = 40;
  int counter = 0;  // guarded by the distributed lock only
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      lockwatch::mutex m(*rt_, "m:count", 2s);
      for (int i = 0; i < kEach; ++i) {
        std::lock_guard lk(m);
        int v = counter;
        std::this_thread::yield();
        counter = v + 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, kThreads * kEach);
}

}  // namespace
}  // namespace lockwatch::testing
