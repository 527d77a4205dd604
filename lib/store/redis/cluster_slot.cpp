#include "store/redis/cluster_slot.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <numeric>

namespace lockwatch::detail {

namespace {

// One entry per byte value: the CRC of that byte shifted in from the top.
constexpr std::array<std::uint16_t, 256> make_table() {
  std::array<std::uint16_t, 256> t{};
  for (unsigned b = 0; b < 256; ++b) {
    std::uint16_t crc = static_cast<std::uint16_t>(b << 8);
    for (int i = 0; i < 8; ++i) crc = static_cast<std::uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
    t[b] = crc;
  }
  return t;
}

constexpr std::array<std::uint16_t, 256> kTable = make_table();

constexpr std::string_view kTagAlphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

// One tag per slot, NUL-padded: every slot has one of at most three
// characters (cluster_slot_test checks it), so four bytes hold any.
using TagTable = std::array<std::array<char, 4>, kClusterSlots>;

TagTable make_tags() {
  TagTable tags{};
  std::size_t found = 0;
  char s[3];
  // Shortest first; within a length, in alphabet order, first character
  // most significant. The first string to land in a slot names it.
  // The strings of one length, in that order, are the numbers below `count`
  // written in base kBase.
  constexpr std::size_t kBase = kTagAlphabet.size();
  for (std::size_t len = 1, count = kBase; len <= 3 && found < kClusterSlots; ++len, count *= kBase) {
    for (std::size_t n = 0; n < count; ++n) {
      for (std::size_t i = len, rest = n; i-- > 0; rest /= kBase) s[i] = kTagAlphabet[rest % kBase];
      const std::uint16_t slot = key_slot(std::string_view(s, len));
      if (tags[slot][0] == '\0') {
        for (std::size_t i = 0; i < len; ++i) tags[slot][i] = s[i];
        ++found;
      }
    }
  }
  return tags;
}

}  // namespace

std::uint16_t crc16(std::string_view data) noexcept {
  std::uint16_t crc = 0;
  for (unsigned char c : data) crc = static_cast<std::uint16_t>((crc << 8) ^ kTable[((crc >> 8) ^ c) & 0xff]);
  return crc;
}

std::string_view hash_tag(std::string_view key) noexcept {
  const auto open = key.find('{');
  if (open == std::string_view::npos) return key;
  const auto close = key.find('}', open + 1);
  // No closing brace, or nothing between: the whole key is hashed.
  if (close == std::string_view::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

std::uint16_t key_slot(std::string_view key) noexcept {
  return static_cast<std::uint16_t>(crc16(hash_tag(key)) & (kClusterSlots - 1));
}

std::string_view slot_tag(std::uint16_t slot) noexcept {
  static const TagTable tags = make_tags();
  return std::string_view(tags[slot & (kClusterSlots - 1)].data());  // NUL-terminated: at most three characters
}

std::vector<SlotGroup> group_by_slot(std::span<const std::uint16_t> slots) {
  std::vector<std::size_t> order(slots.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return slots[a] < slots[b]; });
  std::vector<SlotGroup> groups;
  for (std::size_t i : order) {
    if (groups.empty() || groups.back().slot != slots[i]) groups.push_back(SlotGroup{slots[i], {}});
    groups.back().at.push_back(i);
  }
  return groups;
}

}  // namespace lockwatch::detail
