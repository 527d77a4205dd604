// What counting costs the hot path: each event as the I/O thread reports it
// (relaxed atomics, no observer attached), against the same event with an
// observer attached (one queued task per event), and a whole scrape.
//
//   BM_EventRenewed            a confirmed renewal: one counter
//   BM_EventAcquired           a grant: one counter and a histogram bucket
//   BM_EventReleased           a release: a histogram bucket
//   BM_EventRenewedObserved    the same renewal with one observer attached
//   BM_RenderMetrics           Runtime::metrics_text()'s work: every family
//
// No Redis: the counters are the whole cost the library adds per event.
#include <benchmark/benchmark.h>

#include <string>

#include "lockwatch/thread_pool.hpp"
#include "ops/events.hpp"

namespace {

using lockwatch::ThreadPool;
using lockwatch::detail::Events;
using namespace std::chrono_literals;

const std::string kKey = "orders:12345";

void BM_EventRenewed(benchmark::State& state) {
  ThreadPool thread(1);
  Events events(thread, nullptr);
  for (auto _ : state) events.renewed(kKey, 150ms);
  state.counters["renewals"] = static_cast<double>(events.metrics().renewals.load());
}
BENCHMARK(BM_EventRenewed);

void BM_EventAcquired(benchmark::State& state) {
  ThreadPool thread(1);
  Events events(thread, nullptr);
  for (auto _ : state) events.acquired(kKey, 7, 300us);
}
BENCHMARK(BM_EventAcquired);

void BM_EventReleased(benchmark::State& state) {
  ThreadPool thread(1);
  Events events(thread, nullptr);
  for (auto _ : state) events.released(kKey, 2s);
}
BENCHMARK(BM_EventReleased);

struct Quiet : lockwatch::Observer {};

void BM_EventRenewedObserved(benchmark::State& state) {
  ThreadPool thread(1);
  Events events(thread, nullptr);
  events.add(std::make_shared<Quiet>());
  for (auto _ : state) events.renewed(kKey, 150ms);
  thread.shutdown();  // the queued events are delivered inside the timing: their whole cost
}
BENCHMARK(BM_EventRenewedObserved)->Iterations(200000);

void BM_RenderMetrics(benchmark::State& state) {
  ThreadPool thread(1);
  Events events(thread, nullptr);
  lockwatch::detail::StatsCounters stats;
  for (int i = 0; i < 1000; ++i) events.acquired(kKey, 1, 1ms);
  std::size_t bytes = 0;
  for (auto _ : state) {
    auto text = events.metrics().render(stats);
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_RenderMetrics);

}  // namespace

BENCHMARK_MAIN();
