#include "store/sqlcommon/settings.hpp"

#include "core/option_checks.hpp"

namespace lockwatch::detail::sqlcommon {

SqlSettings sql_settings(const Options& options) {
  return SqlSettings{.key_prefix = options.key_prefix,
                     .owner_name = owner_name(options),
                     .connect_timeout = options.connect_timeout,
                     .command_timeout = options.command_timeout,
                     .reconnect_min = options.reconnect_min,
                     .reconnect_max = options.reconnect_max};
}

}  // namespace lockwatch::detail::sqlcommon
