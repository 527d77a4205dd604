// lib/core/token.hpp: owner tokens, 128 bits from the kernel's CSPRNG as 32 hex
// characters. Random bytes are read in blocks so a token costs no syscall
// on the common path. Not thread-safe: one generator per thread (the loop).
#pragma once

#include <array>
#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>

namespace lockwatch::detail {

// A token kept inline (a lease holds one; a std::string would cost a heap
// block of its own).
struct OwnerToken {
  std::array<char, 32> text{};
  std::string_view view() const noexcept { return {text.data(), text.size()}; }
  std::string str() const { return std::string(view()); }
};

// An owner token of TokenGenerator's as its 16 bytes, half its text's
// size: a held lease keeps it so, and writes the text for each request.
class PackedToken {
 public:
  static constexpr std::size_t kTextSize = std::tuple_size_v<decltype(OwnerToken::text)>;
  PackedToken() noexcept = default;
  // `t` as TokenGenerator::next() wrote it (lowercase hex).
  explicit PackedToken(const OwnerToken& t) noexcept {
    auto nibble = [](char c) noexcept {
      return static_cast<unsigned char>(c <= '9' ? c - '0' : c - 'a' + 10);
    };
    for (std::size_t i = 0; i < bytes_.size(); ++i)
      bytes_[i] = static_cast<unsigned char>(nibble(t.text[2 * i]) << 4 | nibble(t.text[2 * i + 1]));
  }
  // Writes the token's kTextSize characters at `to`; returns their end.
  // A byte's two characters at a time (each renewal writes the token).
  char* write(char* to) const noexcept {
    for (unsigned char b : bytes_) {
      std::memcpy(to, kPairs.data() + 2 * b, 2);
      to += 2;
    }
    return to;
  }
  OwnerToken text() const noexcept {
    OwnerToken t;
    write(t.text.data());
    return t;
  }

 private:
  // The two hex characters of each byte value, in order.
  static constexpr std::array<char, 512> kPairs = [] {
    constexpr char kHex[] = "0123456789abcdef";
    std::array<char, 512> pairs{};
    for (std::size_t b = 0; b < 256; ++b) {
      pairs[2 * b] = kHex[b >> 4];
      pairs[2 * b + 1] = kHex[b & 15];
    }
    return pairs;
  }();
  std::array<unsigned char, kTextSize / 2> bytes_{};
};
static_assert(sizeof(PackedToken) == 16);

class TokenGenerator {
 public:
  OwnerToken next();

 private:
  void refill();
  std::array<unsigned char, 4096> buf_{};
  std::size_t used_ = buf_.size();
};

}  // namespace lockwatch::detail
