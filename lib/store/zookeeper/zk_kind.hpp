// lib/store/zookeeper/zk_kind.hpp: zookeeper:// in the registry (the
// `zookeeper` feature). Its settings: the URL's members, chroot and digest
// credentials (ZkTarget), and Options::key_prefix, which must leave room
// for a key in a 255-byte lock name; min_replicas is refused (a majority
// of the ensemble commits every write).
#pragma once

#include "store/registry.hpp"

namespace lockwatch::detail {

extern const StoreKind kZooKeeperStore;

}  // namespace lockwatch::detail
