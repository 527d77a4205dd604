// LOCKED on an Asio coroutine against LOCKED's future fan-out, 64 calls in
// flight each, in one run against one local redis-server.
//
//   BM_AsioLocked/64/uncontended   one thread runs a single-threaded
//       io_context with 64 coroutines, each awaiting a LOCKED coroutine
//       (an empty body) on a fresh key, again and again: no thread waits
//       on anything, the runtime's notifier posts each outcome to the
//       context.
//   BM_FutureFanOut/64/uncontended the future form's best shape (as
//       lock_bench's BM_LockedFanOut): one thread issues a round of 64
//       LOCKED calls (an empty callable on the pool), then waits for
//       their futures in turn.
//
// Both on a runtime with default options, a lock ttl of 30 s, fresh keys
// ("uncontended"), each row a 1 s slice per iteration. Counters:
//   cycles_per_s       completed lock cycles (acquire, body, release) / s
//   cpu_us_per_cycle   this process's CPU (user + sys, every thread,
//                      the runtime's included) / cycle
//   ctx_switches_per_cycle  this process's context switches (getrusage
//                      RUSAGE_SELF: ru_nvcsw + ru_nivcsw, every thread)
//                      during the slices / cycle
#include <benchmark/benchmark.h>

#include <asio.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <vector>

#include "bench_common.hpp"
#include "lockwatch/asio.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using lockwatch::bench::process_context_switches;
using lockwatch::bench::process_cpu_seconds;

constexpr auto kTtl = 30s;
constexpr auto kSlice = 1s;
lockwatch::testing::RedisServer* g_redis = nullptr;
std::uint64_t g_run = 0;

lockwatch::Options runtime_options() {
  lockwatch::Options o;
  o.redis_url = g_redis->url();
  return o;
}

void report(benchmark::State& state, double cycles, double seconds, double cpu, double switches) {
  state.counters["cycles_per_s"] = cycles / seconds;
  state.counters["cpu_us_per_cycle"] = cycles > 0 ? cpu * 1e6 / cycles : 0;
  state.counters["ctx_switches_per_cycle"] = cycles > 0 ? switches / cycles : 0;
}

void BM_AsioLocked(benchmark::State& state, int conc) {
  lockwatch::Runtime rt(runtime_options());
  const std::uint64_t run = ++g_run;
  auto fn = lockwatch::locked("la:{0}:{1}", kTtl, lockwatch::forever)
                .on(rt)([](std::uint64_t, std::uint64_t) -> asio::awaitable<void> { co_return; });
  double cycles = 0, seconds = 0, cpu = 0, switches = 0;
  std::uint64_t n = 0;
  std::string error;
  for (auto _ : state) {
    asio::io_context ctx(1);
    const auto deadline = Clock::now() + kSlice;
    std::uint64_t done = 0;
    int running = conc;
    auto t0 = Clock::now();
    double c0 = process_cpu_seconds();
    double s0 = process_context_switches();
    for (int i = 0; i < conc; ++i) {
      asio::co_spawn(
          ctx,
          [&]() -> asio::awaitable<void> {
            while (Clock::now() < deadline) {
              co_await fn(run, n++);
              ++done;
            }
          },
          [&](std::exception_ptr e) {
            if (e && error.empty()) {
              try {
                std::rethrow_exception(e);
              } catch (const std::exception& x) {
                error = x.what();
              }
            }
            --running;
          });
    }
    ctx.run_for(kSlice + 30s);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    cpu += process_cpu_seconds() - c0;
    switches += process_context_switches() - s0;
    state.SetIterationTime(secs);
    seconds += secs;
    cycles += static_cast<double>(done);
    if (running != 0 && error.empty()) error = "coroutines still running after the slice's bound";
  }
  report(state, cycles, seconds, cpu, switches);
  if (!error.empty()) state.SkipWithError(error.c_str());
}

void BM_FutureFanOut(benchmark::State& state, int conc) {
  lockwatch::Runtime rt(runtime_options());
  const std::uint64_t run = ++g_run;
  auto fn = lockwatch::locked("lf:{0}:{1}", kTtl, lockwatch::forever).on(rt)([](std::uint64_t, std::uint64_t) {});
  double cycles = 0, seconds = 0, cpu = 0, switches = 0;
  std::uint64_t n = 0;
  std::string error;
  std::vector<std::future<void>> round;
  for (auto _ : state) {
    const auto deadline = Clock::now() + kSlice;
    std::uint64_t done = 0;
    auto t0 = Clock::now();
    double c0 = process_cpu_seconds();
    double s0 = process_context_switches();
    while (Clock::now() < deadline && error.empty()) {
      round.clear();
      for (int i = 0; i < conc; ++i) round.push_back(fn(run, n++));
      for (auto& f : round) {
        try {
          if (f.wait_for(30s) != std::future_status::ready) throw std::runtime_error("a call took over 30 s");
          f.get();
          ++done;
        } catch (const std::exception& e) {
          if (error.empty()) error = e.what();
        }
      }
    }
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    cpu += process_cpu_seconds() - c0;
    switches += process_context_switches() - s0;
    state.SetIterationTime(secs);
    seconds += secs;
    cycles += static_cast<double>(done);
  }
  report(state, cycles, seconds, cpu, switches);
  if (!error.empty()) state.SkipWithError(error.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // Alternated, so that a change in the machine's load shows in both.
  for (int rep = 0; rep < 2; ++rep) {
    benchmark::RegisterBenchmark("BM_AsioLocked/64/uncontended", BM_AsioLocked, 64)
        ->UseManualTime()
        ->Iterations(3)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_FutureFanOut/64/uncontended", BM_FutureFanOut, 64)
        ->UseManualTime()
        ->Iterations(3)
        ->Unit(benchmark::kMillisecond);
  }
  return lockwatch::bench::run_against_redis("asio_bench", g_redis);
}
