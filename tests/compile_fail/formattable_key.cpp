// Control for unformattable_key.cpp: the unformattable argument is passed
// but the pattern does not refer to it, so this compiles.
#include <lockwatch/locked.hpp>

struct Opaque {};

int main() {
  auto f = LOCKED("k:{0}", std::chrono::seconds(1), 0)[](int, Opaque) { return 0; };
  (void)f(1, Opaque{});
}
