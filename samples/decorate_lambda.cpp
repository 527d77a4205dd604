// Decorating a lambda: one reservation per SKU at a time, across every
// process that uses the same Redis.
//
//   LOCKWATCH_STORE_URL=redis://127.0.0.1:6379 ./lockwatch-sample-lambda
#include <lockwatch/lockwatch.hpp>

#include <cstdio>
#include <map>
#include <mutex>

using namespace std::chrono_literals;

int main() {
  std::map<int, int> stock{{42, 10}};
  std::mutex stock_mu;  // the map is local; the lock protects the business rule

  auto reserve = LOCKED("sku:{0}", 5s, 3)[&](int sku, int qty) {
    const lockwatch::Lease& lease = lockwatch::this_lease();
    std::lock_guard lk(stock_mu);
    stock[sku] -= qty;
    std::printf("reserved %d of sku %d under %s (fencing token %llu)\n", qty, sku, lease.key().c_str(),
                static_cast<unsigned long long>(lease.fencing_token()));
    return stock[sku];
  };

  try {
    std::future<int> left = reserve(42, 1);  // returns at once
    std::printf("left: %d\n", left.get());
  } catch (const lockwatch::Error& e) {
    std::fprintf(stderr, "reserve failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
