// Must not compile: Runtime::dispatch takes lockwatch's internal types
// (detail::Call) and is for LOCKED alone.
#include <lockwatch/lockwatch.hpp>

void call(lockwatch::Runtime& rt) { rt.dispatch({}, nullptr); }

int main() {}
