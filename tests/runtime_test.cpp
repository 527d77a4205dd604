// The runtime's edges on an in-memory store: bounds of the arguments, a
// handle that outlives its runtime, work queued for a worker, and a handle
// and LOCKED on the same key from one thread.
#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <thread>

#include "memory_runtime.hpp"

namespace lockwatch::testing {
namespace {

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { rt_ = memory_runtime(backend_, script_, options_); }
  void TearDown() override { rt_.reset(); }
  void restart(Options o) {
    rt_.reset();
    rt_ = memory_runtime(backend_, script_, std::move(o));
  }

  std::shared_ptr<MemoryBackend> backend_ = std::make_shared<MemoryBackend>();
  std::shared_ptr<StoreScript> script_ = std::make_shared<StoreScript>();
  Options options_ = memory_options();
  std::unique_ptr<Runtime> rt_;
};

// The message names the allowed range.
template <class F>
std::string invalid_argument_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("another error: ") + e.what();
  }
  return "no error";
}

TEST_F(RuntimeTest, AbsurdTtlsAndWaitsAreInvalidArgumentsAtTheCall) {
  const auto huge = std::chrono::milliseconds(std::int64_t{1} << 45);
  for (auto ttl : {huge, std::chrono::milliseconds::max(), max_ttl + 1ms}) {
    auto what = invalid_argument_of([&] { (void)rt_->acquire("k", ttl); });
    EXPECT_NE(what.find("ttl must be 1 .. 604800000 ms"), std::string::npos) << what;
    auto call = locked("k", ttl, 0).on(*rt_)([] { return 1; })();
    auto err = error_of<InvalidArgument>(call);
    ASSERT_TRUE(err);
    EXPECT_NE(std::string(err->what()).find("ttl must be"), std::string::npos) << err->what();
  }
  for (auto wait : {huge, std::chrono::milliseconds::max(), -1ms}) {
    auto what = invalid_argument_of([&] { (void)rt_->acquire({.key = "k", .ttl = 1s, .retries = forever, .wait = wait}); });
    EXPECT_NE(what.find("wait must be 0 .. 604800000 ms"), std::string::npos) << what;
  }
  // The bounds themselves are taken.
  auto f = rt_->acquire({.key = "k", .ttl = max_ttl, .retries = 0, .wait = 0ms});
  auto h = get_bounded(f);
  EXPECT_GT(h.lease().remaining(), max_ttl * 9 / 10);  // less the drift allowance
  auto released = h.release();
  get_bounded(released);
  // And so is a scheduled job's lease, checked as a lock's ttl.
  auto what = invalid_argument_of([&] {
    JobOptions jo;
    jo.lease = huge;
    Scheduler s(*rt_);
    (void)s.every(1s, "absurd", [] {}, jo);
  });
  EXPECT_NE(what.find("ttl must be"), std::string::npos) << what;
}

TEST_F(RuntimeTest, ARequestCarriesItsRenewWeightAndMetricsPattern) {
  for (double w : {-0.5, 1.0, 1.5}) {
    auto what = invalid_argument_of([&] { (void)rt_->acquire({.key = "k", .ttl = 1s, .renew_weight = w}); });
    EXPECT_NE(what.find("weight"), std::string::npos) << what;
  }
  auto f = rt_->acquire({.key = "report:7", .ttl = 1s, .renew_weight = 0.5,
                         .metrics_pattern = MetricsPattern("report:{0}")});
  auto h = get_bounded(f);
  auto released = h.release();
  get_bounded(released);
  const std::string text = rt_->metrics_text();
  EXPECT_NE(text.find("lockwatch_acquire_duration_seconds_count{pattern=\"report:{0}\"} 1"), std::string::npos)
      << text;
  EXPECT_EQ(MetricsPattern().id(), 0);
  EXPECT_EQ(MetricsPattern("report:{0}").id(), MetricsPattern("report:{0}").id());
}

