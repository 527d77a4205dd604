// Scheduled jobs on the in-memory store: the cron parser, one leader per
// job, periods on the store's clock, misfires, errors, lease loss.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "jobs/cron.hpp"
#include "jobs/scheduler_impl.hpp"
#include "lockwatch/scheduler.hpp"
#include "memory_runtime.hpp"

namespace lockwatch::testing {
namespace {

using namespace std::chrono;
using detail::CronExpr;

sys_seconds utc(int y, unsigned mo, unsigned d, int h, int mi) {
  return sys_days(year(y) / mo / d) + hours(h) + minutes(mi);
}

CronExpr::Minutes m(sys_seconds t) { return floor<minutes>(t); }

TEST(CronTest, NextFireTimes) {
  auto daily = CronExpr::parse("0 3 * * *");
  EXPECT_EQ(daily.next_after(utc(2024, 5, 1, 2, 59)), m(utc(2024, 5, 1, 3, 0)));
  EXPECT_EQ(daily.next_after(utc(2024, 5, 1, 3, 0)), m(utc(2024, 5, 2, 3, 0)));
  auto quarter = CronExpr::parse("*/15 * * * *");
  EXPECT_EQ(quarter.next_after(utc(2024, 5, 1, 10, 7)), m(utc(2024, 5, 1, 10, 15)));
  EXPECT_EQ(quarter.next_after(utc(2024, 5, 1, 23, 50)), m(utc(2024, 5, 2, 0, 0)));
  auto list = CronExpr::parse("5,10-12 8 * * 1-5");  // weekdays; 2024-05-04 is a Saturday
  EXPECT_EQ(list.next_after(utc(2024, 5, 3, 8, 12)), m(utc(2024, 5, 6, 8, 5)));
  EXPECT_EQ(list.next_after(utc(2024, 5, 6, 8, 5)), m(utc(2024, 5, 6, 8, 10)));
}

TEST(CronTest, EdgeCases) {
  // Leap day: the next one after 2024's is in 2028.
  auto leap = CronExpr::parse("0 0 29 2 *");
  EXPECT_EQ(leap.next_after(utc(2024, 2, 29, 0, 0)), m(utc(2028, 2, 29, 0, 0)));
  // Both day fields restricted: either matches (the 13th, or a Friday).
  auto either = CronExpr::parse("0 12 13 * 5");
  EXPECT_EQ(either.next_after(utc(2024, 9, 1, 0, 0)), m(utc(2024, 9, 6, 12, 0)));   // Friday the 6th
  EXPECT_EQ(either.next_after(utc(2024, 9, 12, 13, 0)), m(utc(2024, 9, 13, 12, 0)));  // the 13th (also a Friday)
  // 7 is Sunday, as 0; year end rolls over.
  auto sunday = CronExpr::parse("30 23 * 12 7");
  EXPECT_EQ(sunday.next_after(utc(2024, 12, 29, 23, 30)), m(utc(2025, 12, 7, 23, 30)));
  // The 31st skips short months.
  auto last = CronExpr::parse("0 0 31 * *");
  EXPECT_EQ(last.next_after(utc(2024, 4, 1, 0, 0)), m(utc(2024, 5, 31, 0, 0)));
  // latest_at: the fire time at or before.
  EXPECT_EQ(CronExpr::parse("0 3 * * *").latest_at(utc(2024, 5, 1, 3, 0) + seconds(59)), m(utc(2024, 5, 1, 3, 0)));
  EXPECT_EQ(CronExpr::parse("0 3 * * *").latest_at(utc(2024, 5, 1, 2, 59)), m(utc(2024, 4, 30, 3, 0)));
  EXPECT_EQ(last.latest_at(utc(2024, 5, 30, 0, 0)), m(utc(2024, 3, 31, 0, 0)));
  EXPECT_EQ(CronExpr::parse("15 10-12/2 * * *").latest_at(utc(2024, 5, 1, 11, 59)), m(utc(2024, 5, 1, 10, 15)));
}

TEST(CronTest, BadExpressionsAreRejected) {
  for (const char* bad : {"", "* * * *", "* * * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * * 13 *",
                          "* * * * 8", "5-1 * * * *", "*/0 * * * *", "a * * * *", "1,,2 * * * *", "1-2-3 * * * *",
                          "0 0 30 2 *", "0 0 31 4 *", "MON * * * *"}) {
    EXPECT_THROW(CronExpr::parse(bad), InvalidArgument) << "'" << bad << "'";
  }
}

// ------------------------------------------------------------ the scheduler

struct RunSeen {
  int node;
  std::int64_t period;
  system_clock::time_point scheduled_for;
  system_clock::time_point store_time_at_start;
  std::uint64_t fence;
};

// Several "processes": runtimes on one backend, each with a scheduler.
class SchedulerTest : public ::testing::Test {
 protected:
  std::shared_ptr<MemoryBackend> backend_ = std::make_shared<MemoryBackend>();

