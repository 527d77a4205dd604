// lib/store/sql/sql_error.hpp: MariaDB/MySQL error numbers as StoreError values.
#pragma once

#include <string>

#include "store/store_error.hpp"

namespace lockwatch::detail {

// A MariaDB/MySQL error number, classified: 1213 (deadlock) and 1205 (lock
// wait timeout) as kRetryLater; 1044, 1045, 1698 (access denied) as kAuth;
// 2002, 2003, 2006, 2013 (no connection, gone away, lost) as kUnavailable;
// others kRefused, the number as `code`.
StoreError sql_error(std::string endpoint, unsigned number, std::string message);

}  // namespace lockwatch::detail
