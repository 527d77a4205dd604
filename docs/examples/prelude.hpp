// docs/examples/prelude.hpp: what the documentation's code fragments may
// assume (docs/README.md says how fragments are marked and compiled).
//
// A fragment is compiled after this header: inside a function, at
// namespace scope or inside an asio::awaitable<void> coroutine. These
// declarations stand for the reader's own program: a runtime, the resource
// a lock protects, the work done under it. They are declared, never
// defined: fragments are compiled, not linked.
#pragma once

#include <lockwatch/lockwatch.hpp>

#include <cassert>
#include <cstdint>
#include <cstdio>
#include <future>
#include <mutex>

using namespace std::chrono_literals;

// The runtime a fragment uses, under both of the names the pages give it.
extern lockwatch::Runtime& rt;
extern lockwatch::Runtime& runtime;

// A resource guarded by a lock, and work done under one.
struct Stock {
  int take(int sku, int qty);  // what is left
};
extern Stock stock;

struct Account {
  int withdraw(int account_id, int amount);  // the balance left
};
extern Account account;

int run_job(int job_id);
void write(std::uint64_t fencing_token);
void write_report(std::uint64_t fencing_token);
void write_report(std::int64_t period, std::uint64_t fencing_token);
void vacuum();

// Locks used with std::scoped_lock and std::unique_lock.
extern lockwatch::mutex a, b, m;

#ifdef ASIO_VERSION  // coroutine fragments: <asio.hpp> and lockwatch/asio.hpp come first
struct AsyncStock {
  asio::awaitable<int> take(int sku, int qty);
};
extern AsyncStock async_stock;
asio::awaitable<void> async_write(std::uint64_t fencing_token);
extern asio::steady_timer timer;
#endif
