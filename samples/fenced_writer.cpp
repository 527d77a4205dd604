// lockwatch-fenced-writer: writes to a FencedStore under a lock, passing
// the lease's fencing token along, and checks the lease before each write.
//
//   lockwatch-fenced-writer --store URL --key NAME --ttl-ms 1000 --writes 100 --interval-ms 50
//
// Prints "held <token>" once the lock is taken, "wrote <token> ok|rejected"
// per write, and "lost" when it learns (before writing) that its lease is
// gone. Exits 0 when all writes were made under the lease, 3 when the lease
// was lost.
#include <lockwatch/lockwatch.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "fenced_store.hpp"

using namespace std::chrono_literals;

int main(int argc, char** argv) {
  std::string url = "redis://127.0.0.1:6379", key = "fenced";
  int ttl_ms = 1000, writes = 100, interval_ms = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--store") || !std::strcmp(argv[i], "--redis")) url = argv[i + 1];  // --redis: its old name
    else if (!std::strcmp(argv[i], "--key")) key = argv[i + 1];
    else if (!std::strcmp(argv[i], "--ttl-ms")) ttl_ms = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--writes")) writes = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--interval-ms")) interval_ms = std::atoi(argv[i + 1]);
  }
  try {
    lockwatch::Options o;
    o.store_url = url;
    o.runtime.threads = 1;
    lockwatch::Runtime rt(o);
    auto ep = lockwatch::Endpoint::parse(url);
    auto write_all = lockwatch::locked([&] { return key; }, std::chrono::milliseconds(ttl_ms), lockwatch::forever)
                         .on(rt)([&] {
                           const lockwatch::Lease& lease = lockwatch::this_lease();
                           FencedStore store(ep.host, ep.port);
                           std::printf("held %llu\n", static_cast<unsigned long long>(lease.fencing_token()));
                           std::fflush(stdout);
                           for (int i = 0; i < writes; ++i) {
                             // remaining() reads the local deadline on the monotonic
                             // clock: right after a pause it is already zero, before
                             // the watchdog had a chance to run.
                             if (lease.stop_token().stop_requested() || lease.remaining() == 0ms) {
                               std::printf("lost\n");
                               std::fflush(stdout);
                               return;
                             }
                             bool ok = store.write(key, "write " + std::to_string(i), lease.fencing_token());
                             std::printf("wrote %llu %s\n", static_cast<unsigned long long>(lease.fencing_token()),
                                         ok ? "ok" : "rejected");
                             std::fflush(stdout);
                             std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
                           }
                         });
    write_all().get();
    return 0;
  } catch (const lockwatch::LeaseLost& e) {
    std::printf("lease lost: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockwatch-fenced-writer: %s\n", e.what());
    return 1;
  }
}
