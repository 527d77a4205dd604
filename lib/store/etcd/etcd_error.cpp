#include "store/etcd/etcd_error.hpp"

#include <fmt/format.h>

namespace lockwatch::detail {

namespace {

const char* grpc_code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
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