TEST_F(RuntimeTest, AKindTheStoreCannotHoldIsUnsupportedAtTheCallNamingKindAndStore) {
  // This store holds exclusive locks only (StoreTraits' default).
  auto message = [&](auto&& f) -> std::string {
    try {
      f();
    } catch (const Unsupported& e) {
      return e.what();
    }
    return "no Unsupported";
  };
  auto shared = message([&] { (void)rt_->acquire({.key = "k", .ttl = 5s, .kind = LockKind::shared()}); });
  EXPECT_NE(shared.find("shared"), std::string::npos) << shared;
  EXPECT_NE(shared.find("store"), std::string::npos) << shared;
  // The asynchronous form tells its handler, and throws nothing.
  std::promise<std::error_code> refused;
  rt_->async_acquire({.key = "k", .ttl = 5s, .kind = LockKind::permits(3)},
                     [&](std::error_code ec, LockHandle) { refused.set_value(ec); });
  auto permits = refused.get_future();
  ASSERT_EQ(permits.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(permits.get(), errc::unsupported);
  auto call = lockwatch::locked("k", 5s, 0).on(*rt_).shared()([] {});
  auto f = call();
  EXPECT_TRUE(error_of<Unsupported>(f));
  EXPECT_EQ(rt_->held_leases(), 0u);
}

TEST_F(RuntimeTest, AHandleThatOutlivesItsRuntimeReadsLostAndItsReleaseSaysSo) {
  auto f = rt_->acquire("outlived", 30s);
  auto h = get_bounded(f);
  ASSERT_FALSE(h.lease().lost());
  rt_.reset();  // releases the key
  EXPECT_FALSE(backend_->owner(memory_name("outlived")));
  EXPECT_TRUE(h.lease().lost());
  EXPECT_EQ(h.lease().lost_reason(), LostReason::kRuntimeStopped);
  EXPECT_EQ(h.lease().remaining(), 0ms);
  EXPECT_TRUE(h.lease().stop_token().stop_requested());
  // Another runtime takes the key; the old handle still reads lost.
  rt_ = memory_runtime(backend_, script_, options_);
  auto other = rt_->acquire("outlived", 30s);
  auto h2 = get_bounded(other);
  EXPECT_TRUE(h.lease().lost());
  auto released = h.release();
  auto err = error_of<LeaseLost>(released);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->reason(), LostReason::kRuntimeStopped);
  EXPECT_TRUE(backend_->owner(memory_name("outlived")));  // the other holder's, untouched
  auto released2 = h2.release();
  get_bounded(released2);
}

TEST_F(RuntimeTest, TimeQueuedForAWorkerDoesNotEatTheLease) {
  // One worker: the second call's lock is granted at once and its work
  // waits for the first. Its ttl and retries count from its start.
  Options o = memory_options(1);
  restart(o);
  Gate second_started;
  auto first = locked("busy-worker", 500ms, forever).on(*rt_)([] { std::this_thread::sleep_for(700ms); });
  std::atomic<long long> left_at_start{-1};
  auto second = locked("queued", 500ms, 0).on(*rt_)([&] {
    left_at_start = this_lease().remaining().count();
    std::this_thread::sleep_for(300ms);  // the work itself: within its ttl
    return this_lease().lost();
  });
  auto f1 = first();
  auto f2 = second();
  get_bounded(f1);
  EXPECT_FALSE(get_bounded(f2));  // not lost: the wait did not count
  // It started with (nearly) a whole ttl, not what the queue left of one.
  EXPECT_GT(left_at_start.load(), 300) << left_at_start.load();
}

TEST_F(RuntimeTest, RenewalsWhileQueuedDoNotSpendTheRetries) {
  Options o = memory_options(1);
  restart(o);
  auto first = locked("blocker", 300ms, forever).on(*rt_)([] { std::this_thread::sleep_for(900ms); });
  auto second = locked("queued-retries", 300ms, 1).on(*rt_)([] {
    std::this_thread::sleep_for(400ms);  // needs its one renewal
    return std::pair(this_lease().lost(), this_lease().renewals());
  });
  auto f1 = first();
  auto f2 = second();
  get_bounded(f1);
  auto [lost, renewals] = get_bounded(f2);
  EXPECT_FALSE(lost);
  EXPECT_EQ(renewals, 1u);  // the one it was allowed, spent on its work
}

