// lib/runtime/list.cpp: the operators' views of what a store holds,
// Runtime::list() and the LockState that it and inspect() answer.
#include <algorithm>

#include "lockwatch/errors.hpp"
#include "runtime/runtime_impl.hpp"
#include "runtime/store_errors.hpp"

namespace lockwatch {

namespace {
constexpr std::size_t kMaxListed = 10000;
}  // namespace

LockState detail::to_lock_state(std::string key, const LockInfo& info) {
  LockState s;
  s.key = std::move(key);
  s.held = info.held;
  s.ttl = info.ttl;
  s.fencing_token = info.fencing_token;
  if (!info.held) return s;
  s.kind = info.kind;
  s.holders.reserve(info.holders.size());
  for (const HolderInfo& h : info.holders) s.holders.push_back(LockHolder{h.owner_name, h.since, h.held_for, h.token});
  std::stable_sort(s.holders.begin(), s.holders.end(),
                   [](const LockHolder& a, const LockHolder& b) { return a.since < b.since; });
  if (!s.holders.empty()) {
    s.owner = s.holders.front().owner;
    s.since = s.holders.front().since;
    s.held_for = s.holders.front().held_for;
  }
  return s;
}

std::future<std::vector<LockState>> detail::RuntimeImpl::list(std::string prefix, std::size_t limit) {
  if (limit == 0 || limit > kMaxListed)
    throw InvalidArgument("Runtime::list: the limit must be in 1.." + std::to_string(kMaxListed));
  if (prefix.size() > options_.runtime.max_key_bytes)
    throw InvalidArgument("Runtime::list: the prefix is longer than a key");
  admission_.check();
  auto& listing = detail::require<detail::LockListing>(*store_, store_kind());
  auto promise = std::make_shared<std::promise<std::vector<LockState>>>();
  auto future = promise->get_future();
  if (!loop_.post([&listing, promise, prefix = std::move(prefix), limit] {
        listing.list_locks(prefix, limit, [promise](std::vector<detail::LockInfo> locks, const detail::StoreError* err) {
          if (err) {
            promise->set_exception(detail::to_exception(*err));
            return;
          }
          std::vector<LockState> out;
          out.reserve(locks.size());
          for (auto& info : locks) out.push_back(detail::to_lock_state(std::move(info.key), info));
          promise->set_value(std::move(out));
        });
      }))
    throw RuntimeStopped("lockwatch runtime is stopping");
  return future;
}

std::future<std::vector<LockState>> Runtime::list(std::string prefix, std::size_t limit) {
  return impl_->list(std::move(prefix), limit);
}

}  // namespace lockwatch
