// lib/core/option_checks.hpp: the checks of the runtime's own Options
// fields. Options::validate() (lib/runtime/options_check.cpp) adds the
// store's checks of its URL and settings, and the metrics address: core
// knows no store.
#pragma once

#include "lockwatch/options.hpp"

namespace lockwatch::detail {

// Throws InvalidArgument for a runtime setting out of its range.
void check_runtime_options(const Options& options);

}  // namespace lockwatch::detail
