// lib/store/postgresql/pg_statements.hpp: the statements PgStore prepares
// (pg_statements.cpp; what each step does is in pg_store.hpp).
#pragma once

#include <string>
#include <vector>

#include "store/postgresql/pg_connection.hpp"

namespace lockwatch::detail {

// The statements, prepared on every command and renewal connection; `t`
// is the quoted lock table, `h` the quoted holders' table. A batch arrives
// as parallel arrays (names, owners, ttls in µs) unnested WITH ORDINALITY,
// so that an answer names the request by its position (1-based).
// `o`: this store's owner name as a bytea expression, recorded with each grant.
std::vector<PgStatement> pg_statements(const std::string& t, const std::string& h, const std::string& o);

}  // namespace lockwatch::detail
