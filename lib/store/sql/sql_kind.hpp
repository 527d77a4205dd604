// lib/store/sql/sql_kind.hpp: mysql:// in the registry (the `sql`
// feature). Its settings: the URL's database, socket and table
// (SqlTarget), and Options::runtime.key_prefix, which must leave room for a key in
// the 255-byte lock_name; min_replicas is refused (the database's own
// replication decides durability).
#pragma once

#include "store/registry.hpp"

namespace lockwatch::detail {

extern const StoreKind kSqlStore;

}  // namespace lockwatch::detail
