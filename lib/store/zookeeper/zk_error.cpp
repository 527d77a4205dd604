#include "store/zookeeper/zk_error.hpp"

#include <zookeeper/zookeeper.h>

namespace lockwatch::detail {

const StoreCategory& zookeeper_category() noexcept {
  static const StoreCategory category(
      "lockwatch.zookeeper", [](int rc) { return std::string(zerror(rc)); }, "{0} answered error {1}: {3}");
  return category;
}

}  // namespace lockwatch::detail
