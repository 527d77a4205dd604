// Lock cycle benchmarks: acquire + empty work + release against one local
// redis-server, with the protocol's limit in the same binary and run.
//
//   BM_RawHiredis/<conc>/uncontended   the limit: lockwatch's own acquire and
//       release scripts sent by hand through hiredis async on a libuv loop in
//       this thread; <conc> state machines (acquire, on its reply release, on
//       that reply the next cycle) pipelined on one connection.
//   BM_RawHiredisFuture/<conc>/uncontended  the limit for an API that
//       returns std::future: <conc> caller threads each write their own
//       requests (the same scripts) on one shared connection and wait on a
//       future, which one reader thread, blocked in read(), completes.
//   BM_RawHiredisBlocking/<conc>/uncontended  the limit for blocking
//       callers that read their own replies (Runtime::lock): <conc> caller
//       threads, each with its own connection and hiredis's blocking client.
//   BM_RawHiredis2/<conc>/uncontended  the same limit for two locks a cycle:
//       both acquire scripts pipelined, then both release scripts.
//   BM_Transfer/<conc>/uncontended     LOCKED on lockwatch::all_of of two
//       fresh keys with an empty callable (a transfer's shape).
//   BM_Transfer/64/accounts16          64 callers transferring between random
//       pairs of 16 accounts, in either order, waiting up to 10 s.
//   BM_LockHandle/<conc>/<mode>        Runtime::acquire(), then
//       LockHandle::release(), each waited on through its future.
//   BM_LockBlocking/<conc>/uncontended Runtime::lock(), then
//       LockHandle::unlock(): the blocking pair, which on one Redis node
//       writes and reads its own requests on the calling thread.
//   BM_Locked/<conc>/<mode>            lockwatch::locked(...) with an empty
//       callable: key formatting, the pool hop and the future included.
//   BM_Hops/<conc>/<path>              the thread hand-offs of a call with
//       no Redis and no lock: the floor under the threaded rows on this
//       machine. <path> loop: caller -> I/O loop -> caller (one post, one
//       promise), the least a blocking caller pays when the connection
//       lives on an I/O thread; loop_pool_loop: caller -> loop -> pool ->
//       loop -> caller, the hops of a LOCKED call (its work runs on the
//       pool, its release on the loop).
//   BM_Hops/chain/pool_loop_pool       a contended key's chain of local
//       hand-offs with no Redis: pool -> loop -> pool, one link a cycle.
//   BM_Hops/fanout64/loop_pool_loop    BM_LockedFanOut's shape with no
//       Redis: one thread, rounds of 64 caller -> loop -> pool -> loop ->
//       caller trips.
//   BM_LockedRuntimes/3x16/<mode>      three runtimes in this process, each
//       with its own connections and owner tokens (to Redis they are three
//       processes), 16 LOCKED callers each, all on one key.
//   BM_LockedProcesses/3x16/<mode>     the same with three processes (this
//       program run again with --contender), started together for 3 s.
//
// <mode>: uncontended = a fresh key every cycle; contended = every caller on
// one key, waiting up to 10 s for it (.wait(10s) / the wait argument);
// contended_handoff = contended with Options::handoff.enabled on, the default
// (rows at 64 callers, and 3x16); contended = with it off. Uncontended rows
// at 1 and 64 callers with a poll suffix run with it on (the default; with
// no caller waiting it makes no request). Rows without a suffix run with Options::runtime.busy_poll = 0
// (no polling). A name ending "+busy_poll" is the same row with
// Options::runtime.busy_poll = 200 us (the I/O thread and one idle pool worker poll
// that long before they sleep); "+adaptive" with kBusyPollAdaptive, the
// default (they poll only while something is outstanding, at most about
// a wake-up's cost).
//   BM_IdleLeases/100                  an idle runtime holding 100 leases
//       that the watchdog renews: its CPU over 10 s (see BM_IdleLeases);
//       "/ttl2s" with a 2 s ttl instead of 200 ms.
// <conc> = 1, 16, 64 callers. Lock ttl 30 s (as the peers' harness).
//
// Concurrency: the callers of BM_LockHandle and BM_Locked are std::threads,
// each doing blocking cycles (call, wait on the future, next call). The API
// returns std::future, which has no continuation, so a thread per caller is
// how an application consumes it; on 2 cores, 64 threads pay futex wake-ups
// and context switches that BM_RawHiredis (callbacks on one thread) does not,
// and that difference is part of what the rows compare. The threads are our
// own rather than ->Threads(n): every caller runs until a common deadline
// and we count what each one completed, which is what shows starvation on a
// contended key (->Threads(n) gives every thread the same iteration count).
//
// One benchmark iteration is a slice of kSlice: all callers cycle until the
// slice's deadline, then finish the cycle they are in. The manual time of an
// iteration runs from the start signal to the last caller's finish, so the
// Time column is the slice, not a cycle; read the counters:
//   cycles_per_s        completed cycles / measured time (kIsRate)
//   p50_us, p99_us      latency of a whole cycle, acquire to release done
//   cpu_us_per_cycle    this process's CPU (user + sys, all threads) / cycle
//   allocs_per_cycle    operator new calls in this process (the library's
//                       and the caller's, every thread) / cycle
//   ctx_switches_per_cycle  context switches of this process (getrusage
//                       RUSAGE_SELF: ru_nvcsw + ru_nivcsw, every thread,
//                       voluntary and involuntary) during the measured
//                       slices / cycle: the thread wake-ups a cycle costs
//                       (raw hiredis: 2, one per reply it waits for)
//   evals_per_cycle     EVALSHA + EVAL calls seen by Redis / cycle (2 ideal)
//   srv_cmds_per_cycle  every command Redis ran, Lua's included, / cycle
//   redis_cpu_us_per_cycle  redis-server's CPU / cycle
//   foreign_cores, steal_cores  CPU taken by other processes and by the
//                       hypervisor while the row ran (noise: trust rows
//                       where both are near 0)
//   contended rows also:
//   max_wait_ms         longest wait for the lock (call to lock granted)
//   p50_wait_ms, p99_wait_ms  the wait for the lock, over all callers
//   min_caller_cycles, max_caller_cycles, mean_caller_cycles, min_over_mean
//                       starvation: the fewest (most) cycles any caller
//                       completed vs the mean
//   3x16 rows also:
//   rt<i>_cycles, min_rt_over_mean  cycles per runtime, and the least
//                       served runtime vs the mean (a starved process)
//                       (proc<i>_cycles, min_proc_over_mean for processes)
// A caller that completes no cycle, or any failed call, fails the row.
//
// Without --benchmark_min_time the binary runs each row for at least 2 s
// (about a minute in all, plus at most 90 s waiting for a quiet machine);
// --benchmark_min_time=0.01 runs one slice per row and does not wait.
#include <benchmark/benchmark.h>
#include <random>
#include <fmt/format.h>
#include <hiredis/adapters/libuv.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "core/loop.hpp"
#include "lockwatch/lockwatch.hpp"
#include "lockwatch/thread_pool.hpp"
#include "store/redis/cluster_slot.hpp"
#include "store/redis/scripts.hpp"
#include "bench_common.hpp"
#include "support/redis_server.hpp"

// Allocation counting: operator new is replaced for the whole process (the
// library's calls included), each thread counting in a slot of its own.
namespace alloc_count {
struct alignas(64) Slot {
  std::atomic<std::uint64_t> n{0};
};
inline Slot g_slots[128];
inline std::atomic<unsigned> g_next{0};
inline std::uint64_t& local_index_plus_one() {
  thread_local std::uint64_t i = 0;
  return i;
}
inline void note() {
  std::uint64_t& i = local_index_plus_one();
  if (i == 0) i = g_next.fetch_add(1, std::memory_order_relaxed) % 128 + 1;
  g_slots[i - 1].n.fetch_add(1, std::memory_order_relaxed);
}
inline std::uint64_t total() {
  std::uint64_t sum = 0;
  for (auto& s : g_slots) sum += s.n.load(std::memory_order_relaxed);
  return sum;
}
}  // namespace alloc_count

