// lib/store/postgresql/pg_target.hpp: where a PostgreSQL lock store lives,
// parsed from its URL.
//
//   postgresql://user[:password]@host[:port]/database[?param=value&...]
//   postgres://...                      (the same)
//
// Port 5432 by default; host may be a name (looked up off the loop), an
// IPv4 address or a bracketed IPv6 one. Credentials and values may be
// %-escaped. Parameters:
//   table=name        the lock table (lockwatch_locks by default): 1 to 63
//                     letters, digits or '_', not starting with a digit
//   host=/dir         a unix socket directory instead of TCP (the URL's
//                     host is then only a name for messages)
//   sslmode=...       disable, allow, prefer (libpq's default), require,
//                     verify-ca or verify-full
//   sslrootcert=, sslcert=, sslkey=, sslcrl=
//                     files, as libpq reads them (absolute paths)
// Anything else is refused, so that a typo is not silently ignored.
//
// Value type; any thread.
#pragma once

#include <string>

#include "core/url.hpp"

namespace lockwatch::detail {

// The URL's parts (its host a name, or a numeric address without
// brackets; its port 5432 when none is given; its parameters read).
struct PgTarget : DatabaseUrl {
  std::string socket_dir = {};  // non-empty: a unix socket in this directory instead of TCP
  std::string table = "lockwatch_locks";
  std::string sslmode = {};  // empty: libpq's default (prefer)
  std::string sslrootcert = {}, sslcert = {}, sslkey = {}, sslcrl = {};

  // Throws InvalidArgument naming what is wrong (never showing the password).
  static PgTarget parse(const std::string& url);
  // "postgresql://host:port/database" (or with ?host=), for messages:
  // never the credentials.
  std::string name() const;
  // The channel release notices go out on: derived from the table's name,
  // at most 63 bytes (PostgreSQL's identifier length), letters, digits
  // and '_' only.
  std::string channel() const;
  // The table of shared, permit and fair holders, writers' marks and fair
  // waiters beside the lock table: "<table>_holders", or for a long name
  // its start and a hash, at most 63 bytes.
  std::string holders_table() const;
};

}  // namespace lockwatch::detail
