// lib/store/store_error.hpp: what a store reports when a call failed, as a
// value the runtime decides on by kind, never by its text. Classified once
// where the failure is read, by the backend's own classifier, with the
// server's code as a std::error_code of that backend's StoreCategory (in its
// folder); how the kinds become the public errors: docs/reference.md
// ("Errors") and runtime/store_errors.hpp. This header names no backend.
//
// Threading: a plain value. Costs: nothing on a success path (callbacks
// take a pointer, null on success, or hold an empty one whose strings do
// not allocate); a failure costs its strings.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace lockwatch::detail {

// A backend's error category, as data: name() is "lockwatch.<backend>"
// (describe() finds it by that name); message() says what a code means
// (`meaning`); refusal() words a refused request the way that backend's
// errors read, by the fmt pattern `refusal` of {0} the endpoint, {1} the
// code, {2} its meaning and {3} the server's text ("{0} answered error
// {1}: {3}": "<endpoint> answered error 1406: ...").
class StoreCategory final : public std::error_category {
 public:
  using Meaning = std::string (*)(int code);
  constexpr StoreCategory(const char* name, Meaning meaning, const char* refusal) noexcept
      : name_(name), meaning_(meaning), refusal_(refusal) {}
  const char* name() const noexcept override { return name_; }
  std::string message(int code) const override { return meaning_(code); }
  std::string refusal(std::string_view endpoint, int code, std::string_view message) const;

 private:
  const char* name_;
  Meaning meaning_;
  const char* refusal_;
};

struct StoreError {
  enum class Kind : std::uint8_t {
    kUnavailable,  // no answer could be had: connect, reset, timeout, closed, no node for the slot
    kAuth,         // the credentials were refused, or a command by the user's ACL (NOPERM)
    kRefused,      // the server answered the command with an error
    kRedirect,     // Redis Cluster: MOVED or ASK (store/redis/redis_error.hpp reads where to)
    kRetryLater,   // "not now": TRYAGAIN, CLUSTERDOWN, LOADING, MASTERDOWN; a deadlock, a lock wait timeout
    kInvalid,      // the request cannot be made (bad input)
  };
  Kind kind = Kind::kUnavailable;
  std::string endpoint;     // the server ("host:port", "mysql://host:port/db", "quorum")
  std::error_code code;     // the server's code, of its backend's StoreCategory: Redis's reply prefix (WRONGTYPE),
                            // MariaDB's error number (1406), PostgreSQL's SQLSTATE (22001), ZooKeeper's return
                            // code (-110), etcd's gRPC status; empty when the server gave none
  std::string message;      // the server's own text (Redis: its whole error line) or why no answer could be had

  // The text users have always read for it (what() of the public error it
  // maps to): "redis h:p answered an error: ...", "redis h:p: connection
  // lost: ...", "mysql://h:p/db answered error 1406: ..." (a refusal is
  // worded by its code's StoreCategory).
  std::string describe() const;

  bool unavailable() const noexcept { return kind == Kind::kUnavailable; }
  bool redirect() const noexcept { return kind == Kind::kRedirect; }
  // What a waiter rides out, keeping its place until its wait runs out.
  bool transient() const noexcept { return kind == Kind::kUnavailable || kind == Kind::kRetryLater; }

  // `code` is the server's, when it gave one. Refused with no code: a reply
  // the protocol did not expect (e.g. a script answering a wrong shape).
  static StoreError unavailable(std::string endpoint, std::string why, std::error_code code = {}) {
    return {Kind::kUnavailable, std::move(endpoint), code, std::move(why)};
  }
  static StoreError auth(std::string endpoint, std::string why, std::error_code code = {}) {
    return {Kind::kAuth, std::move(endpoint), code, std::move(why)};
  }
  static StoreError refused(std::string endpoint, std::string message, std::error_code code = {}) {
    return {Kind::kRefused, std::move(endpoint), code, std::move(message)};
  }
  static StoreError invalid(std::string endpoint, std::string why, std::error_code code = {}) {
    return {Kind::kInvalid, std::move(endpoint), code, std::move(why)};
  }
};

}  // namespace lockwatch::detail
