// A process that takes a lock and holds it until it is killed, for tests of
// what happens when a holder dies. Prints "held <fencing token>" once the
// lock is taken; SIGTERM makes it give the lock back and exit 0 (SIGKILL is
// the holder that dies). KIND: "shared", "permits:N" or "fair" (which waits up to a
// minute for the lock), or "leader": campaigns in the Election named KEY
// and prints "leader <term>" once it leads (default: exclusive).
//   lock_holder REDIS_URL KEY TTL_MS [KIND]
#include <lockwatch/lockwatch.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

namespace {
// Set by the SIGTERM handler on whichever thread takes the signal (the
// runtime's too), read by the work's: a lock-free atomic, safe in both.
std::atomic<bool> terminated{false};
static_assert(std::atomic<bool>::is_always_lock_free);
}

int main(int argc, char** argv) {
  std::signal(SIGTERM, [](int) { terminated.store(true, std::memory_order_relaxed); });
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: lock_holder REDIS_URL KEY TTL_MS [shared|permits:N|fair|leader]\n");
    return 2;
  }
  const std::string kind = argc == 5 ? argv[4] : "";
  lockwatch::Options o = lockwatch::Options::from_env();  // the TLS files, if any
  o.redis_url = argv[1];
  o.runtime.threads = 1;
  lockwatch::Runtime rt(o);
  if (kind == "leader") {
    lockwatch::Election election(rt, argv[2], std::chrono::milliseconds(std::atoi(argv[3])));
    lockwatch::Leadership me = election.campaign().get();
    std::printf("leader %llu\n", static_cast<unsigned long long>(me.term()));
    std::fflush(stdout);
    auto stop = me.stop_token();
    while (!stop.stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::printf("lost\n");
    return 1;
  }
  auto base = lockwatch::locked([key = std::string(argv[2])] { return key; },
                               std::chrono::milliseconds(std::atoi(argv[3])), lockwatch::forever)
                  .on(rt);
  static std::atomic<bool> held{false};
  auto body = [] {
    held.store(true);
    std::printf("held %llu\n", static_cast<unsigned long long>(lockwatch::this_lease().fencing_token()));
    std::fflush(stdout);
    // Hold until killed, told to stop (SIGTERM), or the lease is lost.
    auto stop = lockwatch::this_lease().stop_token();
    while (!stop.stop_requested() && !terminated.load(std::memory_order_relaxed))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  auto run = [&](const auto& builder) {
    auto hold = builder(body);
    // A store not reachable yet (a slow first connection, as under the
    // sanitizers) is tried again for up to 10 s, 100 ms apart: the holder
    // is to hold, and nothing announces that a store became reachable.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      try {
        hold().get();
        return 0;
      } catch (const lockwatch::AuthError& e) {  // refused credentials stay refused
        std::printf("lost %s\n", e.what());
        return 1;
      } catch (const lockwatch::ConnectionError& e) {
        if (held.load() || std::chrono::steady_clock::now() >= give_up) {
          std::printf("lost %s\n", e.what());
          return 1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      } catch (const std::exception& e) {
        std::printf("lost %s\n", e.what());
        return 1;
      }
    }
  };
  if (kind == "shared") return run(base.shared());
  if (kind == "fair") return run(base.fair().wait(std::chrono::minutes(1)));
  if (kind.rfind("permits:", 0) == 0) return run(base.permits(static_cast<std::uint32_t>(std::atoi(kind.c_str() + 8))));
  return run(base);
}
