#include "token.hpp"

#include <sys/random.h>

#include <cerrno>
#include <stdexcept>

namespace lockwatch::detail {

void TokenGenerator::refill() {
  std::size_t got = 0;
  while (got < buf_.size()) {
    ssize_t n = getrandom(buf_.data() + got, buf_.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("getrandom failed");
    }
    got += static_cast<std::size_t>(n);
  }
  used_ = 0;
}

OwnerToken TokenGenerator::next() {
  constexpr std::size_t kBytes = 16;
  if (used_ + kBytes > buf_.size()) refill();
  static constexpr char kHex[] = "0123456789abcdef";
  static_assert(2 * kBytes == std::tuple_size_v<decltype(OwnerToken::text)>);
  OwnerToken out;
  for (std::size_t i = 0; i < kBytes; ++i) {
    unsigned char b = buf_[used_ + i];
    out.text[2 * i] = kHex[b >> 4];
    out.text[2 * i + 1] = kHex[b & 15];
    buf_[used_ + i] = 0;  // a used byte never serves twice
  }
  used_ += kBytes;
  return out;
}

}  // namespace lockwatch::detail
