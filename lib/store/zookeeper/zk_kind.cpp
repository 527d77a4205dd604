#include "store/zookeeper/zk_kind.hpp"

#include "lockwatch/errors.hpp"
#include "store/zookeeper/zk_nodes.hpp"
#include "store/zookeeper/zk_store.hpp"

namespace lockwatch::detail {

constinit const StoreKind kZooKeeperStore{
    kZooKeeperSchemes, kZooKeeperUsage,
    [](const std::string& url, const Options& options) {
      ZkTarget::parse(url);
      if (options.runtime.key_prefix.size() >= zk::kMaxNameBytes)
        throw InvalidArgument(
            "Options::runtime.key_prefix leaves no room for a key in a ZooKeeper lock name (255 bytes)");
    },
    [](Loop& loop, const std::string& url, const Options& options) -> std::unique_ptr<LockStore> {
      return std::make_unique<ZkStore>(loop, ZkTarget::parse(url), StoreSettings::of(options));
    }};

}  // namespace lockwatch::detail
