// Scheduled jobs across real processes on a real redis-server: each period
// runs once, a killed leader is replaced within one lease plus one period,
// skewed local clocks change nothing.
#include <gtest/gtest.h>

#include <csignal>
#include <map>
#include <set>
#include <sstream>

#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

using namespace std::chrono;

struct RunRow {
  std::int64_t period;
  long pid;
  std::uint64_t fence;
};

class SchedulerRedisTest : public ::testing::Test {
 protected:
  void SetUp() override { server_ = std::make_unique<RedisServer>(); }

  std::vector<RunRow> rows(const std::string& list) {
    std::vector<RunRow> out;
    for (const auto& e : server_->command({"LRANGE", list, "0", "-1"}).elements) {
      std::istringstream in(e.str);
      RunRow r{};
      in >> r.period >> r.pid >> r.fence;
      out.push_back(r);
    }
    return out;
  }
  // Waits (bounded) until `pred(rows)` holds; the runs are in Redis, so
  // this polls the list, as renewed_again() polls a counter.
  template <class Pred>
  bool wait_rows(const std::string& list, Pred pred, milliseconds bound = kBound) {
    auto until = steady_clock::now() + bound;
    while (steady_clock::now() < until) {
      if (pred(rows(list))) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  std::unique_ptr<RedisServer> server_;
};

TEST_F(SchedulerRedisTest, ThreeSkewedProcessesRunEachPeriodOnceAndAKilledLeaderIsReplaced) {
  const char* runner = std::getenv("LOCKWATCH_JOB_RUNNER");
  ASSERT_NE(runner, nullptr);
  constexpr auto kPeriod = 400ms;
  constexpr auto kLease = 1000ms;
  const std::string list = "runs:report";
  std::map<long, std::unique_ptr<ChildProcess>> procs;
  const char* skews[] = {"-2000", "0", "3000"};
  for (const char* skew : skews) {
    auto p = std::make_unique<ChildProcess>(
        std::vector<std::string>{runner, server_->url(), "report", std::to_string(kPeriod.count()),
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
  // Numbered on Redis's clock.
  auto t = server_->command({"TIME"});
  auto now_ms = std::stoll(t.elements[0].str) * 1000 + std::stoll(t.elements[1].str) / 1000;
  EXPECT_LE(now_ms / kPeriod.count() - all.back().period, 1);
  EXPECT_EQ(std::stoll(server_->command({"GET", "lockwatch:{job:report}:period"}).str), all.back().period);
  EXPECT_EQ(server_->command({"TTL", "lockwatch:{job:report}:period"}).integer, -1);  // never expires
}

TEST_F(SchedulerRedisTest, ALeaderStolenMidRunIsNotRunAgain) {
  Runtime rt(options_for(*server_));
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
        server_->command({"SET", "lockwatch:{job:stolen}", "intruder", "PX", "500"});
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

}  // namespace
}  // namespace lockwatch::testing
