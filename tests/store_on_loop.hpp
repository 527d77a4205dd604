// tests/store_on_loop.hpp: a LockStore (whatever the Options' URL names)
// driven on a loop of its own, one call at a time, for tests of the store
// calls themselves: what the runtime never does on its own (acquiring
// twice with one token, raise_fence without Redlock, claim_period without
// a job) and what it does only after a failure (a repeated release).
//
// Threading: call from the test thread; every call waits (bounded) for its
// answer. The store's connection events are counted.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "core/loop.hpp"
#include "store/capabilities.hpp"
#include "store/registry.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {

class StoreOnLoop {
 public:
  explicit StoreOnLoop(const Options& o) : store_(detail::make_store(loop_, o)) {
    detail::StoreEvents events;
    events.released = [](std::string_view) {};
    events.subscribed = [](std::string_view) {};
    events.subscriptions_lost = [] {};
    events.connection = [this](const std::string&, bool up, const std::string&) {
      if (!up) downs_++;
    };
    events.log = [](bool, const std::string&) {};
    loop_.post([this, events] { store_->start(events); });
  }
  ~StoreOnLoop() { EXPECT_EQ(loop_.shutdown([this] { store_->close(); }), 0); }
  StoreOnLoop(const StoreOnLoop&) = delete;
  StoreOnLoop& operator=(const StoreOnLoop&) = delete;

  std::string encode(const std::string& key) const { return store_->encode(key); }
  // Times a connection of the store was reported down.
  int downs() const { return downs_.load(); }

  // Keeps the loop's thread busy for `ms` from its next turn on (what was
  // posted before is written out first), as heavy work on the loop or a
  // starved process would.
  void stall(std::chrono::milliseconds ms) {
    loop_.post([this, ms] {
      loop_.post([ms] {
        const auto until = std::chrono::steady_clock::now() + ms;
        while (std::chrono::steady_clock::now() < until) {
        }
      });
    });
  }

  // Starts an acquisition; the future has its answer.
  std::future<detail::Acquired> acquire_async(const std::string& name, const std::string& token,
                                              std::chrono::milliseconds ttl, LockKind kind = {}) {
    auto p = std::make_shared<std::promise<detail::Acquired>>();
    auto f = p->get_future();
    loop_.post([this, p, name, token, ttl, kind] {
      const std::string ttl_ms = std::to_string(ttl.count());
      detail::LockRef ref{name, token, ttl_ms, ttl, kind};
      store_->acquire(std::span<const detail::LockRef>(&ref, 1),
                      [p](std::size_t, const detail::Acquired& r) { p->set_value(r); });
    });
    return f;
  }
  detail::Acquired acquire(const std::string& name, const std::string& token, std::chrono::milliseconds ttl,
                           LockKind kind = {}) {
    auto f = acquire_async(name, token, ttl, kind);
    return get_bounded(f);
  }
  detail::Released release(const std::string& name, const std::string& token) {
    std::promise<detail::Released> p;
    auto f = p.get_future();
    loop_.post([&] {
      detail::LockRef ref{name, token, {}, {}};
      store_->release(std::span<const detail::LockRef>(&ref, 1), true,
                      [&p](std::size_t, detail::Released r, const detail::StoreError*) { p.set_value(r); });
    });
    return get_bounded(f);
  }
  bool raise_fence(const std::string& name, std::uint64_t fence) {
    std::promise<bool> p;
    auto f = p.get_future();
    auto& fences = detail::require<detail::FenceRaising>(*store_, "this store");
    loop_.post([&] { fences.raise_fence(name, fence, [&p](bool ok) { p.set_value(ok); }); });
    return get_bounded(f);
  }
  // TokenBlocks::reserve_tokens: the counter's new value (0: not held with
  // `token`); nullopt for a store without the capability.
  std::optional<std::uint64_t> reserve_tokens(const std::string& name, const std::string& token, std::uint32_t n) {
    auto* blocks = detail::capability<detail::TokenBlocks>(*store_);
    if (blocks == nullptr) return std::nullopt;
    std::promise<std::uint64_t> p;
    auto f = p.get_future();
    loop_.post([&] {
      detail::LockRef ref{name, token, {}, {}};
      blocks->reserve_tokens(ref, n, [&p](std::uint64_t last, const detail::StoreError* e) {
        EXPECT_EQ(e, nullptr) << e->describe();
        p.set_value(last);
      });
    });
    return get_bounded(f);
  }
  // Claims `period`, due from `start` on the store's clock (by default
  // long due).
  detail::ClaimResult claim(const std::string& name, const std::string& token, std::int64_t period,
                            std::chrono::system_clock::time_point start = {}) {
    std::promise<detail::ClaimResult> p;
    auto f = p.get_future();
    auto& claims = detail::require<detail::JobClaims>(*store_, "this store");
    loop_.post([&] {
      claims.claim_period(name, token, period, start, [&p](const detail::ClaimResult& r) { p.set_value(r); });
    });
    return get_bounded(f);
  }
  // The store's clock, or its error.
  struct StoreTime {
    std::chrono::system_clock::time_point now;
    std::optional<detail::StoreError> error;
  };
  StoreTime server_time() {
    std::promise<StoreTime> p;
    auto f = p.get_future();
    auto& claims = detail::require<detail::JobClaims>(*store_, "this store");
    loop_.post([&] {
      claims.server_time([&p](std::chrono::system_clock::time_point now, const detail::StoreError* e) {
        p.set_value(StoreTime{now, e ? std::optional<detail::StoreError>(*e) : std::nullopt});
      });
    });
    return get_bounded(f);
  }

 private:
  detail::Loop loop_;
  std::unique_ptr<detail::LockStore> store_;
  std::atomic<int> downs_{0};
};

}  // namespace lockwatch::testing
