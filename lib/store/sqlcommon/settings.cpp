#include "store/sqlcommon/settings.hpp"

#include "core/option_checks.hpp"

namespace lockwatch::detail::sqlcommon {

SqlSettings sql_settings(const Options& options) {
  return SqlSettings{.key_prefix = options.runtime.key_prefix,
                     .owner_name = owner_name(options),
                     .connect_timeout = options.connection.connect_timeout,
                     .command_timeout = options.connection.command_timeout,
                     .reconnect_min = options.connection.reconnect_min,
                     .reconnect_max = options.connection.reconnect_max};
}

}  // namespace lockwatch::detail::sqlcommon
