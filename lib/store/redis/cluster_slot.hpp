// lib/store/redis/cluster_slot.hpp: which Redis Cluster slot a key lives in.
//
// slot = CRC16(hashed part) mod 16384, where CRC16 is the XMODEM variant
// (polynomial 0x1021, initial value 0, no reflection) and the hashed part is
// the key's hash tag when it has one: the text between its first '{' and the
// first '}' after it, if that text is not empty; otherwise the whole key.
// All keys of one lock (`P{K}`, `P{K}:rel`) share the tag K and so the slot;
// its fencing counter, one per slot, is named with slot_tag(), a short tag
// of the same slot.
//
// group_by_slot() splits a batch of keys into slot groups, one script
// call each on a Redis Cluster (a script's KEYS must share one slot).
//
// Threading: pure functions; slot_tag() builds its table once, on first use
// (thread-safe). Costs: a table lookup per byte of the tag; the first
// slot_tag() call about 240,000 CRCs of three bytes (a millisecond or two);
// group_by_slot() one sort of the batch's positions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace lockwatch::detail {

inline constexpr std::uint16_t kClusterSlots = 16384;

// CRC16/XMODEM of `data`, as Redis computes it.
std::uint16_t crc16(std::string_view data) noexcept;

// The part of `key` Redis hashes (its hash tag, or all of it).
std::string_view hash_tag(std::string_view key) noexcept;

// The slot of `key`, in [0, 16384).
std::uint16_t key_slot(std::string_view key) noexcept;

// A tag of `slot`: crc16(slot_tag(s)) % 16384 == s. It is the first, among
// the shortest, of the strings over "0-9a-zA-Z" in that order (first
// character most significant) whose slot is `slot`: one to three
// characters, "06S" for slot 0. The rule names the fencing counters in
// Redis, so it must never change (cluster_slot_test pins it). `slot` must
// be below kClusterSlots.
std::string_view slot_tag(std::uint16_t slot) noexcept;

// The keys of one slot in a batch: their positions in it, ascending.
struct SlotGroup {
  std::uint16_t slot = 0;
  std::vector<std::size_t> at;
};

// The slot groups of a batch whose item i lives in slot `slots[i]`, by
// ascending slot; each item in exactly one group.
std::vector<SlotGroup> group_by_slot(std::span<const std::uint16_t> slots);

}  // namespace lockwatch::detail
