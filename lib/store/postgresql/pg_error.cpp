#include "store/postgresql/pg_error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

namespace lockwatch::detail {

namespace {

bool is_code_char(char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z'); }

constexpr int kSqlstateBase = 36;
constexpr std::size_t kSqlstateLength = 5;

// The characters of a packed SQLSTATE; "" for a value no SQLSTATE packs to.
std::string unpack_sqlstate(int value) {
  char digits[16];
  std::string out(digits, std::to_chars(digits, digits + sizeof digits, value, kSqlstateBase).ptr);
  if (value <= 0 || out.size() > kSqlstateLength) return {};
  for (char& c : out)
    if (c >= 'a') c = static_cast<char>(c - 'a' + 'A');  // to_chars writes lower-case letters
  return std::string(kSqlstateLength - out.size(), '0') + out;
}

std::string sqlstate_text(int value) {
  std::string sqlstate = unpack_sqlstate(value);
  return sqlstate.empty() ? fmt::format("not a SQLSTATE ({})", value) : sqlstate;
}

bool in_class(std::string_view sqlstate, std::string_view cls) { return sqlstate.substr(0, 2) == cls; }

}  // namespace

const StoreCategory& postgresql_category() noexcept {
  // Its codes are pg_code()'s, each a SQLSTATE.
  static const StoreCategory category("lockwatch.postgresql", sqlstate_text, "{0} answered error {2}: {3}");
  return category;
}

std::error_code pg_code(std::string_view sqlstate) noexcept {
  if (sqlstate.size() != kSqlstateLength || !std::all_of(sqlstate.begin(), sqlstate.end(), is_code_char)) return {};
  int value = 0;
  std::from_chars(sqlstate.data(), sqlstate.data() + sqlstate.size(), value, kSqlstateBase);
  return value == 0 ? std::error_code() : std::error_code(value, postgresql_category());
}

std::string pg_sqlstate(const std::error_code& code) {
  return code.category() == postgresql_category() ? unpack_sqlstate(code.value()) : std::string();
}

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
  return {kind, std::move(endpoint), pg_code(sqlstate), std::move(message)};
}

StoreError pg_connect_error(std::string endpoint, std::string_view sqlstate, std::string message) {
  using Kind = StoreError::Kind;
  // 28000 (no pg_hba.conf entry, refused), 28P01 (wrong password), 42501
  // (no CONNECT privilege on the database).
  Kind kind = in_class(sqlstate, "28") || sqlstate == "42501" ? Kind::kAuth : Kind::kUnavailable;
  return {kind, std::move(endpoint), pg_code(sqlstate), std::move(message)};
}

std::string_view sqlstate_in_verbose_message(std::string_view message) {
  // "<SEVERITY>:  <SQLSTATE>: <primary message>": a five-character code
  // between ":  " and ": ".
  for (std::size_t at = message.find(":  "); at != std::string_view::npos; at = message.find(":  ", at + 1)) {
    std::string_view code = message.substr(at + 3, 5);
    if (code.size() == 5 && message.substr(at + 8, 2) == ": " && std::all_of(code.begin(), code.end(), is_code_char))
      return code;
  }
  return {};
}

}  // namespace lockwatch::detail
