// zookeeper:// in a build without the `zookeeper` feature: its URLs fail naming it.
#include "store/zookeeper/zk_kind.hpp"
namespace lockwatch::detail {
constinit const StoreKind kZooKeeperStore =
    missing_store(kZooKeeperSchemes, kZooKeeperUsage, "'zookeeper' (the ZooKeeper C client, libzookeeper_mt)");
}  // namespace lockwatch::detail
