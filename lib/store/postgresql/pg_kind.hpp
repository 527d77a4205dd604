// lib/store/postgresql/pg_kind.hpp: postgresql:// and postgres:// in the
// registry (the `postgresql` feature). Its settings: the URL's database,
// table, socket directory and libpq's TLS parameters (PgTarget), and
// Options::runtime.key_prefix, which must leave room for a key in the 255-byte
// lock_name; min_replicas is refused (the database's own settings decide
// durability).
#pragma once

#include <string_view>

#include "store/registry.hpp"

namespace lockwatch::detail {

// Its schemes and their usage, the same with or without the feature.
inline constexpr std::string_view kPostgresSchemes = "postgresql postgres";
inline constexpr std::string_view kPostgresUsage =
    "postgresql://user[:password]@host[:port]/database[?table=name&sslmode=...] (or postgres://)";

// The registry's entry (pg_store.cpp): the kind, or, in a build without
// the feature, one whose URLs fail with Unsupported naming it
// (pg_missing.cpp).
extern const StoreKind kPostgresStore;

}  // namespace lockwatch::detail
