// lib/store/sql/sql_target.hpp: where a SQL lock store lives, parsed from
// its URL.
//
//   mysql://user:password@host[:port]/database[?socket=/path][&table=name]
//
// MariaDB or MySQL; port 3306 by default. With `socket`, the client talks
// over that unix socket (the host is then "localhost" by convention).
// `table` names the lock table, lockwatch_locks by default. Credentials may
// be %-escaped. Value type; any thread.
#pragma once

#include <string>

#include "core/url.hpp"

namespace lockwatch::detail {

// The URL's parts (its port 3306 when none is given; its parameters read).
struct SqlTarget : DatabaseUrl {
  std::string socket = {};  // non-empty: a unix socket instead of TCP
  std::string table = "lockwatch_locks";

  // Throws InvalidArgument naming what is wrong (never showing the password).
  static SqlTarget parse(const std::string& url);
  // "mysql://host:port/database" (or with ?socket=), for messages: never
  // the credentials.
  std::string name() const;
};

}  // namespace lockwatch::detail
