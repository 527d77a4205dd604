// A process that counts in files under a lock, for tests of exclusion
// across processes: each increment takes the lock of one of KEYS keys in
// turn and, holding it, reads the key's file, pauses a millisecond and
// writes the count back plus one. Two holders at once lose an increment.
//   file_counter REDIS_URL DIR KEYS INCREMENTS
// Keys are "fc:0" .. "fc:<KEYS-1>", files DIR/fc-<i>. Exit 0 when every
// increment ran, 1 on an error (printed).
#include <lockwatch/lockwatch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: file_counter REDIS_URL DIR KEYS INCREMENTS\n");
    return 2;
  }
  lockwatch::Options o = lockwatch::Options::from_env();
  o.redis_url = argv[1];
  o.threads = 2;
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
        std::printf("error increment %d did not finish within 60 s\n", i);
        return 1;
      }
      done.get();
    }
  } catch (const std::exception& e) {
    std::printf("error %s\n", e.what());
    return 1;
  }
  return 0;
}
