// Options::validate(): the runtime's own settings (core), the store's
// URL and settings (the store picked by the URL's scheme), and the metrics
// address (ops). Defined here, where all three are known.
#include "core/option_checks.hpp"
#include "lockwatch/options.hpp"
#include "ops/metrics_server.hpp"
#include "store/registry.hpp"

namespace lockwatch {

void Options::validate() const {
  detail::check_store_options(*this);
  if (!observability.metrics_listen.empty()) detail::MetricsServer::check_address(observability.metrics_listen);
  detail::check_runtime_options(*this);
}

}  // namespace lockwatch
