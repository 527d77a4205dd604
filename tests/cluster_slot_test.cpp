// Redis Cluster slot math: CRC16/XMODEM and the hash-tag rule, against
// values the Redis cluster specification and documentation give. The same
// function is checked against a real node's CLUSTER KEYSLOT in cluster_test.
#include <gtest/gtest.h>

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
  }
}

TEST(ClusterSlotTest, SlotsStayInRange) {
  for (int i = 0; i < 10000; ++i) EXPECT_LT(key_slot("k" + std::to_string(i)), kClusterSlots);
}

}  // namespace
}  // namespace lockwatch::detail
