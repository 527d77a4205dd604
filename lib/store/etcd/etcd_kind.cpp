#include "store/etcd/etcd_kind.hpp"

#include "store/etcd/etcd_store.hpp"
#include "store/etcd/etcd_target.hpp"

namespace lockwatch::detail {

constinit const StoreKind kEtcdStore{
    kEtcdSchemes, kEtcdUsage,
    [](const std::string& url, const Options& options) { EtcdStore::check_options(EtcdTarget::parse(url), options); },
    [](Loop& loop, const std::string& url, const Options& options) -> std::unique_ptr<LockStore> {
      return std::make_unique<EtcdStore>(loop, EtcdTarget::parse(url), StoreSettings::of(options));
    }};

}  // namespace lockwatch::detail