  struct Node {
    std::shared_ptr<StoreScript> script = std::make_shared<StoreScript>();
    std::unique_ptr<Runtime> runtime;
    std::unique_ptr<Scheduler> scheduler;
    JobHandle handle;
  };

  std::unique_ptr<Node> node(milliseconds skew = 0ms, Options o = memory_options(2)) {
    auto n = std::make_unique<Node>();
    n->runtime = memory_runtime(backend_, n->script, std::move(o));
    n->scheduler = std::make_unique<Scheduler>(*n->runtime);
    detail::SchedulerAccess::set_clock_skew(*n->scheduler, skew);
    return n;
  }

  // Records runs; wakes waiters.
  void record(int node, const JobRun& run) {
    std::lock_guard lk(mu_);
    runs_.push_back(RunSeen{node, run.period(), run.scheduled_for(), backend_->system_now(), run.fencing_token()});
    cv_.notify_all();
  }
  bool wait_runs(std::size_t n, milliseconds bound = kBound) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, bound, [&] { return runs_.size() >= n; });
  }
  std::vector<RunSeen> runs() {
    std::lock_guard lk(mu_);
    return runs_;
  }
  static int leaders(const std::vector<std::unique_ptr<Node>>& nodes) {
    int k = 0;
    for (auto& n : nodes) k += n->handle.is_leader() ? 1 : 0;
    return k;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RunSeen> runs_;
};

JobOptions opts(milliseconds lease = 600ms) {
  JobOptions o;
  o.lease = lease;
  return o;
}

TEST_F(SchedulerTest, SkewedNodesRunEachPeriodOnceOnTheStoresClock) {
  std::vector<std::unique_ptr<Node>> nodes;
  const milliseconds skews[] = {-3000ms, 0ms, 4000ms};
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(node(skews[i]));
    nodes.back()->handle =
        nodes.back()->scheduler->every(200ms, "skewed", [this, i](const JobRun& r) { record(i, r); }, opts());
  }
  ASSERT_TRUE(wait_runs(3));
  // Kill the leader (a cancel releases at once); another skewed node goes on.
  int first = runs().front().node;
  nodes[first]->scheduler.reset();
  auto before = runs().size();
  ASSERT_TRUE(wait_runs(before + 4));
  auto all = runs();
  std::set<std::int64_t> seen;
  std::int64_t prev = -1;
  for (const auto& r : all) {
    EXPECT_TRUE(seen.insert(r.period).second) << "period " << r.period << " ran twice";
    EXPECT_GT(r.period, prev);
    prev = r.period;
    // Numbered and started on the store's clock, whatever the node's (3 s
    // behind and 4 s ahead): claimed within its own period (the first run
    // of a new job, or of a new leader, claims its current period at once,
    // which may be late in it). The body records the time after the
    // claim's answer and a pool hop, which a loaded machine under ASan once
    // stretched 0.45 ms past the period's end: the bound allows 100 ms for it.
    EXPECT_EQ(r.scheduled_for, system_clock::time_point(milliseconds(200) * r.period));
    EXPECT_GE(r.store_time_at_start, r.scheduled_for);
    EXPECT_LT(r.store_time_at_start - r.scheduled_for, 300ms) << "node " << r.node;
  }
  EXPECT_NE(all.back().node, first);
  EXPECT_EQ(backend_->last_period(memory_name("job:skewed")), all.back().period);
}

TEST_F(SchedulerTest, OneStickyLeaderAndPromptTakeoverOnDestroy) {
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(node());
    nodes.back()->handle =
        nodes.back()->scheduler->every(100ms, "sticky", [this, i](const JobRun& r) { record(i, r); }, opts(2000ms));
  }
  ASSERT_TRUE(wait_runs(5));
  EXPECT_EQ(leaders(nodes), 1);
  auto all = runs();
  int leader = all.front().node;
  for (const auto& r : all) EXPECT_EQ(r.node, leader);  // sticky
  EXPECT_TRUE(nodes[leader]->handle.is_leader());
  // Destroying the leader's scheduler releases its lease: another runs
  // well before the 2 s lease could have expired.
  auto t0 = steady_clock::now();
  nodes[leader]->scheduler.reset();
  auto n0 = runs().size();
  ASSERT_TRUE(wait_runs(n0 + 1));
  auto took = steady_clock::now() - t0;
  EXPECT_NE(runs().back().node, leader);
  EXPECT_LT(took, 1000ms);
  std::printf("takeover after a release: %lld ms\n", static_cast<long long>(duration_cast<milliseconds>(took).count()));
  EXPECT_FALSE(nodes[leader]->handle.is_leader());
}

