#include "store/postgresql/pg_error.hpp"

namespace lockwatch::detail {

namespace {

bool is_code_char(char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z'); }

bool in_class(std::string_view sqlstate, std::string_view cls) { return sqlstate.substr(0, 2) == cls; }

StoreError make(StoreError::Kind kind, std::string endpoint, std::string_view sqlstate, std::string message) {
  StoreError e;
  e.kind = kind;
  e.origin = StoreError::Origin::kPostgres;
  e.endpoint = std::move(endpoint);
  e.code = std::string(sqlstate);
  e.message = std::move(message);
  return e;
}

}  // namespace

StoreError pg_statement_error(std::string endpoint, std::string_view sqlstate, std::string message) {
  using Kind = StoreError::Kind;
  Kind kind = Kind::kRefused;
  if (sqlstate.empty()) {
    kind = Kind::kUnavailable;  // libpq's own error: the connection failed, not the statement
  } else if (sqlstate == "40001" || sqlstate == "40P01" || sqlstate == "55P03" || sqlstate == "57014") {
    kind = Kind::kRetryLater;  // serialization failure, deadlock, lock_timeout, statement_timeout
  } else if (in_class(sqlstate, "28")) {
    kind = Kind::kAuth;
  } else if (in_class(sqlstate, "08") || sqlstate == "57P01" || sqlstate == "57P02" || sqlstate == "57P03") {
    kind = Kind::kUnavailable;  // connection exceptions, the server shutting down or starting
  }
  return make(kind, std::move(endpoint), sqlstate, std::move(message));
}

StoreError pg_connect_error(std::string endpoint, std::string_view sqlstate, std::string message) {
  using Kind = StoreError::Kind;
  // 28000 (no pg_hba.conf entry, refused), 28P01 (wrong password), 42501
  // (no CONNECT privilege on the database).
  Kind kind = in_class(sqlstate, "28") || sqlstate == "42501" ? Kind::kAuth : Kind::kUnavailable;
  return make(kind, std::move(endpoint), sqlstate, std::move(message));
}

std::string_view sqlstate_in_verbose_message(std::string_view message) {
  // "<SEVERITY>:  <SQLSTATE>: <primary message>": a five-character code
  // between ":  " and ": ".
  for (std::size_t at = message.find(":  "); at != std::string_view::npos; at = message.find(":  ", at + 1)) {
    std::string_view code = message.substr(at + 3, 5);
    if (code.size() == 5 && message.substr(at + 8, 2) == ": ") {
      bool ok = true;
      for (char c : code) ok = ok && is_code_char(c);
      if (ok) return code;
    }
  }
  return {};
}

}  // namespace lockwatch::detail
