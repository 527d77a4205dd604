// Must not compile: a lock is asked for with named fields (LockRequest),
// so a wait cannot be passed where the ttl goes. This was a 100 ms lease
// with a 30 s wait, where the caller meant the opposite.
#include <lockwatch/lockwatch.hpp>

using namespace std::chrono_literals;

void call(lockwatch::Runtime& rt) { (void)rt.acquire("k", 100ms, lockwatch::forever, 30s); }

int main() {}
