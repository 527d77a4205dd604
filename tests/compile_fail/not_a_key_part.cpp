// Must not compile: the pattern refers to {1}, whose type cannot be a key
// part (key_patterns.cpp is the control).
#include <lockwatch/locked.hpp>

struct Opaque {};

int main() {
  auto f = LOCKED("k:{1}", std::chrono::seconds(1), 0)[](int, Opaque) { return 0; };
  (void)f(1, Opaque{});
}