void* operator new(std::size_t n) {
  alloc_count::note();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// GCC, seeing these inlined where a `new` expression's block is freed,
// takes the malloc/free pair for a mismatch; they are the matching pair.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace {

using namespace std::chrono_literals;
using namespace lockwatch::bench;
using Clock = std::chrono::steady_clock;

constexpr auto kTtl = 30s;
constexpr auto kContendedWait = 10s;
constexpr auto kSlice = 200ms;
// No single future is waited on longer than this (the library bounds every
// call by the wait and the command timeout; this only turns a bug into a
// failed row instead of a hang).
constexpr auto kFutureBound = 20s;
// A slice whose callers have not all finished by its deadline plus this fails
// the whole binary.
constexpr auto kSliceBound = 60s;
constexpr const char* kDefaultMinTime = "--benchmark_min_time=2";

lockwatch::testing::RedisServer* g_redis = nullptr;
std::atomic<std::uint64_t> g_run{0};  // makes keys unique per benchmark run

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct CpuDelta {
  double wall = 0, self = 0, redis = 0, foreign_cores = 0, steal_cores = 0;
};

CpuDelta cpu_delta(const CpuSample& a, const CpuSample& b) {
  CpuDelta d;
  d.wall = std::chrono::duration<double>(b.wall - a.wall).count();
  d.self = b.self - a.self;
  d.redis = b.redis - a.redis;
  if (d.wall > 0) {
    d.foreign_cores = std::max(0.0, (b.busy - a.busy) - d.self - d.redis) / d.wall;
    d.steal_cores = (b.steal - a.steal) / d.wall;
  }
  return d;
}

QuietWait g_quiet(8s, 90s);
// Smoke runs (a --benchmark_min_time below this many seconds) do not wait.
constexpr double kQuietMinTime = 0.5;

std::map<std::string, long long> command_calls() { return lockwatch::bench::command_calls(*g_redis); }
CpuSample sample_cpu() { return lockwatch::bench::sample_cpu(*g_redis); }
void wait_for_quiet() { g_quiet(*g_redis); }

// Starts each run on a quiet machine and an empty keyspace: uncontended
// cycles leave one fencing counter per key behind. Scripts survive FLUSHALL.
void prepare_run() {
  wait_for_quiet();
  g_redis->command({"FLUSHALL"});
}

// What one caller saw over a whole benchmark run (all its slices).
struct Tally {
  std::vector<float> cycle_us;
  std::vector<float> wait_us;  // call to lock granted (contended rows)
  double max_wait_us = 0;
  std::uint64_t cycles = 0;
  std::uint64_t failures = 0;
  std::string first_error;

  void fail(std::string what) {
    ++failures;
    if (first_error.empty()) first_error = std::move(what);
  }
};

double percentile(std::vector<float>& v, double q) {
  if (v.empty()) return 0;
  auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// Accumulates slices and writes the counters.
class Recorder {
 public:
  Recorder() : commands_before_(command_calls()), cpu_before_(sample_cpu()) {}

  // This process's CPU, allocations and context switches during one slice.
  void add_slice(double cpu_seconds, std::uint64_t allocations, double switches) {
    cpu_seconds_ += cpu_seconds;
    allocations_ += allocations;
    switches_ += switches;
  }

  void report(benchmark::State& state, std::vector<Tally>& tallies, bool contended) {
    CpuDelta cpu = cpu_delta(cpu_before_, sample_cpu());
    CommandDelta cmds = command_delta(commands_before_, command_calls());
    std::vector<float> all, waits;
    std::uint64_t cycles = 0, failures = 0, min_cycles = UINT64_MAX, max_cycles = 0;
    double max_wait_us = 0;
    std::string error;
    for (auto& t : tallies) {
      all.insert(all.end(), t.cycle_us.begin(), t.cycle_us.end());
      waits.insert(waits.end(), t.wait_us.begin(), t.wait_us.end());
      cycles += t.cycles;
      failures += t.failures;
      min_cycles = std::min(min_cycles, t.cycles);
      max_cycles = std::max(max_cycles, t.cycles);
      max_wait_us = std::max(max_wait_us, t.max_wait_us);
      if (error.empty()) error = t.first_error;
    }
    double n = static_cast<double>(std::max<std::uint64_t>(cycles, 1));
    state.counters["cycles_per_s"] = benchmark::Counter(static_cast<double>(cycles), benchmark::Counter::kIsRate);
    state.counters["p50_us"] = percentile(all, 0.50);
    state.counters["p99_us"] = percentile(all, 0.99);
    state.counters["cpu_us_per_cycle"] = cpu_seconds_ * 1e6 / n;
    state.counters["allocs_per_cycle"] = static_cast<double>(allocations_) / n;
    state.counters["ctx_switches_per_cycle"] = switches_ / n;
    state.counters["evals_per_cycle"] = static_cast<double>(cmds.evals) / n;
    state.counters["srv_cmds_per_cycle"] = static_cast<double>(cmds.all) / n;
    state.counters["redis_cpu_us_per_cycle"] = cpu.redis * 1e6 / n;
    state.counters["foreign_cores"] = cpu.foreign_cores;
    state.counters["steal_cores"] = cpu.steal_cores;
    if (contended) {
      double mean = static_cast<double>(cycles) / static_cast<double>(tallies.size());
      state.counters["max_wait_ms"] = max_wait_us / 1000;
      state.counters["p50_wait_ms"] = percentile(waits, 0.50) / 1000;
      state.counters["p99_wait_ms"] = percentile(waits, 0.99) / 1000;
      state.counters["min_caller_cycles"] = static_cast<double>(min_cycles);
      state.counters["max_caller_cycles"] = static_cast<double>(max_cycles);
      state.counters["mean_caller_cycles"] = mean;
      state.counters["min_over_mean"] = mean > 0 ? static_cast<double>(min_cycles) / mean : 0;
    }
    if (failures != 0) {
      state.SkipWithError(fmt::format("{} failed calls; first: {}", failures, error).c_str());
    } else if (min_cycles == 0) {
      state.SkipWithError("a caller completed no cycle (starved)");
    }
  }

 private:
  std::map<std::string, long long> commands_before_;
  CpuSample cpu_before_;
  double cpu_seconds_ = 0;
  std::uint64_t allocations_ = 0;
  double switches_ = 0;
};

// Runs `body(caller, tally, deadline)` on n threads, one slice at a time.
class CallerThreads {
 public:
  using Body = std::function<void(int caller, Tally& tally, Clock::time_point deadline)>;

  CallerThreads(int n, Body body) : body_(std::move(body)), tallies_(static_cast<std::size_t>(n)) {
    threads_.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) threads_.emplace_back([this, i] { work(i); });
  }

  ~CallerThreads() {
    {
      std::lock_guard lk(mu_);
      quit_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // Returns the slice's wall time, from the start signal to the last finish.
  double run_slice(Clock::duration length) {
    auto start = Clock::now();
    {
      std::lock_guard lk(mu_);
      deadline_ = start + length;
      finished_ = 0;
      ++generation_;
    }
    start_cv_.notify_all();
    std::unique_lock lk(mu_);
    if (!done_cv_.wait_until(lk, deadline_ + kSliceBound, [&] { return finished_ == threads_.size(); })) {
      std::fprintf(stderr, "lock_bench: callers did not finish a slice within %lld s of its end\n",
                   static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(kSliceBound).count()));
      std::abort();
    }
    return std::chrono::duration<double>(last_finish_ - start).count();
  }

  std::vector<Tally>& tallies() { return tallies_; }

 private:
  void work(int i) {
    std::uint64_t seen = 0;
    for (;;) {
      Clock::time_point deadline;
      {
        std::unique_lock lk(mu_);
        start_cv_.wait(lk, [&] { return quit_ || generation_ != seen; });
        if (quit_) return;
        seen = generation_;
        deadline = deadline_;
      }
      body_(i, tallies_[static_cast<std::size_t>(i)], deadline);
      auto now = Clock::now();
      {
        std::lock_guard lk(mu_);
        last_finish_ = std::max(last_finish_, now);
        if (++finished_ == threads_.size()) done_cv_.notify_one();
      }
    }
  }

  Body body_;
  std::vector<Tally> tallies_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  std::uint64_t generation_ = 0;  // guarded by mu_
  Clock::time_point deadline_;    // guarded by mu_
  Clock::time_point last_finish_; // guarded by mu_
  std::size_t finished_ = 0;      // guarded by mu_
  bool quit_ = false;             // guarded by mu_
};

// Runs a row's slices on `driver` (caller threads or the raw client) and
// reports it; `rec` was made before the driver so it counts its set-up too.
template <class Driver>
void run_slices(benchmark::State& state, Recorder& rec, Driver& driver, bool contended) {
  for (auto _ : state) {
    double cpu0 = process_cpu_seconds();
    double switches0 = process_context_switches();
    std::uint64_t allocs0 = alloc_count::total();
    double seconds = driver.run_slice(kSlice);
    rec.add_slice(process_cpu_seconds() - cpu0, alloc_count::total() - allocs0,
                  process_context_switches() - switches0);
    state.SetIterationTime(seconds);
  }
  rec.report(state, driver.tallies(), contended);
}

// Drives the slices of a threaded row and reports it.
void run_threaded(benchmark::State& state, int conc, bool contended, const CallerThreads::Body& body) {
  Recorder rec;
  CallerThreads callers(conc, body);
  run_slices(state, rec, callers, contended);
}

template <class T>
bool ready_in_bound(std::future<T>& f, Tally& tally, const char* what) {
  if (f.wait_for(kFutureBound) == std::future_status::ready) return true;
  tally.fail(fmt::format("{} not ready within {} s", what, kFutureBound.count()));
  return false;
}

// Options::runtime.busy_poll for the rows named "+busy_poll" (kBusyPoll) and
// "+adaptive" (kBusyPollAdaptive), else 0 (off).
constexpr std::chrono::microseconds kBusyPoll{200};
std::chrono::microseconds g_busy_poll{0};

lockwatch::Options runtime_options(bool handoff = true) {
  lockwatch::Options o;
  o.redis_url = g_redis->url();
  o.runtime.threads = 2;  // one per core
  o.handoff.enabled = handoff;
  o.runtime.busy_poll = g_busy_poll;
  return o;
}

// One cycle on a fresh key before timing: connects, loads the scripts.
void warm_up(lockwatch::Runtime& rt, std::uint64_t run) {
  auto h = rt.acquire(fmt::format("warm:{}", run), kTtl).get();
  h.release().get();
}

// ------------------------------------------------------------ LockHandle

// One acquisition of `key` as `kind` and its release by the handle, noted
// in `tally` (its cycle, and with `note_wait` its wait for the lock). False
// when the caller must stop: a call failed or hung.
bool handle_cycle(lockwatch::Runtime& rt, std::string key, lockwatch::LockKind kind, std::chrono::milliseconds wait,
                  Tally& tally, bool note_wait) {
  auto t0 = Clock::now();
  try {
    auto acquired = rt.acquire({.key = std::move(key), .ttl = kTtl, .retries = lockwatch::forever, .wait = wait, .kind = kind});
    if (!ready_in_bound(acquired, tally, "acquire")) return false;
    lockwatch::LockHandle h = acquired.get();
    auto t1 = Clock::now();
    auto released = h.release();
    if (!ready_in_bound(released, tally, "release")) return false;
    released.get();
    tally.cycle_us.push_back(static_cast<float>(micros(Clock::now() - t0)));
    tally.max_wait_us = std::max(tally.max_wait_us, micros(t1 - t0));
    if (note_wait) tally.wait_us.push_back(static_cast<float>(micros(t1 - t0)));
    ++tally.cycles;
    return true;
  } catch (const std::exception& e) {
    tally.fail(e.what());
    return false;
  }
}

void BM_LockHandle(benchmark::State& state, int conc, bool contended, bool handoff) {
  prepare_run();
  std::uint64_t run = ++g_run;
  lockwatch::Runtime rt(runtime_options(handoff));
  warm_up(rt, run);
  const auto wait = contended ? std::chrono::milliseconds(kContendedWait) : 0ms;
  const std::string hot = fmt::format("lh:hot:{}", run);
  std::vector<std::uint64_t> next(static_cast<std::size_t>(conc), 0);

  run_threaded(state, conc, contended, [&](int caller, Tally& tally, Clock::time_point deadline) {
    std::uint64_t& n = next[static_cast<std::size_t>(caller)];
    while (Clock::now() < deadline) {
      std::string key = contended ? hot : fmt::format("lh:{}:{}:{}", run, caller, n++);
      if (!handle_cycle(rt, std::move(key), lockwatch::LockKind::exclusive(), wait, tally, contended)) return;
    }
  });
}

void BM_LockBlocking(benchmark::State& state, int conc) {
  prepare_run();
  std::uint64_t run = ++g_run;
  lockwatch::Runtime rt(runtime_options());
  warm_up(rt, run);
  std::vector<std::uint64_t> next(static_cast<std::size_t>(conc), 0);
  run_threaded(state, conc, false, [&](int caller, Tally& tally, Clock::time_point deadline) {
    std::uint64_t& n = next[static_cast<std::size_t>(caller)];
    while (Clock::now() < deadline) {
      const auto t0 = Clock::now();
      try {
        lockwatch::LockHandle h = rt.lock({.key = fmt::format("lb:{}:{}:{}", run, caller, n++), .ttl = kTtl});
        h.unlock();
      } catch (const std::exception& e) {
        tally.fail(e.what());
        return;
      }
      tally.cycle_us.push_back(static_cast<float>(micros(Clock::now() - t0)));
      ++tally.cycles;
    }
  });
}

// ------------------------------------------------------------ kinds of lock

// Every caller on one key, held as `kind` (lock_kind.hpp) through
// Runtime::acquire: "exclusive" (the mutex), "shared" (readers only),
// "permits4" (a semaphore of 4), "rw9to1" (a read-write lock, one call in
// ten a writer), "fair" (granted in the callers' order of arrival). A
// reader's or permit holder's cycle needs no other to leave first, so these
// rows show what sharing buys beside the mutex, and "fair" what the order
// costs.
void BM_Kind(benchmark::State& state, int conc, std::string kind) {
  prepare_run();
  std::uint64_t run = ++g_run;
  lockwatch::Runtime rt(runtime_options());
  warm_up(rt, run);
  const std::string hot = fmt::format("kind:{}:{}", kind, run);
  std::vector<std::uint64_t> next(static_cast<std::size_t>(conc), 0);
  auto kind_of = [&](std::uint64_t n) {
    if (kind == "shared") return lockwatch::LockKind::shared();
    if (kind == "permits4") return lockwatch::LockKind::permits(4);
    if (kind == "fair") return lockwatch::LockKind::fair();
    if (kind == "rw9to1" && n % 10 != 0) return lockwatch::LockKind::shared();
    return lockwatch::LockKind::exclusive();
  };

  run_threaded(state, conc, true, [&](int caller, Tally& tally, Clock::time_point deadline) {
    std::uint64_t& n = next[static_cast<std::size_t>(caller)];
    while (Clock::now() < deadline) {
      if (!handle_cycle(rt, hot, kind_of(n++ + static_cast<std::uint64_t>(caller)),
                        std::chrono::milliseconds(kContendedWait), tally, true))
        return;
    }
  });
}

// ---------------------------------------------------------------- LOCKED

// Where the callable notes when it started, to tell the wait for the lock.
struct WorkStart {
  Clock::time_point at;
};

// One LOCKED call made by `call()`, waited for and noted in `tally` (its
// cycle, and with `note_wait` its wait for the lock, from `started`). False
// when the caller must stop: the call failed or hung.
template <class Call>
bool locked_cycle(Call&& call, const WorkStart& started, Tally& tally, bool note_wait) {
  auto t0 = Clock::now();
  try {
    auto done = call();
    if (!ready_in_bound(done, tally, "locked call")) return false;
    done.get();
    tally.cycle_us.push_back(static_cast<float>(micros(Clock::now() - t0)));
    tally.max_wait_us = std::max(tally.max_wait_us, micros(started.at - t0));
    if (note_wait) tally.wait_us.push_back(static_cast<float>(micros(started.at - t0)));
    ++tally.cycles;
    return true;
  } catch (const std::exception& e) {
    tally.fail(e.what());
    return false;
  }
}

void BM_Locked(benchmark::State& state, int conc, bool contended, bool handoff) {
  prepare_run();
  std::uint64_t run = ++g_run;
  // Before the runtime: a call abandoned after kFutureBound may still write.
  std::vector<WorkStart> starts(static_cast<std::size_t>(conc));
  lockwatch::Runtime rt(runtime_options(handoff));
  warm_up(rt, run);
  // Arguments: run, caller, cycle, and where to note the start (not part of
  // the key). Contended calls all format the same key.
  auto work = [](std::uint64_t, int, std::uint64_t, WorkStart* s) { s->at = Clock::now(); };
  auto fn = contended ? lockwatch::locked("lk:hot:{0}", kTtl, lockwatch::forever).on(rt).wait(kContendedWait)(work)
                      : lockwatch::locked("lk:{0}:{1}:{2}", kTtl, lockwatch::forever).on(rt)(work);
  std::vector<std::uint64_t> next(static_cast<std::size_t>(conc), 0);

  run_threaded(state, conc, contended, [&](int caller, Tally& tally, Clock::time_point deadline) {
    std::uint64_t& n = next[static_cast<std::size_t>(caller)];
    WorkStart& started = starts[static_cast<std::size_t>(caller)];
    while (Clock::now() < deadline) {
      if (!locked_cycle([&] { return fn(run, caller, n++, &started); }, started, tally, contended)) return;
    }
  });
}

// A transfer: LOCKED on a set of two keys (lockwatch::all_of) with an
// empty callable. `accounts` = 0: a fresh pair every cycle (uncontended);
// else each caller picks random pairs among that many accounts, in either
// order, waiting up to kContendedWait.
void BM_Transfer(benchmark::State& state, int conc, int accounts) {
  prepare_run();
  std::uint64_t run = ++g_run;
  std::vector<WorkStart> starts(static_cast<std::size_t>(conc));
  lockwatch::Runtime rt(runtime_options());
  warm_up(rt, run);
  auto work = [](std::uint64_t, std::uint64_t, std::uint64_t, WorkStart* s) { s->at = Clock::now(); };
  auto fresh = lockwatch::locked(lockwatch::all_of("tr:{0}:{1}:a", "tr:{0}:{1}:b"), kTtl, lockwatch::forever)
                   .on(rt)(work);
  auto pair = lockwatch::locked(lockwatch::all_of("acct:{0}:{1}", "acct:{0}:{2}"), kTtl, lockwatch::forever)
                  .on(rt)
                  .wait(kContendedWait)(work);
  std::vector<std::uint64_t> next(static_cast<std::size_t>(conc), 0);
  const bool contended = accounts > 0;

  run_threaded(state, conc, contended, [&](int caller, Tally& tally, Clock::time_point deadline) {
    std::uint64_t& n = next[static_cast<std::size_t>(caller)];
    WorkStart& started = starts[static_cast<std::size_t>(caller)];
    std::mt19937_64 rng(run * 1000 + static_cast<std::uint64_t>(caller));
    while (Clock::now() < deadline) {
      bool ok;
      if (contended) {
        const auto a = static_cast<std::uint64_t>(accounts);
        std::uint64_t from = rng() % a, to = rng() % a;
        ok = locked_cycle([&] { return pair(run, from, to, &started); }, started, tally, true);
      } else {
        std::uint64_t id = (static_cast<std::uint64_t>(caller) << 40) | n++;
        ok = locked_cycle([&] { return fresh(run, id, 0, &started); }, started, tally, false);
      }
      if (!ok) return;
    }
  });
}

// ------------------------------------------------------------ idle leases

// An idle runtime: `leases` LockHandles held with `ttl` (kIdleTtl, 200 ms,
// has the watchdog renew each about every 150 ms), taken ttl / leases
// apart so that their renewals fall in different ticks (one renewal a
// round trip, the worst case for polling), then nothing but renewals for
// kIdleFor. Counters:
//   cpu_pct              this process's CPU (getrusage: user + sys, every
//                        thread) over kIdleFor, in % of one core
//   renewals_per_s       renewals sent (RuntimeStats::renewals_sent)
//   cpu_us_per_renewal   this process's CPU / renewal
//   redis_cpu_pct        redis-server's CPU over the same time
//   lost                 leases lost (must be 0)
constexpr auto kIdleTtl = 200ms;
constexpr auto kIdleFor = 10s;

void BM_IdleLeases(benchmark::State& state, int leases, std::chrono::milliseconds ttl) {
  prepare_run();
  std::uint64_t run = ++g_run;
  lockwatch::Runtime rt(runtime_options());
  warm_up(rt, run);
  for (auto _ : state) {
    std::vector<lockwatch::LockHandle> held;
    held.reserve(static_cast<std::size_t>(leases));
    const auto spacing = std::chrono::duration_cast<Clock::duration>(ttl) / leases;
    auto next = Clock::now();
    for (int i = 0; i < leases; ++i) {
      auto f = rt.acquire(fmt::format("idle:{}:{}", run, i), ttl);
      if (f.wait_for(kFutureBound) != std::future_status::ready) {
        state.SkipWithError("acquire not ready in bound");
        return;
      }
      held.push_back(f.get());
      next += spacing;
      std::this_thread::sleep_until(next);  // spreads the renewals: the pace is what is measured
    }
    const auto renewals0 = rt.stats().renewals_sent;
    const CpuSample c0 = sample_cpu();
    std::this_thread::sleep_for(kIdleFor);  // idle: what the runtime costs meanwhile is the measurement
    const CpuSample c1 = sample_cpu();
    const auto renewals = rt.stats().renewals_sent - renewals0;
    const CpuDelta cpu = cpu_delta(c0, c1);
    state.SetIterationTime(cpu.wall);
    int lost = 0;
    for (auto& h : held) lost += h.lease().lost() ? 1 : 0;
    for (auto& h : held) {
      auto r = h.release();
      if (r.wait_for(kFutureBound) != std::future_status::ready) {
        state.SkipWithError("release not ready in bound");
        return;
      }
    }
    state.counters["cpu_pct"] = cpu.self / cpu.wall * 100;
    state.counters["renewals_per_s"] = static_cast<double>(renewals) / cpu.wall;
    state.counters["cpu_us_per_renewal"] = renewals > 0 ? cpu.self * 1e6 / static_cast<double>(renewals) : 0;
    state.counters["redis_cpu_pct"] = cpu.redis / cpu.wall * 100;
    state.counters["lost"] = lost;
    state.counters["foreign_cores"] = cpu.foreign_cores;
    state.counters["steal_cores"] = cpu.steal_cores;
    if (lost != 0) state.SkipWithError("a lease was lost while idle");
  }
}

// <runtimes> runtimes in this process, each with its own connections and
// owner tokens (to Redis, as many processes), <per> LOCKED callers each, all
// on one key. Counters, besides the contended ones: rt<i>_cycles per runtime
// and min_rt_over_mean (the least served runtime vs the mean: starvation of
// a process).
void BM_LockedRuntimes(benchmark::State& state, int runtimes, int per, bool handoff) {
  prepare_run();
  std::uint64_t run = ++g_run;
  const int conc = runtimes * per;
  std::vector<WorkStart> starts(static_cast<std::size_t>(conc));
  std::vector<std::unique_ptr<lockwatch::Runtime>> rts;
  std::vector<std::function<std::future<void>(std::uint64_t, WorkStart*)>> fns;
  auto work = [](std::uint64_t, WorkStart* s) { s->at = Clock::now(); };
  for (int r = 0; r < runtimes; ++r) {
    rts.push_back(std::make_unique<lockwatch::Runtime>(runtime_options(handoff)));
    warm_up(*rts.back(), run * 100 + static_cast<std::uint64_t>(r));
    fns.emplace_back(
        lockwatch::locked("lr:hot:{0}", kTtl, lockwatch::forever).on(*rts.back()).wait(kContendedWait)(work));
  }
  Recorder rec;
  CallerThreads callers(conc, [&](int caller, Tally& tally, Clock::time_point deadline) {
    auto& fn = fns[static_cast<std::size_t>(caller / per)];
    WorkStart& started = starts[static_cast<std::size_t>(caller)];
    while (Clock::now() < deadline) {
      if (!locked_cycle([&] { return fn(run, &started); }, started, tally, true)) return;
    }
  });
  run_slices(state, rec, callers, true);
  std::vector<double> per_rt(static_cast<std::size_t>(runtimes), 0);
  for (int c = 0; c < conc; ++c)
    per_rt[static_cast<std::size_t>(c / per)] += static_cast<double>(callers.tallies()[static_cast<std::size_t>(c)].cycles);
  double mean = std::accumulate(per_rt.begin(), per_rt.end(), 0.0) / runtimes;
  for (int r = 0; r < runtimes; ++r) state.counters[fmt::format("rt{}_cycles", r)] = per_rt[static_cast<std::size_t>(r)];
  state.counters["min_rt_over_mean"] = mean > 0 ? *std::min_element(per_rt.begin(), per_rt.end()) / mean : 0;
}

// ------------------------------------------------- separate processes

constexpr auto kProcessRun = 3s;

// What one contender process did, as it prints it on one line.
struct ContenderReport {
  double cycles = 0, failures = 0, min_caller = 0, p99_wait_us = 0, max_wait_us = 0;
};

// `lock_bench --contender URL HANDOFF CALLERS MILLIS START_MS`: CALLERS
// threads make LOCKED calls on one key from START_MS (system clock, ms since
// the epoch) for MILLIS, then one line of figures goes to standard output.
int run_contender(char** argv) {
  lockwatch::Options o;
  o.redis_url = argv[0];
  o.runtime.threads = 2;
  o.handoff.enabled = std::string_view(argv[1]) == "1";
  const int callers = std::atoi(argv[2]);
  const auto length = std::chrono::milliseconds(std::atoll(argv[3]));
  const std::chrono::system_clock::time_point start{std::chrono::milliseconds(std::atoll(argv[4]))};
  lockwatch::Runtime rt(o);
  warm_up(rt, static_cast<std::uint64_t>(::getpid()));
  auto work = [](WorkStart* s) { s->at = Clock::now(); };
  auto fn = lockwatch::locked("lp:hot", kTtl, lockwatch::forever).on(rt).wait(kContendedWait)(work);
  std::vector<Tally> tallies(static_cast<std::size_t>(callers));
  std::vector<WorkStart> starts(static_cast<std::size_t>(callers));
  std::this_thread::sleep_until(start);  // all three begin together
  const auto deadline = Clock::now() + length;
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c) {
    threads.emplace_back([&, c] {
      Tally& tally = tallies[static_cast<std::size_t>(c)];
      WorkStart& started = starts[static_cast<std::size_t>(c)];
      while (Clock::now() < deadline) {
        if (!locked_cycle([&] { return fn(&started); }, started, tally, true)) return;
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<float> waits;
  std::uint64_t cycles = 0, failures = 0, min_caller = UINT64_MAX;
  double max_wait = 0;
  for (auto& t : tallies) {
    waits.insert(waits.end(), t.wait_us.begin(), t.wait_us.end());
    cycles += t.cycles;
    failures += t.failures;
    // Standard error is the benchmark's: a failed call says why there.
    if (!t.first_error.empty())
      std::fprintf(stderr, "contender %d: a call failed: %s\n", static_cast<int>(::getpid()), t.first_error.c_str());
    min_caller = std::min(min_caller, t.cycles);
    max_wait = std::max(max_wait, t.max_wait_us);
  }
  std::printf("%llu %llu %llu %.1f %.1f\n", static_cast<unsigned long long>(cycles),
              static_cast<unsigned long long>(failures), static_cast<unsigned long long>(min_caller),
              percentile(waits, 0.99), max_wait);
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

void BM_LockedProcesses(benchmark::State& state, int procs, int per, bool handoff) {
  prepare_run();
  std::vector<ContenderReport> reports(static_cast<std::size_t>(procs));
  std::string error;
  for (auto _ : state) {
    // Room for each process to start, connect and warm up before the start.
    const auto start = std::chrono::system_clock::now() + 2s;
    const auto start_ms = std::chrono::duration_cast<std::chrono::milliseconds>(start.time_since_epoch()).count();
    std::vector<std::unique_ptr<lockwatch::testing::ChildProcess>> children;
    for (int p = 0; p < procs; ++p) {
      children.push_back(std::make_unique<lockwatch::testing::ChildProcess>(std::vector<std::string>{
          "/proc/self/exe", "--contender", g_redis->url(), handoff ? "1" : "0", std::to_string(per),
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(kProcessRun).count()),
          std::to_string(start_ms)}));
    }
    for (int p = 0; p < procs; ++p) {
      auto line = children[static_cast<std::size_t>(p)]->read_line(kProcessRun + 2s + kFutureBound);
      ContenderReport& r = reports[static_cast<std::size_t>(p)];
      if (!line || std::sscanf(line->c_str(), "%lf %lf %lf %lf %lf", &r.cycles, &r.failures, &r.min_caller,
                               &r.p99_wait_us, &r.max_wait_us) != 5) {
        error = fmt::format("contender {} gave no figures", p);
      }
      if (children[static_cast<std::size_t>(p)]->wait(10s) != 0 && error.empty())
        error = fmt::format("contender {} failed", p);
    }
    state.SetIterationTime(std::chrono::duration<double>(kProcessRun).count());
  }
  double total = 0, worst_p99 = 0, max_wait = 0, min_caller = 1e18;
  for (const auto& r : reports) {
    total += r.cycles;
    worst_p99 = std::max(worst_p99, r.p99_wait_us);
    max_wait = std::max(max_wait, r.max_wait_us);
    min_caller = std::min(min_caller, r.min_caller);
  }
  const double mean = total / procs;
  double least = 1e18;
  for (int p = 0; p < procs; ++p) {
    state.counters[fmt::format("proc{}_cycles", p)] = reports[static_cast<std::size_t>(p)].cycles;
    least = std::min(least, reports[static_cast<std::size_t>(p)].cycles);
  }
  state.counters["cycles_per_s"] = total / std::chrono::duration<double>(kProcessRun).count();
  state.counters["min_proc_over_mean"] = mean > 0 ? least / mean : 0;
  state.counters["min_caller_cycles"] = min_caller;
  state.counters["p99_wait_ms"] = worst_p99 / 1000;  // the worst process's
  state.counters["max_wait_ms"] = max_wait / 1000;
  if (!error.empty()) state.SkipWithError(error.c_str());
}

// One thread keeping <conc> calls in flight: rounds of <conc> calls made by
// `call()` (each returns a std::future<void>), then each awaited in turn.
template <class Call>
void fan_out_rounds(benchmark::State& state, int conc, Call&& call) {
  run_threaded(state, 1, false, [&](int, Tally& tally, Clock::time_point deadline) {
    std::vector<std::future<void>> round;
    std::vector<Clock::time_point> issued;
    round.reserve(static_cast<std::size_t>(conc));
    while (Clock::now() < deadline) {
      round.clear();
      issued.clear();
      for (int i = 0; i < conc; ++i) {
        issued.push_back(Clock::now());
        round.push_back(call());
      }
      for (int i = 0; i < conc; ++i) {
        auto& f = round[static_cast<std::size_t>(i)];
        try {
          if (!ready_in_bound(f, tally, "call")) return;
          f.get();
        } catch (const std::exception& e) {
          tally.fail(e.what());
          return;
        }
        tally.cycle_us.push_back(static_cast<float>(micros(Clock::now() - issued[static_cast<std::size_t>(i)])));
        ++tally.cycles;
      }
    }
  });
}

// One caller thread keeping <conc> LOCKED calls in flight: it issues a
// round of <conc> calls, then waits for their futures. This is how an
// application fans work out with futures, and what the node peers do (one
// thread, N tasks): the runtime pipelines the round, with a few thread
// wake-ups per round instead of several per call.
void BM_LockedFanOut(benchmark::State& state, int conc) {
  prepare_run();
  std::uint64_t run = ++g_run;
  lockwatch::Runtime rt(runtime_options());
  warm_up(rt, run);
  auto fn = lockwatch::locked("lf:{0}:{1}", kTtl, lockwatch::forever).on(rt)([](std::uint64_t, std::uint64_t) {});
  std::uint64_t n = 0;
  fan_out_rounds(state, conc, [&] { return fn(run, n++); });
}

// ------------------------------------------------------------ hops only

void BM_Hops(benchmark::State& state, int conc, bool through_pool) {
  prepare_run();
  lockwatch::detail::Loop loop(runtime_options().runtime.busy_poll);
  lockwatch::ThreadPool pool(runtime_options().runtime.threads, runtime_options().runtime.busy_poll);
  run_threaded(state, conc, false, [&](int, Tally& tally, Clock::time_point deadline) {
    while (Clock::now() < deadline) {
      auto t0 = Clock::now();
      auto done = std::make_shared<std::promise<void>>();
      auto f = done->get_future();
      if (through_pool) {
        loop.post([&loop, &pool, done] {
          pool.post([&loop, done] { loop.post([done] { done->set_value(); }); });
        });
      } else {
        loop.post([done] { done->set_value(); });
      }
      if (!ready_in_bound(f, tally, "hop")) return;
      tally.cycle_us.push_back(static_cast<float>(micros(Clock::now() - t0)));
      ++tally.cycles;
    }
  });
  pool.shutdown();
  loop.shutdown([] {});
}

// The hops of BM_LockedFanOut with no Redis and no lock: one thread
// issues a round of <conc> caller -> loop -> pool -> loop -> caller trips,
// then waits for each. The ceiling of the fan-out shape's own threads.
void BM_HopsFanOut(benchmark::State& state, int conc) {
  prepare_run();
  lockwatch::detail::Loop loop(runtime_options().runtime.busy_poll);
  lockwatch::ThreadPool pool(runtime_options().runtime.threads, runtime_options().runtime.busy_poll);
  fan_out_rounds(state, conc, [&] {
    auto done = std::make_shared<std::promise<void>>();
    auto f = done->get_future();
    loop.post([&loop, &pool, done] { pool.post([&loop, done] { loop.post([done] { done->set_value(); }); }); });
    return f;
  });
  pool.shutdown();
  loop.shutdown([] {});
}

// The serial chain of a contended key with local hand-off, with no Redis:
// a holder's work ends on a pool thread, which tells the loop; the loop
// hands the lock on and wakes a pool thread for the next holder's work.
// One cycle is one such link (pool -> loop -> pool); nothing else runs.
void BM_HopsChain(benchmark::State& state) {
  prepare_run();
  lockwatch::detail::Loop loop(runtime_options().runtime.busy_poll);
  lockwatch::ThreadPool pool(runtime_options().runtime.threads, runtime_options().runtime.busy_poll);
  run_threaded(state, 1, false, [&](int, Tally& tally, Clock::time_point deadline) {
    std::promise<void> done;
    auto f = done.get_future();
    std::function<void()> link;  // runs on the pool
    Clock::time_point last = Clock::now();
    link = [&] {
      auto now = Clock::now();
      tally.cycle_us.push_back(static_cast<float>(micros(now - last)));
      last = now;
      ++tally.cycles;
      if (now >= deadline) {
        done.set_value();
        return;
      }
      loop.post([&] { pool.post([&] { link(); }); });
    };
    pool.post([&] { link(); });
    if (!ready_in_bound(f, tally, "chain")) std::abort();  // the chain still runs on our locals
  });
  pool.shutdown();
  loop.shutdown([] {});
}

// --------------------------------------------------------- raw hiredis

// The protocol with nothing around it: <conc> callers as state machines on
// one hiredis async connection and one libuv loop, run on this thread.
class RawClient {
 public:
  // `keys`: locks per cycle (2: a transfer's pair, their acquisitions
  // pipelined, then their releases).
  RawClient(int conc, std::uint64_t run, int keys = 1)
      : run_(run), keys_(keys), callers_(static_cast<std::size_t>(conc)) {
    uv_loop_init(&loop_);
    uv_timer_init(&loop_, &bound_timer_);
    bound_timer_.data = this;
    for (std::size_t i = 0; i < callers_.size(); ++i) {
      callers_[i].client = this;
      callers_[i].id = static_cast<int>(i);
    }
    ac_ = redisAsyncConnect("127.0.0.1", g_redis->port());
    if (ac_ == nullptr || ac_->err) {
      error_ = ac_ ? ac_->errstr : "out of memory";
      return;
    }
    ac_->data = this;
    redisLibuvAttach(ac_, &loop_);
    redisAsyncSetDisconnectCallback(ac_, &RawClient::on_disconnect);
    // The first reply says the connection is up.
    redisAsyncCommand(
        ac_,
        [](redisAsyncContext* ac, void* r, void*) {
          auto* self = static_cast<RawClient*>(ac->data);
          if (r == nullptr) self->error_ = "PING failed";
          uv_stop(&self->loop_);
        },
        nullptr, "PING");
    run_bounded(Clock::now() + 10s);
  }

  ~RawClient() {
    if (ac_ != nullptr) redisAsyncDisconnect(ac_);  // frees it once the replies are in
    uv_close(reinterpret_cast<uv_handle_t*>(&bound_timer_), nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop_) != 0) std::fprintf(stderr, "lock_bench: raw client left a uv handle open\n");
  }

  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  const std::string& error() const { return error_; }
  std::vector<Tally>& tallies() { return tallies_; }

  // Every caller cycles until `length` has passed, then finishes its cycle.
  // Returns the wall time until the last one finished.
  double run_slice(Clock::duration length) {
    auto start = Clock::now();
    deadline_ = start + length;
    active_ = callers_.size();
    for (auto& c : callers_) send_acquire(c);
    run_bounded(deadline_ + kSliceBound);
    if (active_ != 0) {
      std::fprintf(stderr, "lock_bench: raw callers did not finish a slice in time\n");
      std::abort();
    }
    return std::chrono::duration<double>(last_finish_ - start).count();
  }

 private:
  struct Lock {
    char lock_key[96] = {};
    char counter_key[32] = {};
    char legacy_key[104] = {};
    char channel[104] = {};
  };
  struct Caller {
    RawClient* client = nullptr;
    int id = 0;
    std::uint64_t n = 0;
    Clock::time_point started;
    Lock locks[2];
    int pending = 0;  // replies still due in this step
    bool failed = false;
    char token[33] = {};
  };

  void run_bounded(Clock::time_point until) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    uv_timer_start(
        &bound_timer_,
        [](uv_timer_t* t) {
          auto* self = static_cast<RawClient*>(t->data);
          if (self->error_.empty()) self->error_ = "slice not finished in time";
          uv_stop(t->loop);
        },
        static_cast<std::uint64_t>(std::max<long long>(ms, 1)), 0);
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_timer_stop(&bound_timer_);
  }

  void send_acquire(Caller& c) {
    // Same key layout and token size as lockwatch: `<prefix>{key}`, 32 hex.
    const auto n = static_cast<unsigned long long>(c.n++);
    std::snprintf(c.token, sizeof c.token, "%016llx%016llx", static_cast<unsigned long long>(run_),
                  static_cast<unsigned long long>(++tokens_));
    c.started = Clock::now();
    c.pending = keys_;
    c.failed = false;
    const auto& script = lockwatch::detail::script(lockwatch::detail::ScriptId::kAcquire);
    for (int k = 0; k < keys_; ++k) {
      Lock& l = c.locks[k];
      std::snprintf(l.lock_key, sizeof l.lock_key, "lockwatch:{raw:%llu:%d:%llu:%d}",
                    static_cast<unsigned long long>(run_), c.id, n, k);
      const std::string_view tag = lockwatch::detail::slot_tag(lockwatch::detail::key_slot(l.lock_key));
      std::snprintf(l.counter_key, sizeof l.counter_key, "lockwatch:fence:{%.*s}", static_cast<int>(tag.size()),
                    tag.data());
      std::snprintf(l.legacy_key, sizeof l.legacy_key, "%s:fence", l.lock_key);
      std::snprintf(l.channel, sizeof l.channel, "%s:rel", l.lock_key);
      const char* argv[] = {"EVALSHA",     script.sha1.c_str(), "3",     l.lock_key,
                            l.counter_key, l.legacy_key,        c.token, "30000"};
      std::size_t lens[8];
      for (int i = 0; i < 8; ++i) lens[i] = std::strlen(argv[i]);
      redisAsyncCommandArgv(ac_, &RawClient::on_acquired, &c, 8, argv, lens);
    }
  }

  static void on_acquired(redisAsyncContext*, void* reply, void* privdata) {
    auto& c = *static_cast<Caller*>(privdata);
    auto* r = static_cast<redisReply*>(reply);
    RawClient* self = c.client;
    // One entry for the one lock: 't<fencing token>' when taken.
    if (r == nullptr || r->type != REDIS_REPLY_STRING || r->len < 2 || r->str[0] != 't') c.failed = true;
    if (--c.pending != 0) return;
    if (c.failed) {
      self->caller_failed(c, r == nullptr ? "no reply to acquire" : "acquire refused or failed");
      return;
    }
    const auto& script = lockwatch::detail::script(lockwatch::detail::ScriptId::kRelease);
    c.pending = self->keys_;
    for (int k = 0; k < self->keys_; ++k) {
      Lock& l = c.locks[k];
      const char* argv[] = {"EVALSHA", script.sha1.c_str(), "1", l.lock_key, "p", c.token, l.channel};
      std::size_t lens[7];
      for (int i = 0; i < 7; ++i) lens[i] = std::strlen(argv[i]);
      redisAsyncCommandArgv(self->ac_, &RawClient::on_released, &c, 7, argv, lens);
    }
  }

  static void on_released(redisAsyncContext*, void* reply, void* privdata) {
    auto& c = *static_cast<Caller*>(privdata);
    auto* r = static_cast<redisReply*>(reply);
    RawClient* self = c.client;
    // Released: '1', 'u' or 'v' (by how many subscribers heard the notice).
    if (r == nullptr || r->type != REDIS_REPLY_STRING || r->len != 1 ||
        std::string_view("1uv").find(r->str[0]) == std::string_view::npos)
      c.failed = true;
    if (--c.pending != 0) return;
    if (c.failed) {
      self->caller_failed(c, r == nullptr ? "no reply to release" : "release did not delete");
      return;
    }
    auto now = Clock::now();
    Tally& t = self->tallies_[static_cast<std::size_t>(c.id)];
    t.cycle_us.push_back(static_cast<float>(micros(now - c.started)));
    ++t.cycles;
    if (now < self->deadline_) {
      self->send_acquire(c);
    } else {
      self->caller_done(now);
    }
  }

  void caller_failed(Caller& c, const char* what) {
    tallies_[static_cast<std::size_t>(c.id)].fail(what);
    caller_done(Clock::now());
  }

  void caller_done(Clock::time_point now) {
    last_finish_ = std::max(last_finish_, now);
    if (--active_ == 0) uv_stop(&loop_);
  }

  static void on_disconnect(const redisAsyncContext* ac, int) {
    static_cast<RawClient*>(ac->data)->ac_ = nullptr;
  }

  std::uint64_t run_;
  int keys_;
  uv_loop_t loop_{};
  uv_timer_t bound_timer_{};
  redisAsyncContext* ac_ = nullptr;
  std::vector<Caller> callers_;
  std::vector<Tally> tallies_ = std::vector<Tally>(callers_.size());
  std::uint64_t tokens_ = 0;
  std::size_t active_ = 0;
  Clock::time_point deadline_;
  Clock::time_point last_finish_;
  std::string error_;
};

// EVALSHA only: the scripts must be in Redis's cache.
void load_raw_scripts() {
  for (auto id : {lockwatch::detail::ScriptId::kAcquire, lockwatch::detail::ScriptId::kRelease})
    g_redis->command({"SCRIPT", "LOAD", std::string(lockwatch::detail::script(id).source)});
}

void BM_RawHiredis(benchmark::State& state, int conc, int keys) {
  prepare_run();
  std::uint64_t run = ++g_run;
  load_raw_scripts();
  Recorder rec;
  RawClient client(conc, run, keys);
  if (!client.error().empty()) {
    state.SkipWithError(client.error().c_str());
    return;
  }
  run_slices(state, rec, client, false);
}

// ------------------------------------------------ raw hiredis behind a future

// The limit for a call that returns a std::future (Runtime::acquire,
// LockHandle::release): the caller formats and writes its own request on
// the shared connection (no hop to an I/O thread), and one reader thread,
// blocked in read(), parses the replies and completes each request's
// promise in the order the requests went out. Each round trip then wakes
// the reader for the reply and the caller for its promise: two context
// switches, four a cycle. No design that hands a reply to a caller blocked
// on a future does with fewer without a thread that spins.
class FutureClient {
 public:
  explicit FutureClient(int port) {
    ctx_ = redisConnect("127.0.0.1", port);
    if (ctx_ == nullptr || ctx_->err) {
      error_ = ctx_ ? ctx_->errstr : "out of memory";
      return;
    }
    reader_ = std::thread([this] { read_replies(); });
  }
  ~FutureClient() {
    if (ctx_ == nullptr) return;
    if (reader_.joinable()) {
      ::shutdown(ctx_->fd, SHUT_RDWR);  // the reader's read() returns 0
      reader_.join();
    }
    redisFree(ctx_);
  }
  FutureClient(const FutureClient&) = delete;
  FutureClient& operator=(const FutureClient&) = delete;

  const std::string& error() const { return error_; }

  // Any caller thread: the reply (to free with freeReplyObject), or
  // nullptr once the connection is gone.
  std::future<redisReply*> send(int argc, const char** argv) {
    std::size_t lens[16];
    for (int i = 0; i < argc; ++i) lens[i] = std::strlen(argv[i]);
    char* cmd = nullptr;
    const int len = redisFormatCommandArgv(&cmd, argc, argv, lens);
    std::promise<redisReply*> reply;
    auto f = reply.get_future();
    {
      std::lock_guard lk(mu_);  // the requests go out in the promises' order
      if (closed_ || len < 0 || !write_all(cmd, static_cast<std::size_t>(len))) {
        reply.set_value(nullptr);
      } else {
        pending_.push_back(std::move(reply));
      }
    }
    redisFreeCommand(cmd);
    return f;
  }

 private:
  bool write_all(const char* p, std::size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(ctx_->fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }

  void read_replies() {
    redisReader* reader = redisReaderCreate();
    char buf[16384];
    for (bool lost = false; !lost;) {
      const ssize_t n = ::read(ctx_->fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || redisReaderFeed(reader, buf, static_cast<std::size_t>(n)) != REDIS_OK) break;
      void* reply = nullptr;
      while (!lost && redisReaderGetReply(reader, &reply) == REDIS_OK && reply != nullptr) {
        std::promise<redisReply*> p;
        {
          std::lock_guard lk(mu_);
          if (pending_.empty()) {  // a reply nobody asked for: the stream is lost
            freeReplyObject(reply);
            lost = true;
            continue;
          }
          p = std::move(pending_.front());
          pending_.pop_front();
        }
        p.set_value(static_cast<redisReply*>(reply));
        reply = nullptr;
      }
    }
    redisReaderFree(reader);
    std::lock_guard lk(mu_);
    closed_ = true;
    for (auto& p : pending_) p.set_value(nullptr);
    pending_.clear();
  }

  redisContext* ctx_ = nullptr;
  std::string error_;
  std::mutex mu_;
  std::deque<std::promise<redisReply*>> pending_;  // guarded by mu_
  bool closed_ = false;                            // guarded by mu_
  std::thread reader_;
};

// One raw cycle's two script calls, with the same scripts, keys and token
// size as BM_RawHiredis, for caller `caller`'s `n`th cycle of run `run`.
struct RawCycleArgs {
  RawCycleArgs(const char* prefix, std::uint64_t run, int caller, std::uint64_t n) {
    using lockwatch::detail::ScriptId;
    std::snprintf(token, sizeof token, "%016llx%016llx", static_cast<unsigned long long>(run),
                  static_cast<unsigned long long>(n * 1024 + static_cast<std::uint64_t>(caller)));
    std::snprintf(lock_key, sizeof lock_key, "lockwatch:{%s:%llu:%d:%llu}", prefix,
                  static_cast<unsigned long long>(run), caller, static_cast<unsigned long long>(n));
    const std::string_view tag = lockwatch::detail::slot_tag(lockwatch::detail::key_slot(lock_key));
    std::snprintf(counter_key, sizeof counter_key, "lockwatch:fence:{%.*s}", static_cast<int>(tag.size()), tag.data());
    std::snprintf(legacy_key, sizeof legacy_key, "%s:fence", lock_key);
    std::snprintf(channel, sizeof channel, "%s:rel", lock_key);
    acquire[1] = lockwatch::detail::script(ScriptId::kAcquire).sha1.c_str();
    release[1] = lockwatch::detail::script(ScriptId::kRelease).sha1.c_str();
  }
  RawCycleArgs(const RawCycleArgs&) = delete;
  RawCycleArgs& operator=(const RawCycleArgs&) = delete;

  // Whether `r` (nullptr: no reply) granted the lock, and deleted it.
  static bool granted(const redisReply* r) {
    return r != nullptr && r->type == REDIS_REPLY_STRING && r->len >= 2 && r->str[0] == 't';
  }
  static bool deleted(const redisReply* r) {
    return r != nullptr && r->type == REDIS_REPLY_STRING && r->len == 1 &&
           std::string_view("1uv").find(r->str[0]) != std::string_view::npos;
  }

  char lock_key[96], counter_key[32], legacy_key[104], channel[104], token[33];
  const char* acquire[8] = {"EVALSHA", nullptr, "3", lock_key, counter_key, legacy_key, token, "30000"};
  const char* release[7] = {"EVALSHA", nullptr, "1", lock_key, "p", token, channel};
};

// Takes `reply`, frees it and says whether `check` holds for it; a
// failure is noted in `tally` as `what`.
bool raw_reply_ok(redisReply* reply, bool (*check)(const redisReply*), Tally& tally, const char* what) {
  const bool ok = check(reply);
  if (reply != nullptr) freeReplyObject(reply);
  if (!ok) tally.fail(what);
  return ok;
}

// One caller's cycles on FutureClient, each reply awaited through its future.
bool future_cycle(FutureClient& client, std::uint64_t run, int caller, std::uint64_t n, Tally& tally) {
  RawCycleArgs args("rawf", run, caller, n);
  const auto t0 = Clock::now();
  auto taken = client.send(8, args.acquire);
  if (!ready_in_bound(taken, tally, "raw acquire") ||
      !raw_reply_ok(taken.get(), RawCycleArgs::granted, tally, "raw acquire refused or failed"))
    return false;
  auto released = client.send(7, args.release);
  if (!ready_in_bound(released, tally, "raw release") ||
      !raw_reply_ok(released.get(), RawCycleArgs::deleted, tally, "raw release did not delete"))
    return false;
  tally.cycle_us.push_back(static_cast<float>(micros(Clock::now() - t0)));
  ++tally.cycles;
  return true;
}

void BM_RawHiredisFuture(benchmark::State& state, int conc) {
  prepare_run();
  const std::uint64_t run = ++g_run;
  load_raw_scripts();
  FutureClient client(g_redis->port());
  if (!client.error().empty()) {
    state.SkipWithError(client.error().c_str());
    return;
  }
  std::vector<std::uint64_t> next(static_cast<std::size_t>(conc), 0);
  run_threaded(state, conc, false, [&](int caller, Tally& tally, Clock::time_point deadline) {
    std::uint64_t& n = next[static_cast<std::size_t>(caller)];
    while (Clock::now() < deadline) {
      if (!future_cycle(client, run, caller, n++, tally)) return;
    }
  });
}

// ------------------------------------------------ raw hiredis, blocking

// The limit for blocking callers that read their own replies
// (Runtime::lock/unlock): each caller thread has its own connection and
// hiredis's blocking client, and sends the same two script calls.
void BM_RawHiredisBlocking(benchmark::State& state, int conc) {
  prepare_run();
  const std::uint64_t run = ++g_run;
  load_raw_scripts();
  std::vector<redisContext*> lines(static_cast<std::size_t>(conc), nullptr);
  auto close_all = [&] {
    for (auto* c : lines)
      if (c != nullptr) redisFree(c);
  };
  for (auto& c : lines) {
    c = redisConnect("127.0.0.1", g_redis->port());
    if (c == nullptr || c->err) {
      state.SkipWithError(c ? c->errstr : "out of memory");
      close_all();
      return;
    }
  }
  std::vector<std::uint64_t> next(static_cast<std::size_t>(conc), 0);
  run_threaded(state, conc, false, [&](int caller, Tally& tally, Clock::time_point deadline) {
    redisContext* c = lines[static_cast<std::size_t>(caller)];
    std::uint64_t& n = next[static_cast<std::size_t>(caller)];
    while (Clock::now() < deadline) {
      RawCycleArgs args("rawb", run, caller, n++);
      const auto t0 = Clock::now();
      if (!raw_reply_ok(static_cast<redisReply*>(redisCommandArgv(c, 8, args.acquire, nullptr)), RawCycleArgs::granted,
                        tally, "raw acquire refused or failed") ||
          !raw_reply_ok(static_cast<redisReply*>(redisCommandArgv(c, 7, args.release, nullptr)), RawCycleArgs::deleted,
                        tally, "raw release did not delete"))
        return;
      tally.cycle_us.push_back(static_cast<float>(micros(Clock::now() - t0)));
      ++tally.cycles;
    }
  });
  close_all();
}

struct PollVariant {
  const char* suffix;
  std::chrono::microseconds poll;
};
constexpr PollVariant kPollVariants[] = {{"+busy_poll", kBusyPoll}, {"+adaptive", lockwatch::kBusyPollAdaptive}};

// The row `name` once more as "name+busy_poll", with Options::runtime.busy_poll
// at kBusyPoll for the runtime (or the loop and pool) it builds, and as
// "name+adaptive" with kBusyPollAdaptive (the default).
template <class Fn, class... A>
void register_busy_poll(const std::string& name, Fn fn, A... a) {
  for (const auto& variant : kPollVariants) {
    const auto poll = variant.poll;
    benchmark::RegisterBenchmark((name + variant.suffix).c_str(),
                                 [=](benchmark::State& state) {
                                   g_busy_poll = poll;
                                   fn(state, a...);
                                   g_busy_poll = {};
                                 })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

void register_benchmarks() {
  const int kConcurrency[] = {1, 16, 64};
  for (const char* kind : {"exclusive", "fair", "shared", "permits4", "rw9to1"}) {
    for (int conc : kConcurrency) {
      benchmark::RegisterBenchmark(fmt::format("BM_Kind/{}/{}", kind, conc).c_str(), BM_Kind, conc, std::string(kind))
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (int conc : kConcurrency) {
    benchmark::RegisterBenchmark(fmt::format("BM_RawHiredis/{}/uncontended", conc).c_str(), BM_RawHiredis, conc, 1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  // The limit for an API that returns futures: the caller writes, one
  // reader thread completes the futures.
  // The limit for blocking callers: each thread its own connection.
  for (int conc : {1, 64}) {
    benchmark::RegisterBenchmark(fmt::format("BM_RawHiredisFuture/{}/uncontended", conc).c_str(), BM_RawHiredisFuture,
                                 conc)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(fmt::format("BM_RawHiredisBlocking/{}/uncontended", conc).c_str(),
                                 BM_RawHiredisBlocking, conc)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  // Sets of two keys (lockwatch::all_of) beside one key, and the limit
  // for two: both acquisitions pipelined, then both releases.
  for (int conc : {1, 64}) {
    benchmark::RegisterBenchmark(fmt::format("BM_RawHiredis2/{}/uncontended", conc).c_str(), BM_RawHiredis, conc, 2)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(fmt::format("BM_Transfer/{}/uncontended", conc).c_str(), BM_Transfer, conc, 0)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("BM_Transfer/64/accounts16", BM_Transfer, 64, 16)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  // Options::runtime.busy_poll: the rows it changes most, next to the raw client.
  for (int conc : {1, 64}) {
    register_busy_poll(fmt::format("BM_LockHandle/{}/uncontended", conc), BM_LockHandle, conc, false, true);
    register_busy_poll(fmt::format("BM_Locked/{}/uncontended", conc), BM_Locked, conc, false, true);
  }
  register_busy_poll("BM_LockedFanOut/64/uncontended", BM_LockedFanOut, 64);
  // 64 callers on one key with local hand-offs off, and on (the default).
  register_busy_poll("BM_LockHandle/64/contended", BM_LockHandle, 64, true, false);
  register_busy_poll("BM_Locked/64/contended", BM_Locked, 64, true, false);
  register_busy_poll("BM_LockHandle/64/contended_handoff", BM_LockHandle, 64, true, true);
  register_busy_poll("BM_Locked/64/contended_handoff", BM_Locked, 64, true, true);
  register_busy_poll("BM_LockedRuntimes/3x16/contended_handoff", BM_LockedRuntimes, 3, 16, true);
  register_busy_poll("BM_Hops/chain/pool_loop_pool", BM_HopsChain);
  register_busy_poll("BM_Hops/1/loop_pool_loop", BM_Hops, 1, true);
  register_busy_poll("BM_Hops/fanout64/loop_pool_loop", BM_HopsFanOut, 64);
  // An idle runtime's own CPU, with polling off and in both forms.
  // Renewed about every 150 ms (kIdleTtl, the worst case), and with a 2 s
  // ttl every 1.8 s ("/ttl2s").
  for (auto [name, ttl] : {std::pair{"BM_IdleLeases/100", std::chrono::milliseconds(kIdleTtl)},
                           std::pair{"BM_IdleLeases/100/ttl2s", std::chrono::milliseconds(2000)}}) {
    benchmark::RegisterBenchmark(name, BM_IdleLeases, 100, ttl)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
    for (const auto& variant : kPollVariants) {
      const auto poll = variant.poll;
      benchmark::RegisterBenchmark((std::string(name) + variant.suffix).c_str(),
                                   [=](benchmark::State& state) {
                                     g_busy_poll = poll;
                                     BM_IdleLeases(state, 100, ttl);
                                     g_busy_poll = {};
                                   })
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (bool contended : {false, true}) {
    const char* mode = contended ? "contended" : "uncontended";
    for (int conc : kConcurrency) {
      benchmark::RegisterBenchmark(fmt::format("BM_LockHandle/{}/{}", conc, mode).c_str(), BM_LockHandle, conc,
                                   contended, false)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (int conc : {1, 64}) {
    benchmark::RegisterBenchmark(fmt::format("BM_LockBlocking/{}/uncontended", conc).c_str(), BM_LockBlocking, conc)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  // Options::handoff.enabled: the contended rows with the in-process hand-off.
  benchmark::RegisterBenchmark("BM_LockHandle/64/contended_handoff", BM_LockHandle, 64, true, true)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  for (bool contended : {false, true}) {
    const char* mode = contended ? "contended" : "uncontended";
    for (int conc : kConcurrency) {
      benchmark::RegisterBenchmark(fmt::format("BM_Locked/{}/{}", conc, mode).c_str(), BM_Locked, conc, contended,
                                   false)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RegisterBenchmark("BM_Locked/64/contended_handoff", BM_Locked, 64, true, true)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  // Three runtimes (as three processes) x 16 callers on one key.
  for (bool handoff : {false, true}) {
    benchmark::RegisterBenchmark(
        handoff ? "BM_LockedRuntimes/3x16/contended_handoff" : "BM_LockedRuntimes/3x16/contended", BM_LockedRuntimes,
        3, 16, handoff)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (bool handoff : {false, true}) {
    benchmark::RegisterBenchmark(
        handoff ? "BM_LockedProcesses/3x16/contended_handoff" : "BM_LockedProcesses/3x16/contended",
        BM_LockedProcesses, 3, 16, handoff)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  for (int conc : {16, 64}) {
    benchmark::RegisterBenchmark(fmt::format("BM_LockedFanOut/{}/uncontended", conc).c_str(), BM_LockedFanOut, conc)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("BM_Hops/chain/pool_loop_pool", BM_HopsChain)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_Hops/fanout64/loop_pool_loop", BM_HopsFanOut, 64)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  for (int conc : {1, 64}) {
    for (bool pool : {false, true}) {
      benchmark::RegisterBenchmark(fmt::format("BM_Hops/{}/{}", conc, pool ? "loop_pool_loop" : "loop").c_str(),
                                   BM_Hops, conc, pool)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 7 && std::strcmp(argv[1], "--contender") == 0) return run_contender(argv + 2);
  // A 2 s minimum per row unless the command line sets one.
  std::vector<char*> args(argv, argv + argc);
  bool has_min_time = std::any_of(args.begin(), args.end(),
                                  [](const char* a) { return std::strncmp(a, "--benchmark_min_time", 20) == 0; });
  std::string min_time = kDefaultMinTime;
  if (!has_min_time) args.insert(args.begin() + 1, min_time.data());
  for (const char* a : args) {
    if (std::strncmp(a, "--benchmark_min_time=", 21) == 0 && std::strtod(a + 21, nullptr) < kQuietMinTime)
      g_quiet.disable();
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;

  register_benchmarks();
  return lockwatch::bench::run_against_redis("lock_bench", g_redis);
}
