// lib/store/etcd/etcd_kind.hpp: etcd:// in the registry (the `etcd`
// feature). Its settings: the URL's members and credentials (EtcdTarget),
// Options::runtime.key_prefix, connect_timeout (authentication) and
// command_timeout (every call); min_replicas is refused (a write is
// committed by a majority of the members before it is answered).
#pragma once

#include <string_view>

#include "store/registry.hpp"

namespace lockwatch::detail {

// Its schemes and their usage, the same with or without the feature.
inline constexpr std::string_view kEtcdSchemes = "etcd etcds";
inline constexpr std::string_view kEtcdUsage = "etcd://[user:password@]host:port[,host:port...] (etcds:// over TLS)";

// The registry's entry: the kind, or, in a build without the feature, one
// whose URLs fail with Unsupported naming it (etcd_missing.cpp).
extern const StoreKind kEtcdStore;

}  // namespace lockwatch::detail
