// Must not compile: {2} with two arguments (key_patterns.cpp is the control).
#include <lockwatch/locked.hpp>

int main() {
  auto f = LOCKED("k:{2}", std::chrono::seconds(1), 0)[](int, int) { return 0; };
  (void)f(1, 2);
}
