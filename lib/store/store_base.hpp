// lib/store/store_base.hpp: what most stores share, so that a store
// class declares only what is its own.
//
// - Key rules: a store's name for a key is `prefix + key` (or, for Redis,
//   `prefix{key}`: rules.name), and a key is refused when rules.problem
//   says why; encode() and check_key() come from them.
// - The events start() hands over, kept in events_; a store's own start
//   work goes in started().
// - Whether it reports releases, and no-op subscriptions for a store
//   that does not.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "store/lock_store.hpp"

namespace lockwatch::detail {

struct KeyRules {
  using Name = std::string (*)(std::string_view prefix, std::string_view key);
  using Problem = const char* (*)(std::string_view prefix, std::string_view key) noexcept;

  static std::string plain(std::string_view prefix, std::string_view key) {
    std::string name;
    name.reserve(prefix.size() + key.size());
    name.append(prefix).append(key);
    return name;
  }
  static const char* any(std::string_view, std::string_view) noexcept { return nullptr; }

  std::string prefix;
  Name name = plain;
  Problem problem = any;
};

class StoreBase : public LockStore {
 public:
  std::string encode(std::string_view key) const override { return keys_.name(keys_.prefix, key); }
  const char* check_key(std::string_view key) const noexcept override { return keys_.problem(keys_.prefix, key); }
  bool release_events() const noexcept override { return release_events_; }
  void start(StoreEvents events) final {
    events_ = std::move(events);
    started();
  }
  void subscribe(std::string_view) override {}
  void unsubscribe(std::string_view) override {}

 protected:
  StoreBase(KeyRules keys, bool release_events) : keys_(std::move(keys)), release_events_(release_events) {}
  // start()'s work beyond keeping the events (connections, timers).
  virtual void started() {}

  const KeyRules keys_;
  StoreEvents events_;

 private:
  const bool release_events_;
};

}  // namespace lockwatch::detail
