// tools/lockwatch/duration.hpp: durations as the command line writes them,
// a whole number and a unit: 500ms, 30s, 5m, 1h, 1d.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace lockwatch::cli {

// The duration `text` names, or std::nullopt with the reason in `error`
// (a missing unit, a sign, a fraction, an overflow).
std::optional<std::chrono::milliseconds> parse_duration(std::string_view text, std::string& error);

// The shortest exact form: "0s", "1500ms", "30s", "5m", "2h", "1d".
std::string format_duration(std::chrono::milliseconds d);

}  // namespace lockwatch::cli