TEST_F(RuntimeTest, ALockedCallBlockingTheOnlyWorkerOnAnotherFailsItInsteadOfDeadlocking) {
  Options o = memory_options(1);
  o.runtime.queue_timeout = 300ms;
  restart(o);
  auto inner = locked("inner", 200ms, forever).on(*rt_)([] { return 1; });
  std::promise<std::shared_future<int>> handed;
  Gate outer_runs;
  auto outer = locked("outer", 200ms, forever).on(*rt_)([&] {
    // Blocks the only worker on a call queued behind it: a deadlock
    // unless the queued call gives up.
    outer_runs.open();
    auto inner_done = handed.get_future().get();
    return inner_done.wait_for(kBound) == std::future_status::ready;
  });
  auto f = outer();
  ASSERT_TRUE(outer_runs.wait());
  std::shared_future<int> shared = inner().share();
  handed.set_value(shared);
  EXPECT_TRUE(get_bounded(f));
  ASSERT_EQ(shared.wait_for(kBound), std::future_status::ready);
  try {
    shared.get();
    ADD_FAILURE() << "the queued call ran";
  } catch (const LeaseLost& e) {
    EXPECT_EQ(e.reason(), LostReason::kNotStarted);
    EXPECT_NE(std::string(e.what()).find("queue_timeout"), std::string::npos) << e.what();
  }
  // Its lock was given back, and the runtime goes on.
  EXPECT_FALSE(backend_->owner(memory_name("inner")));
  auto again = inner();
  EXPECT_EQ(get_bounded(again), 1);
}

// Reentrancy follows the lease, not the thread: a handle taken on a thread
// makes no later, unrelated call on that thread reentrant (in a thread-pool
// server, two requests that land on one worker are two holders). The call
// waits for the handle like any caller, and is granted after its release.
TEST_F(RuntimeTest, AHandleTakenOnAThreadMakesNoLaterCallOnItReentrant) {
  auto f = rt_->acquire("handle-then-locked", 5s);
  auto h = get_bounded(f);
  const auto token = h.lease().fencing_token();
  std::atomic<int> ran{0};
  auto busy = locked("handle-then-locked", 5s, 0).on(*rt_)([&] { return ++ran; })();
  EXPECT_NE(error_of<LockNotAcquired>(busy), nullptr);  // not run inside the handle
  auto waiting = locked("handle-then-locked", 5s, 0).on(*rt_).wait(10s)([&] {
    ++ran;
    return this_lease().fencing_token();
  })();
  auto second_handle = rt_->acquire("handle-then-locked", 5s);  // nor is a second handle
  EXPECT_NE(error_in<LockNotAcquired>(second_handle), nullptr);
  EXPECT_EQ(ran.load(), 0);
  auto released = h.release();
  get_bounded(released);
  EXPECT_GT(get_bounded(waiting), token);  // its own holding, after the handle's
  EXPECT_EQ(ran.load(), 1);
}

// A handle's lease handed over explicitly (LockHandle::enter()) makes the
// calls inside the scope, on that thread, run within the holding; after
// the scope, or on another thread, they wait as any caller.
TEST_F(RuntimeTest, AHandleEnteredOnAThreadMakesTheCallsInsideItsScopeReentrant) {
  auto f = rt_->acquire("entered", 5s);
  auto h = get_bounded(f);
  const auto acquires = script_->count(Op::kAcquire);
  auto token_inside = locked("entered", 5s, 0).on(*rt_)([] { return this_lease().fencing_token(); });
  {
    LeaseScope in = h.enter();
    EXPECT_EQ(&this_lease(), &h.lease());
    auto inside = token_inside();
    EXPECT_EQ(get_bounded(inside), h.lease().fencing_token());
    EXPECT_EQ(script_->count(Op::kAcquire), acquires);  // the store was not asked
    std::future<std::uint64_t> elsewhere;
    std::thread([&] { elsewhere = token_inside(); }).join();
    EXPECT_NE(error_of<LockNotAcquired>(elsewhere), nullptr);  // another thread has no claim
  }
  EXPECT_EQ(current_lease(), nullptr);
  auto after_scope = token_inside();
  EXPECT_NE(error_of<LockNotAcquired>(after_scope), nullptr);
  EXPECT_THROW((void)LockHandle().enter(), InvalidArgument);
}

// A plain callable may take its lease as its first parameter too.
TEST_F(RuntimeTest, ALockedCallableTakingALeaseParameterGetsItsOwnLease) {
  auto work = locked("lease-param:{0}", 5s, forever).on(*rt_)([](const Lease& lease, int n) {
    EXPECT_EQ(&lease, &this_lease());
    return lease.key() + "/" + std::to_string(n);
  });
  auto done = work(3);
  EXPECT_EQ(get_bounded(done), "lease-param:3/3");
}

