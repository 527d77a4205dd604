// lib/core/error_values.hpp: looking into an exception_ptr without
// letting anything escape (errors travel inside the loop as values).
#pragma once

#include <exception>
#include <string>

#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

// A ConnectionError that is not an AuthError: the store may answer later.
inline bool is_connection_error(std::exception_ptr e) noexcept {
  try {
    std::rethrow_exception(e);
  } catch (const AuthError&) {
    return false;
  } catch (const ConnectionError&) {
    return true;
  } catch (...) {
    return false;
  }
}

// What a waiter rides out (keeping its place until its wait runs out): a
// connection error, or a Redis Cluster's "not now" (CLUSTERDOWN while a
// failover runs, TRYAGAIN mid-migration, LOADING, MASTERDOWN) that the
// store's own redirect budget did not outlast.
inline bool is_transient_error(std::exception_ptr e) noexcept {
  if (is_connection_error(e)) return true;
  try {
    std::rethrow_exception(e);
  } catch (const RedisError& r) {
    const std::string& m = r.redis_message();
    for (const char* p : {"CLUSTERDOWN", "TRYAGAIN", "LOADING", "MASTERDOWN"})
      if (m.rfind(p, 0) == 0) return true;
    return false;
  } catch (...) {
    return false;
  }
}

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
