// lib/store/redis/redis_kinds.hpp: the Redis stores in the registry.
//
//   kRedisStore         redis[s]://h:p          one master (RedisNodeStore)
//                       redis[s]://..,redis..   Redlock: a QuorumStore over one
//                                               RedisNodeStore per master
//                       redis[s]-sentinel://    a master found through Sentinel
//   kRedisClusterStore  redis[s]-cluster://     a Redis Cluster (ClusterStore)
//
// Their settings and how their URLs look: redis_kinds.cpp.
#pragma once

#include "store/registry.hpp"

namespace lockwatch::detail {

extern const StoreKind kRedisStore;
extern const StoreKind kRedisClusterStore;

}  // namespace lockwatch::detail
