#include "store/zookeeper/zk_error.hpp"

#include <fmt/format.h>
#include <zookeeper/zookeeper.h>

namespace lockwatch::detail {

namespace {

class ZooKeeperCategory final : public StoreCategory {
 public:
  const char* name() const noexcept override { return "lockwatch.zookeeper"; }
  std::string message(int rc) const override { return zerror(rc); }
  std::string refusal(std::string_view endpoint, int rc, std::string_view message) const override {
    return fmt::format("{} answered error {}: {}", endpoint, rc, message);
  }
};

}  // namespace

const StoreCategory& zookeeper_category() noexcept {
  static const ZooKeeperCategory category;
  return category;
}

}  // namespace lockwatch::detail
