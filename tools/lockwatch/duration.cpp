#include "duration.hpp"

#include <charconv>
#include <cstdint>
#include <limits>

namespace lockwatch::cli {

std::optional<std::chrono::milliseconds> parse_duration(std::string_view text, std::string& error) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') digits++;
  std::string_view number = text.substr(0, digits);
  std::string_view unit = text.substr(digits);
  if (number.empty()) {
    error = "'" + std::string(text) + "' is not a duration: write a whole number and a unit, like 500ms, 30s, 5m or 1h";
    return std::nullopt;
  }
  std::int64_t scale;
  if (unit == "ms") {
    scale = 1;
  } else if (unit == "s") {
    scale = 1000;
  } else if (unit == "m") {
    scale = 60 * 1000;
  } else if (unit == "h") {
    scale = 3600 * 1000;
  } else if (unit == "d") {
    scale = 24 * 3600 * 1000;
  } else {
    error = "'" + std::string(text) + "' is not a duration: " +
            (unit.empty() ? std::string("it needs a unit") : "unknown unit '" + std::string(unit) + "'") +
            " (ms, s, m, h or d, as in 500ms, 30s, 5m, 1h, 1d)";
    return std::nullopt;
  }
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  // A year of milliseconds fits many times over; anything near int64's end
  // is a typo, and would overflow the steady clock's nanoseconds.
  constexpr std::int64_t kMaxMs = std::int64_t{1} << 50;
  if (ec != std::errc() || end != number.data() + number.size() || value > kMaxMs / scale) {
    error = "'" + std::string(text) + "' is too long a duration";
    return std::nullopt;
  }
  return std::chrono::milliseconds(value * scale);
}

std::string format_duration(std::chrono::milliseconds d) {
  auto ms = d.count();
  if (ms == 0) return "0s";
  if (ms % (24 * 3600 * 1000) == 0) return std::to_string(ms / (24 * 3600 * 1000)) + "d";
  if (ms % (3600 * 1000) == 0) return std::to_string(ms / (3600 * 1000)) + "h";
  if (ms % (60 * 1000) == 0) return std::to_string(ms / (60 * 1000)) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

}  // namespace lockwatch::cli
