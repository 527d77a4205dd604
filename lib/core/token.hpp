// lib/token.hpp: owner tokens, 128 bits from the kernel's CSPRNG as 32 hex
// characters. Random bytes are read in blocks so a token costs no syscall
// on the common path. Not thread-safe: one generator per thread (the loop).
#pragma once

#include <array>
#include <cstddef>
#include <string>

namespace lockwatch::detail {

class TokenGenerator {
 public:
  std::string next();

 private:
  void refill();
  std::array<unsigned char, 4096> buf_{};
  std::size_t used_ = buf_.size();
};

}  // namespace lockwatch::detail
