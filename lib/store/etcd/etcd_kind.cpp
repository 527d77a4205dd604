#include "store/etcd/etcd_kind.hpp"

#include "core/tls.hpp"
#include "lockwatch/errors.hpp"
#include "store/etcd/etcd_store.hpp"
#include "store/etcd/etcd_target.hpp"

namespace lockwatch::detail {

constinit const StoreKind kEtcdStore{
    kEtcdSchemes, kEtcdUsage,
    [](const std::string& url, const Options& options) {
      if (!EtcdTarget::parse(url).tls) return;
      if (!options.tls.verify)
        throw InvalidArgument("etcds:// always verifies the members' certificates: Options::tls.verify must stay true");
      check_tls_files(options.tls);
    },
    [](Loop& loop, const std::string& url, const Options& options) -> std::unique_ptr<LockStore> {
      return std::make_unique<EtcdStore>(loop, EtcdTarget::parse(url), StoreSettings::of(options));
    }};

}  // namespace lockwatch::detail
