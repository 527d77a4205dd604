#include "lockwatch/errors.hpp"

#include <fmt/format.h>

namespace lockwatch {

const char* to_string(LostReason reason) noexcept {
  switch (reason) {
    case LostReason::kExpired: return "the key expired";
    case LostReason::kTakenByOther: return "the key was taken by another owner";
    case LostReason::kRenewalsExhausted: return "the renewals were exhausted";
    case LostReason::kRedisUnreachable: return "no renewal was confirmed before the local deadline";
    case LostReason::kRuntimeStopped: return "the runtime was stopped";
    case LostReason::kNotStarted: return "no pool worker was free to start the work";
  }
  return "unknown";
}

namespace {
// Keys may be huge or binary: messages show a bounded, printable excerpt.
std::string shown_key(const std::string& key) {
  std::string out;
  for (char c : key.substr(0, 64)) out.push_back((c >= 0x20 && c < 0x7f) ? c : '?');
  if (key.size() > 64) out += fmt::format("...({} bytes)", key.size());
  return out;
}
}  // namespace

LockNotAcquired::LockNotAcquired(std::string key, std::chrono::milliseconds waited)
    : Error(fmt::format("lock '{}' is held by another owner (waited {} ms)", shown_key(key), waited.count())),
      key_(std::move(key)),
      waited_(waited) {}

LockNotAcquired::LockNotAcquired(std::string key, std::chrono::milliseconds waited, std::string_view why)
    : Error(fmt::format("lock '{}' was not acquired within its wait of {} ms: {}", shown_key(key), waited.count(), why)),
      key_(std::move(key)),
      waited_(waited) {}

Cancelled::Cancelled(std::string key)
    : Error(fmt::format("waiting for lock '{}' was cancelled", shown_key(key))), key_(std::move(key)) {}

LeaseLost::LeaseLost(std::string key, LostReason reason, std::string detail)
    : Error(fmt::format("lease on '{}' lost: {}{}{}", shown_key(key), to_string(reason), detail.empty() ? "" : ": ",
                        detail)),
      key_(std::move(key)),
      reason_(reason) {}

// A Redis node is named "host:port"; other stores name themselves with
// their scheme ("mysql://host:port/db").
ConnectionError::ConnectionError(std::string endpoint, const std::string& what)
    : Error(endpoint.find("://") == std::string::npos ? fmt::format("redis {}: {}", endpoint, what)
                                                        : fmt::format("{}: {}", endpoint, what)),
      endpoint_(std::move(endpoint)) {}

ListenError::ListenError(std::string address, const std::string& why)
    : Error(fmt::format("cannot serve metrics on {}: {}", address, why)), address_(std::move(address)) {}

RedisError::RedisError(std::string endpoint, std::string redis_message)
    : Error(fmt::format("redis {} answered an error: {}", endpoint, redis_message)),
      endpoint_(std::move(endpoint)),
      redis_message_(std::move(redis_message)) {}

SqlError::SqlError(std::string endpoint, unsigned code, std::string server_message)
    : Error(fmt::format("{} answered error {}: {}", endpoint, code, server_message)),
      endpoint_(std::move(endpoint)),
      code_(code),
      server_message_(std::move(server_message)) {}

SqlError::SqlError(std::string endpoint, std::string sqlstate, std::string server_message)
    : Error(fmt::format("{} answered error {}: {}", endpoint, sqlstate, server_message)),
      endpoint_(std::move(endpoint)),
      sqlstate_(std::move(sqlstate)),
      server_message_(std::move(server_message)) {}

ZooKeeperError::ZooKeeperError(std::string endpoint, int code, std::string server_message)
    : Error(fmt::format("{} answered error {}: {}", endpoint, code, server_message)),
      endpoint_(std::move(endpoint)),
      code_(code),
      server_message_(std::move(server_message)) {}

EtcdError::EtcdError(std::string endpoint, std::string code, std::string server_message)
    : Error(fmt::format("{} answered {}: {}", endpoint, code, server_message)),
      endpoint_(std::move(endpoint)),
      code_(std::move(code)),
      server_message_(std::move(server_message)) {}

}  // namespace lockwatch
