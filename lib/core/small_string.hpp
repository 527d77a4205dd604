// lib/core/small_string.hpp: a string kept inline up to N bytes, in a heap
// block of its own beyond. What the loop keeps per lock (a lease's store
// name, a batch's queued names and tokens) then costs no allocation for
// the usual sizes: std::string keeps 15 bytes inline, and a store's names
// ("lockwatch:{sku:42}") and owner tokens (32 characters) are longer.
// Not thread-safe (a value, as std::string).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace lockwatch::detail {

template <std::size_t N>
class SmallString {
  static_assert(N >= sizeof(char*), "the inline bytes hold the heap block's address beyond N");

 public:
  SmallString() noexcept = default;
  explicit SmallString(std::string_view s) { assign(s); }
  SmallString(const SmallString& other) { assign(other.view()); }
  SmallString(SmallString&& other) noexcept { take(other); }
  SmallString& operator=(const SmallString& other) {
    if (this != &other) assign(other.view());
    return *this;
  }
  SmallString& operator=(SmallString&& other) noexcept {
    if (this != &other) {
      release();
      take(other);
    }
    return *this;
  }
  SmallString& operator=(std::string_view s) {
    assign(s);
    return *this;
  }
  ~SmallString() { release(); }

  // Becomes the pieces in `parts`, joined.
  template <std::size_t K>
  void assign_joined(const std::array<std::string_view, K>& parts) {
    std::size_t size = 0;
    for (std::string_view p : parts) size += p.size();
    char inline_copy[N];
    char* to = size > N ? new char[size] : inline_copy;
    std::size_t at = 0;
    for (std::string_view p : parts) {
      if (!p.empty()) std::memcpy(to + at, p.data(), p.size());
      at += p.size();
    }
    release();
    if (size > N)
      std::memcpy(bytes_, &to, sizeof to);
    else if (size > 0)
      std::memcpy(bytes_, inline_copy, size);
    size_ = static_cast<std::uint32_t>(size);
  }

  std::string_view view() const noexcept {
    const char* h = heap();
    return {h ? h : bytes_, size_};
  }
  operator std::string_view() const noexcept { return view(); }  // NOLINT: a string, as std::string is
  std::string str() const { return std::string(view()); }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }

 private:
  char* heap() const noexcept {
    if (size_ <= N) return nullptr;
    char* h;
    std::memcpy(&h, bytes_, sizeof h);
    return h;
  }
  void assign(std::string_view s) {
    // `s` may be this string's own bytes: copied before they are let go.
    if (s.size() > N) {
      char* block = new char[s.size()];
      std::memcpy(block, s.data(), s.size());
      release();
      std::memcpy(bytes_, &block, sizeof block);
    } else {
      char copy[N];
      std::memcpy(copy, s.data(), s.size());
      release();
      std::memcpy(bytes_, copy, s.size());
    }
    size_ = static_cast<std::uint32_t>(s.size());
  }
  void take(SmallString& other) noexcept {
    std::memcpy(bytes_, other.bytes_, N);
    size_ = other.size_;
    other.size_ = 0;  // its heap block, if any, is ours now
  }
  void release() noexcept {
    delete[] heap();
    size_ = 0;
  }

  char bytes_[N] = {};
  std::uint32_t size_ = 0;
};

}  // namespace lockwatch::detail
