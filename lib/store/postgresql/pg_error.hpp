// lib/store/postgresql/pg_error.hpp: PostgreSQL's SQLSTATEs as StoreErrors.
//
// Classified by the code alone, never by the message: a serialization
// failure, a deadlock, a lock wait past lock_timeout or a statement past
// statement_timeout is "retry later"; a refused login (class 28, or no
// CONNECT privilege) is auth; a connection exception (class 08) or a
// server shutting down (57P01-57P03) is unavailable; anything else the
// server refused. The SQLSTATE travels as the error's `code`.
//
// Threading: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "store/store_error.hpp"

namespace lockwatch::detail {

// A statement's error result (no SQLSTATE: libpq's own, the connection
// failed: unavailable).
StoreError pg_statement_error(std::string endpoint, std::string_view sqlstate, std::string message);
// A failed connection attempt: auth, or unavailable (an unknown database,
// too many connections, no server, a TLS failure).
StoreError pg_connect_error(std::string endpoint, std::string_view sqlstate, std::string message);

// The SQLSTATE in a message libpq formatted with PQERRORS_VERBOSE
// ("...FATAL:  28P01: password authentication failed..."): libpq keeps the
// code of a failed connection attempt nowhere else. Empty when there is
// none (a refused TCP connection, a TLS failure: libpq's own errors).
std::string_view sqlstate_in_verbose_message(std::string_view message);

}  // namespace lockwatch::detail
