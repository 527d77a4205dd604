#include "store/sql/sql_error.hpp"

namespace lockwatch::detail {

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
  StoreError e = StoreError::refused(std::move(endpoint), std::move(message), StoreError::Origin::kSql);
  e.kind = kind;
  e.code = std::to_string(number);
  return e;
}

}  // namespace lockwatch::detail
