// Helpers for the Asio tests: running a coroutine to its end on a
// single-threaded io_context, with a bound, and the coroutine stress
// shared by the in-memory and the Redis suites.
#pragma once

#include <asio.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/experimental/deferred.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "lockwatch/asio.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {

// Runs `coro` on `ctx` (on this thread) until it finished, at most kBound;
// the exception it ended with, if any, is rethrown here. Records a failure
// if it did not finish.
template <class T>
T run_to_end(asio::io_context& ctx, asio::awaitable<T> coro) {
  std::optional<std::conditional_t<std::is_void_v<T>, bool, T>> value;
  std::exception_ptr error;
  bool done = false;
  asio::co_spawn(ctx, std::move(coro), [&](std::exception_ptr e, auto... v) {
    done = true;
    error = e;
    if constexpr (sizeof...(v) == 1)
      if (!e) value.emplace(std::move(v)...);
  });
  auto until = std::chrono::steady_clock::now() + kBound;
  while (!done && std::chrono::steady_clock::now() < until) {
    ctx.restart();
    ctx.run_for(std::chrono::milliseconds(50));
  }
  if (!done) {
    ADD_FAILURE() << "coroutine did not finish within the bound";
    throw std::runtime_error("coroutine did not finish within the bound");
  }
  if (error) std::rethrow_exception(error);
  if constexpr (!std::is_void_v<T>) return std::move(*value);
}

struct StressResult {
  int done = 0;                              // coroutines that finished their cycles
  int errors = 0;                            // coroutines that ended with an error
  int overlaps = 0;                          // a key entered while another held it
  std::vector<int> per_key;                  // cycles per key, counted under the lock
  std::vector<std::chrono::microseconds> tick_late;  // how late each tick of the 1 ms ticker ran
  int ticks = 0;
  // The lateness that all but the latest `share` of the ticks kept within
  // (0: the worst).
  std::chrono::microseconds late_at(double share) const {
    if (tick_late.empty()) return {};
    auto sorted = tick_late;
    std::sort(sorted.begin(), sorted.end());
    const auto drop = static_cast<std::size_t>(share * static_cast<double>(sorted.size()));
    return sorted[sorted.size() - 1 - std::min(drop, sorted.size() - 1)];
  }
};

// `coroutines` coroutines on one single-threaded io_context, each locking
// keys[i % keys] `cycles` times through LOCKED, suspending (a 1 ms timer)
// while it holds, and making a read-suspend-write increment of the key's
// counter; a 1 ms ticker on the same context measures how late it runs.
inline StressResult coroutine_stress(Runtime& rt, int coroutines, int cycles, std::vector<std::string> keys) {
  asio::io_context ctx(1);
  StressResult r;
  r.per_key.assign(keys.size(), 0);
  std::vector<int> inside(keys.size(), 0);
  auto step = locked("{0}", std::chrono::seconds(5), forever).on(rt).wait(std::chrono::seconds(60))(
      [&](const std::string& key, std::size_t k) -> asio::awaitable<void> {
        if (inside[k]++ != 0) ++r.overlaps;
        int v = r.per_key[k];
        asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(1));
        co_await t.async_wait(asio::use_awaitable);
        r.per_key[k] = v + 1;
        --inside[k];
        (void)key;
      });
  int running = coroutines;
  bool stop_ticker = false;
  for (int i = 0; i < coroutines; ++i) {
    std::size_t k = static_cast<std::size_t>(i) % keys.size();
    asio::co_spawn(
        ctx,
        [&, k]() -> asio::awaitable<void> {
          for (int c = 0; c < cycles; ++c) co_await step(keys[k], k);
        },
        [&](std::exception_ptr e) {
          if (e) {
            ++r.errors;
            try {
              std::rethrow_exception(e);
            } catch (const std::exception& x) {
              ADD_FAILURE() << x.what();
            }
          } else {
            ++r.done;
          }
          if (--running == 0) stop_ticker = true;
        });
  }
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        asio::steady_timer t(co_await asio::this_coro::executor);
        while (!stop_ticker) {
          auto due = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
          t.expires_at(due);
          co_await t.async_wait(asio::use_awaitable);
          auto late = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - due);
          r.tick_late.push_back(late);
          ++r.ticks;
        }
      },
      asio::detached);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!stop_ticker && std::chrono::steady_clock::now() < until) {
    ctx.restart();
    ctx.run_for(std::chrono::milliseconds(100));
  }
  ctx.restart();
  ctx.run_for(std::chrono::milliseconds(100));  // the ticker's last round
  if (!stop_ticker) ADD_FAILURE() << "the coroutines did not finish within 120 s";
  return r;
}

}  // namespace lockwatch::testing
