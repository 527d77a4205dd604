// postgresql:// in a build without the `postgresql` feature: its URLs fail naming it.
#include "store/postgresql/pg_kind.hpp"
namespace lockwatch::detail {
constinit const StoreKind kPostgresStore =
    missing_store(kPostgresSchemes, kPostgresUsage, "'postgresql' (libpq >= 14)");
}  // namespace lockwatch::detail
