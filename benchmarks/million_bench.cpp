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
//   loop_us_per_renewal    the I/O thread's CPU alone (its schedstat) during
//                     the hold / renewals sent: the part of the above that
//                     sends and answers them
//   lost              leases reported lost (must be 0)
//   released_per_s    N / the time to release them all at once (a release
//                     that Redis did not confirm would wait out its ttl)
//   srv_us_per_acquisition  redis-server's CPU while they were taken, over N
//   srv_us_per_renewal      redis-server's CPU during the hold / renewals
//
// The limit, BM_RawHiredisMillion: raw hiredis doing the same work on one
// connection, as lockwatch's Redis store sends it (the same three scripts,
// kBatch locks a script call, kCallsInFlight calls unanswered at most, the
// same key layout, token size and owner record): take N leases, renew each
// once, release them. Its client keeps nothing but a token per lease, so
// it has no bytes-per-lease figure; its srv_us_per_acquisition is what the
// server itself needs, which bounds acquired_per_s for any client of one
// redis-server.
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>

#include "bench_common.hpp"
#include "core/option_checks.hpp"
#include "lockwatch/runtime.hpp"
#include "store/redis/keys.hpp"
#include "store/redis/scripts.hpp"

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
    auto start_cpu = lockwatch::bench::sample_cpu(*g_redis);
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

    auto acquired_cpu = lockwatch::bench::sample_cpu(*g_redis);

    auto before = rt.stats();
    double cpu0 = lockwatch::bench::process_cpu_seconds();
    const double loop0 = lockwatch::bench::threads_cpu_seconds("lw-loop");
    std::this_thread::sleep_for(kHold);  // holding is the measurement
    double cpu = lockwatch::bench::process_cpu_seconds() - cpu0;
    const double loop_cpu = lockwatch::bench::threads_cpu_seconds("lw-loop") - loop0;
    auto held_cpu = lockwatch::bench::sample_cpu(*g_redis);
    auto after = rt.stats();
    double renewals = static_cast<double>(after.renewals_sent - before.renewals_sent);
    std::size_t lost = 0;
    for (auto& h : held) lost += h.lease().lost() ? 1 : 0;

    state.counters["acquired_per_s"] = static_cast<double>(leases) / acquire_s;
    state.counters["bytes_per_lease"] = (rss1 - rss0) / static_cast<double>(leases);
    state.counters["heap_bytes_per_lease"] = (heap1 - heap0) / static_cast<double>(leases);
    state.counters["renewals"] = renewals;
    state.counters["client_us_per_renewal"] = renewals > 0 ? cpu * 1e6 / renewals : 0;
    state.counters["loop_us_per_renewal"] = renewals > 0 ? loop_cpu * 1e6 / renewals : 0;
    state.counters["renewals_per_lease"] = renewals / static_cast<double>(leases);
    state.counters["srv_us_per_acquisition"] =
        (acquired_cpu.redis - start_cpu.redis) * 1e6 / static_cast<double>(leases);
    state.counters["srv_us_per_renewal"] = renewals > 0 ? (held_cpu.redis - acquired_cpu.redis) * 1e6 / renewals : 0;
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

// One pipelined connection for BM_RawHiredisMillion: calls go out as they
// are made, at most kCallsInFlight unanswered; each answer is checked to
// hold one `ok` byte (or entry) per lock.
class RawPipeline {
 public:
  static constexpr std::size_t kCallsInFlight = 64;  // RedisNodeStore::kMaxBatchesInFlight

  RawPipeline() : c_(redisConnect(g_redis->host().c_str(), g_redis->port())) {
    if (c_ == nullptr || c_->err) throw std::runtime_error("raw hiredis: cannot connect");
  }
  ~RawPipeline() { redisFree(c_); }
  RawPipeline(const RawPipeline&) = delete;
  RawPipeline& operator=(const RawPipeline&) = delete;

  // Sends one call (its arguments: views into strings that live until
  // it is sent) whose answer must hold `locks` times `ok`.
  void call(const std::vector<std::string_view>& args, std::size_t locks, char ok) {
    argv_.clear();
    lens_.clear();
    for (auto a : args) {
      argv_.push_back(a.data());
      lens_.push_back(a.size());
    }
    if (redisAppendCommandArgv(c_, static_cast<int>(argv_.size()), argv_.data(), lens_.data()) != REDIS_OK)
      throw std::runtime_error("raw hiredis: cannot queue a call");
    expected_.push_back({locks, ok});
    if (expected_.size() >= kCallsInFlight) read_one();
  }
  // Waits for every answer.
  void drain() {
    while (!expected_.empty()) read_one();
  }

