// A process that counts in files under a lock, for tests of exclusion
// across processes: each increment takes the lock of one of KEYS keys in
// turn and, holding it, reads the key's file, pauses a millisecond and
// writes the count back plus one. Two holders at once lose an increment.
//   file_counter REDIS_URL DIR KEYS INCREMENTS
// Keys are "fc:0" .. "fc:<KEYS-1>", files DIR/fc-<i>. Exit 0 when every
// increment ran, 1 on an error (printed).
//
//   file_counter STORE_URL DIR ACCOUNTS TRANSFERS transfer THREADS SEED
// Transfers instead: THREADS threads each make TRANSFERS transfers of one
// unit between random accounts (from == to included), each naming the pair
// in its own order, under the set lockwatch::all_of("acct:{from}",
// "acct:{to}"); holding it, a transfer reads both accounts' files
// (DIR/acct-<i>, 1000 when missing), pauses a millisecond and writes both
// back. A transfer overlapping another on an account changes the total.
#include <lockwatch/lockwatch.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <string>
#include <random>
#include <thread>
#include <vector>

namespace {

long read_balance(const std::string& path) {
  long n = 1000;
  std::ifstream in(path);
  if (in) in >> n;
  return n;
}

int transfers(lockwatch::Runtime& rt, const std::string& dir, int accounts, int count, int threads, unsigned seed) {
  auto transfer = LOCKED(lockwatch::all_of("acct:{0}", "acct:{1}"), std::chrono::seconds(2), lockwatch::forever,
                         .on(rt).wait(std::chrono::seconds(60)))[&](int from, int to) {
    const std::string a = dir + "/acct-" + std::to_string(from), b = dir + "/acct-" + std::to_string(to);
    long fa = read_balance(a), fb = read_balance(b);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // widen the race
    if (from == to) return;
    std::ofstream(a, std::ios::trunc) << fa - 1 << "\n";
    std::ofstream(b, std::ios::trunc) << fb + 1 << "\n";
  };
  std::atomic<int> errors{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937 rng(seed * 100 + static_cast<unsigned>(t));
      for (int i = 0; i < count; ++i) {
        int from = static_cast<int>(rng() % static_cast<unsigned>(accounts));
        int to = static_cast<int>(rng() % static_cast<unsigned>(accounts));
        auto done = transfer(from, to);
        if (done.wait_for(std::chrono::seconds(90)) != std::future_status::ready) {
          std::fprintf(stderr, "file_counter: error transfer %d -> %d did not finish within 90 s\n", from, to);
          errors++;
          return;
        }
        try {
          done.get();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "file_counter: error %s\n", e.what());
          errors++;
          return;
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 8 && std::string(argv[5]) == "transfer") {
    lockwatch::Options o = lockwatch::Options::from_env();
    o.redis_url = argv[1];
    o.runtime.threads = 4;
    try {
      lockwatch::Runtime rt(o);
      return transfers(rt, argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[6]),
                       static_cast<unsigned>(std::atoi(argv[7])));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "file_counter: error %s\n", e.what());
      return 1;
    }
  }
  if (argc != 5) {
    std::fprintf(stderr, "usage: file_counter REDIS_URL DIR KEYS INCREMENTS\n");
    return 2;
  }
  lockwatch::Options o = lockwatch::Options::from_env();
  o.redis_url = argv[1];
  o.runtime.threads = 2;
  const std::string dir = argv[2];
  const int keys = std::atoi(argv[3]);
  const int increments = std::atoi(argv[4]);
  try {
    lockwatch::Runtime rt(o);
    auto bump = lockwatch::locked("fc:{0}", std::chrono::seconds(2), lockwatch::forever)
                    .on(rt)
                    .wait(std::chrono::seconds(30))([&](int k) {
                      const std::string path = dir + "/fc-" + std::to_string(k);
                      long n = 0;
                      {
                        std::ifstream in(path);
                        in >> n;
                      }
                      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // widen the race
                      std::ofstream(path, std::ios::trunc) << n + 1 << "\n";
                    });
    for (int i = 0; i < increments; ++i) {
      auto done = bump(i % keys);
      // Bounded, as the parent's wait is: a hung call is an error here.
      if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
        std::fprintf(stderr, "file_counter: error increment %d did not finish within 60 s\n", i);
        return 1;
      }
      done.get();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "file_counter: error %s\n", e.what());
    return 1;
  }
  return 0;
}