// A lost lease completes the call at once (the work stops on the lease's
// stop token), not once the release the store does not answer is settled:
// the release goes on in the background. The same for a handle's release.
TEST_F(RuntimeTest, ALostLeaseCompletesTheCallAtOnceWhileTheReleaseGoesOn) {
  script_->set_delay(Op::kRenew, 3s);  // the store stops answering
  script_->set_delay(Op::kRelease, 3s);
  auto t0 = std::chrono::steady_clock::now();
  auto work = locked("lost-at-once", 1s, forever).on(*rt_)([] { return stopped_within_bound(this_lease().stop_token()); })();
  ASSERT_EQ(work.wait_for(kBound), std::future_status::ready);
  auto lost = error_of<LeaseLost>(work);
  ASSERT_NE(lost, nullptr);
  EXPECT_EQ(lost->reason(), LostReason::kStoreUnreachable);
  // The local deadline is 988 ms in; the release's answer would come 3 s
  // after it.
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 2500ms);

  auto f = rt_->acquire("lost-handle", 1s);
  auto h = get_bounded(f);
  ASSERT_TRUE(stopped_within_bound(h.lease().stop_token()));
  auto t1 = std::chrono::steady_clock::now();
  auto released = h.release();
  ASSERT_EQ(released.wait_for(kBound), std::future_status::ready);
  EXPECT_LT(ms_between(t1, std::chrono::steady_clock::now()), 1500ms);
  EXPECT_THROW(released.get(), LeaseLost);
}

// A grant that arrives after the stop began (its answer was on the way)
// fails the call with RuntimeStopped, runs no work and gives the lock
// back: the stop waits for no handle that nobody is left to release.
TEST_F(RuntimeTest, AGrantArrivingAfterTheStopBeganFailsTheCallAndGivesTheLockBack) {
  script_->set_delay(Op::kAcquire, 1s);
  std::atomic<bool> ran{false};
  auto handle = rt_->acquire("late-handle", 5s);
  auto work = locked("late-work", 5s, forever).on(*rt_)([&] { ran = true; })();
  ASSERT_TRUE(script_->wait_for(Op::kAcquire, 2));  // both on the way
  auto stopped = std::async(std::launch::async, [this] { rt_.reset(); });
  ASSERT_EQ(stopped.wait_for(kBound), std::future_status::ready);
  EXPECT_NE(error_in<RuntimeStopped>(handle), nullptr);
  EXPECT_NE(error_of<RuntimeStopped>(work), nullptr);
  EXPECT_FALSE(ran.load());
  script_->set_delay(Op::kAcquire, 0ms);
  restart(options_);
  for (const char* key : {"late-handle", "late-work"}) {
    auto f = rt_->acquire(key, 5s);
    EXPECT_NO_THROW(get_bounded(f)) << key;  // given back, not left to its ttl
  }
}

// A holder starved past its lease's local deadline (its watchdog had not
// run) whose work then ended, the end read before the late timer as a loop
// woken from a long stall reads it: the lease was lost, even though the
// store answers the release as done (ZooKeeper does, for a node that went
// with its expired session). Both with no renewal sent and with one sent
// but unanswered at the end. Found by scripts/soak --nemesis starve.
TEST_F(RuntimeTest, WorkEndingPastTheDeadlineBeforeTheWatchdogRanLosesTheLease) {
  script_->script_release([](const std::string&) -> std::optional<detail::Released> { return detail::Released::kYes; });
  for (bool renewal_in_flight : {false, true}) {
    if (renewal_in_flight) script_->set_delay(Op::kRenew, 600ms);
    const std::string key = renewal_in_flight ? "starved-awaiting" : "starved";
    auto f = rt_->acquire(key, 300ms);
    LockHandle h = get_bounded(f);
    auto l = std::static_pointer_cast<detail::LeaseRecord>(detail::HandleAccess::state(h));
    auto& impl = detail::RuntimeAccess::impl(*rt_);
    if (renewal_in_flight) {
      ASSERT_TRUE(script_->wait_for(Op::kRenew, 1));  // sent, unanswered
    }
    auto ended = std::make_shared<std::promise<void>>();
    auto ended_f = ended->get_future();
    auto& table = detail::RuntimeAccess::table(*rt_);
    impl.post([&table, l, ended] {
      // The loop stalls past the deadline, then reads the work's end first.
      const auto until = std::chrono::steady_clock::now() + kBound;
      while (std::chrono::steady_clock::now() <= l->deadline() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(1ms);
      table.work_ended(l);
      ended->set_value();
    });
    ASSERT_EQ(ended_f.wait_for(kBound), std::future_status::ready);
    auto released = h.release();
    ASSERT_EQ(released.wait_for(kBound), std::future_status::ready);
    EXPECT_THROW(released.get(), LeaseLost) << key;
    script_->set_delay(Op::kRenew, 0ms);
  }
}

// A handle's future dropped unread gives the lock back once it is taken:
// nothing else keeps the handle, so the next caller gets the key long
// before its 30 s ttl.
TEST_F(RuntimeTest, AHandlesFutureDroppedUnreadReleasesTheLock) {
  { (void)rt_->acquire("dropped", 30s); }
  auto t0 = std::chrono::steady_clock::now();
  auto next = rt_->acquire({.key = "dropped", .ttl = 5s, .wait = 10s});
  LockHandle h = get_bounded(next);
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 5s);
  EXPECT_GE(script_->count(Op::kRelease), 1u);
  h.release().get();
}

