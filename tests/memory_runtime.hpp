// A Runtime on an in-memory store, for the unit tests of the runtime's
// logic (no redis-server anywhere).
#pragma once

#include <memory>

#include "lockwatch/lockwatch.hpp"
#include "runtime/runtime_impl.hpp"
#include "support/memory_store.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {

// Short ttls keep the tests quick; the tick is the default 5 ms.
inline Options memory_options(std::size_t threads = 4) {
  Options o;
  o.runtime.threads = threads;
  return o;
}

// `store`, if given, is pointed at the runtime's store (it lives as long
// as the runtime).
inline std::unique_ptr<Runtime> memory_runtime(std::shared_ptr<MemoryBackend> backend,
                                               std::shared_ptr<StoreScript> script,
                                               Options options = memory_options(), MemoryStore** store = nullptr) {
  return detail::RuntimeAccess::make(
      std::move(options), [backend, script, store](detail::Loop& loop, const Options& o) {
        auto s = std::make_unique<MemoryStore>(loop, backend, script, o.runtime.key_prefix);
        if (store) *store = s.get();
        return s;
      });
}

// The store's name for a key (MemoryStore: the prefix and the key).
inline std::string memory_name(const std::string& key) { return "lockwatch:" + key; }

inline std::chrono::milliseconds ms_between(std::chrono::steady_clock::time_point a,
                                            std::chrono::steady_clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a);
}

// The exception a future holds, of type E (nullptr, with a failure
// recorded, if it holds another or none).
template <class E>
std::unique_ptr<E> error_in(std::future<LockHandle>& f) {
  return error_of<E>(f);
}

}  // namespace lockwatch::testing
