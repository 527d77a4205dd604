// lib/core/option_checks.hpp: the checks of the runtime's own Options
// fields. Options::validate() (lib/runtime/options_check.cpp) adds the
// store's checks of its URL and settings, and the metrics address: core
// knows no store.
#pragma once

#include <string>
#include <string_view>

#include "lockwatch/options.hpp"

namespace lockwatch::detail {

// Throws InvalidArgument for a runtime setting out of its range.
void check_runtime_options(const Options& options);

// Options::runtime.owner_name, or "host:pid:program" of this process when it is
// empty. Any thread.
std::string owner_name(const Options& options);

// `owner` as one word for a connection's name: each space or character
// outside printable ASCII becomes '_'.
std::string connection_owner_name(std::string_view owner);

}  // namespace lockwatch::detail
