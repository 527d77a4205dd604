#include "lockwatch/errors.hpp"

#include <fmt/format.h>

#include <new>

namespace lockwatch {

const char* to_string(LostReason reason) noexcept {
  switch (reason) {
    case LostReason::kExpired: return "the key expired";
    case LostReason::kTakenByOther: return "the key was taken by another owner";
    case LostReason::kRenewalsExhausted: return "the renewals were exhausted";
    case LostReason::kStoreUnreachable: return "no renewal was confirmed before the local deadline";
    case LostReason::kRuntimeStopped: return "the runtime was stopped";
    case LostReason::kNotStarted: return "no pool worker was free to start the work";
    case LostReason::kRemoved:
      return "the key was removed before its ttl ran out (release --force, a delete, or a failover that lost it)";
  }
  return "unknown";
}

namespace {
class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "lockwatch"; }
  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::busy: return "the lock is held by another owner";
      case errc::lease_lost: return "the lease was lost";
      case errc::unreachable: return "the store could not be reached";
      case errc::refused_credentials: return "the store refused the credentials";
      case errc::invalid_argument: return "invalid argument";
      case errc::unsupported: return "not supported by the store";
      case errc::cancelled: return "cancelled";
      case errc::runtime_stopped: return "the runtime stopped";
      case errc::store_refused: return "the store answered an error";
      case errc::no_active_lease: return "no locked call is running";
      case errc::listen_failed: return "the metrics endpoint could not listen";
    }
    return "unknown lockwatch error";
  }
  // errc::cancelled is also what a cancelled operation means anywhere
  // (std::errc::operation_canceled), as Asio's operation_aborted is.
  std::error_condition default_error_condition(int value) const noexcept override {
    if (static_cast<errc>(value) == errc::cancelled) return std::errc::operation_canceled;
    return {value, *this};
  }
};
}  // namespace

const std::error_category& error_category() noexcept {
  static const Category category;
  return category;
}

std::error_code detail::code_of(std::exception_ptr e) noexcept {
  if (!e) return {};
  try {
    std::rethrow_exception(e);
  } catch (const Error& ex) {
    return ex.code();
  } catch (const std::bad_alloc&) {
    return std::make_error_code(std::errc::not_enough_memory);
  } catch (...) {
    return std::make_error_code(std::errc::state_not_recoverable);
  }
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
ConnectionError::ConnectionError(std::string endpoint, const std::string& what, std::error_code backend_code)
    : Error(endpoint.find("://") == std::string::npos ? fmt::format("redis {}: {}", endpoint, what)
                                                        : fmt::format("{}: {}", endpoint, what)),
      endpoint_(std::move(endpoint)),
      backend_code_(backend_code) {}

ListenError::ListenError(std::string address, const std::string& why)
    : Error(fmt::format("cannot serve metrics on {}: {}", address, why)), address_(std::move(address)) {}

StoreRefused::StoreRefused(std::string endpoint, std::error_code backend_code, std::string server_message,
                           const std::string& what)
    : Error(what),
      endpoint_(std::move(endpoint)),
      backend_code_(backend_code),
      server_message_(std::move(server_message)) {}

}  // namespace lockwatch
