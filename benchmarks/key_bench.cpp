// Building a lock key from a LOCKED pattern and the call's arguments: the
// work every decorated call does before it asks for the lock. Each case
// runs twice in this binary:
//   BM_Key/<case>/lockwatch   Locked::key_for(), what a call runs (a LOCKED
//                             literal: checked at compile time)
//   BM_Key/<case>/fmt         fmt::vformat with the same pattern and
//                             arguments: how LOCKED built keys before it
//                             had its own formatter
// Counter allocs: heap allocations per key (the key itself, once it is
// longer than std::string's inline 15 bytes).
//
// Cases: int "sku:{0}"; int_string "order:{0}:{1}"; mixed "{}:{}:{}"
// (string_view, uint64, double); double "price:{0}"; long, a 40-byte key
// of three parts.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>

#include "lockwatch/lockwatch.hpp"

// --- allocation accounting -------------------------------------------------
namespace {

std::atomic<std::uint64_t> g_allocs{0};

void* counted_alloc(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  void* p = std::malloc(n != 0 ? n : 1);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void counted_free(void* p) noexcept { std::free(p); }

}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }

namespace {

using namespace std::chrono_literals;

// Runs `make` (which returns a key) once per iteration and reports the
// allocations it made per key.
template <class Make>
void run(benchmark::State& state, Make make) {
  const std::uint64_t before = g_allocs.load(std::memory_order_relaxed);
  for (auto _ : state) {
    std::string key = make();
    benchmark::DoNotOptimize(key.data());
  }
  state.counters["allocs"] = benchmark::Counter(
      static_cast<double>(g_allocs.load(std::memory_order_relaxed) - before) / static_cast<double>(state.iterations()));
}

// Registers one case twice: the key of `locked` (a LOCKED callable) for
// these arguments, and fmt::vformat of the same `pattern` with them. The
// arguments are the registered benchmark's captures, read from memory by
// each call: neither side sees constants.
template <class Locked, class... A>
void add_case(const std::string& name, Locked locked, const char* pattern, A... a) {
  benchmark::RegisterBenchmark(("BM_Key/" + name + "/lockwatch").c_str(), [=](benchmark::State& state) {
    run(state, [&] { return locked.key_for(a...); });
  });
  benchmark::RegisterBenchmark(("BM_Key/" + name + "/fmt").c_str(), [=](benchmark::State& state) {
    run(state, [&] { return fmt::vformat(pattern, fmt::make_format_args(a...)); });
  });
}

}  // namespace

int main(int argc, char** argv) {
  add_case("int", LOCKED("sku:{0}", 5s, 3)[](int) {}, "sku:{0}", 42);
  add_case("int_string", LOCKED("order:{0}:{1}", 5s, 3)[](int, const std::string&) {}, "order:{0}:{1}", 7,
           std::string("ann"));
  add_case("mixed", LOCKED("{}:{}:{}", 5s, 3)[](std::string_view, std::uint64_t, double) {}, "{}:{}:{}",
           std::string_view("acme"), std::uint64_t{9001}, 0.25);
  add_case("double", LOCKED("price:{0}", 5s, 3)[](double) {}, "price:{0}", 19.99);
  add_case("long", LOCKED("tenant:{0}:warehouse:{1}:sku:{2}", 5s, 3)[](const std::string&, const std::string&, long) {},
           "tenant:{0}:warehouse:{1}:sku:{2}", std::string("acme"), std::string("eu-west-1"), 123456789L);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
