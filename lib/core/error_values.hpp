// lib/core/error_values.hpp: the text of an exception_ptr without letting
// anything escape (its code: detail::code_of, lockwatch/errors.hpp). Inside the library a store's failure is a StoreError
// (store/store_error.hpp), decided by kind, never by this text.
#pragma once

#include <exception>
#include <string>

#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

inline std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace lockwatch::detail
