// Scheduled jobs across real processes on each real store (redis-server,
// a Redis Cluster, mariadbd, postgres, a ZooKeeper ensemble and an etcd
// cluster; in one process on memory://): each period runs once and only once, a killed leader is
// replaced within one lease plus one period, skewed local clocks change
// nothing, a long run delays the next without overlap or burst, a thrown
// exception costs only its own run, and a lease stolen mid-run stops the
// run without running its period again.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "backends.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

using namespace std::chrono;

struct RunRow {
  std::int64_t period;
  long pid;
  std::uint64_t fence;
};

class SchedulerStoresTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = make_backend(GetParam());
    char dir[] = "/tmp/lockwatch-runs-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  Options options(std::size_t threads = 2) const {
    Options o;
    o.redis_url = backend_->url();
    o.runtime.threads = threads;
    return o;
  }

  // The runs the job_runner processes appended to `file`.
  std::vector<RunRow> rows(const std::string& file) const {
    std::vector<RunRow> out;
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream l(line);
      RunRow r{};
      if (l >> r.period >> r.pid >> r.fence) out.push_back(r);
    }
    return out;
  }
  // Waits (bounded) until `pred(rows)` holds; polls the file, as
  // renewed_again() polls a counter.
  template <class Pred>
  bool wait_rows(const std::string& file, Pred pred, milliseconds bound = kBound) const {
    auto until = steady_clock::now() + bound;
    while (steady_clock::now() < until) {
      if (pred(rows(file))) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  std::unique_ptr<Backend> backend_;
  std::string dir_;
};

// Runs recorded in-process: what a body saw, in order.
class Recorder {
 public:
  struct Run {
    std::int64_t period;
    steady_clock::time_point started, ended;
  };
  void add(Run r) {
    std::lock_guard lk(mu_);
    runs_.push_back(r);
  }
  std::vector<Run> runs() const {
    std::lock_guard lk(mu_);
    return runs_;
  }
  bool wait_for(std::size_t n) const {
    auto until = steady_clock::now() + kBound;
    while (steady_clock::now() < until) {
      if (runs().size() >= n) return true;
      std::this_thread::sleep_for(5ms);  // polling what the job's thread records
    }
    return false;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Run> runs_;
};

TEST_P(SchedulerStoresTest, ThreeSkewedProcessesRunEachPeriodOnceAndAKilledLeaderIsReplaced) {
  if (!backend_->has_server()) GTEST_SKIP() << "a memory space is per process: other processes cannot share it";
  const char* runner = std::getenv("LOCKWATCH_JOB_RUNNER");
  ASSERT_NE(runner, nullptr);
  constexpr auto kPeriod = 400ms;
  constexpr auto kLease = 1000ms;
  const std::string list = dir_ + "/runs";
  std::map<long, std::unique_ptr<ChildProcess>> procs;
  const char* skews[] = {"-2000", "0", "3000"};
  for (const char* skew : skews) {
    auto p = std::make_unique<ChildProcess>(
        std::vector<std::string>{runner, backend_->url(), "report", std::to_string(kPeriod.count()),
                                 std::to_string(kLease.count()), list},
        std::vector<std::string>{std::string("LOCKWATCH_TEST_CLOCK_SKEW_MS=") + skew});
    auto line = p->read_line(kBound);
    ASSERT_TRUE(line.has_value());
    ASSERT_EQ(*line, "ready");
    procs[p->pid()] = std::move(p);
  }
  ASSERT_TRUE(wait_rows(list, [](const auto& r) { return r.size() >= 4; }));
  auto before = rows(list);
  long leader = before.front().pid;
  for (const auto& r : before) EXPECT_EQ(r.pid, leader) << "the leader is sticky";

  procs.at(leader)->kill(SIGKILL);
  auto killed_at = steady_clock::now();
  auto last_before = rows(list).back().period;
  ASSERT_TRUE(wait_rows(list, [&](const auto& r) { return r.back().pid != leader; }, kBound));
  auto takeover = steady_clock::now() - killed_at;
  std::printf("takeover after kill -9: %lld ms (lease %lld ms + period %lld ms)\n",
              static_cast<long long>(duration_cast<milliseconds>(takeover).count()),
              static_cast<long long>(kLease.count()), static_cast<long long>(kPeriod.count()));
  EXPECT_LT(takeover, kLease + kPeriod + 300ms);

  auto n = rows(list).size();
  ASSERT_TRUE(wait_rows(list, [&](const auto& r) { return r.size() >= n + 3; }));
  auto all = rows(list);
  std::set<std::int64_t> seen;
  std::int64_t prev = -1;
  for (const auto& r : all) {
    EXPECT_TRUE(seen.insert(r.period).second) << "period " << r.period << " ran twice";
    EXPECT_GT(r.period, prev);
    prev = r.period;
  }
  // No period missed while a leader lived; the takeover runs the latest
  // missed period once, no burst.
  auto first_after = std::find_if(all.begin(), all.end(), [&](const RunRow& r) { return r.pid != leader; });
  EXPECT_LE(first_after->period - last_before, (kLease + kPeriod) / kPeriod + 1);
  EXPECT_GT(first_after->fence, before.back().fence);
  // Numbered on the store's clock, which records the last period run.
  EXPECT_LE(backend_->now_ms() / kPeriod.count() - all.back().period, 1);
  EXPECT_GE(backend_->last_period("report"), all.back().period);
}

TEST_P(SchedulerStoresTest, ALeaderStolenMidRunIsNotRunAgain) {
  Runtime rt(options());
  Scheduler jobs(rt);
  JobOptions o;
  o.lease = 800ms;
  Gate stopped;
  std::mutex mu;
  std::vector<std::int64_t> periods;
  std::atomic<bool> stolen{false};
  auto h = jobs.every(
      200ms, "stolen",
      [&](const JobRun& r) {
        {
          std::lock_guard lk(mu);
          periods.push_back(r.period());
        }
        if (stolen.exchange(true)) return;
        backend_->steal("job:stolen", "intruder", 500ms);
        auto until = steady_clock::now() + kBound;
        while (!r.stop_token().stop_requested() && steady_clock::now() < until) std::this_thread::sleep_for(5ms);
        if (r.stop_token().stop_requested()) stopped.open();
      },
      o);
  ASSERT_TRUE(stopped.wait());
  // After the intruder's key expires, this process leads again and goes on.
  auto until = steady_clock::now() + kBound;
  for (;;) {
    {
      std::lock_guard lk(mu);
      if (periods.size() >= 3 || steady_clock::now() > until) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  h.cancel();
  std::lock_guard lk(mu);
  ASSERT_GE(periods.size(), 3u);
  std::set<std::int64_t> seen(periods.begin(), periods.end());
  EXPECT_EQ(seen.size(), periods.size()) << "a period ran twice";
}

TEST_P(SchedulerStoresTest, ARunLongerThanItsPeriodDelaysTheNextWithoutOverlapOrBurst) {
  Runtime rt(options());
  Scheduler jobs(rt);
  JobOptions o;
  o.lease = 1s;
  Recorder rec;
  auto h = jobs.every(
      200ms, "long",
      [&](const JobRun& r) {
        auto started = steady_clock::now();
        if (rec.runs().empty()) std::this_thread::sleep_for(750ms);  // the long run: more than 3 periods
        rec.add({r.period(), started, steady_clock::now()});
      },
      o);
  ASSERT_TRUE(rec.wait_for(4));
  h.cancel();
  auto all = rec.runs();
  for (std::size_t i = 1; i < all.size(); ++i) {
    EXPECT_GT(all[i].period, all[i - 1].period);
    EXPECT_GE(all[i].started, all[i - 1].ended) << "runs of one job overlapped";
  }
  // The missed periods ran once, as the latest one: no burst of catch-up
  // runs after the long one.
  EXPECT_GE(all[1].period - all[0].period, 3);
  EXPECT_EQ(all[2].period, all[1].period + 1);
}

TEST_P(SchedulerStoresTest, AThrowingRunCostsOnlyItsOwnPeriod) {
  Runtime rt(options());
  Scheduler jobs(rt);
  JobOptions o;
  o.lease = 1s;
  Recorder rec;
  auto h = jobs.every(
      150ms, "thrower",
      [&](const JobRun& r) {
        bool first = rec.runs().empty();
        rec.add({r.period(), steady_clock::now(), steady_clock::now()});
        if (first) throw std::runtime_error("disk full");
      },
      o);
  ASSERT_TRUE(rec.wait_for(3));
  h.cancel();
  auto all = rec.runs();
  std::set<std::int64_t> seen;
  for (const auto& r : all) EXPECT_TRUE(seen.insert(r.period).second) << "period " << r.period << " ran twice";
  EXPECT_GT(all[1].period, all[0].period);
  // The thrown period counts as run: the store recorded one at least as late.
  EXPECT_GE(backend_->last_period("thrower"), all.back().period);
  auto metrics = rt.metrics_text();
  EXPECT_NE(metrics.find("lockwatch_job_runs_total{job=\"thrower\",result=\"error\"} 1"), std::string::npos)
      << metrics;
}

INSTANTIATE_TEST_SUITE_P(Stores, SchedulerStoresTest, ::testing::ValuesIn(job_backend_kinds()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string name = p.param;
                           std::replace(name.begin(), name.end(), '-', '_');  // a test name is an identifier
                           return name;
                         });

}  // namespace
}  // namespace lockwatch::testing
