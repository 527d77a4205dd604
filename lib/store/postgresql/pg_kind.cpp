#include "store/postgresql/pg_kind.hpp"

#include "store/postgresql/pg_store.hpp"

namespace lockwatch::detail {

constinit const StoreKind kPostgresStore =
    sqlcommon::sql_store_kind<PgStore, PgTarget>(kPostgresSchemes, kPostgresUsage);

}  // namespace lockwatch::detail
