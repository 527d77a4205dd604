// benchmarks/bench_common.hpp: measurement helpers shared by the benchmark
// programs that run against a redis-server: process CPU, Redis's own CPU
// and command counts (INFO), the machine's busy and stolen time
// (/proc/stat), and a bounded wait for a quiet machine before each row.
#pragma once

#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "support/redis_server.hpp"

namespace lockwatch::bench {

using BenchClock = std::chrono::steady_clock;

inline double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// CPU so far of this process's threads named `name` (the runtime's I/O
// thread is "lw-loop"), from each one's schedstat (nanoseconds on a core):
// a thread's own share, which other threads of the process (a benchmark's
// probes, its callers) do not move. Threads that ended are not counted.
inline double threads_cpu_seconds(const std::string& name) {
  double total = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string got;
    if (!std::getline(comm, got) || got != name) continue;
    std::ifstream stat(task.path() / "schedstat");
    unsigned long long ns = 0;
    if (stat >> ns) total += static_cast<double>(ns) * 1e-9;
  }
  return total;
}

// Context switches of this whole process so far (every thread), voluntary
// (it blocked: a futex, a read with nothing to read) and involuntary (the
// scheduler took the core): what the thread hand-offs cost in the kernel.
inline double process_context_switches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_nvcsw) + static_cast<double>(u.ru_nivcsw);
}

// `calls` per command from INFO commandstats (lower-case names; commands run
// inside Lua scripts are counted too).
inline std::map<std::string, long long> command_calls(const testing::RedisServer& redis) {
  std::map<std::string, long long> out;
  auto reply = redis.command({"INFO", "commandstats"});
  const std::string& s = reply.str;
  std::size_t pos = 0;
  while ((pos = s.find("cmdstat_", pos)) != std::string::npos) {
    std::size_t colon = s.find(':', pos);
    std::size_t calls = s.find("calls=", colon);
    if (colon == std::string::npos || calls == std::string::npos) break;
    out[s.substr(pos + 8, colon - pos - 8)] = std::atoll(s.c_str() + calls + 6);
    pos = calls;
  }
  return out;
}

struct CommandDelta {
  double evals = 0;
  double all = 0;  // except INFO
};

inline CommandDelta command_delta(const std::map<std::string, long long>& before,
                                  const std::map<std::string, long long>& after) {
  CommandDelta d;
  for (const auto& [name, calls] : after) {
    if (name == "info") continue;
    auto it = before.find(name);
    auto n = static_cast<double>(calls - (it == before.end() ? 0 : it->second));
    d.all += n;
    if (name == "evalsha" || name == "eval") d.evals += n;
  }
  return d;
}

// CPU seconds so far: this process, redis-server, and the whole machine
// (busy, and stolen by the hypervisor, from /proc/stat).
struct CpuSample {
  BenchClock::time_point wall = BenchClock::now();
  double self = process_cpu_seconds();
  double redis = 0;
  double busy = 0;
  double steal = 0;
};

inline CpuSample sample_cpu(const testing::RedisServer& redis) {
  CpuSample s;
  auto info = redis.command({"INFO", "cpu"});
  for (const char* field : {"used_cpu_sys:", "used_cpu_user:"}) {
    auto pos = info.str.find(field);
    if (pos != std::string::npos) s.redis += std::atof(info.str.c_str() + pos + std::strlen(field));
  }
  if (std::FILE* f = std::fopen("/proc/stat", "r")) {
    unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &system, &idle, &iowait, &irq,
                    &softirq, &steal) == 8) {
      double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
      s.busy = static_cast<double>(user + nice + system + irq + softirq) / hz;
      s.steal = static_cast<double>(steal) / hz;
    }
    std::fclose(f);
  }
  return s;
}

// Other processes share the 2 cores (builds, tests): before each row, wait
// until they leave the machine nearly idle (under 0.2 cores), at most
// `max_wait` per row and `budget` per binary. A row's foreign_cores counter
// says how quiet it stayed.
class QuietWait {
 public:
  QuietWait(BenchClock::duration max_wait, BenchClock::duration budget) : max_wait_(max_wait), budget_(budget) {}
  void disable() { budget_ = BenchClock::duration::zero(); }
  void operator()(const testing::RedisServer& redis) {
    using namespace std::chrono_literals;
    auto start = BenchClock::now();
    auto until = start + std::min(max_wait_, budget_);
    while (BenchClock::now() < until) {
      CpuSample a = sample_cpu(redis);
      std::this_thread::sleep_for(300ms);
      CpuSample b = sample_cpu(redis);
      double wall = std::chrono::duration<double>(b.wall - a.wall).count();
      double other = (b.busy - a.busy) - (b.self - a.self) - (b.redis - a.redis) + (b.steal - a.steal);
      if (other / wall < 0.2) break;
    }
    budget_ -= std::min(budget_, BenchClock::now() - start);
  }

 private:
  BenchClock::duration max_wait_;
  BenchClock::duration budget_;
};

// Runs the registered benchmarks against a throwaway redis-server, which
// `redis` points at meanwhile; returns the exit status (1 if the server could
// not be started or stopped).
inline int run_against_redis(const char* program, testing::RedisServer*& redis) {
  int status = 0;
  try {
    testing::RedisServer server;
    redis = &server;
    benchmark::RunSpecifiedBenchmarks();
    redis = nullptr;
    server.stop();
  } catch (const std::exception& e) {
    redis = nullptr;
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    status = 1;
  }
  benchmark::Shutdown();
  return status;
}

}  // namespace lockwatch::bench
