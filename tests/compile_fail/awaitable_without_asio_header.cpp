// Must not compile: LOCKED on a coroutine returning asio::awaitable without
// <lockwatch/asio.hpp> would run the coroutine's factory on the pool and
// return a future of an unstarted coroutine.
#include <asio/awaitable.hpp>
#include <lockwatch/locked.hpp>

int main() {
  auto f = LOCKED("k:{0}", std::chrono::seconds(1), 0)[](int x) -> asio::awaitable<int> { co_return x; };
  (void)f(1);
}
