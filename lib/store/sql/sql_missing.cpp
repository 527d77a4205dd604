// mysql:// in a build without the `sql` feature: its URLs fail naming it.
#include "store/sql/sql_kind.hpp"
namespace lockwatch::detail {
constinit const StoreKind kSqlStore = missing_store(kSqlSchemes, kSqlUsage, "'sql' (libmariadb)");
}  // namespace lockwatch::detail
