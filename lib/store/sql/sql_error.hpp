// lib/store/sql/sql_error.hpp: MariaDB/MySQL error numbers as StoreError values.
//
// The number travels as the error's `code`, of the category
// "lockwatch.mariadb" (mariadb_category()): its value is the number, its
// message() the error's name where lockwatch knows it ("ER_DATA_TOO_LONG
// (1406)"), "MariaDB error <n>" otherwise. Threading: pure functions; the
// category is a constant.
#pragma once

#include <string>
#include <system_error>

#include "store/store_error.hpp"

namespace lockwatch::detail {

// The category of MariaDB/MySQL error numbers: name() "lockwatch.mariadb".
const StoreCategory& mariadb_category() noexcept;
// The error number `number` as a code of mariadb_category().
inline std::error_code mariadb_code(unsigned number) noexcept {
  return {static_cast<int>(number), mariadb_category()};
}

// A MariaDB/MySQL error number, classified: 1213 (deadlock) and 1205 (lock
// wait timeout) as kRetryLater; 1044, 1045, 1698 (access denied) as kAuth;
// 2002, 2003, 2006, 2013 (no connection, gone away, lost) as kUnavailable;
// others kRefused; the number as `code`.
StoreError sql_error(std::string endpoint, unsigned number, std::string message);

}  // namespace lockwatch::detail
