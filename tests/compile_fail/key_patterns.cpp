// The control of the other key pattern cases: each form a pattern may take
// compiles, with arguments that can be key parts, and so does an argument
// of any type that the pattern does not use. (options_test shows what each
// kind of key part writes.)
#include <lockwatch/locked.hpp>

#include <string>
#include <string_view>

struct Opaque {};

int main() {
  using std::chrono::seconds;
  auto automatic = LOCKED("k:{}:{}", seconds(1), 0)[](int, int) { return 0; };
  (void)automatic(1, 2);
  auto numbered = LOCKED("{{k}}:{1}:{0}:{1}", seconds(1), 0)[](int, int) { return 0; };
  (void)numbered(1, 2);
  auto kinds = LOCKED("{}{}{}{}{}{}", seconds(1), 0)[](bool, char, unsigned long long, float, const char*,
                                                        std::string_view) { return 0; };
  (void)kinds(true, 'c', 2ULL, 0.5F, "s", std::string_view("v"));
  auto unused = LOCKED("k:{0}", seconds(1), 0)[](int, Opaque, wchar_t) { return 0; };
  (void)unused(1, Opaque{}, L'x');
}
