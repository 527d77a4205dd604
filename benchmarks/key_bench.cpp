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

template <class... A>
std::string with_fmt(std::string_view pattern, const A&... a) {
  return fmt::vformat(pattern, fmt::make_format_args(a...));
}

// Arguments pass through memory the compiler must assume changed, so that
// neither side sees constants. (DoNotOptimize(v) on a double itself loses
// the value with Google Benchmark 1.7 and g++ 12: hence its address.)
template <class T>
T opaque(T v) {
  benchmark::DoNotOptimize(&v);
  benchmark::ClobberMemory();
  return v;
}

void BM_Key_Int_Lockwatch(benchmark::State& state) {
  auto f = LOCKED("sku:{0}", 5s, 3)[](int) {};
  const int sku = opaque(42);
  run(state, [&] { return f.key_for(sku); });
}
void BM_Key_Int_Fmt(benchmark::State& state) {
  const int sku = opaque(42);
  run(state, [&] { return with_fmt("sku:{0}", sku); });
}

void BM_Key_IntString_Lockwatch(benchmark::State& state) {
  auto f = LOCKED("order:{0}:{1}", 5s, 3)[](int, const std::string&) {};
  const int id = opaque(7);
  const std::string who = opaque(std::string("ann"));
  run(state, [&] { return f.key_for(id, who); });
}
void BM_Key_IntString_Fmt(benchmark::State& state) {
  const int id = opaque(7);
  const std::string who = opaque(std::string("ann"));
  run(state, [&] { return with_fmt("order:{0}:{1}", id, who); });
}

void BM_Key_Mixed_Lockwatch(benchmark::State& state) {
  auto f = LOCKED("{}:{}:{}", 5s, 3)[](std::string_view, std::uint64_t, double) {};
  const std::string_view tenant = opaque(std::string_view("acme"));
  const std::uint64_t n = opaque(std::uint64_t{9001});
  const double share = opaque(0.25);
  run(state, [&] { return f.key_for(tenant, n, share); });
}
void BM_Key_Mixed_Fmt(benchmark::State& state) {
  const std::string_view tenant = opaque(std::string_view("acme"));
  const std::uint64_t n = opaque(std::uint64_t{9001});
  const double share = opaque(0.25);
  run(state, [&] { return with_fmt("{}:{}:{}", tenant, n, share); });
}

void BM_Key_Double_Lockwatch(benchmark::State& state) {
  auto f = LOCKED("price:{0}", 5s, 3)[](double) {};
  const double price = opaque(19.99);
  run(state, [&] { return f.key_for(price); });
}
void BM_Key_Double_Fmt(benchmark::State& state) {
  const double price = opaque(19.99);
  run(state, [&] { return with_fmt("price:{0}", price); });
}

void BM_Key_Long_Lockwatch(benchmark::State& state) {
  auto f = LOCKED("tenant:{0}:warehouse:{1}:sku:{2}", 5s, 3)[](const std::string&, const std::string&, long) {};
  const std::string tenant = opaque(std::string("acme"));
  const std::string warehouse = opaque(std::string("eu-west-1"));
  const long sku = opaque(123456789L);
  run(state, [&] { return f.key_for(tenant, warehouse, sku); });
}
void BM_Key_Long_Fmt(benchmark::State& state) {
  const std::string tenant = opaque(std::string("acme"));
  const std::string warehouse = opaque(std::string("eu-west-1"));
  const long sku = opaque(123456789L);
  run(state, [&] { return with_fmt("tenant:{0}:warehouse:{1}:sku:{2}", tenant, warehouse, sku); });
}

BENCHMARK(BM_Key_Int_Lockwatch)->Name("BM_Key/int/lockwatch");
BENCHMARK(BM_Key_Int_Fmt)->Name("BM_Key/int/fmt");
BENCHMARK(BM_Key_IntString_Lockwatch)->Name("BM_Key/int_string/lockwatch");
BENCHMARK(BM_Key_IntString_Fmt)->Name("BM_Key/int_string/fmt");
BENCHMARK(BM_Key_Mixed_Lockwatch)->Name("BM_Key/mixed/lockwatch");
BENCHMARK(BM_Key_Mixed_Fmt)->Name("BM_Key/mixed/fmt");
BENCHMARK(BM_Key_Double_Lockwatch)->Name("BM_Key/double/lockwatch");
BENCHMARK(BM_Key_Double_Fmt)->Name("BM_Key/double/fmt");
BENCHMARK(BM_Key_Long_Lockwatch)->Name("BM_Key/long/lockwatch");
BENCHMARK(BM_Key_Long_Fmt)->Name("BM_Key/long/fmt");

}  // namespace

BENCHMARK_MAIN();
