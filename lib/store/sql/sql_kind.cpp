#include "store/sql/sql_kind.hpp"

#include "store/sql/sql_store.hpp"

namespace lockwatch::detail {

constinit const StoreKind kSqlStore = sqlcommon::sql_store_kind<SqlStore, SqlTarget>(kSqlSchemes, kSqlUsage);

}  // namespace lockwatch::detail
