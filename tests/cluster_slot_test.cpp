// Redis Cluster slot math: CRC16/XMODEM and the hash-tag rule, against
// values the Redis cluster specification and documentation give. The same
// function is checked against a real node's CLUSTER KEYSLOT in cluster_test.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "store/redis/cluster_slot.hpp"

namespace lockwatch::detail {
namespace {

TEST(ClusterSlotTest, Crc16IsXmodemAsTheSpecGivesIt) {
  // The check value of CRC16/XMODEM, quoted in the cluster specification.
  EXPECT_EQ(crc16("123456789"), 0x31C3);
  EXPECT_EQ(crc16(""), 0);
}

TEST(ClusterSlotTest, KnownKeysLandInTheirDocumentedSlots) {
  EXPECT_EQ(key_slot("somekey"), 11058);
  EXPECT_EQ(key_slot("foo"), 12182);
  EXPECT_EQ(key_slot("{user1000}.following"), 3443);
  EXPECT_EQ(key_slot("{user1000}.followers"), 3443);
}

TEST(ClusterSlotTest, HashTagEdgeCasesFollowTheSpec) {
  // An empty first tag: the whole key is hashed.
  EXPECT_EQ(hash_tag("foo{}{bar}"), "foo{}{bar}");
  EXPECT_EQ(key_slot("foo{}{bar}"), crc16("foo{}{bar}") % kClusterSlots);
  // From the first '{' to the first '}' after it.
  EXPECT_EQ(hash_tag("foo{{bar}}zap"), "{bar");
  EXPECT_EQ(key_slot("foo{{bar}}zap"), crc16("{bar") % kClusterSlots);
  // Only the first tag counts.
  EXPECT_EQ(hash_tag("foo{bar}{zap}"), "bar");
  EXPECT_EQ(key_slot("foo{bar}{zap}"), crc16("bar") % kClusterSlots);
  // No closing brace: the whole key.
  EXPECT_EQ(hash_tag("foo{bar"), "foo{bar");
  EXPECT_EQ(hash_tag("plain"), "plain");
}

TEST(ClusterSlotTest, AllKeysOfOneLockShareASlot) {
  for (std::string_view k : {"a", "orders:42", "x}y", "{", "with space"}) {
    std::string lock = "lockwatch:{" + std::string(k) + "}";
    EXPECT_EQ(key_slot(lock), key_slot(lock + ":fence")) << k;
    EXPECT_EQ(key_slot(lock), key_slot(lock + ":rel")) << k;
    const std::string counter = "lockwatch:fence:{" + std::string(slot_tag(key_slot(lock))) + "}";
    EXPECT_EQ(key_slot(lock), key_slot(counter)) << k;
  }
}

TEST(ClusterSlotTest, EverySlotHasAShortTagOfItsOwn) {
  const std::string_view alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  for (int slot = 0; slot < kClusterSlots; ++slot) {
    const std::string_view tag = slot_tag(static_cast<std::uint16_t>(slot));
    ASSERT_GE(tag.size(), 1u) << slot;
    ASSERT_LE(tag.size(), 3u) << slot;
    EXPECT_EQ(tag.find_first_not_of(alphabet), std::string_view::npos) << slot;
    ASSERT_EQ(key_slot(tag), slot) << tag;
    ASSERT_EQ(key_slot("lockwatch:fence:{" + std::string(tag) + "}"), slot) << tag;
  }
}

// The tags name the fencing counters in Redis: another rule would start
// new counters from zero after an upgrade, and tokens would go back. These
// values pin the rule (the first, among the shortest strings over 0-9a-zA-Z
// in that order, that lands in the slot), "06S" as Redis's own test suite
// uses it for slot 0.
TEST(ClusterSlotTest, TheTagRuleNeverChanges) {
  EXPECT_EQ(slot_tag(0), "06S");
  EXPECT_EQ(slot_tag(1), "Qi");
  EXPECT_EQ(slot_tag(13907), "0");
  EXPECT_EQ(slot_tag(12182), "9Le");
  EXPECT_EQ(slot_tag(16383), "6ZJ");
  // FNV-1a (64 bits) of every tag in slot order, each ended by '\n'.
  std::uint64_t h = 0xcbf29ce484222325ull;
  std::size_t chars = 0;
  for (int slot = 0; slot < kClusterSlots; ++slot) {
    std::string line(slot_tag(static_cast<std::uint16_t>(slot)));
    chars += line.size();
    line.push_back('\n');
    for (unsigned char c : line) h = (h ^ c) * 0x100000001b3ull;
  }
  EXPECT_EQ(chars, 45580u);
  EXPECT_EQ(h, 0x5d3648f5941e0973ull);
}

// A batch split for one script call per slot: every item in one group,
// the groups by slot, each keeping the batch's order within its slot.
TEST(ClusterSlotTest, ABatchIsGroupedBySlotKeepingItsOrderWithinASlot) {
  const std::vector<std::uint16_t> slots{5, 3, 5, 16383, 3, 5, 0};
  const auto groups = group_by_slot(slots);
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].slot, 0);
  EXPECT_EQ(groups[0].at, (std::vector<std::size_t>{6}));
  EXPECT_EQ(groups[1].slot, 3);
  EXPECT_EQ(groups[1].at, (std::vector<std::size_t>{1, 4}));
  EXPECT_EQ(groups[2].slot, 5);
  EXPECT_EQ(groups[2].at, (std::vector<std::size_t>{0, 2, 5}));
  EXPECT_EQ(groups[3].slot, 16383);
  EXPECT_EQ(groups[3].at, (std::vector<std::size_t>{3}));
  EXPECT_TRUE(group_by_slot({}).empty());
  const std::vector<std::uint16_t> one{42};
  ASSERT_EQ(group_by_slot(one).size(), 1u);
  EXPECT_EQ(group_by_slot(one)[0].at, (std::vector<std::size_t>{0}));
}

TEST(ClusterSlotTest, SlotsStayInRange) {
  for (int i = 0; i < 10000; ++i) EXPECT_LT(key_slot("k" + std::to_string(i)), kClusterSlots);
}

}  // namespace
}  // namespace lockwatch::detail