// A lease's steps (runtime/step.hpp), read on the loop that owns them:
// held while the handle is out, releasing while its release is on its
// way, ended once the release is confirmed.
TEST_F(RuntimeTest, ALeaseGoesFromHeldThroughReleasingToEnded) {
  auto f = rt_->acquire("steps", 5s);
  LockHandle h = get_bounded(f);
  auto l = std::static_pointer_cast<detail::LeaseRecord>(detail::HandleAccess::state(h));
  auto& impl = detail::RuntimeAccess::impl(*rt_);
  auto step_now = [&] {
    auto read = std::make_shared<std::promise<detail::Step>>();
    auto got = read->get_future();
    impl.post([l, read] { read->set_value(l->step); });
    EXPECT_EQ(got.wait_for(kBound), std::future_status::ready);
    return got.get();
  };
  EXPECT_STREQ(detail::step_name(step_now()), "held");
  // The answer is held back long enough for the step to be read before it
  // under a loaded machine (the read is one task on the loop).
  script_->set_delay(Op::kRelease, 2s);
  auto released = h.release();
  ASSERT_TRUE(script_->wait_for(Op::kRelease, 1));
  EXPECT_STREQ(detail::step_name(step_now()), "releasing");
  EXPECT_FALSE(l->lost());
  script_->set_delay(Op::kRelease, 0ms);
  ASSERT_EQ(released.wait_for(kBound), std::future_status::ready);
  EXPECT_NO_THROW(released.get());
  EXPECT_STREQ(detail::step_name(step_now()), "ended");
}

// Holds the runtime's loop (I/O thread) until open(): what is asked for
// once reached() says the hold runs is started in one go when it opens,
// before any answer.
class LoopHold {
 public:
  explicit LoopHold(Runtime& rt) {
    detail::RuntimeAccess::impl(rt).post([reached = reached_, gate = gate_] {
      reached->open();
      (void)gate->wait();
    });
  }
  ~LoopHold() { open(); }
  void open() { gate_->open(); }
  // Waits (bounded) until the loop has run all posted before the hold.
  bool reached() const { return reached_->wait(); }

 private:
  std::shared_ptr<Gate> reached_ = std::make_shared<Gate>();
  std::shared_ptr<Gate> gate_ = std::make_shared<Gate>();
};

constexpr int kWindow = static_cast<int>(detail::WaitQueue::kAttemptsInFlight);
// A wait counts from the call, and a burst asked for while the loop is
// held takes seconds to go through under TSan: these waits outlast it.
constexpr auto kLongWait = std::chrono::milliseconds(60000);

// `n` locks "<prefix><i>" asked for at once, every other one with a wait.
std::vector<std::future<LockHandle>> ask_burst(Runtime& rt, const std::string& prefix, int n,
                                               std::chrono::milliseconds ttl) {
  std::vector<std::future<LockHandle>> asked;
  asked.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    asked.push_back(rt.acquire({.key = prefix + std::to_string(i), .ttl = ttl, .retries = forever, .wait = i % 2 == 0 ? 0ms : kLongWait}));
  return asked;
}

