// The control of the other key pattern cases: every form a pattern may
// take and every kind of key part compile, and so does an argument of any
// type that the pattern does not use.
#include <lockwatch/locked.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace app {
struct Sku {
  int id;
};
std::string lockwatch_key(const Sku& s) { return "sku-" + std::to_string(s.id); }
enum class Color { kRed, kBlue };
const char* lockwatch_key(Color c) { return c == Color::kRed ? "red" : "blue"; }
}  // namespace app

enum class Level : std::uint8_t { kLow, kHigh };
struct Opaque {};

int main() {
  using std::chrono::seconds;
  auto automatic = LOCKED("k:{}:{}:{}", seconds(1), 0)[](int, const std::string&, double) { return 0; };
  (void)automatic(1, std::string("a"), 0.5);
  auto numbered = LOCKED("{{k}}:{1}:{0}:{1}", seconds(1), 0)[](long, std::string_view) { return 0; };
  (void)numbered(1L, std::string_view("a"));
  auto kinds = LOCKED("{}{}{}{}{}{}{}{}", seconds(1), 0)[](bool, char, signed char, unsigned long long, float,
                                                            Level, const char*, std::string_view) { return 0; };
  (void)kinds(true, 'c', static_cast<signed char>(-1), 2ULL, 0.5F, Level::kHigh, "s", std::string_view("v"));
  auto custom = LOCKED("{0}:{1}", seconds(1), 0)[](app::Sku, app::Color) { return 0; };
  (void)custom(app::Sku{7}, app::Color::kBlue);
  auto unused = LOCKED("k:{0}", seconds(1), 0)[](int, Opaque) { return 0; };
  (void)unused(1, Opaque{});
}
