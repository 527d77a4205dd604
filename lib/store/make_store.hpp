// lib/store/make_store.hpp: the store a URL names.
//
//   redis://...                      RedisNodeStore (one master)
//   redis://...,redis://...          QuorumStore over one RedisNodeStore each (Redlock)
//   redis-sentinel://.../name        RedisNodeStore following the master through Sentinel
//   redis-cluster://h:p[,h:p...]     ClusterStore (a RedisNodeStore per master, routed by slot)
//   rediss://, rediss-sentinel://,   the same over TLS
//   rediss-cluster://
//   mysql://user:password@host/db    SqlStore (a lock table)
//   postgresql://user@host/db        PgStore (a lock table; postgres:// too; the Meson feature postgresql)
//   memory://[name]                  MemoryStore (this process's memory, shared by name)
//
// A new store is one more line here; nothing else in the runtime changes.
#pragma once

#include <memory>

#include "lockwatch/options.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class Loop;

// Any thread. Throws InvalidArgument if the URL's scheme is unknown, the
// URL is malformed, or the options do not suit that store.
void check_store_options(const Options& options);

// Any thread; the store's connections start on the loop with start().
std::unique_ptr<LockStore> make_store(Loop& loop, const Options& options);

}  // namespace lockwatch::detail
