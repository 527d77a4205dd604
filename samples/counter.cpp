// lockwatch-counter: a deliberately racy read-modify-write (GET, a short
// sleep, SET) made safe by a lock. Run several at once against one Redis;
// with the lock, no increment is lost.
//
//   lockwatch-counter --store redis://127.0.0.1:6379 --key demo --increments 50 --threads 4
//
// Prints the counter's value after this process's increments, and exits
// non-zero if any increment failed.
#include <hiredis/hiredis.h>
#include <lockwatch/lockwatch.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

struct Args {
  std::string redis = "redis://127.0.0.1:6379";
  std::string key = "counter";
  int increments = 100;
  int threads = 4;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "lockwatch-counter: %s\nusage: lockwatch-counter --store URL --key NAME --increments N --threads T\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value");
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--store") || !std::strcmp(argv[i], "--redis")) a.redis = value();  // --redis: its old name
    else if (!std::strcmp(argv[i], "--key")) a.key = value();
    else if (!std::strcmp(argv[i], "--increments")) a.increments = std::atoi(value().c_str());
    else if (!std::strcmp(argv[i], "--threads")) a.threads = std::atoi(value().c_str());
    else usage("unknown option");
  }
  if (a.increments < 0 || a.threads <= 0) usage("increments must be >= 0 and threads > 0");
  return a;
}

// The counter lives in Redis; each worker thread has its own connection.
class Store {
 public:
  explicit Store(const lockwatch::Endpoint& ep) {
    timeval tv{2, 0};
    c_ = redisConnectWithTimeout(ep.host.c_str(), ep.port, tv);
    if (c_ == nullptr || c_->err) throw std::runtime_error("cannot connect to Redis");
    if (!ep.password.empty()) {
      auto* r = static_cast<redisReply*>(ep.user.empty() ? redisCommand(c_, "AUTH %s", ep.password.c_str())
                                                         : redisCommand(c_, "AUTH %s %s", ep.user.c_str(),
                                                                        ep.password.c_str()));
      if (r) freeReplyObject(r);
    }
    if (ep.db != 0) {
      auto* r = static_cast<redisReply*>(redisCommand(c_, "SELECT %d", ep.db));
      if (r) freeReplyObject(r);
    }
  }
  ~Store() { redisFree(c_); }
  long get(const std::string& key) {
    auto* r = static_cast<redisReply*>(redisCommand(c_, "GET %b", key.data(), key.size()));
    if (r == nullptr) throw std::runtime_error("redis GET failed");
    long v = r->type == REDIS_REPLY_STRING ? std::atol(r->str) : 0;
    freeReplyObject(r);
    return v;
  }
  void set(const std::string& key, long v) {
    std::string s = std::to_string(v);
    auto* r = static_cast<redisReply*>(redisCommand(c_, "SET %b %b", key.data(), key.size(), s.data(), s.size()));
    if (r == nullptr) throw std::runtime_error("redis SET failed");
    freeReplyObject(r);
  }

 private:
  redisContext* c_ = nullptr;
};

// One connection per pool thread, made on first use there.
thread_local std::unique_ptr<Store> store;

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  lockwatch::Options options;
  options.store_url = args.redis;
  options.runtime.threads = static_cast<std::size_t>(args.threads);
  try {
    lockwatch::Runtime runtime(options);
    // The counter itself lives on the first node (with Redlock, the lock
    // spans them all).
    auto endpoint = lockwatch::Endpoint::parse_list(args.redis).front();
    std::string counter_key = "counter:" + args.key;

    auto increment = lockwatch::locked("counter:{0}", 2s, lockwatch::forever).on(runtime).wait(30s)(
        [&](const std::string& /*name*/) {
          if (!store) store = std::make_unique<Store>(endpoint);
          long v = store->get(counter_key);
          std::this_thread::sleep_for(1ms);  // widen the race the lock closes
          store->set(counter_key, v + 1);
        });

    std::atomic<int> failed{0};
    std::vector<std::thread> workers;
    for (int t = 0; t < args.threads; ++t) {
      workers.emplace_back([&, t] {
        int mine = args.increments / args.threads + (t < args.increments % args.threads ? 1 : 0);
        for (int i = 0; i < mine; ++i) {
          try {
            increment(args.key).get();
          } catch (const std::exception& e) {
            std::fprintf(stderr, "increment failed: %s\n", e.what());
            failed++;
          }
        }
      });
    }
    for (auto& w : workers) w.join();
    Store reader(endpoint);
    std::printf("%ld\n", reader.get(counter_key));
    return failed == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockwatch-counter: %s\n", e.what());
    return 1;
  }
}
