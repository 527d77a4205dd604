// Unit-testing code that uses LOCKED, without a server: the store is
// memory://NAME, locks in this process's memory, shared by the runtimes
// that name the same space. Ttls, fencing tokens, the watchdog and waiting
// behave as on Redis.
//
//   ./lockwatch-sample-unit-test-with-memory    (prints "ok", exit 0)
//
// The code under test takes its runtime from the caller (a test gives it
// one on memory://test), or uses LOCKED's default runtime, which reads
// LOCKWATCH_STORE_URL (a test sets it to memory:// before the first call).
// A test framework's ASSERTs would replace check() below.
#include <lockwatch/lockwatch.hpp>

#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <vector>

using namespace std::chrono_literals;

// ---------------------------------------------------------- code under test

// Stock with a racy read-then-write, made safe by the lock: one
// reservation per SKU at a time, in every process that shares the store.
struct Stock {
  std::map<int, int> left;
  std::mutex mu;  // for the map itself; the lock keeps the rule
  int read(int sku) {
    std::lock_guard lk(mu);
    return left[sku];
  }
  void write(int sku, int n) {
    std::lock_guard lk(mu);
    left[sku] = n;
  }
};

// Reserves `qty` of `sku` and returns what is left (0 refused: too few).
std::future<int> reserve(lockwatch::Runtime& rt, Stock& stock, int sku, int qty) {
  auto take = lockwatch::locked("sku:{0}", 5s, 3).on(rt).wait(5s)([&stock](int sku, int qty) {
    int n = stock.read(sku);
    if (n < qty) return 0;
    std::this_thread::yield();  // the race the lock closes
    stock.write(sku, n - qty);
    return n - qty;
  });
  return take(sku, qty);
}

// ------------------------------------------------------------------- tests

int failures = 0;
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

// Many concurrent reservations lose no update.
void concurrent_reservations_lose_nothing() {
  lockwatch::Options o;
  o.store_url = "memory://test";  // a space of this test's own: nothing to start
  lockwatch::Runtime rt(o);
  Stock stock;
  stock.write(42, 100);
  std::vector<std::future<int>> calls;
  for (int i = 0; i < 40; ++i) calls.push_back(reserve(rt, stock, 42, 1));
  for (auto& c : calls) c.get();
  check(stock.read(42) == 60, "40 reservations of 1 leave 60");
}

// Another runtime on the same space plays another process: while one
// holds the SKU's lock, the other's reservation waits for it.
void another_process_waits_for_the_holder() {
  lockwatch::Options o;
  o.store_url = "memory://test";
  lockwatch::Runtime here(o), there(o);
  Stock stock;
  stock.write(7, 10);
  auto held = here.acquire("sku:7", 5s).get();  // as if another process held it
  auto waiting = reserve(there, stock, 7, 3);
  check(waiting.wait_for(200ms) == std::future_status::timeout, "the reservation waits for the holder");
  held.release().get();
  check(waiting.get() == 7, "and runs once the holder let go");
}

// LOCKED without .on() uses the default runtime, from the environment.
void locked_on_the_default_runtime() {
  ::setenv("LOCKWATCH_STORE_URL", "memory://", 1);  // before the default runtime's first use
  Stock stock;
  stock.write(1, 2);
  auto take = LOCKED("sku:{0}", 5s, 3)[&stock](int sku) {
    stock.write(sku, stock.read(sku) - 1);
    return lockwatch::this_lease().fencing_token();
  };
  auto first = take(1).get();
  auto second = take(1).get();
  check(stock.read(1) == 0, "two calls took two");
  check(second > first, "fencing tokens rise");
}

int main() {
  try {
    concurrent_reservations_lose_nothing();
    another_process_waits_for_the_holder();
    locked_on_the_default_runtime();
  } catch (const lockwatch::Error& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
  if (failures != 0) return 1;
  std::printf("ok\n");
  return 0;
}