// More acquisitions at once than the window of attempts in flight: those
// beyond it wait in the client and are sent as earlier ones are answered,
// with a wait and without one; every one is granted. (A long ttl: no
// renewal round of 35,768 leases falls within the case, which under TSan
// the client could not confirm in time.)
TEST_F(RuntimeTest, ABurstBeyondTheWindowOfAttemptsIsSentAsEarlierOnesAreAnswered) {
  constexpr int kBurst = kWindow * 2 + 3000;
  std::vector<std::future<LockHandle>> asked;
  {
    LoopHold hold(*rt_);
    ASSERT_TRUE(hold.reached());
    asked = ask_burst(*rt_, "burst-", kBurst, 60s);
  }
  std::vector<LockHandle> held;
  held.reserve(kBurst);
  for (auto& f : asked) held.push_back(get_bounded(f));
  EXPECT_EQ(script_->count(Op::kAcquire), static_cast<std::size_t>(kBurst));  // each sent once
  EXPECT_EQ(rt_->stats().attempts_queued, static_cast<std::uint64_t>(kBurst - kWindow));
  std::size_t lost = 0;
  std::optional<LostReason> reason;
  for (const auto& h : held) {
    if (!h.lease().lost()) continue;
    ++lost;
    reason = h.lease().lost_reason();
  }
  EXPECT_EQ(lost, 0u) << "one was lost so: " << (reason ? to_string(*reason) : "-");
}

// The window is shared: an attempt that waits for it and whose wait ends
// meanwhile is never sent, and the key's next waiter goes on.
TEST_F(RuntimeTest, AnAttemptWhoseWaitEndsBeforeTheWindowLetsItGoIsNeverSent) {
  // The window stays full past the short wait, also when starting the
  // calls that fill it takes a long turn of the loop (TSan on a loaded
  // machine): answers due before the brief call's wait is judged would open
  // the window for it.
  script_->set_delay(Op::kAcquire, 2s);
  std::vector<std::future<LockHandle>> asked;
  std::future<LockHandle> brief, next;
  {
    LoopHold hold(*rt_);
    ASSERT_TRUE(hold.reached());
    for (int i = 0; i < kWindow; ++i) asked.push_back(rt_->acquire("full-" + std::to_string(i), 5s));
    brief = rt_->acquire({.key = "contended", .ttl = 5s, .retries = forever, .wait = 50ms});
    next = rt_->acquire({.key = "contended", .ttl = 5s, .retries = forever, .wait = kLongWait});
  }
  auto e = error_in<LockNotAcquired>(brief);  // its wait ended in the client
  ASSERT_NE(e, nullptr);
  EXPECT_NE(std::string(e->what()).find("never sent"), std::string::npos) << e->what();  // not "held by another"
  EXPECT_EQ(e->key(), "contended");
  script_->set_delay(Op::kAcquire, 0ms);  // for the next in line, sent as the window opens
  auto h = get_bounded(next);  // the next in line was sent, and took it
  EXPECT_FALSE(h.lease().lost());
  for (auto& f : asked) (void)get_bounded(f);
  EXPECT_EQ(script_->count(Op::kAcquire), static_cast<std::size_t>(kWindow + 1));  // not the brief one
  EXPECT_EQ(rt_->stats().attempts_queued, 1u);  // the next one went as the window opened
}

// A runtime stopped while attempts wait for the window fails them: no
// call is left hanging, and none sent is left held.
TEST_F(RuntimeTest, AttemptsWaitingForTheWindowFailWhenTheRuntimeStops) {
  constexpr int kBurst = kWindow + 5000;
  // None is answered before the stop, even when starting them all takes
  // seconds (TSan on a loaded machine): the window is still full when the
  // stop begins. The stop waits for those sent.
  script_->set_delay(Op::kAcquire, 10s);
  LoopHold asking(*rt_);
  ASSERT_TRUE(asking.reached());
  auto asked = ask_burst(*rt_, "stop-", kBurst, 5s);
  LoopHold started(*rt_);  // once reached, every one was started: the window is full
  asking.open();
  ASSERT_TRUE(started.reached());
  started.open();
  auto stopped = std::async(std::launch::async, [this] { rt_.reset(); });
  ASSERT_EQ(stopped.wait_for(kBound), std::future_status::ready);
  // Every call ends with RuntimeStopped: those waiting for the window and
  // those in flight, whose grants come after the stop began.
  for (auto& f : asked) {
    ASSERT_EQ(f.wait_for(kBound), std::future_status::ready);
    EXPECT_NE(error_in<RuntimeStopped>(f), nullptr);
  }
  EXPECT_EQ(script_->count(Op::kAcquire), static_cast<std::size_t>(kWindow));  // never those waiting
  // Those never sent were never taken.
  script_->set_delay(Op::kAcquire, 0ms);
  restart(options_);
  for (int i = kWindow; i < kBurst; i += 97) {
    auto f = rt_->acquire("stop-" + std::to_string(i), 5s);
    EXPECT_NO_THROW(get_bounded(f)) << i;
  }
}

}  // namespace
}  // namespace lockwatch::testing
