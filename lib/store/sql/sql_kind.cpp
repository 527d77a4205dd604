#include "store/sql/sql_kind.hpp"

#include "store/sql/sql_store.hpp"
#include "store/sql/sql_target.hpp"

namespace lockwatch::detail {

namespace {

void check_sql(const std::string& url, const Options& options) {
  (void)SqlTarget::parse(url);
  SqlStore::check_prefix(sqlcommon::sql_settings(options), "SQL");
}

}  // namespace

constinit const StoreKind kSqlStore{
    kSqlSchemes, kSqlUsage, check_sql,
    [](Loop& loop, const std::string& url, const Options& options) -> std::unique_ptr<LockStore> {
      return std::make_unique<SqlStore>(loop, SqlTarget::parse(url), sqlcommon::sql_settings(options));
    }};

}  // namespace lockwatch::detail
