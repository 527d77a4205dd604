// The same lock work on each lock store, in one run: one Redis node
// (redis-server) in plaintext (`redis`) and over TLS (`rediss`, its own
// server with a TLS port), a Redis Cluster of 3 masters and 3 replicas
// (`cluster`), a SQL table (`mysql`, mariadbd) and, when lockwatch is built
// with it, a PostgreSQL table (`postgresql`, postgres), each started here
// on loopback. Server CPU is the server's process; for the cluster, the sum
// over its six nodes; for postgres, over its process tree (the postmaster,
// a process per connection and its helpers, and those that ended).
//
//   BM_Cycle/<store>/<callers>     acquire + release through LockHandle on
//                                  distinct keys, <callers> threads
//   BM_Watchdog/<store>/<leases>   <leases> held for three renewal rounds
//                                  (ttl 2 s): client and server CPU per
//                                  renewal, renewal commands per round,
//                                  leases lost (must be 0); and what says
//                                  why one would be: the least slack a
//                                  confirmed renewal left (min_slack_ms;
//                                  negative: read after its deadline), the
//                                  I/O thread's wake-ups that came more than
//                                  50 ms late (late_wakeups_50ms) and the
//                                  latest one's bucket (max_lag_ms), and the
//                                  lost leases by reason (lost_expired,
//                                  lost_unreachable, lost_taken); on Redis,
//                                  the least slack as it stood after each
//                                  round (slack_r1_ms, slack_r2_ms,
//                                  slack_r3_ms: which round spent it) and the
//                                  server's longest event by its latency
//                                  monitor (server_max_event_ms, threshold
//                                  1 ms; the events are printed); how long
//                                  asking for the leases took (asked_in_s)
//                                  and getting them (acquired_in_s), and
//                                  how many attempts waited in the client
//                                  for the window of 16,384 in flight
//                                  (queued: RuntimeStats::attempts_queued)
//   BM_WatchdogPaced/<store>/<leases>/<ms>
//                                  the same, the leases asked for evenly
//                                  over <ms> (redis, rediss): a round's
//                                  renewals come due as densely as the
//                                  acquisitions were sent
//
// The servers run with the durability of the tests' servers:
// redis-server without persistence, mariadbd with
// innodb_flush_log_at_trx_commit=2 (tests/support/mariadb_server.cpp),
// postgres with fsync=off (tests/support/postgres_server.cpp): each
// commit is written to the OS, none is flushed to disk, as with
// mariadbd's 2 (a crash of the server loses nothing, one of the machine
// may).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <stdexcept>
#include <utility>
#include <vector>

#include "bench_common.hpp"
#include "lockwatch/lockwatch.hpp"
#if LOCKWATCH_WITH_SQL
#include "support/mariadb_server.hpp"
#endif
#if LOCKWATCH_WITH_POSTGRESQL
#include "support/postgres_server.hpp"
#endif
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;
using lockwatch::bench::BenchClock;

constexpr auto kFutureBound = 30s;

lockwatch::testing::RedisServer* g_redis = nullptr;
lockwatch::testing::RedisServer* g_rediss = nullptr;
#if LOCKWATCH_WITH_SQL
lockwatch::testing::MariaDbServer* g_mariadb = nullptr;
#endif
#if LOCKWATCH_WITH_POSTGRESQL
lockwatch::testing::PostgresServer* g_postgres = nullptr;
#endif
lockwatch::testing::RedisCluster* g_cluster = nullptr;
std::atomic<std::uint64_t> g_run{0};
bool g_failed = false;

std::string url_of(const std::string& store) {
  if (store == "redis") return g_redis->url();
  if (store == "rediss") return g_rediss->url();
  if (store == "cluster") return g_cluster->url();
#if LOCKWATCH_WITH_POSTGRESQL
  if (store == "postgresql") return g_postgres->url();
#endif
#if LOCKWATCH_WITH_SQL
  if (store == "mysql") return g_mariadb->url();
#endif
  throw std::invalid_argument("no store " + store);
}
std::vector<pid_t> server_pids(const std::string& store) {
  if (store == "redis") return {g_redis->pid()};
  if (store == "rediss") return {g_rediss->pid()};
  if (store == "cluster") {
    std::vector<pid_t> all;
    for (int i = 0; i < lockwatch::testing::RedisCluster::kNodes; ++i) all.push_back(g_cluster->node(i).pid());
    return all;
  }
#if LOCKWATCH_WITH_POSTGRESQL
  if (store == "postgresql") return g_postgres->pids();
#endif
#if LOCKWATCH_WITH_SQL
  if (store == "mysql") return {g_mariadb->pid()};
#endif
  return {};
}

