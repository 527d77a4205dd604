#include "store/store_error.hpp"
#include "store/capabilities.hpp"

#include "lockwatch/errors.hpp"

#include <fmt/format.h>

#include <charconv>

namespace lockwatch::detail {

namespace {

// The first word of a Redis error line: its code ("MOVED", "WRONGTYPE", "ERR").
std::string_view first_word(std::string_view message) { return message.substr(0, message.find(' ')); }

// "<slot> <host>:<port>" after MOVED or ASK; false when it is not that.
bool parse_redirect(std::string_view rest, StoreError& out) {
  auto space = rest.find(' ');
  if (space == std::string_view::npos || space == 0) return false;
  unsigned slot = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + space, slot);
  if (ec != std::errc() || end != rest.data() + space || slot >= 16384) return false;
  std::string_view hp = rest.substr(space + 1);
  auto colon = hp.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == hp.size()) return false;
  int port = 0;
  for (char c : hp.substr(colon + 1)) {
    if (c < '0' || c > '9') return false;
    port = port * 10 + (c - '0');
    if (port > 65535) return false;
  }
  if (port == 0) return false;
  out.slot = static_cast<std::uint16_t>(slot);
  out.target_host = std::string(hp.substr(0, colon));
  out.target_port = port;
  return true;
}

// A command a script called, refused by the user's ACL: Redis answers ERR
// with these words (7.0: "The user executing the script can't run this
// command ...", "... can't access at least one of the keys ...", "...
// can't publish to the channel ..."; 7.2 on: "ACL failure in script: User
// u has no permissions to run the 'x' command"), where a command sent
// directly gets NOPERM.
bool script_acl_refusal(std::string_view text) {
  return text.starts_with("The user executing the script can't") || text.starts_with("ACL failure in script:");
}

StoreError make(StoreError::Kind kind, StoreError::Origin origin, std::string endpoint, std::string message) {
  StoreError e;
  e.kind = kind;
  e.origin = origin;
  e.endpoint = std::move(endpoint);
  e.message = std::move(message);
  return e;
}

}  // namespace

// The wording of the public errors' what() (core/errors.cpp), which tests
// and users' logs have always read; store_errors_test checks they agree.
std::string StoreError::describe() const {
  switch (kind) {
    case Kind::kUnavailable:
    case Kind::kAuth:
      return endpoint.find("://") == std::string::npos ? fmt::format("redis {}: {}", endpoint, message)
                                                       : fmt::format("{}: {}", endpoint, message);
    case Kind::kInvalid:
      return message;
    case Kind::kRefused:
    case Kind::kRedirect:
    case Kind::kRetryLater:
      break;
  }
  if (origin == Origin::kEtcd) return fmt::format("{} answered {}: {}", endpoint, code, message);
  if (origin == Origin::kSql || origin == Origin::kPostgres || origin == Origin::kZooKeeper)
    return fmt::format("{} answered error {}: {}", endpoint, code.empty() ? "0" : code, message);
  return fmt::format("redis {} answered an error: {}", endpoint, message);
}

StoreError StoreError::unavailable(std::string endpoint, std::string why, Origin origin) {
  return make(Kind::kUnavailable, origin, std::move(endpoint), std::move(why));
}

StoreError StoreError::auth(std::string endpoint, std::string why, Origin origin) {
  return make(Kind::kAuth, origin, std::move(endpoint), std::move(why));
}

StoreError StoreError::refused(std::string endpoint, std::string message, Origin origin) {
  return make(Kind::kRefused, origin, std::move(endpoint), std::move(message));
}

StoreError StoreError::invalid(std::string endpoint, std::string why, Origin origin) {
  return make(Kind::kInvalid, origin, std::move(endpoint), std::move(why));
}

StoreError redis_reply_error(std::string endpoint, std::string_view message) {
  StoreError e = make(StoreError::Kind::kRefused, StoreError::Origin::kRedis, std::move(endpoint), std::string(message));
  const std::string_view code = first_word(message);
  e.code = std::string(code);
  if (code == "MOVED" || code == "ASK") {
    if (parse_redirect(message.substr(std::min(message.size(), code.size() + 1)), e)) {
      e.kind = StoreError::Kind::kRedirect;
      e.ask = code == "ASK";
    }
  } else if (code == "TRYAGAIN" || code == "CLUSTERDOWN" || code == "LOADING" || code == "MASTERDOWN") {
    e.kind = StoreError::Kind::kRetryLater;
  } else if (code == "NOAUTH" || code == "WRONGPASS" || code == "NOPERM" ||
             (code == "ERR" && script_acl_refusal(message.substr(std::min(message.size(), code.size() + 1))))) {
    e.kind = StoreError::Kind::kAuth;
  } else if (code == "LOCKWATCH-KIND") {
    // A key held as another kind of lock (or a semaphore of another n).
    e.kind = StoreError::Kind::kInvalid;
    e.message = std::string(message.substr(std::min(message.size(), code.size() + 1)));
  }
  return e;
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
  StoreError e = make(kind, StoreError::Origin::kSql, std::move(endpoint), std::move(message));
  e.code = std::to_string(number);
  return e;
}

bool parse_owner_record(std::string_view text, HolderInfo& out) {
  const auto space = text.find(' ');
  if (space == std::string_view::npos || space == 0) return false;
  if (text.substr(0, space) == "-") {  // the time was not to be had (an ACL without TIME)
    out.owner_name.assign(text.substr(space + 1));
    return false;
  }
  std::int64_t ms = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + space, ms);
  if (ec != std::errc() || p != text.data() + space || ms < 0) return false;
  out.since = std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
  out.owner_name.assign(text.substr(space + 1));
  return true;
}

[[noreturn]] void throw_unsupported(std::string_view store_kind, std::string_view what) {
  throw Unsupported(std::string(store_kind) + " offers no " + std::string(what));
}

}  // namespace lockwatch::detail
