// Must not compile: a field that is neither {} nor {N} (key_patterns.cpp is the control).
#include <lockwatch/locked.hpp>

int main() {
  auto f = LOCKED("k:{sku}", std::chrono::seconds(1), 0)[](int, int) { return 0; };
  (void)f(1, 2);
}
