// lib/runtime/store_errors.hpp: the one place a store's failure (a
// StoreError, decided by kind inside the library) becomes the public
// exception a user catches.
//
//   kUnavailable                     ConnectionError(endpoint, message, code)
//   kAuth                            AuthError(endpoint, message, code)
//   kRefused, kRetryLater, kRedirect StoreRefused(endpoint, code, message), whatever the store
//   kInvalid                         InvalidArgument(message)
//
// The code is the store's own (its backend's category); no backend is
// named here.
//
// Their what() reads as StoreError::describe(). Threading: any. Costs: one
// exception object per failure; nothing on a success path.
#pragma once

#include <exception>

#include "store/store_error.hpp"

namespace lockwatch::detail {

std::exception_ptr to_exception(const StoreError& error);

}  // namespace lockwatch::detail
