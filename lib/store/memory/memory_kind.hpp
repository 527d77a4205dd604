// lib/store/memory/memory_kind.hpp: memory://[name] in the registry. A
// space is this process's; the options for servers (TLS, replicas) have
// nothing to act on there, so a test may swap the URL alone.
#pragma once

#include "store/registry.hpp"

namespace lockwatch::detail {

extern const StoreKind kMemoryStore;

}  // namespace lockwatch::detail
