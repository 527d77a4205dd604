// lib/store/etcd/etcd_kind.hpp: etcd:// in the registry (the `etcd`
// feature). Its settings: the URL's members and credentials (EtcdTarget),
// Options::runtime.key_prefix, connect_timeout (authentication) and
// command_timeout (every call); min_replicas is refused (a write is
// committed by a majority of the members before it is answered).
#pragma once

#include <string_view>

#include "store/registry.hpp"

namespace lockwatch::detail {

// Its schemes and their usage: the registry's line for a build without the
// feature shows the same.
inline constexpr std::string_view kEtcdSchemes = "etcd etcds";
inline constexpr std::string_view kEtcdUsage = "etcd://[user:password@]host:port[,host:port...] (etcds:// over TLS)";

// Defined when the build has the feature.
extern const StoreKind kEtcdStore;

}  // namespace lockwatch::detail
