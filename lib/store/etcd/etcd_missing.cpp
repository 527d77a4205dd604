// etcd:// in a build without the `etcd` feature: its URLs fail naming it.
#include "store/etcd/etcd_kind.hpp"
namespace lockwatch::detail {
constinit const StoreKind kEtcdStore = missing_store(kEtcdSchemes, kEtcdUsage, "'etcd' (grpc++, protobuf, protoc)");
}  // namespace lockwatch::detail
