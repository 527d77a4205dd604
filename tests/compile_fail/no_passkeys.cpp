// Must not compile: the runtime has one way in, Runtime::async_acquire
// (LOCKED's work goes through it as locked_work.hpp says); the public
// headers keep no passkey for the library's own adapters, nor their
// internal call type.
#include <lockwatch/lockwatch.hpp>

void call(lockwatch::Runtime& rt) { lockwatch::detail::DispatchAccess::dispatch(rt, {}, nullptr); }
void release(lockwatch::LockHandle& h) { lockwatch::detail::ReleaseAccess::release(h, nullptr); }
std::shared_ptr<lockwatch::detail::Call> work;

int main() {}
