#include "store/store_error.hpp"
#include "store/capabilities.hpp"

#include "lockwatch/errors.hpp"

#include <fmt/format.h>

#include <charconv>

namespace lockwatch::detail {

namespace {

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
