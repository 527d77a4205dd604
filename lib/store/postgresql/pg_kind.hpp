// lib/store/postgresql/pg_kind.hpp: postgresql:// and postgres:// in the
// registry (the `postgresql` feature). Its settings: the URL's database,
// table, socket directory and libpq's TLS parameters (PgTarget), and
// Options::runtime.key_prefix, which must leave room for a key in the 255-byte
// lock_name; min_replicas is refused (the database's own settings decide
// durability).
#pragma once

#include "store/registry.hpp"

namespace lockwatch::detail {

extern const StoreKind kPostgresStore;

}  // namespace lockwatch::detail
