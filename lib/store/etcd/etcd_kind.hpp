// lib/store/etcd/etcd_kind.hpp: etcd:// in the registry (the `etcd`
// feature). Its settings: the URL's members and credentials (EtcdTarget),
// Options::key_prefix, connect_timeout (authentication) and
// command_timeout (every call); min_replicas is refused (a write is
// committed by a majority of the members before it is answered).
#pragma once

#include "store/registry.hpp"

namespace lockwatch::detail {

extern const StoreKind kEtcdStore;

}  // namespace lockwatch::detail
