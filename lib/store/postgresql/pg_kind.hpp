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

// The registry's entry: the kind, defined when the build has the feature;
// without it, a kind whose URLs fail with Unsupported naming the feature.
#if LOCKWATCH_WITH_POSTGRESQL
extern const StoreKind kPostgresStore;
inline constexpr const StoreKind* kPostgresKind = &kPostgresStore;
#else
inline constexpr StoreKind kPostgresMissing =
    missing_store(kPostgresSchemes, kPostgresUsage, "'postgresql' (libpq >= 14)");
inline constexpr const StoreKind* kPostgresKind = &kPostgresMissing;
#endif

}  // namespace lockwatch::detail