 private:
  void read_one() {
    void* out = nullptr;
    if (redisGetReply(c_, &out) != REDIS_OK || out == nullptr) throw std::runtime_error("raw hiredis: no reply");
    auto* r = static_cast<redisReply*>(out);
    auto [locks, ok] = expected_.front();
    expected_.pop_front();
    const std::string_view text = r->type == REDIS_REPLY_STRING ? std::string_view(r->str, r->len) : "";
    const auto n = static_cast<std::size_t>(std::count(text.begin(), text.end(), ok));
    freeReplyObject(r);
    if (n != locks) throw std::runtime_error(fmt::format("raw hiredis: {} of {} locks answered '{}'", n, locks, ok));
  }

  redisContext* c_;
  std::vector<const char*> argv_;
  std::vector<std::size_t> lens_;
  std::deque<std::pair<std::size_t, char>> expected_;
};

void BM_RawHiredisMillion(benchmark::State& state) {
  using lockwatch::detail::script;
  using lockwatch::detail::ScriptId;
  const auto leases = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t kBatch = 256;  // RedisNodeStore::kMaxBatch
  const std::string owner = lockwatch::detail::owner_name(lockwatch::Options{});
  for (auto _ : state) {
    for (auto id : {ScriptId::kAcquire, ScriptId::kRenew, ScriptId::kRelease})
      g_redis->command({"SCRIPT", "LOAD", std::string(script(id).source)});
    // What lockwatch's store keeps per lease, made before the clock starts:
    // its names and token.
    namespace keys = lockwatch::detail::redis_keys;
    struct Names {
      std::string lock, counter, legacy, channel;
      std::array<char, 33> token;
    };
    std::vector<Names> locks(leases);
    for (std::size_t i = 0; i < leases; ++i) {
      auto& l = locks[i];
      l.lock = keys::lock("lockwatch:", fmt::format("million-raw:{}", i));
      l.counter = keys::counter("lockwatch:", l.lock);
      l.legacy = keys::legacy_fence(l.lock);
      l.channel = keys::channel(l.lock);
      std::snprintf(l.token.data(), l.token.size(), "%016llx%016llx", 0x5eedULL, static_cast<unsigned long long>(i));
    }
    const std::string ttl = "30000";
    // Each pass: the locks of [0, leases) in calls of kBatch, `args` adding
    // a call's keys and arguments.
    auto pass = [&](ScriptId id, char ok, auto&& args) {
      RawPipeline pipe;
      std::vector<std::string_view> call;
      std::string keys_count;
      for (std::size_t first = 0; first < leases; first += kBatch) {
        const std::size_t n = std::min(kBatch, leases - first);
        call.assign({"EVALSHA", script(id).sha1, ""});
        args(call, std::span(locks).subspan(first, n));
        keys_count = std::to_string(id == ScriptId::kAcquire ? 3 * n : n);
        call[2] = keys_count;
        pipe.call(call, n, ok);
      }
      pipe.drain();
    };
    try {
      auto c0 = lockwatch::bench::sample_cpu(*g_redis);
      pass(ScriptId::kAcquire, 't', [&](std::vector<std::string_view>& call, std::span<const Names> batch) {
        for (const auto& l : batch) call.insert(call.end(), {l.lock, l.counter, l.legacy});
        for (const auto& l : batch) call.insert(call.end(), {l.token.data(), ttl});
        call.push_back(owner);
      });
      auto c1 = lockwatch::bench::sample_cpu(*g_redis);
      pass(ScriptId::kRenew, '1', [&](std::vector<std::string_view>& call, std::span<const Names> batch) {
        for (const auto& l : batch) call.push_back(l.lock);
        for (const auto& l : batch) call.insert(call.end(), {l.token.data(), ttl});
      });
      auto c2 = lockwatch::bench::sample_cpu(*g_redis);
      pass(ScriptId::kRelease, 'u', [&](std::vector<std::string_view>& call, std::span<const Names> batch) {
        for (const auto& l : batch) call.push_back(l.lock);
        call.emplace_back("p");
        for (const auto& l : batch) call.insert(call.end(), {l.token.data(), l.channel});
      });
      auto c3 = lockwatch::bench::sample_cpu(*g_redis);
      auto per = [&](double seconds) { return seconds * 1e6 / static_cast<double>(leases); };
      auto wall = [](const auto& a, const auto& b) { return std::chrono::duration<double>(b.wall - a.wall).count(); };
      state.counters["acquired_per_s"] = static_cast<double>(leases) / wall(c0, c1);
      state.counters["srv_us_per_acquisition"] = per(c1.redis - c0.redis);
      state.counters["client_us_per_renewal"] = per(c2.self - c1.self);
      state.counters["srv_us_per_renewal"] = per(c2.redis - c1.redis);
      state.counters["released_per_s"] = static_cast<double>(leases) / wall(c2, c3);
      state.counters["lost"] = 0;
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      g_failed = true;
      return;
    }
  }
}

}  // namespace

BENCHMARK(BM_RawHiredisMillion)->Arg(1'000'000)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK(BM_MillionLeases)->Arg(1'000'000)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int status = lockwatch::bench::run_against_redis(argv[0], g_redis);
  return status != 0 || g_failed ? 1 : 0;
}