TEST_F(SchedulerTest, AJobRunsOnTheRuntimesNamedThreadsWithNoneOfItsOwn) {
  auto n = node();
  std::string ran_on;
  n->handle = n->scheduler->every(
      100ms, "named",
      [this, &ran_on](const JobRun& r) {
        char name[16] = {};
        pthread_getname_np(pthread_self(), name, sizeof name);
        if (ran_on.empty()) ran_on = name;
        record(0, r);
      },
      opts());
  ASSERT_TRUE(wait_runs(1));
  EXPECT_EQ(ran_on.rfind("lw-pool-", 0), 0u) << ran_on;  // runs go to the runtime's pool
  int jobs = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name == "lw-job") ++jobs;
  }
  EXPECT_EQ(jobs, 0);  // a job waits on the runtime's loop, not on a thread
}

TEST_F(SchedulerTest, ALongRunDelaysTheNextAndRunsTheLatestMissedOnce) {
  auto n = node();
  std::atomic<int> active{0}, overlap{0};
  n->handle = n->scheduler->every(
      100ms, "long",
      [&](const JobRun& r) {
        if (active.fetch_add(1) != 0) overlap++;
        bool first = runs().empty();
        record(0, r);
        if (first) std::this_thread::sleep_for(450ms);  // the work itself: longer than four periods
        active.fetch_sub(1);
      },
      opts());
  ASSERT_TRUE(wait_runs(3));
  auto all = runs();
  EXPECT_EQ(overlap.load(), 0);
  // The run after the long one is the latest period missed, once: no burst.
  EXPECT_GE(all[1].period - all[0].period, 4);
  EXPECT_LE(all[1].period - all[0].period, 6);
  EXPECT_EQ(all[2].period, all[1].period + 1);
}

TEST_F(SchedulerTest, SkipPolicyWaitsForTheNextPeriodAfterALongRun) {
  auto n = node();
  auto o = opts();
  o.misfire = Misfire::kSkip;
  o.misfire_grace = 20ms;
  n->handle = n->scheduler->every(
      100ms, "skip",
      [&](const JobRun& r) {
        bool first = runs().empty();
        record(0, r);
        if (first) std::this_thread::sleep_for(250ms);
      },
      o);
  ASSERT_TRUE(wait_runs(2));
  auto all = runs();
  // The run after the long one started on time for its own period.
  EXPECT_GE(all[1].period - all[0].period, 3);
  EXPECT_LT(all[1].store_time_at_start - all[1].scheduled_for, 100ms);  // within its own period
}

TEST_F(SchedulerTest, AThrowingRunIsReportedAndTheNextPeriodRuns) {
  std::mutex log_mu;
  std::vector<std::string> lines;
  Options o = memory_options(2);
  o.observability.log = [&](LogLevel level, std::string_view line) {
    std::lock_guard lk(log_mu);
    if (level == LogLevel::kError) lines.emplace_back(line);
  };
  struct Seen : Observer {
    std::mutex mu;
    std::vector<std::string> finished;
    void on_run_finished(std::string_view job, std::int64_t period, std::string_view error) override {
      std::lock_guard lk(mu);
      finished.push_back(fmt::format("{} {} {}", job, period, error));
    }
  };
  auto seen = std::make_shared<Seen>();
  auto n = node(0ms, o);
  n->runtime->add_observer(seen);
  std::int64_t thrown_period = -1;
  n->handle = n->scheduler->every(
      100ms, "thrower",
      [&](const JobRun& r) {
        bool first = runs().empty();
        if (first) thrown_period = r.period();
        record(0, r);
        if (first) throw std::runtime_error("disk full");
      },
      opts());
  ASSERT_TRUE(wait_runs(3));
  n->handle.cancel();
  auto metrics = n->runtime->metrics_text();
  EXPECT_NE(metrics.find("lockwatch_job_runs_total{job=\"thrower\",result=\"error\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("lockwatch_job_runs_total{job=\"thrower\",result=\"ok\"} "), std::string::npos);
  EXPECT_NE(metrics.find("lockwatch_job_leader{job=\"thrower\"} 0"), std::string::npos);
  n->runtime.reset();  // the event thread has told everything
  auto expected = fmt::format("job 'thrower' period {} threw: disk full", thrown_period);
  EXPECT_NE(std::find(lines.begin(), lines.end(), expected), lines.end());
  ASSERT_GE(seen->finished.size(), 3u);
  EXPECT_EQ(seen->finished[0], fmt::format("thrower {} disk full", thrown_period));
}

TEST_F(SchedulerTest, ALeaseStolenMidRunStopsTheRunAndAnotherTakesOver) {
  std::vector<std::unique_ptr<Node>> nodes;
  Gate stopped;
  std::atomic<bool> stolen{false};
  std::atomic<bool> saw_this_lease{false};
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(node());
    nodes.back()->handle = nodes.back()->scheduler->every(
        100ms, "stolen",
        [&, i](const JobRun& r) {
          record(i, r);
          if (stolen.exchange(true)) return;
          saw_this_lease = this_lease().fencing_token() == r.fencing_token();
          // Someone else takes the lock under us (an operator, a split brain).
          backend_->set_owner(memory_name("job:stolen"), "intruder", 300ms);
          auto until = steady_clock::now() + kBound;
          while (!r.stop_token().stop_requested() && steady_clock::now() < until) std::this_thread::sleep_for(5ms);
          if (r.stop_token().stop_requested()) stopped.open();
        },
        opts());
  }
  ASSERT_TRUE(stopped.wait());
  EXPECT_TRUE(saw_this_lease.load());
  ASSERT_TRUE(wait_runs(3));
  auto all = runs();
  std::set<std::int64_t> seen;
  for (const auto& r : all) EXPECT_TRUE(seen.insert(r.period).second) << "period " << r.period << " ran twice";
  EXPECT_GT(all[1].fence, all[0].fence);  // a new lease: a new leader or the same one again
}

