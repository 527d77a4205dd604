// lib/store/sqlcommon/settings.hpp: what the SQL stores (MariaDB and
// PostgreSQL) and their connections read of the runtime's Options, and
// nothing more.
//
// sql_settings() is the one place these stores read Options: each store's
// kind builds the settings once and hands them to the store, which hands
// them to its connections. Plain values; any thread.
#pragma once

#include <chrono>
#include <string>

#include "core/option_checks.hpp"
#include "lockwatch/options.hpp"

namespace lockwatch::detail::sqlcommon {

struct SqlSettings {
  std::string key_prefix;  // Options::runtime.key_prefix: the lock rows' names start with it
  std::string owner_name;  // Options::runtime.owner_name, or this process's default (core/option_checks.hpp)
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds command_timeout{2000};
  std::chrono::milliseconds reconnect_min{10};
  std::chrono::milliseconds reconnect_max{1000};
};

// The settings of a SQL store from the runtime's options.
inline SqlSettings sql_settings(const Options& options) {
  return SqlSettings{.key_prefix = options.runtime.key_prefix,
                     .owner_name = owner_name(options),
                     .connect_timeout = options.connection.connect_timeout,
                     .command_timeout = options.connection.command_timeout,
                     .reconnect_min = options.connection.reconnect_min,
                     .reconnect_max = options.connection.reconnect_max};
}

}  // namespace lockwatch::detail::sqlcommon
