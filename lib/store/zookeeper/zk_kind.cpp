#include "store/zookeeper/zk_kind.hpp"

#include "store/zookeeper/zk_store.hpp"
#include "store/zookeeper/zk_target.hpp"

namespace lockwatch::detail {

constinit const StoreKind kZooKeeperStore{
    kZooKeeperSchemes, kZooKeeperUsage,
    [](const std::string& url, const Options& options) { ZkStore::check_options(ZkTarget::parse(url), options); },
    [](Loop& loop, const std::string& url, const Options& options) -> std::unique_ptr<LockStore> {
      return std::make_unique<ZkStore>(loop, ZkTarget::parse(url), StoreSettings::of(options));
    }};

}  // namespace lockwatch::detail
