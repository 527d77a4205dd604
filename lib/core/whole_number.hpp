// lib/core/whole_number.hpp: a text that is wholly one decimal number, as
// URLs, server answers and stored values carry them.
#pragma once

#include <charconv>
#include <optional>
#include <string_view>

namespace lockwatch::detail {

// `text`, all of it, as a number of type T: nullopt for an empty text, a
// sign T does not take, anything after the digits, or a number T cannot hold.
template <class T>
std::optional<T> whole_number(std::string_view text) noexcept {
  T n{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return n;
}

// The same into `out`, which is left as it was when `text` is not one.
template <class T>
bool whole_number(std::string_view text, T& out) noexcept {
  const auto n = whole_number<T>(text);
  if (n) out = *n;
  return n.has_value();
}

}  // namespace lockwatch::detail
