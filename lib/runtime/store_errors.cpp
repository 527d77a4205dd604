#include "runtime/store_errors.hpp"

#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

std::exception_ptr to_exception(const StoreError& e) {
  using Kind = StoreError::Kind;
  switch (e.kind) {
    case Kind::kUnavailable:
      return std::make_exception_ptr(ConnectionError(e.endpoint, e.message, e.code));
    case Kind::kAuth:
      return std::make_exception_ptr(AuthError(e.endpoint, e.message, e.code));
    case Kind::kInvalid:
      return std::make_exception_ptr(InvalidArgument(e.message));
    case Kind::kRefused:
    case Kind::kRetryLater:
    case Kind::kRedirect:
      break;
  }
  return std::make_exception_ptr(StoreRefused(e.endpoint, e.code, e.message, e.describe()));
}

}  // namespace lockwatch::detail
