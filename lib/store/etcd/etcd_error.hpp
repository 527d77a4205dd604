// lib/store/etcd/etcd_error.hpp: etcd's gRPC status codes as error codes.
//
// A call's status (INVALID_ARGUMENT, DEADLINE_EXCEEDED, ...) travels as a
// StoreError's `code`, of the category "lockwatch.etcd" (etcd_category()):
// its value is the gRPC status code, its message() the code's name
// ("INVALID_ARGUMENT"). Threading: the category is a constant.
#pragma once

#include <grpcpp/support/status.h>

#include <system_error>

#include "store/store_error.hpp"

namespace lockwatch::detail {

// The category of gRPC status codes from etcd: name() "lockwatch.etcd".
const StoreCategory& etcd_category() noexcept;
// `status` as a code of etcd_category() (empty for OK).
inline std::error_code etcd_code(grpc::StatusCode status) noexcept {
  return {static_cast<int>(status), etcd_category()};
}

}  // namespace lockwatch::detail
