// Watchdog benchmark: what it costs to keep many leases alive.
//
//   BM_Watchdog/<leases>/<ttl_ms>   leases = 1000, 10000, 100000;
//                                   ttl = 2000 ms and 30000 ms
//
// Each case takes <leases> locks with Runtime::acquire (distinct keys, renewed
// forever, up to kWindow futures in flight), holds them all for a
// bounded time while the watchdog renews them, then releases them all. Only
// the hold is measured (the Time column is the hold); acquiring and releasing
// are timed on their own (acquire_s, release_s) and kept out of the rest.
//
// Hold: 10 s at ttl 2 s (renewal every 1.8 s: ~5.5 renewals per lease, as in
// the peers' harness: 10,000 locks, ttl 2 s, 10 s); 30 s at ttl 30 s, which
// covers exactly one renewal per lease (due 27 s after it was taken, and all
// were taken just before the hold began). The default run holds 3 x 10 s +
// 3 x 30 s, about 2.5 minutes with acquiring, releasing and a 4 s probe
// calibration, plus at most 60 s waiting for a quiet machine (wait_for_quiet);
// select cases with e.g. --benchmark_filter=1000/ (1K only) or
// --benchmark_filter=/2000 (ttl 2 s only).
//
// Counters, over the hold:
//   renewals            renewals sent (RuntimeStats::renewals_sent delta)
//   renewals_per_lease
//   renewals_ok         renewals confirmed (sum of lease().renewals() deltas)
//   us_cpu_per_renewal  this process's CPU (getrusage RUSAGE_SELF, user +
//                       sys) / renewals, after taking away what the lag
//                       probes cost (measured once per binary on an idle
//                       runtime, see probe_cost()); us_cpu_gross_per_renewal
//                       keeps it in. The wheel's ticking is part of the cost.
//   us_loop_cpu_per_renewal  the runtime's I/O thread's CPU alone (its
//                       schedstat) / renewals: the thread that sends and
//                       answers every renewal; the probes' own threads and
//                       the calibration do not move it (their answers, read
//                       on this thread, do, a little)
//   cmds_per_renewal    renewal commands / renewals (renew_commands delta):
//                       round trips per renewal, as the client counts them
//   srv_evals_per_renewal  EVALSHA + EVAL calls Redis saw (INFO
//                       commandstats), the probes' 2 each taken away
//   srv_cmds_per_renewal   every command Redis ran, Lua's included, the
//                       probes' 8 each taken away
//   redis_cpu_us_per_renewal  redis-server's CPU / renewals
//   lost                leases lost from acquisition to the end of the hold
//                       (the larger of RuntimeStats::leases_lost and the
//                       handles whose lease().lost() is set); must be 0:
//                       otherwise the reasons go to stderr and the binary
//                       exits with 1, the row's counters still shown
//   lag_p50_ms, lag_p99_ms, lag_max_ms  the I/O loop's responsiveness: every
//                       kProbeEvery a probe thread times Runtime::acquire of
//                       a fresh key (ttl 2 s) until its future is ready, then
//                       releases it untimed. That is a post to the loop, one
//                       EVALSHA round trip to Redis queued behind whatever
//                       renewals are in the pipeline, and a thread wake-up,
//                       so an idle loop shows ~0.1-0.3 ms, not 0.
//   foreign_cores, steal_cores  CPU other processes and the hypervisor took
//                       (noise: trust cases where both are near 0)
// Outside the hold: acquire_s, release_s, release_errors (must be 0, as lost).
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "lockwatch/lockwatch.hpp"
#include "bench_common.hpp"
#include "support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;
using namespace lockwatch::bench;
using Clock = std::chrono::steady_clock;