// CPU seconds a process has used (user + system), from /proc; with
// `reaped`, also that of its children that ended and were waited for.
double process_cpu(pid_t pid, bool reaped = false);
double servers_cpu(const std::string& store) {
  double sum = 0;
  // postgres: the processes there now, and the postmaster's reaped
  // children (connections and helpers that ended in between).
  bool first = true;
  for (pid_t p : server_pids(store)) {
    sum += process_cpu(p, first && store == "postgresql");
    first = false;
  }
  return sum;
}
double process_cpu(pid_t pid, bool reaped) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(in, s);
  if (s.empty()) return 0;  // ended meanwhile
  std::istringstream rest(s.substr(s.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 17 && rest >> field; ++i)
    if (i == 14 || i == 15 || (reaped && (i == 16 || i == 17))) ticks += std::stod(field);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

template <class T>
T get_bounded(std::future<T>& f, const char* what) {
  if (f.wait_for(kFutureBound) != std::future_status::ready)
    throw std::runtime_error(fmt::format("{} not ready within {} s", what, kFutureBound.count()));
  return f.get();
}

lockwatch::Options options_for(const std::string& store) {
  lockwatch::Options o;
  o.redis_url = url_of(store);
  o.runtime.threads = 2;
  if (store == "rediss") o.tls.ca_file = lockwatch::testing::test_certificates().ca_cert;
  return o;
}

// One runtime per store and benchmark, shared by its threads.
std::unique_ptr<lockwatch::Runtime> g_runtime;

void BM_Cycle(benchmark::State& state, const std::string& store) {
  std::uint64_t run = 0;
  if (state.thread_index() == 0) {
    run = ++g_run;
    g_runtime = std::make_unique<lockwatch::Runtime>(options_for(store));
    auto warm = g_runtime->acquire(fmt::format("warm:{}", run), 5s);
    auto h = get_bounded(warm, "warm-up");
    auto r = h.release();
    get_bounded(r, "warm-up release");
  }
  std::uint64_t n = 0;
  const int me = state.thread_index();
  for (auto _ : state) {
    try {
      auto acquired = g_runtime->acquire(fmt::format("cycle:{}:{}:{}", g_run.load(), me, n++), 5s);
      auto h = get_bounded(acquired, "acquire");
      auto released = h.release();
      get_bounded(released, "release");
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      g_failed = true;
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());  // items_per_second: cycles per second, all callers together
}

// A counter of the runtime's Prometheus text ("name{labels} value").
double metric(const std::string& text, const std::string& name) {
  auto at = text.find("\n" + name + " ");
  if (at == std::string::npos) return 0;
  return std::atof(text.c_str() + at + name.size() + 2);
}

// From the loop-lag histogram: wake-ups more than `bound` s late (its
// buckets count those at most so late), and the
// upper bound of the highest occupied bucket in ms (+Inf as 1e9).
std::pair<double, double> lag_summary(const std::string& text, double bound) {
  const std::string prefix = "lockwatch_loop_lag_seconds_bucket{le=\"";
  const double count = metric(text, "lockwatch_loop_lag_seconds_count");
  double below = 0, max_ms = 0, previous = 0;
  for (std::size_t at = text.find(prefix); at != std::string::npos; at = text.find(prefix, at + 1)) {
    const std::size_t le_at = at + prefix.size();
    const std::string le = text.substr(le_at, text.find('"', le_at) - le_at);
    const double cumulative = std::atof(text.c_str() + text.find("} ", le_at) + 2);
    const double upper = le == "+Inf" ? 1e9 : std::atof(le.c_str()) * 1000;
    if (le != "+Inf" && std::atof(le.c_str()) < bound + 1e-12) below = cumulative;
    if (cumulative > previous) max_ms = upper;
    previous = cumulative;
  }
  return {count - below, max_ms};
}

// The Redis server of `store` (plain or TLS), or none.
lockwatch::testing::RedisServer* redis_of(const std::string& store) {
  if (store == "redis") return g_redis;
  if (store == "rediss") return g_rediss;
  return nullptr;
}

// The longest event the server's latency monitor saw since it was reset
// (ms), and the events, as "name:max_ms" each.
std::pair<double, std::string> server_latency(const lockwatch::testing::RedisServer& server) {
  double longest = 0;
  std::string events;
  for (const auto& e : server.command({"LATENCY", "LATEST"}).elements) {
    if (e.elements.size() < 4) continue;
    longest = std::max(longest, static_cast<double>(e.elements[3].integer));
    events += fmt::format("{}{}:{}", events.empty() ? "" : " ", e.elements[0].str, e.elements[3].integer);
  }
  return {longest, events};
}

double slack_ms(const lockwatch::RuntimeStats& s) {
  return s.min_renewal_slack == std::chrono::microseconds::max()
             ? 0
             : static_cast<double>(s.min_renewal_slack.count()) / 1000;
}

// `ask_span`: the leases are asked for evenly over it (zero: as fast as
// the loop takes them).
void watchdog_rounds(benchmark::State& state, const std::string& store, std::chrono::milliseconds ask_span) {
  const auto leases = static_cast<std::size_t>(state.range(0));
  constexpr auto kTtl = 2000ms;  // renewed every 1.8 s
  constexpr int kRounds = 3;
  auto* redis = redis_of(store);
  if (redis) redis->command({"CONFIG", "SET", "latency-monitor-threshold", "1"});
  for (auto _ : state) {
    std::uint64_t run = ++g_run;
    if (redis) redis->command({"LATENCY", "RESET"});
    lockwatch::Runtime rt(options_for(store));
    std::vector<std::future<lockwatch::LockHandle>> acquiring;
    acquiring.reserve(leases);
    auto t0 = BenchClock::now();
    for (std::size_t i = 0; i < leases; ++i) {
      if (ask_span.count() > 0 && i % 1000 == 0)
        std::this_thread::sleep_until(t0 + ask_span * static_cast<long>(i) / static_cast<long>(leases));
      acquiring.push_back(rt.acquire(fmt::format("wd:{}:{}", run, i), kTtl));
    }
    // About the span over which the acquisitions were sent, which each
    // renewal round repeats (a renewal goes out a fixed time after the
    // request before it).
    const double asked_s = std::chrono::duration<double>(BenchClock::now() - t0).count();
    std::vector<lockwatch::LockHandle> held;
    held.reserve(leases);
    try {
      for (auto& f : acquiring) held.push_back(get_bounded(f, "acquire"));
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      g_failed = true;
      return;
    }
    double acquire_s = std::chrono::duration<double>(BenchClock::now() - t0).count();
    auto before = rt.stats();
    double client0 = lockwatch::bench::process_cpu_seconds();
    double server0 = servers_cpu(store);
    auto until = BenchClock::now() + 60s;
    double slack_after[kRounds] = {};
    for (int round = 1; round <= kRounds; ++round) {
      // A round is over once the next one has begun: a round's renewals
      // go out over about the second the acquisitions took, so each was
      // answered, or its lease lost, by then.
      const std::size_t ended = round < kRounds ? round * leases + 1 : kRounds * leases;
      while (rt.stats().renewals_sent - before.renewals_sent < ended && BenchClock::now() < until)
        std::this_thread::sleep_for(50ms);  // a benchmark watching counters, not synchronising
      slack_after[round - 1] = slack_ms(rt.stats());
    }
    auto after = rt.stats();
    double client = lockwatch::bench::process_cpu_seconds() - client0;
    double server = servers_cpu(store) - server0;
    double renewals = static_cast<double>(after.renewals_sent - before.renewals_sent);
    std::size_t lost = 0;
    for (auto& h : held) lost += h.lease().lost() ? 1 : 0;
    state.counters["acquired_per_s"] = static_cast<double>(leases) / acquire_s;
    state.counters["asked_in_s"] = asked_s;
    state.counters["acquired_in_s"] = acquire_s;
    state.counters["queued"] = static_cast<double>(after.attempts_queued);  // a fresh runtime
    state.counters["renewals"] = renewals;
    state.counters["client_us_per_renewal"] = renewals > 0 ? client * 1e6 / renewals : 0;
    state.counters["server_us_per_renewal"] = renewals > 0 ? server * 1e6 / renewals : 0;
    state.counters["commands_per_round"] =
        static_cast<double>(after.renew_commands - before.renew_commands) / static_cast<double>(kRounds);
    // The same leases seen two ways (their handles, and the runtime's
    // count): the larger of the two, not their sum.
    state.counters["lost"] = static_cast<double>(std::max<std::uint64_t>(lost, after.leases_lost - before.leases_lost));
    const std::string text = rt.metrics_text();
    const auto [late, max_lag_ms] = lag_summary(text, 0.05);
    state.counters["min_slack_ms"] = slack_ms(after);
    if (redis) {
      for (int round = 0; round < kRounds; ++round)
        state.counters[fmt::format("slack_r{}_ms", round + 1)] = slack_after[round];
      const auto [longest, events] = server_latency(*redis);
      state.counters["server_max_event_ms"] = longest;
      if (!events.empty()) fmt::print(stderr, "{}: server latency events (max ms): {}\n", store, events);
    }
    state.counters["late_wakeups_50ms"] = late;
    state.counters["max_lag_ms"] = max_lag_ms;
    state.counters["lost_expired"] = metric(text, "lockwatch_leases_lost_total{reason=\"expired\"}");
    state.counters["lost_unreachable"] = metric(text, "lockwatch_leases_lost_total{reason=\"unreachable\"}");
    state.counters["lost_taken"] = metric(text, "lockwatch_leases_lost_total{reason=\"taken_by_other\"}");
    if (lost > 0) g_failed = true;
    for (auto& h : held) (void)h.release();
    held.clear();
  }
}

void BM_Watchdog(benchmark::State& state, const std::string& store) { watchdog_rounds(state, store, {}); }

// The same, the leases asked for over range(1) ms.
void BM_WatchdogPaced(benchmark::State& state, const std::string& store) {
  watchdog_rounds(state, store, std::chrono::milliseconds(state.range(1)));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::vector<std::string> stores{"redis", "rediss", "cluster"};
#if LOCKWATCH_WITH_SQL
  stores.push_back("mysql");
#endif
#if LOCKWATCH_WITH_POSTGRESQL
  stores.push_back("postgresql");
#endif
  for (const std::string& store : stores) {
    for (int callers : {1, 16, 64})
      benchmark::RegisterBenchmark(fmt::format("BM_Cycle/{}", store).c_str(), BM_Cycle, store)
          ->Threads(callers)
          ->UseRealTime()
          ->MinTime(2.0);
    auto* wd = benchmark::RegisterBenchmark(fmt::format("BM_Watchdog/{}", store).c_str(), BM_Watchdog, store);
    wd->Arg(10000);
    if (store != "mysql" && store != "postgresql") wd->Arg(100000);
    wd->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    if (store == "redis" || store == "rediss")
      benchmark::RegisterBenchmark(fmt::format("BM_WatchdogPaced/{}", store).c_str(), BM_WatchdogPaced, store)
          ->Args({100000, 1000})
          ->Iterations(1)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  }
  int status = 0;
  try {
    lockwatch::testing::RedisServer redis;
    lockwatch::testing::RedisServerOptions tls_options;
    tls_options.tls = lockwatch::testing::RedisTls{};
    lockwatch::testing::RedisServer rediss(tls_options);
#if LOCKWATCH_WITH_SQL
    lockwatch::testing::MariaDbServer mariadb;
    g_mariadb = &mariadb;
#endif
#if LOCKWATCH_WITH_POSTGRESQL
    lockwatch::testing::PostgresServer postgres;
    g_postgres = &postgres;
#endif
    lockwatch::testing::RedisCluster cluster;
    g_cluster = &cluster;
    g_redis = &redis;
    g_rediss = &rediss;
    benchmark::RunSpecifiedBenchmarks();
    g_runtime.reset();
    g_redis = nullptr;
    g_rediss = nullptr;
#if LOCKWATCH_WITH_SQL
    g_mariadb = nullptr;
#endif
#if LOCKWATCH_WITH_POSTGRESQL
    g_postgres = nullptr;
#endif
    g_cluster = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_bench: %s\n", e.what());
    status = 1;
  }
  benchmark::Shutdown();
  return g_failed ? 1 : status;
}
