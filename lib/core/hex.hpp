// lib/core/hex.hpp: one hexadecimal digit's value, for the stores that
// decode hex text (PostgreSQL's bytea, ZooKeeper's escaped node names).
#pragma once

namespace lockwatch::detail {

// 0-15 for a digit of either case; -1 for anything else.
constexpr int hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace lockwatch::detail
