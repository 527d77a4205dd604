// Must not compile: three {} with two arguments (key_patterns.cpp is the control).
#include <lockwatch/locked.hpp>

int main() {
  auto f = LOCKED("k:{}:{}:{}", std::chrono::seconds(1), 0)[](int, int) { return 0; };
  (void)f(1, 2);
}
