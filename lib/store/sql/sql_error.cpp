#include "store/sql/sql_error.hpp"

#include <fmt/format.h>

#include <string_view>

namespace lockwatch::detail {

namespace {

// The names of the numbers lockwatch decides on or users are likely to
// meet; the server's text says the rest.
std::string_view mariadb_error_name(int number) {
  switch (number) {
    case 1044: return "ER_DBACCESS_DENIED_ERROR";
    case 1045: return "ER_ACCESS_DENIED_ERROR";
    case 1046: return "ER_NO_DB_ERROR";
    case 1049: return "ER_BAD_DB_ERROR";
    case 1054: return "ER_BAD_FIELD_ERROR";
    case 1064: return "ER_PARSE_ERROR";
    case 1142: return "ER_TABLEACCESS_DENIED_ERROR";
    case 1146: return "ER_NO_SUCH_TABLE";
    case 1205: return "ER_LOCK_WAIT_TIMEOUT";
    case 1213: return "ER_LOCK_DEADLOCK";
    case 1406: return "ER_DATA_TOO_LONG";
    case 1698: return "ER_ACCESS_DENIED_NO_PASSWORD_ERROR";
    case 2002: return "CR_CONNECTION_ERROR";
    case 2003: return "CR_CONN_HOST_ERROR";
    case 2006: return "CR_SERVER_GONE_ERROR";
    case 2013: return "CR_SERVER_LOST";
    default: return {};
  }
}

class MariaDbCategory final : public StoreCategory {
 public:
  const char* name() const noexcept override { return "lockwatch.mariadb"; }
  std::string message(int number) const override {
    const std::string_view known = mariadb_error_name(number);
    return known.empty() ? fmt::format("MariaDB error {}", number) : fmt::format("{} ({})", known, number);
  }
  std::string refusal(std::string_view endpoint, int number, std::string_view message) const override {
    return fmt::format("{} answered error {}: {}", endpoint, number, message);
  }
};

}  // namespace

const StoreCategory& mariadb_category() noexcept {
  static const MariaDbCategory category;
  return category;
}

StoreError sql_error(std::string endpoint, unsigned number, std::string message) {
  using Kind = StoreError::Kind;
  Kind kind = Kind::kRefused;
  switch (number) {
    case 1205:  // ER_LOCK_WAIT_TIMEOUT
    case 1213:  // ER_LOCK_DEADLOCK
      kind = Kind::kRetryLater;
      break;
    case 1044:  // ER_DBACCESS_DENIED_ERROR
    case 1045:  // ER_ACCESS_DENIED_ERROR
    case 1698:  // ER_ACCESS_DENIED_NO_PASSWORD_ERROR
      kind = Kind::kAuth;
      break;
    case 2002:  // CR_CONNECTION_ERROR
    case 2003:  // CR_CONN_HOST_ERROR
    case 2006:  // CR_SERVER_GONE_ERROR
    case 2013:  // CR_SERVER_LOST
      kind = Kind::kUnavailable;
      break;
    default:
      break;
  }
  StoreError e = StoreError::refused(std::move(endpoint), std::move(message), mariadb_code(number));
  e.kind = kind;
  return e;
}

}  // namespace lockwatch::detail
