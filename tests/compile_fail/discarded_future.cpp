// Must not compile (with unused results as errors, as here): a LOCKED
// call's future is how its outcome reaches the caller. Dropped, a busy
// lock or a lost lease would go unseen while the work runs anyway.
#include <lockwatch/lockwatch.hpp>

#pragma GCC diagnostic error "-Wunused-result"

void call() {
  auto reserve = LOCKED("sku:{0}", std::chrono::seconds(5), 3)[](int sku) { return sku; };
  reserve(42);
}

int main() {}