TEST_F(SchedulerTest, MaxRunAsksTheRunToStop) {
  auto n = node();
  auto o = opts();
  o.max_run = 150ms;
  Gate stopped;
  n->handle = n->scheduler->every(
      100ms, "bounded",
      [&](const JobRun& r) {
        auto t0 = steady_clock::now();
        while (!r.stop_token().stop_requested() && steady_clock::now() - t0 < kBound) std::this_thread::sleep_for(5ms);
        if (r.stop_token().stop_requested() && !r.lease().lost()) stopped.open();
      },
      o);
  EXPECT_TRUE(stopped.wait());
}

// Threads of this process right now (/proc/self/task).
std::size_t threads_now() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

TEST_F(SchedulerTest, JobsCostNoThreadOfTheirOwnAndCancelPromptly) {
  // Two nodes with 40 jobs each: one leads some, the other waits for them.
  // A job waits on the runtime's loop, not on a thread: the thread count
  // does not grow with the jobs, and a cancel ends a standby at once.
  auto a = node();
  auto b = node();
  constexpr int kJobs = 40;
  std::atomic<int> ran{0};
  const auto before = threads_now();
  std::vector<JobHandle> ha, hb;
  for (int i = 0; i < kJobs; ++i) {
    auto name = "many" + std::to_string(i);
    ha.push_back(a->scheduler->every(50ms, name, [&ran] { ++ran; }, opts(2000ms)));
    hb.push_back(b->scheduler->every(50ms, name, [&ran] { ++ran; }, opts(2000ms)));
  }
  auto until = steady_clock::now() + kBound;
  auto leaders_now = [&] {
    int k = 0;
    for (int i = 0; i < kJobs; ++i) k += (ha[i].is_leader() ? 1 : 0) + (hb[i].is_leader() ? 1 : 0);
    return k;
  };
  while (leaders_now() < kJobs && steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);  // is_leader() has no event to wait for
  EXPECT_EQ(leaders_now(), kJobs);
  EXPECT_LE(threads_now(), before + 2) << "jobs took threads of their own";
  // Cancelling every job of both nodes (standbys included, whose waits run
  // for 2 s) is prompt: nothing polls a cancel flag.
  auto t0 = steady_clock::now();
  for (auto& h : hb) h.cancel();
  for (auto& h : ha) h.cancel();
  EXPECT_LT(steady_clock::now() - t0, 1500ms);
  for (int i = 0; i < kJobs; ++i) EXPECT_FALSE(ha[i].is_leader() || hb[i].is_leader());
  EXPECT_GT(ran.load(), 0);
}

TEST_F(SchedulerTest, CronAndNoArgumentCallablesAreAccepted) {
  auto n = node();
  auto h = n->scheduler->cron("0 3 * * *", "nightly", [] {});
  EXPECT_TRUE(static_cast<bool>(h));
  h.cancel();
  h.cancel();  // idempotent
  EXPECT_FALSE(h.is_leader());
}

