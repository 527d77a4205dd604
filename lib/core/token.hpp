// lib/core/token.hpp: owner tokens, 128 bits from the kernel's CSPRNG as 32 hex
// characters. Random bytes are read in blocks so a token costs no syscall
// on the common path. Not thread-safe: one generator per thread (the loop).
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace lockwatch::detail {

// A token kept inline (a lease holds one; a std::string would cost a heap
// block of its own).
struct OwnerToken {
  std::array<char, 32> text{};
  std::string_view view() const noexcept { return {text.data(), text.size()}; }
  std::string str() const { return std::string(view()); }
};

class TokenGenerator {
 public:
  OwnerToken next();

 private:
  void refill();
  std::array<unsigned char, 4096> buf_{};
  std::size_t used_ = buf_.size();
};

}  // namespace lockwatch::detail
