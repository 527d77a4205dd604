// Must not compile: a wchar_t cannot be a key part (a key is bytes, with no
// encoding to write it in; key_patterns.cpp is the control).
#include <lockwatch/locked.hpp>

int main() {
  auto f = LOCKED("k:{0}", std::chrono::seconds(1), 0)[](wchar_t) { return 0; };
  (void)f(L'x');
}