TEST_F(SchedulerTest, BadInputThrowsInvalidArgument) {
  auto n = node();
  auto& s = *n->scheduler;
  EXPECT_THROW(s.every(0ms, "x", [] {}), InvalidArgument);
  EXPECT_THROW(s.every(-5ms, "x", [] {}), InvalidArgument);
  EXPECT_THROW(s.every(1s, "", [] {}), InvalidArgument);
  EXPECT_THROW(s.every(1s, "x", [] {}, opts(5ms)), InvalidArgument);  // too short for the tick
  EXPECT_THROW(s.cron("61 * * * *", "x", [] {}), InvalidArgument);
  auto o = opts();
  o.max_run = -1ms;
  EXPECT_THROW(s.every(1s, "x", [] {}, o), InvalidArgument);
  s.every(1s, "dup", [] {});
  EXPECT_THROW(s.every(1s, "dup", [] {}), InvalidArgument);
}

// ----------------------------------------- once per period (claim_period)

LockHandle take(Runtime& rt, const std::string& key, milliseconds ttl = 2s) {
  auto f = rt.acquire(key, ttl);
  return get_bounded(f);
}

PeriodClaim claimed(std::future<PeriodClaim> f) { return get_bounded(f); }

TEST_F(SchedulerTest, ClaimPeriodRunsEachPeriodOnceAcrossProcesses) {
  auto a = node();
  auto b = node();
  LockHandle ha = take(*a->runtime, "once");
  PeriodClaim first = claimed(claim_period(*a->runtime, ha, 1h));
  EXPECT_TRUE(first.claimed);
  auto now = backend_->system_now();
  EXPECT_LE(first.scheduled_for, now);
  EXPECT_GT(first.scheduled_for + 1h, now);
  EXPECT_EQ(first.period, duration_cast<hours>(first.scheduled_for.time_since_epoch()).count());
  EXPECT_EQ(backend_->last_period(memory_name("once")), first.period);
  ha.release().get();

  // Another process, a moment later: the same period, run already.
  LockHandle hb = take(*b->runtime, "once");
  PeriodClaim second = claimed(claim_period(*b->runtime, hb, 1h));
  EXPECT_FALSE(second.claimed);
  EXPECT_EQ(second.period, first.period);
  EXPECT_EQ(second.last_run, first.period);
  hb.release().get();

  // The next period, on the store's clock.
  backend_->advance(1h);
  LockHandle hb2 = take(*b->runtime, "once");
  PeriodClaim third = claimed(claim_period(*b->runtime, hb2, 1h));
  EXPECT_TRUE(third.claimed);
  EXPECT_EQ(third.period, first.period + 1);
}

TEST_F(SchedulerTest, ClaimCronPeriodNumbersPeriodsByTheirMinute) {
  auto a = node();
  LockHandle h = take(*a->runtime, "nightly");
  PeriodClaim c = claimed(claim_cron_period(*a->runtime, h, "0 3 * * *"));
  EXPECT_TRUE(c.claimed);
  auto fire = floor<days>(backend_->system_now()) + 3h;
  if (fire > backend_->system_now()) fire -= days(1);
  EXPECT_EQ(c.scheduled_for, fire);
  EXPECT_EQ(c.period, duration_cast<minutes>(fire.time_since_epoch()).count());
  EXPECT_FALSE(claimed(claim_cron_period(*a->runtime, h, "0 3 * * *")).claimed) << "once per period, also for the same holder";
}

TEST_F(SchedulerTest, AClaimWithoutTheLockFailsWithLeaseLostAndRecordsNothing) {
  auto a = node();
  LockHandle h = take(*a->runtime, "gone");
  backend_->set_owner(memory_name("gone"), "someone-else", 5s);
  auto f = claim_period(*a->runtime, h, 1h);
  EXPECT_TRUE(error_of<LeaseLost>(f));
  EXPECT_FALSE(backend_->last_period(memory_name("gone")));
}

TEST_F(SchedulerTest, ABadClaimThrowsInvalidArgumentBeforeAnythingStarts) {
  auto a = node();
  LockHandle empty;
  EXPECT_THROW((void)claim_period(*a->runtime, empty, 1h), InvalidArgument);
  LockHandle h = take(*a->runtime, "bad");
  EXPECT_THROW((void)claim_period(*a->runtime, h, 0ms), InvalidArgument);
  EXPECT_THROW((void)claim_cron_period(*a->runtime, h, "61 * * * *"), InvalidArgument);
  EXPECT_FALSE(backend_->last_period(memory_name("bad")));
}

}  // namespace
}  // namespace lockwatch::testing
