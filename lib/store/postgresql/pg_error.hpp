// lib/store/postgresql/pg_error.hpp: PostgreSQL's SQLSTATEs as StoreErrors.
//
// Classified by the code alone, never by the message: a serialization
// failure, a deadlock, a lock wait past lock_timeout or a statement past
// statement_timeout is "retry later"; a refused login (class 28, or no
// CONNECT privilege) is auth; a connection exception (class 08) or a
// server shutting down (57P01-57P03) is unavailable; anything else the
// server refused. The SQLSTATE travels as the error's `code`, of the
// category "lockwatch.postgresql" (postgresql_category()): its five
// characters (digits and capitals) packed into an int, base 36, and
// message() giving them back ("22001").
//
// Threading: pure functions; the category is a constant.
#pragma once

#include <string>
#include <string_view>
#include <system_error>

#include "store/store_error.hpp"

namespace lockwatch::detail {

// The category of SQLSTATEs: name() "lockwatch.postgresql".
const StoreCategory& postgresql_category() noexcept;
// `sqlstate` as a code of postgresql_category(); empty for anything but
// five digits or capitals (and for 00000, success).
std::error_code pg_code(std::string_view sqlstate) noexcept;
// The five characters of a code of postgresql_category() ("" for another).
std::string pg_sqlstate(const std::error_code& code);

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
