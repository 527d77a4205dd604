// lib/store/sqlcommon/values.hpp: how the SQL stores write values into
// their statements and read them back from the servers' text answers.
//
// Names and tokens travel as hex (MariaDB's X'..' literals, PostgreSQL's
// decode(.., 'hex')): any bytes, no escaping, and nothing a key holds can
// change a statement. An answer, from either driver, is one Rows, read
// as its server writes it. Pure functions; any thread.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/hex.hpp"

namespace lockwatch::detail::sqlcommon {

// `bytes` as lowercase hex digits.
inline std::string to_hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (unsigned char c : bytes) out.append({kHex[c >> 4], kHex[c & 15]});
  return out;
}

// Hex text back to bytes; false if it is not hex.
inline bool unhex(std::string_view text, std::string& out) {
  if (text.size() % 2 != 0) return false;
  out.clear();
  out.reserve(text.size() / 2);
  for (std::size_t i = 0; i < text.size(); i += 2) {
    const int hi = hex_digit(text[i]), lo = hex_digit(text[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

inline long long micros(std::chrono::milliseconds ttl) { return static_cast<long long>(ttl.count()) * 1000; }

// A number in an answer's text ("" and NULL read as 0).
inline long long to_ll(std::string_view s) {
  long long v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

// Microseconds since the epoch as a time point, and back.
inline std::chrono::system_clock::time_point from_micros(long long us) {
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::microseconds(us)));
}
inline long long to_micros(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

// "<unix seconds>[.<fraction>]" (MariaDB's UNIX_TIMESTAMP(..)) in
// microseconds since the epoch.
inline long long unix_micros(std::string_view s) {
  const std::size_t dot = std::min(s.find('.'), s.size());
  std::string frac(s.substr(std::min(dot + 1, s.size()), 6));
  frac.resize(6, '0');  // the fraction's digits as µs (none: 0)
  return to_ll(s.substr(0, dot)) * 1000000 + to_ll(frac);
}

// A list parameter: a text array literal of `n` items, get(0).., each a
// number or, as hex, bytes ({"6b31","6b32"}).
template <class Get>
std::string array_literal(std::size_t n, Get get) {
  std::string out = "{";
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += ',';
    if constexpr (std::is_integral_v<decltype(get(i))>)
      out += std::to_string(get(i));
    else
      out += '"' + to_hex(get(i)) + '"';
  }
  return out + '}';
}

// A statement's answer, from either driver: rows of text cells (none:
// NULL), each read as its server writes it. MariaDB's: names and tokens
// as bytes, times as UNIX_TIMESTAMP(), booleans "1", and NULL and "" one;
// PostgreSQL's (`hex`): names and tokens as hex, times in µs, booleans "t".
// A cell past the rows or columns reads as empty and NULL. The cells are
// views into the driver's result, which the connection keeps until the
// callback given the Rows returns: no cell is copied.
struct Rows {
  std::vector<std::optional<std::string_view>> cells;  // row after row, `columns` each
  std::size_t columns = 0;
  bool hex = false;

  int size() const noexcept { return columns == 0 ? 0 : static_cast<int>(cells.size() / columns); }
  std::string_view at(int row, int column) const noexcept {
    const std::optional<std::string_view>* c = cell(row, column);
    return c != nullptr && *c ? **c : std::string_view();
  }
  bool null(int row, int column) const noexcept {
    const std::optional<std::string_view>* c = cell(row, column);
    return c == nullptr || !*c || (!hex && (*c)->empty());
  }
  // A name, token or owner name: false when the cell holds none.
  bool read_bytes(int row, int column, std::string& out) const {
    if (hex) return unhex(at(row, column), out);
    out = at(row, column);
    return true;
  }
  std::string bytes(int row, int column) const {
    std::string out;
    read_bytes(row, column, out);
    return out;
  }
  // A time in µs since the epoch.
  long long micros(int row, int column) const { return hex ? to_ll(at(row, column)) : unix_micros(at(row, column)); }
  bool yes(int row, int column) const { return at(row, column) == (hex ? "t" : "1"); }

 private:
  const std::optional<std::string_view>* cell(int row, int column) const noexcept {
    if (row < 0 || row >= size() || column < 0 || static_cast<std::size_t>(column) >= columns) return nullptr;
    return &cells[static_cast<std::size_t>(row) * columns + static_cast<std::size_t>(column)];
  }
};

}  // namespace lockwatch::detail::sqlcommon
