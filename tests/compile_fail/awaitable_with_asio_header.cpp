// The control of awaitable_without_asio_header.cpp: with the header, the
// same program compiles, and the call gives an awaitable.
#include <lockwatch/asio.hpp>

int main() {
  auto f = LOCKED("k:{0}", std::chrono::seconds(1), 0)[](int x) -> asio::awaitable<int> { co_return x; };
  asio::awaitable<int> a = f(1);
  (void)a;
}
