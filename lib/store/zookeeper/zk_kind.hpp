// lib/store/zookeeper/zk_kind.hpp: zookeeper:// in the registry (the
// `zookeeper` feature). Its settings: the URL's members, chroot and digest
// credentials (ZkTarget), and Options::runtime.key_prefix, which must leave room
// for a key in a 255-byte lock name; min_replicas is refused (a majority
// of the ensemble commits every write).
#pragma once

#include <string_view>

#include "store/registry.hpp"

namespace lockwatch::detail {

// Its schemes and their usage, the same with or without the feature.
inline constexpr std::string_view kZooKeeperSchemes = "zookeeper";
inline constexpr std::string_view kZooKeeperUsage = "zookeeper://[user:password@]host:port[,host:port...][/chroot]";

// The registry's entry: the kind, or, in a build without the feature, one
// whose URLs fail with Unsupported naming it (zk_missing.cpp).
extern const StoreKind kZooKeeperStore;

}  // namespace lockwatch::detail
