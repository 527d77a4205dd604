// Must not compile: a '}' that closes no field (key_patterns.cpp is the control).
#include <lockwatch/locked.hpp>

int main() {
  auto f = LOCKED("k:0}", std::chrono::seconds(1), 0)[](int, int) { return 0; };
  (void)f(1, 2);
}
