#include "store/store_error.hpp"
#include "core/whole_number.hpp"
#include "store/capabilities.hpp"

#include "lockwatch/errors.hpp"

#include <fmt/format.h>

#include <iterator>


namespace lockwatch::detail {

namespace {

// A Redis node is named "host:port"; other stores name themselves with
// their scheme ("mysql://host:port/db").
std::string shown_endpoint(const std::string& endpoint) {
  return endpoint.find("://") == std::string::npos ? "redis " + endpoint : endpoint;
}

// How much a node's failure says: a refusal or refused credentials say
// what is wrong, a "not now" or a redirect less, an unreachable node least.
// By StoreError::Kind: kUnavailable, kAuth, kRefused, kRedirect, kRetryLater, kInvalid.
constexpr int kWeight[] = {0, 4, 3, 1, 2, 3};
static_assert(std::size(kWeight) == static_cast<std::size_t>(StoreError::Kind::kInvalid) + 1);
int weight(const StoreError& e) { return kWeight[static_cast<std::size_t>(e.kind)]; }

}  // namespace

std::string StoreCategory::refusal(std::string_view endpoint, int code, std::string_view message) const {
  return fmt::format(fmt::runtime(refusal_), endpoint, code, meaning_(code), message);
}

// The wording of the public errors' what() (core/errors.cpp), which tests
// and users' logs have always read; store_errors_test checks they agree.
std::string StoreError::describe() const {
  switch (kind) {
    case Kind::kUnavailable:
    case Kind::kAuth:
      return fmt::format("{}: {}", shown_endpoint(endpoint), message);
    case Kind::kInvalid:
      return message;
    case Kind::kRefused:
    case Kind::kRedirect:
    case Kind::kRetryLater:
      break;
  }
  // The backends' categories are StoreCategories, and only they are named
  // "lockwatch.<backend>".
  if (code && std::string_view(code.category().name()).starts_with("lockwatch."))
    return static_cast<const StoreCategory&>(code.category()).refusal(endpoint, code.value(), message);
  return fmt::format("{} answered an error: {}", shown_endpoint(endpoint), message);
}

void keep_most_telling(std::unique_ptr<StoreError>& kept, const StoreError& e) {
  if (!kept)
    kept = std::make_unique<StoreError>(e);
  else if (weight(e) > weight(*kept))
    *kept = e;
}

bool parse_owner_record(std::string_view text, HolderInfo& out) {
  const auto space = text.find(' ');
  if (space == std::string_view::npos || space == 0) return false;
  const auto ms = whole_number<std::int64_t>(text.substr(0, space));
  const bool timed = ms && *ms >= 0;
  // "-": the time was not to be had (an ACL without TIME), the name was.
  if (!timed && text.substr(0, space) != "-") return false;
  if (timed) out.since = std::chrono::system_clock::time_point(std::chrono::milliseconds(*ms));
  out.owner_name.assign(text.substr(space + 1));
  return timed;
}

[[noreturn]] void throw_unsupported(std::string_view store_kind, std::string_view what) {
  throw Unsupported(std::string(store_kind) + " offers no " + std::string(what));
}

}  // namespace lockwatch::detail
