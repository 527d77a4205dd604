// lib/store/registry.hpp: the store a URL names, by its scheme.
//
// Each store's folder describes itself in a StoreKind: the schemes it
// serves, a line for the message that lists what is supported, how it
// checks its URL and its own settings, and how it is made. registry.cpp
// holds the table, one line per kind (each store's `*_kind.hpp`); a store
// the build left out (its Meson feature off) still has its line, which
// fails with Unsupported naming the feature.
#pragma once

#include "lockwatch/options.hpp"
#include "store/lock_store.hpp"

namespace lockwatch::detail {

class Loop;

struct StoreKind {
  // The schemes it serves, without "://", separated by spaces.
  std::string_view schemes;
  // How its URLs look, for the message that lists what is supported.
  std::string_view usage;
  // Throws InvalidArgument when `url` or this store's settings in `options`
  // are bad, Unsupported when the build cannot serve them.
  void (*check)(const std::string& url, const Options& options);
  // Makes the store; its connections start on the loop with start().
  std::unique_ptr<LockStore> (*make)(Loop& loop, const std::string& url, const Options& options);
  // A store the build left out: the Meson feature that builds it (check
  // and make are null, and its URLs fail with Unsupported naming it).
  std::string_view missing_feature = {};
};

// The line for a store the build left out.
constexpr StoreKind missing_store(std::string_view schemes, std::string_view usage, std::string_view feature) {
  return StoreKind{schemes, usage, nullptr, nullptr, feature};
}

// Throws Unsupported: `url` needs the Meson `feature`, which the build left out.
[[noreturn]] void throw_missing_feature(const std::string& url, std::string_view feature);

// Any thread. Throws InvalidArgument if the URL's scheme is unknown, the
// URL is malformed, or the options do not suit that store; Unsupported
// if the build has no store for it.
void check_store_options(const Options& options);

// Any thread; the store's connections start on the loop with start().
std::unique_ptr<LockStore> make_store(Loop& loop, const Options& options);

}  // namespace lockwatch::detail
