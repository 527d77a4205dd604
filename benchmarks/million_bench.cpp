// benchmarks/million_bench.cpp: a million leases held by one process on one
// redis-server (the program starts it): how fast they are taken, what each
// costs in client memory, what a renewal costs in client CPU, and whether
// any is lost.
//
// One row per lease count: take N leases through Runtime::acquire (ttl 30 s,
// at most 16,384 in flight), then hold them all for 35 s, so that every lease
// is renewed at least once (at 9/10 of its ttl), then release them.
//   acquired_per_s    N / the time to take them all
//   bytes_per_lease   growth of the resident set while taking them, over N
//                     (the caller's own vector of handles is touched before
//                     the first reading, so it is not counted)
//   heap_bytes_per_lease  growth of what malloc has handed out, over N: the
//                     part of the above that is the library's blocks
//   client_us_per_renewal  the process's CPU during the hold / renewals sent
//   lost              leases reported lost (must be 0)
//   released_per_s    N / the time to release them all at once (a release
//                     that Redis did not confirm would wait out its ttl)
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "lockwatch/runtime.hpp"

namespace {

using namespace std::chrono_literals;
using lockwatch::bench::BenchClock;

lockwatch::testing::RedisServer* g_redis = nullptr;
bool g_failed = false;

// Bytes the allocator has handed out and not got back, over every arena
// (malloc_info: what it holds from the system less its free chunks).
double heap_in_use() {
  char* text = nullptr;
  std::size_t size = 0;
  std::FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return 0;
  malloc_info(0, f);
  std::fclose(f);
  std::string xml(text, size);
  std::free(text);
  // The totals over all arenas follow the last </heap>.
  auto pos = xml.rfind("</heap>");
  if (pos == std::string::npos) return 0;
  auto number = [&](const char* tag) {
    auto at = xml.find(tag, pos);
    if (at == std::string::npos) return 0.0;
    at = xml.find("size=\"", at);
    return at == std::string::npos ? 0.0 : std::atof(xml.c_str() + at + 6);
  };
  return number("<system type=\"current\"") + number("<total type=\"mmap\"") - number("<total type=\"fast\"") -
         number("<total type=\"rest\"");
}

double resident_bytes() {
  long pages = 0, resident = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

void BM_MillionLeases(benchmark::State& state) {
  const auto leases = static_cast<std::size_t>(state.range(0));
  constexpr auto kTtl = 30s;
  constexpr auto kHold = 35s;
  constexpr std::size_t kInFlight = 16384;
  for (auto _ : state) {
    lockwatch::Options o;
    o.redis_url = g_redis->url();
    lockwatch::Runtime rt(o);
    {  // connected, scripts loaded, allocator warm
      auto h = rt.acquire("million:warm", kTtl).get();
      h.release().get();
    }
    std::vector<lockwatch::LockHandle> held(leases);  // touched now, not counted below
    std::deque<std::future<lockwatch::LockHandle>> acquiring;
    double rss0 = resident_bytes();
    double heap0 = heap_in_use();
    auto t0 = BenchClock::now();
    std::size_t next = 0, done = 0;
    try {
      while (done < leases) {
        while (next < leases && acquiring.size() < kInFlight)
          acquiring.push_back(rt.acquire(fmt::format("million:{}", next++), kTtl));
        auto& f = acquiring.front();
        if (f.wait_for(60s) != std::future_status::ready) throw std::runtime_error("an acquisition took over 60 s");
        held[done++] = f.get();
        acquiring.pop_front();
      }
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      g_failed = true;
      return;
    }
    double acquire_s = std::chrono::duration<double>(BenchClock::now() - t0).count();
    acquiring.shrink_to_fit();
    double rss1 = resident_bytes();
    double heap1 = heap_in_use();

    auto before = rt.stats();
    double cpu0 = lockwatch::bench::process_cpu_seconds();
    std::this_thread::sleep_for(kHold);  // holding is the measurement
    double cpu = lockwatch::bench::process_cpu_seconds() - cpu0;
    auto after = rt.stats();
    double renewals = static_cast<double>(after.renewals_sent - before.renewals_sent);
    std::size_t lost = 0;
    for (auto& h : held) lost += h.lease().lost() ? 1 : 0;

    state.counters["acquired_per_s"] = static_cast<double>(leases) / acquire_s;
    state.counters["bytes_per_lease"] = (rss1 - rss0) / static_cast<double>(leases);
    state.counters["heap_bytes_per_lease"] = (heap1 - heap0) / static_cast<double>(leases);
    state.counters["renewals"] = renewals;
    state.counters["client_us_per_renewal"] = renewals > 0 ? cpu * 1e6 / renewals : 0;
    state.counters["renewals_per_lease"] = renewals / static_cast<double>(leases);
    state.counters["lost"] = static_cast<double>(lost);
    if (lost > 0 || renewals < static_cast<double>(leases)) g_failed = true;

    // All at once: confirmed releases only, at Redis's pace (a release
    // left unconfirmed would wait for its key to expire, a whole ttl).
    std::vector<std::future<void>> releasing;
    releasing.reserve(leases);
    const auto release_start = std::chrono::steady_clock::now();
    for (auto& h : held) releasing.push_back(h.release());
    std::size_t unready = 0;
    for (auto& f : releasing) unready += f.wait_for(60s) != std::future_status::ready;
    const double release_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - release_start).count();
    state.counters["released_per_s"] = static_cast<double>(leases) / release_s;
    if (unready > 0) g_failed = true;
  }
}

}  // namespace

BENCHMARK(BM_MillionLeases)->Arg(1'000'000)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int status = lockwatch::bench::run_against_redis(argv[0], g_redis);
  return status != 0 || g_failed ? 1 : 0;
}
