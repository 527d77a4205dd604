#include "store/sql/sql_error.hpp"

#include <fmt/format.h>

#include <string_view>
#include <utility>

namespace lockwatch::detail {

namespace {

// A number's name, for the numbers lockwatch decides on or users are
// likely to meet; the server's text says the rest.
std::string error_text(int number) {
  static constexpr std::pair<int, std::string_view> kNames[] = {
      {1044, "ER_DBACCESS_DENIED_ERROR"}, {1045, "ER_ACCESS_DENIED_ERROR"}, {1046, "ER_NO_DB_ERROR"},
      {1049, "ER_BAD_DB_ERROR"}, {1054, "ER_BAD_FIELD_ERROR"}, {1064, "ER_PARSE_ERROR"},
      {1142, "ER_TABLEACCESS_DENIED_ERROR"}, {1146, "ER_NO_SUCH_TABLE"}, {1205, "ER_LOCK_WAIT_TIMEOUT"},
      {1213, "ER_LOCK_DEADLOCK"}, {1406, "ER_DATA_TOO_LONG"}, {1698, "ER_ACCESS_DENIED_NO_PASSWORD_ERROR"},
      {2002, "CR_CONNECTION_ERROR"}, {2003, "CR_CONN_HOST_ERROR"}, {2006, "CR_SERVER_GONE_ERROR"},
      {2013, "CR_SERVER_LOST"}};
  for (const auto& [n, name] : kNames)
    if (n == number) return fmt::format("{} ({})", name, number);
  return fmt::format("MariaDB error {}", number);
}

}  // namespace

const StoreCategory& mariadb_category() noexcept {
  static const StoreCategory category("lockwatch.mariadb", error_text, "{0} answered error {1}: {3}");
  return category;
}

StoreError sql_error(std::string endpoint, unsigned number, std::string message) {
  using Kind = StoreError::Kind;
  StoreError e = StoreError::refused(std::move(endpoint), std::move(message), mariadb_code(number));
  // A deadlock or a lock wait timeout; access denied; no connection, gone
  // away, lost (their names: error_text()).
  if (number == 1205 || number == 1213) e.kind = Kind::kRetryLater;
  if (number == 1044 || number == 1045 || number == 1698) e.kind = Kind::kAuth;
  if (number == 2002 || number == 2003 || number == 2006 || number == 2013) e.kind = Kind::kUnavailable;
  return e;
}

}  // namespace lockwatch::detail
