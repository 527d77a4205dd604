#include "store/etcd/etcd_error.hpp"

#include <iterator>

namespace lockwatch::detail {

namespace {

// gRPC's status codes are 0 to 16, in this order.
std::string grpc_code_name(int code) {
  static constexpr const char* kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
      "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const auto i = static_cast<std::size_t>(code);
  return i < std::size(kNames) ? kNames[i] : "UNKNOWN";
}

}  // namespace

const StoreCategory& etcd_category() noexcept {
  static const StoreCategory category("lockwatch.etcd", grpc_code_name, "{0} answered {2}: {3}");
  return category;
}

}  // namespace lockwatch::detail
