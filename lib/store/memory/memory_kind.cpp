#include "store/memory/memory_kind.hpp"

#include "store/memory/memory_store.hpp"

namespace lockwatch::detail {

constinit const StoreKind kMemoryStore{
    "memory", "memory://[name] (in this process: runtimes naming the same space share it)",
    [](const std::string& url, const Options&) { (void)MemoryStore::space_name(url); },
    [](Loop& loop, const std::string& url, const Options& options) -> std::unique_ptr<LockStore> {
      return std::make_unique<MemoryStore>(loop, MemorySpace::open(MemoryStore::space_name(url)), options);
    }};

}  // namespace lockwatch::detail