// Acquisitions and releases in flight at once. Everything shares one
// pipelined connection, so a renewal waits behind whatever is queued before
// it: with 4096 or more acquisitions in flight, 100K leases at ttl 2 s lose
// their first-taken leases (a renewal has only ttl - ttl * 0.9 - drift =
// 178 ms to be confirmed). Releasing 100K at once takes longer than 2 s, and
// the watchdog stops renewing a lease as soon as its release is requested,
// so the back of the queue expires and its release reports LeaseLost.
constexpr std::size_t kWindow = 1024;
constexpr auto kProbeEvery = 50ms;
constexpr auto kProbeTtl = 2s;
// Commands one probe adds at Redis: acquire and release by EVALSHA, with
// EXISTS, INCR, SET and GET, DEL, PUBLISH inside the scripts.
constexpr double kProbeEvals = 2;
constexpr double kProbeCommands = 8;
// No single future is waited on longer than this: a bug fails the case
// instead of hanging it.
constexpr auto kFutureBound = 30s;

lockwatch::testing::RedisServer* g_redis = nullptr;
std::atomic<std::uint64_t> g_run{0};

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

QuietWait g_quiet(15s, 60s);

std::map<std::string, long long> command_calls() { return lockwatch::bench::command_calls(*g_redis); }
CpuSample sample_cpu() { return lockwatch::bench::sample_cpu(*g_redis); }
void wait_for_quiet() { g_quiet(*g_redis); }

bool g_failed = false;

void report_failure(const benchmark::State& state, const std::string& what) {
  std::fprintf(stderr, "watchdog_bench: FAILED %lld leases, ttl %lld ms: %s\n", static_cast<long long>(state.range(0)),
               static_cast<long long>(state.range(1)), what.c_str());
  g_failed = true;
}

lockwatch::Options runtime_options() {
  lockwatch::Options o;
  o.redis_url = g_redis->url();
  o.runtime.threads = 2;  // the pool is idle here; one per core
  return o;
}

template <class T>
bool ready_in_bound(std::future<T>& f) {
  return f.wait_for(kFutureBound) == std::future_status::ready;
}

// Times probes on a fixed schedule on its own thread until `until`.
class LagProbe {
 public:
  LagProbe(lockwatch::Runtime& rt, std::uint64_t run, Clock::time_point until)
      : thread_([this, &rt, run, until] { probe(rt, run, until); }) {}
  ~LagProbe() {
    if (thread_.joinable()) thread_.join();
  }
  LagProbe(const LagProbe&) = delete;
  LagProbe& operator=(const LagProbe&) = delete;

  // Joins; then the results may be read.
  void join() { thread_.join(); }
  std::vector<double>& lag_ms() { return lag_ms_; }
  std::size_t probes() const { return probes_; }
  const std::string& error() const { return error_; }

 private:
  void probe(lockwatch::Runtime& rt, std::uint64_t run, Clock::time_point until) {
    auto next = Clock::now() + kProbeEvery;
    while (next < until && error_.empty()) {
      std::this_thread::sleep_until(next);
      next += kProbeEvery;
      try {
        auto t0 = Clock::now();
        auto acquired = rt.acquire(fmt::format("wdprobe:{}:{}", run, probes_), kProbeTtl);
        ++probes_;
        if (!ready_in_bound(acquired)) {
          error_ = "probe acquire not ready in time";
          return;
        }
        auto h = acquired.get();
        lag_ms_.push_back(seconds_between(t0, Clock::now()) * 1e3);
        auto released = h.release();
        if (!ready_in_bound(released)) {
          error_ = "probe release not ready in time";
          return;
        }
        released.get();
      } catch (const std::exception& e) {
        error_ = std::string("probe: ") + e.what();
      }
    }
  }

