// lib/store/store_settings.hpp: what the stores outside the SQL folders and
// their connections read of the Options: the connection and TLS groups,
// the drift allowance, the key prefix and the owner's name. A store's kind
// takes it once where it makes the store (StoreKind::make); no store or
// connection keeps a copy of the Options. The settings that belong to one
// store come from its URL's query instead (store/redis/topology.hpp).
#pragma once

#include <string>

#include "core/option_checks.hpp"
#include "lockwatch/options.hpp"

namespace lockwatch::detail {

struct StoreSettings {
  ConnectionOptions connection;
  TlsOptions tls;
  // Its drift_factor and drift_floor: the lease arithmetic (core/timing.hpp).
  WatchdogOptions watchdog;
  std::string key_prefix;
  // The runtime's owner name, resolved: never empty.
  std::string owner_name;

  static StoreSettings of(const Options& options) {
    return StoreSettings{options.connection, options.tls, options.watchdog, options.runtime.key_prefix,
                         detail::owner_name(options)};
  }
};

}  // namespace lockwatch::detail
