// lib/store/sql/sql_kind.hpp: mysql:// in the registry (the `sql`
// feature). Its settings: the URL's database, socket and table
// (SqlTarget), and Options::runtime.key_prefix, which must leave room for a key in
// the 255-byte lock_name; min_replicas is refused (the database's own
// replication decides durability).
#pragma once

#include <string_view>

#include "store/registry.hpp"

namespace lockwatch::detail {

// Its schemes and their usage, the same with or without the feature.
inline constexpr std::string_view kSqlSchemes = "mysql";
inline constexpr std::string_view kSqlUsage = "mysql://user:password@host[:port]/database[?socket=/path&table=name]";

// The registry's entry (sql_store.cpp): the kind, or, in a build without
// the feature, one whose URLs fail with Unsupported naming it
// (sql_missing.cpp).
extern const StoreKind kSqlStore;

}  // namespace lockwatch::detail
