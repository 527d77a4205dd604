#include "store/postgresql/pg_kind.hpp"

#include "store/postgresql/pg_store.hpp"
#include "store/postgresql/pg_target.hpp"

namespace lockwatch::detail {

constinit const StoreKind kPostgresStore{
    kPostgresSchemes, kPostgresUsage,
    [](const std::string& url, const Options& options) {
      (void)PgTarget::parse(url);
      PgStore::check_prefix(sqlcommon::sql_settings(options), "PostgreSQL");
    },
    [](Loop& loop, const std::string& url, const Options& options) -> std::unique_ptr<LockStore> {
      return std::make_unique<PgStore>(loop, PgTarget::parse(url), sqlcommon::sql_settings(options));
    }};

}  // namespace lockwatch::detail
