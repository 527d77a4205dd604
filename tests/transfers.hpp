// Transfers between accounts under a set lock (lockwatch::all_of), for
// the tests of sets: a ledger whose transfers check that no two overlap on
// an account and that each account's fencing token rises, and threads that
// make transfers between random pairs, each naming the pair in its own
// order (from == to included).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lockwatch/lockwatch.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {

template <int N>
struct Ledger {
  Ledger() {
    for (long& b : balance) b = 1000;
  }
  // One transfer's work, run holding both accounts' keys ("acct:<i>").
  void move(int from, int to, long cents) {
    const int touched[] = {from, to};
    for (int k = 0; k < (to == from ? 1 : 2); ++k) {
      const int acct = touched[k];
      auto token = this_lease().fencing_token("acct:" + std::to_string(acct));
      if (busy[acct].fetch_add(1) != 0) overlaps++;
      if (token <= last_token[acct]) token_regressions++;
      last_token[acct] = token;
    }
    long f = balance[from];
    std::this_thread::yield();  // widen the race
    balance[from] = f - cents;
    balance[to] += cents;
    busy[from].fetch_sub(1);
    if (to != from) busy[to].fetch_sub(1);
  }
  long total() const {
    long t = 0;
    for (long b : balance) t += b;
    return t;
  }

  long balance[N];
  std::uint64_t last_token[N] = {};
  std::atomic<int> busy[N] = {};
  std::atomic<int> overlaps{0}, token_regressions{0}, failures{0};
};

// `threads` threads, thread t making `transfers` transfers through
// `make(t)` (a callable (from, to, cents) -> std::future<void>) between
// random pairs of N accounts; a call that fails counts in ledger.failures.
template <int N, class Make>
void run_transfers(Ledger<N>& ledger, int threads, int transfers, unsigned seed, Make make) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto transfer = make(t);
      std::mt19937 rng(seed * 100 + static_cast<unsigned>(t));
      for (int i = 0; i < transfers; ++i) {
        int from = static_cast<int>(rng() % N), to = static_cast<int>(rng() % N);
        auto f = transfer(from, to, 1 + static_cast<long>(rng() % 9));
        if (!completes(f)) ledger.failures++;
      }
    });
  }
  for (auto& t : pool) t.join();
}

}  // namespace lockwatch::testing
