#include "store/etcd/etcd_error.hpp"

#include <fmt/format.h>

#include <iterator>

namespace lockwatch::detail {

namespace {

// gRPC's status codes are 0 to 16, in this order.
const char* grpc_code_name(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
      "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const auto i = static_cast<std::size_t>(code);
  return i < std::size(kNames) ? kNames[i] : "UNKNOWN";
}

class EtcdCategory final : public StoreCategory {
 public:
  const char* name() const noexcept override { return "lockwatch.etcd"; }
  std::string message(int code) const override { return grpc_code_name(static_cast<grpc::StatusCode>(code)); }
  std::string refusal(std::string_view endpoint, int code, std::string_view message) const override {
    return fmt::format("{} answered {}: {}", endpoint, grpc_code_name(static_cast<grpc::StatusCode>(code)), message);
  }
};

}  // namespace

const StoreCategory& etcd_category() noexcept {
  static const EtcdCategory category;
  return category;
}

}  // namespace lockwatch::detail