  std::vector<double> lag_ms_;
  std::size_t probes_ = 0;
  std::string error_;
  std::thread thread_;  // last: starts once the rest is built
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// This process's CPU per probe, measured once on an idle runtime that holds
// one lease (so the wheel ticks, as during a hold): CPU over kWindow with
// probes every kEvery, minus CPU over kWindow without. It is an upper bound
// for a busy loop, where wake-ups are shared with the renewals.
double probe_cost() {
  static const double cost = [] {
    constexpr auto kWindow = 2s;
    constexpr auto kEvery = 10ms;
    lockwatch::Runtime rt(runtime_options());
    std::uint64_t run = ++g_run;
    auto held = rt.acquire(fmt::format("wdcal:{}", run), 30s).get();
    std::this_thread::sleep_for(200ms);  // settle
    double cpu0 = process_cpu_seconds();
    std::this_thread::sleep_for(kWindow);
    double idle = process_cpu_seconds() - cpu0;
    std::size_t probes = 0;
    auto until = Clock::now() + kWindow;
    double cpu1 = process_cpu_seconds();
    for (auto next = Clock::now() + kEvery; next < until; next += kEvery) {
      std::this_thread::sleep_until(next);
      auto h = rt.acquire(fmt::format("wdcal:{}:{}", run, probes++), kProbeTtl).get();
      h.release().get();
    }
    std::this_thread::sleep_until(until);
    double busy = process_cpu_seconds() - cpu1;
    held.release().get();
    return std::max(0.0, (busy - idle) / static_cast<double>(probes));
  }();
  return cost;
}

void BM_Watchdog(benchmark::State& state) {
  const auto leases = static_cast<std::size_t>(state.range(0));
  const auto ttl = std::chrono::milliseconds(state.range(1));
  const auto hold = ttl < 10s ? 10s : 30s;
  wait_for_quiet();
  const double per_probe_cpu = probe_cost();

  g_redis->command({"FLUSHALL"});
  const std::uint64_t run = ++g_run;
  lockwatch::Runtime rt(runtime_options());
  rt.acquire(fmt::format("wdwarm:{}", run), ttl).get().release().get();  // connects, loads the scripts

  std::vector<lockwatch::LockHandle> handles;
  handles.reserve(leases);
  std::string error;
  for (auto _ : state) {
    // Acquire, with up to kWindow in flight.
    auto acquire_start = Clock::now();
    std::deque<std::future<lockwatch::LockHandle>> in_flight;
    std::size_t next = 0;
    while ((next < leases || !in_flight.empty()) && error.empty()) {
      while (next < leases && in_flight.size() < kWindow)
        in_flight.push_back(rt.acquire(fmt::format("wd:{}:{}", run, next++), ttl));
      auto& f = in_flight.front();
      if (!ready_in_bound(f)) {
        error = "acquire not ready in time";
        break;
      }
      try {
        handles.push_back(f.get());
      } catch (const std::exception& e) {
        error = std::string("acquire failed: ") + e.what();
      }
      in_flight.pop_front();
    }
    double acquire_s = seconds_between(acquire_start, Clock::now());
    if (!error.empty()) {
      state.SkipWithError(error.c_str());  // before leaving the loop early
      break;
    }

    // Hold.
    auto stats0 = rt.stats();
    auto cmds0 = command_calls();
    auto cpu0 = sample_cpu();
    const double loop0 = threads_cpu_seconds("lw-loop");
    std::uint64_t confirmed0 = 0;
    for (auto& h : handles) confirmed0 += h.lease().renewals();
    auto hold_start = Clock::now();
    LagProbe probe(rt, run, hold_start + hold);
    std::this_thread::sleep_until(hold_start + hold);
    auto stats1 = rt.stats();
    auto hold_end = Clock::now();
    auto cpu1 = sample_cpu();
    const double loop_cpu = threads_cpu_seconds("lw-loop") - loop0;
    probe.join();
    auto cmds1 = command_calls();
    std::uint64_t confirmed1 = 0, lost_handles = 0;
    std::map<std::string, std::uint64_t> lost_reasons;
    for (auto& h : handles) {
      confirmed1 += h.lease().renewals();
      if (h.lease().lost()) {
        ++lost_handles;
        auto reason = h.lease().lost_reason();
        ++lost_reasons[reason ? lockwatch::to_string(*reason) : "?"];
      }
    }
    double held_s = seconds_between(hold_start, hold_end);
    state.SetIterationTime(held_s);

    // Release, timed on its own.
    auto release_start = Clock::now();
    std::deque<std::future<void>> releasing;
    std::size_t release_errors = 0;
    std::string first_release_error;
    for (std::size_t i = 0; (i < handles.size() || !releasing.empty()) && error.empty();) {
      while (i < handles.size() && releasing.size() < kWindow) releasing.push_back(handles[i++].release());
      auto& f = releasing.front();
      if (!ready_in_bound(f)) {
        error = "release not ready in time";
        break;
      }
      try {
        f.get();
      } catch (const std::exception& e) {
        if (release_errors++ == 0) first_release_error = e.what();
      }
      releasing.pop_front();
    }
    double release_s = seconds_between(release_start, Clock::now());
    handles.clear();

    const auto renewals = static_cast<double>(stats1.renewals_sent - stats0.renewals_sent);
    const double r = std::max(renewals, 1.0);
    const auto probes = static_cast<double>(probe.probes());
    const double self_cpu = cpu1.self - cpu0.self;
    const double wall = seconds_between(cpu0.wall, cpu1.wall);
    CommandDelta cmds = command_delta(cmds0, cmds1);
    auto& c = state.counters;
    c["renewals"] = renewals;
    c["renewals_per_lease"] = renewals / static_cast<double>(leases);
    c["renewals_ok"] = static_cast<double>(confirmed1 - confirmed0);
    c["us_cpu_per_renewal"] = std::max(0.0, self_cpu - probes * per_probe_cpu) * 1e6 / r;
    c["us_cpu_gross_per_renewal"] = self_cpu * 1e6 / r;
    c["us_loop_cpu_per_renewal"] = loop_cpu * 1e6 / r;
    c["cmds_per_renewal"] = static_cast<double>(stats1.renew_commands - stats0.renew_commands) / r;
    c["wakeups_per_renewal"] = static_cast<double>(stats1.timer_wakeups - stats0.timer_wakeups) / r;
    c["min_slack_ms"] = static_cast<double>(stats1.min_renewal_slack.count()) / 1000.0;
    c["srv_evals_per_renewal"] = std::max(0.0, cmds.evals - probes * kProbeEvals) / r;
    c["srv_cmds_per_renewal"] = std::max(0.0, cmds.all - probes * kProbeCommands) / r;
    c["redis_cpu_us_per_renewal"] = (cpu1.redis - cpu0.redis) * 1e6 / r;
    c["lost"] = static_cast<double>(std::max<std::uint64_t>(stats1.leases_lost, lost_handles));
    c["lag_p50_ms"] = percentile(probe.lag_ms(), 0.50);
    c["lag_p99_ms"] = percentile(probe.lag_ms(), 0.99);
    c["lag_max_ms"] = percentile(probe.lag_ms(), 1.0);
    c["probes"] = probes;
    c["foreign_cores"] = std::max(0.0, (cpu1.busy - cpu0.busy) - self_cpu - (cpu1.redis - cpu0.redis)) / wall;
    c["steal_cores"] = (cpu1.steal - cpu0.steal) / wall;
    c["acquire_s"] = acquire_s;
    c["release_s"] = release_s;
    c["release_errors"] = static_cast<double>(release_errors);
    if (!probe.error().empty() && error.empty()) error = probe.error();
    if (!error.empty()) {
      state.SkipWithError(error.c_str());
      continue;
    }
    // Lost leases and failed releases fail the binary but keep the row's
    // counters on the table.
    if (stats1.leases_lost != 0 || lost_handles != 0) {
      std::string why;
      for (const auto& [reason, n] : lost_reasons) why += fmt::format("; {}: {}", reason, n);
      report_failure(state, fmt::format("{} leases lost (runtime stats: {}){}", lost_handles, stats1.leases_lost, why));
    }
    if (release_errors != 0)
      report_failure(state, fmt::format("{} releases failed; first: {}", release_errors, first_release_error));
  }
  // Whatever is still held is released by the handles' destructors, before
  // the runtime goes.
  handles.clear();
}

void register_benchmarks() {
  for (long ttl_ms : {2000L, 30000L}) {
    for (long leases : {1000L, 10000L, 100000L}) {
      benchmark::RegisterBenchmark("BM_Watchdog", BM_Watchdog)
          ->Args({leases, ttl_ms})
          ->Iterations(1)
          ->UseManualTime()
          ->Unit(benchmark::kSecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_benchmarks();
  int status = lockwatch::bench::run_against_redis("watchdog_bench", g_redis);
  return g_failed ? 1 : status;
}
